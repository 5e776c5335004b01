"""`--retry-errors`: after a fix, the rows of a finished output whose error is set are done again and
replaced, for verify, generate --verify and validate; nothing is duplicated and nothing lost."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import GENESYS, read_jsonl, rollout, write_jsonl


def genesys(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([GENESYS, *args], env=env, capture_output=True, text=True, timeout=300)


def output_rows(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    files = [path] if path.is_file() else sorted(path.glob("*.parquet"))
    return [row for file in files for row in pq.read_table(file).to_pylist()]


def _mixed_rows() -> list[dict]:
    rows = []
    for i in range(12):
        row = rollout("fixable" if i % 3 == 0 else "echo", "a", expected="a")
        row["problem_id"] = f"p{i}"
        rows.append(row)
    return rows


@pytest.mark.parametrize("output_name", ["out.jsonl", "out.parquet", "shards"])
def test_verify_retry_errors_replaces_the_error_rows_once_the_verifier_is_fixed(
    tmp_path: Path, plugin_env, output_name
):
    inputs = write_jsonl(tmp_path / "in.jsonl", _mixed_rows())
    output = tmp_path / output_name
    command = ("verify", str(inputs), "-o", str(output), "--workers", "2", "--no-progress")
    broken = genesys(*command, env={**plugin_env, "GENESYS_TEST_BROKEN": "1"})
    assert broken.returncode == 0, broken.stderr
    assert sum(row["error"] is not None for row in output_rows(output)) == 4
    # a plain rerun resumes: the rows with errors stay
    assert genesys(*command, env=plugin_env).returncode == 0
    assert sum(row["error"] is not None for row in output_rows(output)) == 4

    fixed = genesys(*command, "--retry-errors", env=plugin_env)
    assert fixed.returncode == 0, fixed.stderr
    rows = output_rows(output)
    assert sorted(row["problem_id"] for row in rows) == sorted(f"p{i}" for i in range(12))  # none twice
    assert all(row["error"] is None and row["score"] == 1.0 for row in rows), rows


def test_verify_retry_errors_keeps_an_error_row_no_input_holds_any_more(tmp_path: Path, plugin_env):
    rows = _mixed_rows()
    output = tmp_path / "out.jsonl"
    first = write_jsonl(tmp_path / "first.jsonl", rows)
    env = {**plugin_env, "GENESYS_TEST_BROKEN": "1"}
    assert genesys("verify", str(first), "-o", str(output), "--no-progress", env=env).returncode == 0
    fewer = write_jsonl(tmp_path / "fewer.jsonl", rows[1:])  # p0, an error row, is in no input now
    done = genesys("verify", str(fewer), "-o", str(output), "--no-progress", "--retry-errors", env=plugin_env)
    assert done.returncode == 0, done.stderr
    by_id = {row["problem_id"]: row for row in read_jsonl(output)}
    assert len(by_id) == len(read_jsonl(output)) == 12
    assert by_id["p0"]["error"] is not None  # kept as it was, not lost
    assert by_id["p3"]["error"] is None and by_id["p3"]["score"] == 1.0


def test_generate_retry_errors_verifies_again_keeping_the_completions(tmp_path: Path, plugin_env):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {"problem_id": f"t{i}", "source": "t", "task_type": "fixable" if i % 2 else "echo",
                 "prompt": f"say {i}", "verification_info": {"expected": "x"}}
            ) + "\n"
            for i in range(4)
        )
    )  # fmt: skip
    output = tmp_path / "gen.jsonl"
    command = (
        "generate", "--tasks", str(tasks), "--model", "m", "--backend", "scripted", "-n", "2", "--verify",
        "-o", str(output), "--no-progress",
    )  # fmt: skip
    broken = genesys(*command, env={**plugin_env, "GENESYS_TEST_BROKEN": "1"})
    assert broken.returncode == 0, broken.stderr
    assert "4 of 8 rows could not be verified" in broken.stderr  # said without a progress bar too
    before = {row["response_id"]: row for row in read_jsonl(output)}
    assert sum(row["error"] is not None for row in before.values()) == 4
    fixed = genesys(*command, "--retry-errors", env=plugin_env)
    assert fixed.returncode == 0, fixed.stderr
    after = read_jsonl(output)
    assert sorted(row["response_id"] for row in after) == sorted(before)  # nothing twice, nothing new
    assert all(row["error"] is None and row["score"] == 0.0 for row in after)
    assert all(row["llm_response"] == before[row["response_id"]]["llm_response"] for row in after)


def test_retry_errors_needs_verification_and_excludes_overwrite(tmp_path: Path, plugin_env):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "p", "task_type": "echo", "verification_info": {}}) + "\n")
    plain = genesys(
        "generate", "--tasks", str(tasks), "--model", "m", "--backend", "scripted", "-o",
        str(tmp_path / "o.jsonl"), "--retry-errors", env=plugin_env,
    )  # fmt: skip
    assert plain.returncode == 2 and "--verify" in plain.stderr
    both = genesys(
        "verify", str(tasks), "-o", str(tmp_path / "v.jsonl"), "--retry-errors", "--overwrite", env=plugin_env
    )
    assert both.returncode == 2 and "--overwrite" in both.stderr and "--retry-errors" in both.stderr


@pytest.mark.slow
def test_validate_retry_errors_validates_again_the_rows_not_found_valid(tiny_model: str, tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"problem_id": f"m{i}", "task_type": "verifiable_math", "prompt": f"{i} + {i} = ?",
                        "verification_info": {"ground_truth": str(2 * i)}}) + "\n"
            for i in range(3)
        )
    )  # fmt: skip
    rows = tmp_path / "rows.jsonl"
    generated = subprocess.run(
        [GENESYS, "generate", "--tasks", str(tasks), "--model", tiny_model, "-o", str(rows), "--backend",
         "transformers", "-n", "2", "--max-tokens", "16", "--proofs", "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    output = tmp_path / "validated.jsonl"
    command = [GENESYS, "validate", str(rows), "--model", tiny_model, "-o", str(output), "--no-progress"]
    wrong = subprocess.run(
        [*command, "--model-name", "someone/else"], capture_output=True, text=True, timeout=300
    )
    assert wrong.returncode == 0, wrong.stderr
    assert [row["toploc_valid"] for row in read_jsonl(output)] == [False] * 6
    again = subprocess.run([*command, "--retry-errors"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    validated = read_jsonl(output)
    assert sorted(row["response_id"] for row in validated) == sorted(
        row["response_id"] for row in read_jsonl(rows)
    )
    assert [row["toploc_valid"] for row in validated] == [True] * 6, [
        row["toploc_reason"] for row in validated
    ]
