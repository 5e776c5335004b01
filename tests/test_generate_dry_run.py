"""`genesys generate --dry-run`: the plan of a run per task type (single completions and environments),
with the first task's opening messages, and nothing loaded or written."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from genesys.testing.digits import digit_tasks


def dry_run(tasks: list[Path], output: Path, *flags: str) -> str:
    from genesys.cli import cli

    args = ["generate", "--model", "no/such-model", "-o", str(output), "--backend", "transformers"]
    for task_file in tasks:
        args += ["--tasks", str(task_file)]
    shown = CliRunner().invoke(cli, [*args, "-n", "3", "--max-tokens", "7", *flags, "--dry-run"])
    assert shown.exit_code == 0, shown.output
    return shown.output


def test_the_plan_shows_single_completions_and_environment_turns(tmp_path, plugin_env):
    single = digit_tasks(tmp_path / "single.jsonl", count=2)
    turns = digit_tasks(tmp_path / "turns.jsonl", count=3, task_type="digit_turns")
    output = tmp_path / "out.jsonl"
    shown = dry_run([single, turns], output, "--system-prompt", "Be brief.", "--proofs")
    assert "digit_share: 2 tasks, 6 samples to generate" in shown
    assert "one completion per sample, scored by the task type's verifier" in shown
    assert "[system] 'Be brief.'" in shown and "[user] 'Write digits 0'" in shown
    assert "digit_turns: 3 tasks, 9 samples to generate" in shown
    assert (
        "played in environment DigitTurns: up to 2 model turns of at most 7 tokens each; tools: none" in shown
    )
    assert "validate replays its environment side" in shown
    assert not output.exists()  # no model loaded (it does not exist), nothing written


def test_samples_the_output_holds_are_counted_as_resumed(tmp_path, plugin_env):
    from genesys.data.identity import response_id
    from genesys.tasks.prepare import prepare_tasks, select_tasks

    turns = digit_tasks(tmp_path / "turns.jsonl", count=2, task_type="digit_turns")
    [first, _] = prepare_tasks(select_tasks([str(turns)])).tasks
    output = tmp_path / "out.jsonl"
    output.write_text(json.dumps({"response_id": response_id(first.key, 0)}) + "\n")
    shown = dry_run([turns], output)
    assert "digit_turns: 2 tasks, 5 samples to generate (1 already in the output)" in shown
    assert output.read_text().count("\n") == 1
