"""`genesys report`: every plot is a real PNG, the summary's figures are right, and the CLI writes both."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import GENESYS, write_jsonl

from genesys.analysis.report import write_report
from genesys.errors import InputError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS = {
    "pass_rate_by_source",
    "reward_distribution",
    "completion_length",
    "length_vs_correctness",
    "score_by_task_type",
}


def rollouts() -> list[dict]:
    """3 sources x 4 tasks x 5 samples; longer completions fail more often; every 10th rollout errored."""
    rows = []
    for t in range(12):
        source, task_type = [
            ("math-a", "verifiable_math"),
            ("code-b", "verifiable_code"),
            ("puzzles", "countdown"),
        ][t % 3]
        for k in range(5):
            n = len(rows)
            length = 100 + 150 * k + 10 * t
            score = (
                None
                if n % 10 == 9
                else (1.0 if k < t % 5 + 1 else (0.5 if task_type == "verifiable_code" else 0.0))
            )
            rows.append(
                {
                    "problem_id": f"task-{t}",
                    "source": source,
                    "task_type": task_type,
                    "prompt": f"problem {t}",
                    "verification_info": {"ground_truth": str(t)},
                    "llm_response": "x" * length,
                    "completion_ids": list(range(length)),
                    "score": score,
                    "reward": None if score is None else score - 0.0003 * length,
                    "error": "timeout: exceeded 10s" if score is None else None,
                }
            )
    return rows


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    assert len(data) > 10_000, f"{path.name} is suspiciously small ({len(data)} bytes)"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 400 and height >= 200, f"{path.name} is {width}x{height}"


def test_every_plot_is_a_png_and_the_summary_links_them(tmp_path: Path):
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rollouts())
    report = write_report([str(inputs)], tmp_path / "report")
    assert {p.stem for p in report.plots} == PLOTS
    for path in report.plots:
        assert_png(path)
    summary = report.summary.read_text()
    for path in report.plots:
        assert f"]({path.name})" in summary


def test_summary_figures(tmp_path: Path):
    rows = rollouts()
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    summary = write_report([str(inputs)], tmp_path / "report").summary.read_text()
    errors = sum(r["score"] is None for r in rows)
    correct = sum(r["score"] == 1.0 for r in rows)
    assert "| 60 | 12 | " in summary
    assert f"{correct} ({correct / (60 - errors):.1%})" in summary
    assert f"{errors} ({errors / 60:.1%})" in summary
    code = [r for r in rows if r["task_type"] == "verifiable_code"]
    partial = sum(r["score"] == 0.5 for r in code)
    code_errors = sum(r["score"] is None for r in code)
    assert "| verifiable_code | 20 | " in summary and f"| {partial} | 0 | {code_errors} |" in summary
    assert f"| timeout | {errors} |" in summary
    assert "median length (tokens)" in summary


def test_rollouts_read_twice_count_once(tmp_path: Path):
    rows = [{**row, "response_id": f"r{index}"} for index, row in enumerate(rollouts())]
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    report = write_report([str(inputs), str(inputs)], tmp_path / "report")
    assert report.repeats == 60
    summary = report.summary.read_text()
    assert "| 60 | 12 | " in summary and "60 rollouts appeared more than once" in summary


def test_lengths_fall_back_to_characters_without_token_ids(tmp_path: Path):
    rows = [{k: v for k, v in r.items() if k != "completion_ids"} for r in rollouts()]
    report = write_report([str(write_jsonl(tmp_path / "r.jsonl", rows))], tmp_path / "report")
    assert "median length (characters)" in report.summary.read_text()
    assert {p.stem for p in report.plots} == PLOTS


def test_unverified_rollouts_are_refused(tmp_path: Path):
    inputs = write_jsonl(tmp_path / "r.jsonl", [{"problem_id": "a", "llm_response": "x"}])
    with pytest.raises(InputError, match="no 'score' column"):
        write_report([str(inputs)], tmp_path / "report")


@pytest.mark.parametrize(
    ("bad", "message"),
    [("x", 'r.jsonl:8: score "x" is not a number'), (7, "r.jsonl:8: score 7 is outside 0..1")],
)
def test_a_bad_score_is_refused_naming_its_line(tmp_path: Path, bad, message):
    rows = rollouts()
    rows[7]["score"] = bad
    with pytest.raises(InputError, match=message):
        write_report([str(write_jsonl(tmp_path / "r.jsonl", rows))], tmp_path / "report")


def test_cli_writes_plots_and_summary(tmp_path: Path):
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rollouts())
    done = subprocess.run(
        [GENESYS, "report", str(inputs), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert {p.stem for p in (tmp_path / "out").glob("*.png")} == PLOTS
    assert (tmp_path / "out" / "summary.md").read_text().startswith("# Rollout report")
