"""The one progress bar and the closing summaries, each printed from its own run's data."""

from __future__ import annotations

from pathlib import Path

from genesys.generate.runner import GenerateSummary, print_generate_summary
from genesys.ui.progress import RunProgress, console
from genesys.verification.api import RunSummary, print_summary
from genesys.verification.stats import TypeStats


def test_rates_count_what_is_done_now_not_what_an_earlier_run_did():
    with RunProgress(10, "generating", "tasks", rated=("samples", "tokens"), enabled=False) as progress:
        progress.skip(4)
        progress.advance(1, samples=8, tokens=900)
        progress.advance(1, samples=8, tokens=100)
    assert progress.counts == {"samples": 16, "tokens": 1000}
    with RunProgress(5, "verifying", "rows", enabled=False) as rows:
        rows.skip(2)
        rows.advance(3)
    assert rows.counts == {"rows": 3}


def _printed(print_call) -> str:
    with console.capture() as captured:
        print_call()
    return captured.get()


def test_summaries_print_their_own_figures():
    stats = {"echo": TypeStats(count=4, score_sum=3.0, scored=4), "mystery": TypeStats(count=2, errors=2)}
    generated = GenerateSummary(
        output=Path("out.jsonl"), tasks=3, generated=6, resumed=2, tokens=60, seconds=2.0, verify_stats=stats
    )
    text = _printed(lambda: print_generate_summary(generated))
    assert "generated 6 rollouts in 2.0s" in text and "verified 6 rows in 2.0s (3 rows/s)" in text
    assert "echo" in text and "0.750" in text and "output: out.jsonl" in text
    verified = RunSummary(output=Path("v.jsonl"), stats=stats, verified=5, resumed=1, seconds=5.0)
    text = _printed(lambda: print_summary(verified, None))
    assert "verified 5 rows in 5.0s (1 rows/s)" in text and "resumed: 1 rows were already in v.jsonl" in text
