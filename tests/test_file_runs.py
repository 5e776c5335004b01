"""The one resumable file run (`genesys.data.runs.FileRun`) through the real `genesys` command:
outputs overlapping inputs are refused, one run per output, parquet outputs merge when a column's
type changed, and a rollout without a completion is an error, never a silent 0."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import GENESYS, read_jsonl, rollout, write_jsonl

from genesys.data.runs import FileRun, FileRunSummary, lock_path
from genesys.errors import InputError


def genesys(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GENESYS, *args], env=env, capture_output=True, text=True, timeout=120)


def _echo_rows(count: int, prefix: str = "p") -> list[dict]:
    rows = []
    for i in range(count):
        row = rollout("echo", "a", expected="a")
        row["problem_id"] = f"{prefix}{i}"
        rows.append(row)
    return rows


# --- an output overlapping an input ---------------------------------------------------------------


def test_an_output_that_is_its_jsonl_input_is_refused_and_the_input_kept(tmp_path: Path, plugin_env):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("\n".join(json.dumps(row) for row in _echo_rows(3)))  # no newline after the last row
    before = inputs.read_bytes()
    result = genesys("verify", str(inputs), "-o", str(inputs), "--no-progress", env=plugin_env)
    assert result.returncode == 2, result.stderr
    assert f"output {str(inputs)!r} is also input {str(inputs)!r}" in result.stderr
    assert inputs.read_bytes() == before  # the last row used to be cut as a torn line
    assert not lock_path(inputs).exists()


def test_an_output_that_is_its_parquet_input_is_refused_and_the_input_kept(tmp_path: Path, plugin_env):
    inputs = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(_echo_rows(2)), inputs)
    before = inputs.read_bytes()
    result = genesys("verify", str(inputs), "-o", str(inputs), "--no-progress", env=plugin_env)
    assert result.returncode == 2 and "is also input" in result.stderr, result.stderr
    assert inputs.read_bytes() == before  # it used to be moved into in.parquet.parts/
    assert not (tmp_path / "in.parquet.parts").exists()


def test_an_output_inside_an_input_directory_is_refused_before_any_work(tmp_path: Path, plugin_env):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", _echo_rows(2))
    output = data / "verified.jsonl"
    result = genesys("verify", str(data), "-o", str(output), "--no-progress", env=plugin_env)
    assert result.returncode == 2, result.stderr
    assert str(output) in result.stderr and f"input directory {str(data)!r}" in result.stderr
    assert not output.exists()  # a rerun used to read it as input and write its rows again


def test_a_glob_that_would_read_the_output_is_refused(tmp_path: Path, plugin_env):
    write_jsonl(tmp_path / "a.jsonl", _echo_rows(2))
    pattern = str(tmp_path / "*.jsonl")
    result = genesys("verify", pattern, "-o", str(tmp_path / "b.jsonl"), "--no-progress", env=plugin_env)
    assert result.returncode == 2 and f"would be read by input {pattern!r}" in result.stderr, result.stderr


def test_an_input_inside_the_output_directory_is_refused(tmp_path: Path, plugin_env):
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.Table.from_pylist(_echo_rows(2)), shards / "part-0.parquet")
    result = genesys(
        "verify", str(shards / "part-0.parquet"), "-o", str(shards), "--no-progress", env=plugin_env
    )
    assert result.returncode == 2, result.stderr
    assert f"input {str(shards / 'part-0.parquet')!r} is inside the output {str(shards)!r}" in result.stderr
    assert [p.name for p in shards.iterdir()] == ["part-0.parquet"]


def test_generate_and_validate_refuse_an_output_that_is_their_input_before_loading_a_model(tmp_path: Path):
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"task_type": "countdown", "prompt": "x"}])
    before = tasks.read_bytes()
    generated = genesys("generate", "--tasks", str(tasks), "--model", "/nonexistent", "-o", str(tasks))
    assert generated.returncode == 2, generated.stderr
    assert f"output {str(tasks)!r} is also input {str(tasks)!r}" in generated.stderr
    validated = genesys("validate", str(tasks), "--model", "/nonexistent", "-o", str(tasks))
    assert validated.returncode == 2, validated.stderr
    assert f"output {str(tasks)!r} is also input {str(tasks)!r}" in validated.stderr
    assert tasks.read_bytes() == before


# --- one run per output -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_run_on_the_same_output_is_refused_naming_the_first(tmp_path: Path, plugin_env):
    rows = [rollout("slow", "x", sleep=0.02) | {"problem_id": f"p{i}"} for i in range(150)]
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    command = [GENESYS, "verify", str(inputs), "-o", str(output), "--workers", "1", "--no-progress"]
    first = subprocess.Popen(command, env=plugin_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lock = lock_path(output)
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().strip()):
        assert first.poll() is None and time.monotonic() < deadline, "the first run never took its lock"
        time.sleep(0.02)
    second = genesys("verify", str(inputs), "-o", str(output), "--no-progress", env=plugin_env)
    assert first.poll() is None, "the first run ended before the second was tried: make it slower"
    assert second.returncode == 2, second.stderr
    assert "is being written by another run" in second.stderr
    assert f"pid {first.pid} " in second.stderr and "genesys verify" in second.stderr
    assert first.wait(timeout=120) == 0, first.stderr.read().decode()  # type: ignore[union-attr]
    ids = [row["response_id"] for row in read_jsonl(output)]
    assert len(ids) == len(set(ids)) == 150  # both runs used to write every row
    assert not lock.exists()


def test_generate_is_refused_while_another_run_holds_the_output(tmp_path: Path):
    from genesys.config import GenerateConfig
    from genesys.generate.runner import run_generation

    tasks = write_jsonl(tmp_path / "t.jsonl", [{"task_type": "countdown", "prompt": "x"}])
    output = tmp_path / "out.jsonl"
    config = GenerateConfig(tasks=[str(tasks)], model="/nonexistent", output=output, progress=False)
    with FileRun(output, FileRunSummary(output), command="genesys verify holder"):
        with pytest.raises(
            InputError, match=r"being written by another run \(pid \d+ .*genesys verify holder"
        ):
            run_generation(config)
    assert not lock_path(output).exists()


# --- a parquet output whose column changed type -------------------------------------------------------


def _with_rating(rows: list[dict], ratings: list) -> list[dict]:
    return [row | {"rating": rating} for row, rating in zip(rows, ratings)]


def test_resuming_a_parquet_output_whose_column_became_text_merges_every_row(tmp_path: Path, plugin_env):
    first = write_jsonl(tmp_path / "a.jsonl", _with_rating(_echo_rows(2, "a"), [1, 2]))
    second = write_jsonl(tmp_path / "b.jsonl", _with_rating(_echo_rows(2, "b"), ["good", "bad"]))
    output = tmp_path / "out.parquet"
    assert genesys("verify", str(first), "-o", str(output), "--no-progress", env=plugin_env).returncode == 0
    again = genesys("verify", str(first), str(second), "-o", str(output), env=plugin_env)
    assert again.returncode == 0, again.stderr  # used to end in a pyarrow traceback, out.parquet gone
    assert "Traceback" not in again.stderr and "resumed: 2 rows" in again.stderr
    rows = {row["problem_id"]: row for row in pq.read_table(output).to_pylist()}
    assert {p: r["rating"] for p, r in rows.items()} == {"a0": "1", "a1": "2", "b0": "good", "b1": "bad"}
    assert all(row["score"] == 1.0 for row in rows.values())
    assert not (tmp_path / "out.parquet.parts").exists()


def test_a_parquet_column_whose_types_cannot_merge_is_refused_keeping_every_part(tmp_path: Path, plugin_env):
    first = write_jsonl(tmp_path / "a.jsonl", _with_rating(_echo_rows(2, "a"), [[1, 2], [3]]))
    second = write_jsonl(tmp_path / "b.jsonl", _with_rating(_echo_rows(1, "b"), ["good"]))
    output = tmp_path / "out.parquet"
    assert genesys("verify", str(first), "-o", str(output), "--no-progress", env=plugin_env).returncode == 0
    finished = output.read_bytes()
    for _ in range(2):  # a rerun says the same, and loses nothing
        again = genesys("verify", str(first), str(second), "-o", str(output), "--no-progress", env=plugin_env)
        assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
        assert "column 'rating'" in again.stderr
        assert "written as list<element: int64> and now as string" in again.stderr
        assert output.read_bytes() == finished
        (part,) = (tmp_path / "out.parquet.parts").glob("*.parquet")
        assert pq.read_table(part).column("problem_id").to_pylist() == ["b0"]


# --- the completion column ---------------------------------------------------------------------------


def test_a_missing_or_null_completion_is_an_invalid_row_not_a_zero(tmp_path: Path, plugin_env):
    rows = _echo_rows(3)
    for row in rows[:2]:
        row["response"] = row.pop("llm_response")
    rows[2]["llm_response"] = None
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    result = genesys(
        "verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), "--no-progress", env=plugin_env
    )
    assert result.returncode == 0, result.stderr
    out = {row["problem_id"]: row for row in read_jsonl(tmp_path / "out.jsonl")}
    for name in ("p0", "p1"):
        assert out[name]["score"] is None and out[name]["reward"] is None  # used to score 0.0
        error = out[name]["error"]
        assert error.startswith("invalid_row: field 'llm_response' (the completion) is missing")
        assert "response" in error.split("the row has", 1)[1] and "--completion-field" in error
    assert out["p2"]["score"] is None and out["p2"]["error"].startswith("invalid_row:")
    assert "is null" in out["p2"]["error"]


def test_completion_field_maps_another_schema(tmp_path: Path, plugin_env):
    rows = _echo_rows(2)
    for row in rows:
        row["response"] = row.pop("llm_response")
    rows[1]["response"] = "b"
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    result = genesys(
        "verify", str(inputs), "-o", str(output), "--completion-field", "response", env=plugin_env
    )
    assert result.returncode == 0, result.stderr
    out = {row["problem_id"]: row for row in read_jsonl(output)}
    assert out["p0"]["score"] == 1.0 and out["p1"]["score"] == 0.0
    assert out["p0"]["llm_response"] == "a" and "response" not in out["p0"]  # written in the GENESYS schema
    again = genesys(
        "verify", str(inputs), "-o", str(output), "--completion-field", "response", env=plugin_env
    )
    assert again.returncode == 0 and "resumed: 2 rows" in again.stderr, again.stderr
    assert len(read_jsonl(output)) == 2


# --- rejects ------------------------------------------------------------------------------------------


def test_the_rejects_file_is_rewritten_by_each_run_and_removed_when_clean(tmp_path: Path, plugin_env):
    inputs = tmp_path / "in.jsonl"
    good = [json.dumps(row) for row in _echo_rows(2)]
    inputs.write_text(f"{good[0]}\n{{broken\n{good[1]}\n")
    output = tmp_path / "out.jsonl"
    rejects = tmp_path / "out.jsonl.rejects.jsonl"
    first = genesys("verify", str(inputs), "-o", str(output), env=plugin_env)
    assert first.returncode == 0 and "1 unreadable rows written to" in first.stderr, first.stderr
    assert [r["location"] for r in read_jsonl(rejects)] == [f"{inputs}:2"]
    again = genesys("verify", str(inputs), "-o", str(output), "--no-progress", env=plugin_env)
    assert again.returncode == 0 and len(read_jsonl(rejects)) == 1  # rewritten, not appended to
    inputs.write_text(f"{good[0]}\n{good[1]}\n")
    assert genesys("verify", str(inputs), "-o", str(output), "--no-progress", env=plugin_env).returncode == 0
    assert not rejects.exists() and len(read_jsonl(output)) == 2


def test_in_order_hands_rows_on_in_number_order_and_gives_back_what_it_still_holds():
    from genesys.data.runs import InOrder

    order = InOrder()
    assert order.add(1, {"n": 1}) == [] and order.add(3, {"n": 3}) == [] and len(order) == 2
    assert order.add(0, {"n": 0}) == [{"n": 0}, {"n": 1}] and len(order) == 1
    assert order.add(4, {"n": 4}) == []
    assert order.rest() == [{"n": 3}, {"n": 4}] and len(order) == 0
