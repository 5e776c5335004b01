"""Where commands write and in what order: output paths (`-` and unknown extensions), stdin as input,
one rule for an existing output (resumed, or refused without --overwrite), rows in input order, and
`genesys filter --emit rollouts`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import GENESYS, read_jsonl, rollout, write_jsonl


def genesys(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GENESYS, *args], env=env, input=stdin, capture_output=True, text=True, timeout=300)


def echo_rows(count: int, *, right_every: int = 2) -> list[dict]:
    rows = []
    for i in range(count):
        row = rollout("echo", "a" if i % right_every == 0 else "b", expected="a")
        row["problem_id"] = f"p{i // 4}"  # four rollouts per task
        row["response_id"] = f"r{i}"
        rows.append(row)
    return rows


# --- paths -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "validate", "generate"])
def test_an_unknown_output_extension_is_refused_naming_the_accepted_ones(tmp_path: Path, plugin_env, command):
    inputs = write_jsonl(tmp_path / "in.jsonl", echo_rows(4))
    args = {
        "verify": ("verify", str(inputs)),
        "validate": ("validate", str(inputs), "--model", "m"),
        "generate": ("generate", "--tasks", str(inputs), "--model", "m", "--backend", "scripted"),
    }[command]
    done = genesys(*args, "-o", str(tmp_path / "o.csv"), "--no-progress", env=plugin_env)
    assert done.returncode == 2, done.stderr
    assert "unknown extension '.csv'" in done.stderr and ".jsonl" in done.stderr and ".parquet" in done.stderr
    assert not (tmp_path / "o.csv").exists()


def test_stdout_as_a_resumable_output_is_refused_clearly(tmp_path: Path, plugin_env):
    inputs = write_jsonl(tmp_path / "in.jsonl", echo_rows(4))
    done = subprocess.run(
        [GENESYS, "verify", str(inputs), "-o", "-", "--no-progress"],
        env=plugin_env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "output '-' (stdout)" in done.stderr and "resum" in done.stderr
    assert not (tmp_path / "-").exists()


def test_dash_reads_jsonl_from_stdin_and_filter_writes_jsonl_to_stdout(tmp_path: Path, plugin_env):
    lines = "".join(json.dumps(row) + "\n" for row in echo_rows(8)) + "{not json\n"
    output = tmp_path / "v.jsonl"
    verified = genesys("verify", "-", "-o", str(output), "--no-progress", env=plugin_env, stdin=lines)
    assert verified.returncode == 0, verified.stderr
    assert [row["response_id"] for row in read_jsonl(output)] == [f"r{i}" for i in range(8)]
    assert "1 unreadable rows" in verified.stderr  # said even without a progress bar
    (reject,) = read_jsonl(Path(f"{output}.rejects.jsonl"))
    assert reject["location"] == "<stdin>:9"

    filtered = genesys("filter", "-", "-o", "-", env=plugin_env, stdin=output.read_text())
    assert filtered.returncode == 0, filtered.stderr
    tasks = [json.loads(line) for line in filtered.stdout.splitlines()]
    assert [task["problem_id"] for task in tasks] == ["p0", "p1"] and tasks[0]["pass_rate"] == 0.5
    assert "-> stdout" in " ".join(filtered.stderr.split())


def test_no_progress_still_says_when_rows_could_not_be_verified(tmp_path: Path, plugin_env):
    inputs = write_jsonl(tmp_path / "in.jsonl", [rollout("boom", "x"), rollout("echo", "a", expected="a")])
    done = genesys("verify", str(inputs), "-o", str(tmp_path / "o.jsonl"), "--no-progress", env=plugin_env)
    assert done.returncode == 0, done.stderr
    assert "1 of 2 rows could not be verified" in done.stderr and "--retry-errors" in done.stderr


# --- an existing output ------------------------------------------------------------------------------


def test_filter_refuses_an_existing_output_without_overwrite(tmp_path: Path, plugin_env):
    verified = tmp_path / "v.jsonl"
    assert genesys("verify", str(write_jsonl(tmp_path / "in.jsonl", echo_rows(8))), "-o", str(verified),
                   "--no-progress", env=plugin_env).returncode == 0  # fmt: skip
    output = tmp_path / "tasks.jsonl"
    output.write_text('{"kept": "from before"}\n' * 36)
    refused = genesys("filter", str(verified), "-o", str(output), env=plugin_env)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert len(output.read_text().splitlines()) == 36  # untouched
    replaced = genesys("filter", str(verified), "-o", str(output), "--overwrite", env=plugin_env)
    assert replaced.returncode == 0, replaced.stderr
    assert [row["problem_id"] for row in read_jsonl(output)] == ["p0", "p1"]


@pytest.mark.parametrize("output_name", ["out.jsonl", "out.parquet", "shards"])
def test_verify_overwrite_starts_over_instead_of_resuming(tmp_path: Path, plugin_env, output_name):
    inputs = write_jsonl(tmp_path / "in.jsonl", echo_rows(4))
    output = tmp_path / output_name
    command = ("verify", str(inputs), "-o", str(output), "--no-progress")
    assert genesys(*command, env=plugin_env).returncode == 0
    write_jsonl(inputs, echo_rows(4, right_every=1))  # every answer right now
    resumed = genesys(*command, env=plugin_env)
    assert resumed.returncode == 0
    over = genesys(*command, "--overwrite", env=plugin_env)
    assert over.returncode == 0, over.stderr
    from test_retry_errors import output_rows

    rows = output_rows(output)
    assert len(rows) == 4 and all(row["score"] == 1.0 for row in rows)


def test_overwrite_leaves_a_directory_holding_other_files_alone(tmp_path: Path, plugin_env):
    inputs = write_jsonl(tmp_path / "in.jsonl", echo_rows(4))
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    done = genesys("verify", str(inputs), "-o", str(folder), "--overwrite", "--no-progress", env=plugin_env)
    assert done.returncode == 2 and "notes.txt" in done.stderr
    assert (folder / "notes.txt").read_text() == "keep me"


# --- order -------------------------------------------------------------------------------------------


def test_verify_writes_rows_in_input_order_though_they_finish_out_of_order(tmp_path: Path, plugin_env):
    rows = []
    for i in range(40):
        row = rollout("slow", "x", sleep=0.3 if i % 10 == 0 else 0.0)  # every tenth row is slow
        row.update(problem_id=f"s{i}", response_id=f"r{i:02d}")
        rows.append(row)
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    done = genesys(
        "verify", str(inputs), "-o", str(output), "--workers", "4", "--no-progress", env=plugin_env
    )
    assert done.returncode == 0, done.stderr
    written = read_jsonl(output)
    assert [row["response_id"] for row in written] == [f"r{i:02d}" for i in range(40)]
    finished = sorted(written, key=lambda row: row["verification_result_info"]["end"])
    assert [row["response_id"] for row in finished] != [row["response_id"] for row in written]  # out of order


# --- filter --emit rollouts --------------------------------------------------------------------------


def test_filter_emit_rollouts_writes_the_rollouts_of_the_kept_tasks(tmp_path: Path, plugin_env):
    rows = echo_rows(12)  # p0..p2, each 2 of 4 right
    for row in rows[8:]:
        row["llm_response"] = "a"  # p2: all right
    verified = tmp_path / "v.jsonl"
    assert genesys("verify", str(write_jsonl(tmp_path / "in.jsonl", rows)), "-o", str(verified),
                   "--no-progress", env=plugin_env).returncode == 0  # fmt: skip
    output = tmp_path / "kept.jsonl"
    done = genesys("filter", str(verified), str(verified), "-o", str(output), "--max-pass-rate", "0.9",
                   "--emit", "rollouts", env=plugin_env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    kept = read_jsonl(output)
    assert [row["response_id"] for row in kept] == [f"r{i}" for i in range(8)]  # each once, in order
    assert all("score" in row and isinstance(row["verification_info"], dict) for row in kept)
    assert "(8 rollouts of the kept tasks)" in " ".join(done.stderr.split())
