"""What runs print on a terminal: a progress bar whose figures fit 80 columns, a refusal that comes
before any bar, and a closing table that shows the mean reward when the reward is shaped."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from conftest import GENESYS, rollout, write_jsonl

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def on_a_terminal(*args: str, env: dict[str, str], columns: int = 80) -> subprocess.CompletedProcess:
    """Run `genesys` as on a terminal `columns` wide (rich reads COLUMNS and FORCE_COLOR)."""
    terminal = {**env, "COLUMNS": str(columns), "FORCE_COLOR": "1", "TERM": "xterm-256color"}
    terminal.pop("NO_COLOR", None)
    return subprocess.run([GENESYS, *args], env=terminal, capture_output=True, text=True, timeout=300)


def bar_lines(stderr: str, word: str) -> list[str]:
    """Every state the progress bar was drawn in (redraws are separated by carriage returns)."""
    text = ANSI.sub("", stderr)
    return [line for line in re.split(r"[\r\n]", text) if line.startswith(word)]


def test_the_generate_bar_shows_every_figure_whole_at_80_columns(tmp_path: Path, plugin_env):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"problem_id": f"t{i}", "task_type": "echo", "prompt": f"a longer prompt number {i}"})
            + "\n"
            for i in range(400)
        )
    )
    done = on_a_terminal(
        "generate", "--tasks", str(tasks), "--model", "m", "--backend", "scripted", "-n", "8",
        "-o", str(tmp_path / "out.jsonl"), "-B", "delay=0.002", env=plugin_env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = bar_lines(done.stderr, "generating")
    assert lines, done.stderr
    for line in lines:
        assert len(line.rstrip()) <= 80 and "…" not in line, line
    last = lines[-1]
    assert "400/400 tasks" in last and "samples/s" in last and "tok/s" in last and "ETA 0:00" in last, last


def test_a_refused_option_prints_no_progress_bar_first(tmp_path: Path, plugin_env):
    rows = [rollout("verifiable_math", "\\boxed{2}", ground_truth="2") for _ in range(19)]
    for i, row in enumerate(rows):
        row["problem_id"] = f"m{i}"
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    done = on_a_terminal(
        "verify", str(inputs), "-o", str(tmp_path / "o.jsonl"), "-O", "time_limt=3", env=plugin_env
    )
    assert done.returncode == 2 and "unknown verifier option(s) 'time_limt'" in done.stderr
    assert "verifying" not in done.stderr, done.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_the_closing_table_shows_mean_reward_beside_mean_score_when_a_length_penalty_is_on(
    tmp_path: Path, plugin_env
):
    rows = []
    for i, completion in enumerate(["yes", "yes, and a good deal more than that"]):
        row = rollout("echo", completion, expected="yes")
        row.update(problem_id=f"e{i}", completion_ids=list(range(len(completion))), target_length=4)
        rows.append(row)
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    shaped = on_a_terminal(
        "verify", str(inputs), "-o", str(tmp_path / "shaped.jsonl"), "--length-penalty", "max", env=plugin_env,
        columns=120,
    )  # fmt: skip
    assert shaped.returncode == 0, shaped.stderr
    text = ANSI.sub("", shaped.stderr)
    assert "mean score" in text and "mean reward" in text, text
    plain = on_a_terminal(
        "verify", str(inputs), "-o", str(tmp_path / "plain.jsonl"), env=plugin_env, columns=120
    )
    assert "mean score" in plain.stderr and "mean reward" not in plain.stderr  # reward = score: one column
