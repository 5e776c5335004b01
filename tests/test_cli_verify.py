"""`genesys verify` end to end: formats, resume after SIGKILL, refusal of unknown types, rejects."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import GENESYS, read_jsonl, rollout, write_jsonl


def genesys(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([GENESYS, *args], env=env, capture_output=True, text=True, timeout=120)


def output_rows(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    return pq.read_table(path).to_pylist()


@pytest.mark.slow
@pytest.mark.parametrize("output_name", ["out.jsonl", "out.parquet", "shards"])
def test_sigkill_then_same_command_leaves_every_row_exactly_once(tmp_path: Path, plugin_env, output_name):
    rows = []
    for i in range(1500):
        row = rollout("slow", "x", sleep=0.004)
        row["problem_id"] = f"p{i}"  # no response_id: the engine derives a stable one
        rows.append(row)
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / output_name
    command = [GENESYS, "verify", str(inputs), "-o", str(output), "--workers", "2", "--no-progress"]
    first = subprocess.Popen(command, env=plugin_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    written_dir = output if output_name == "shards" else Path(f"{output}.parts")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for the first atomic unit, then kill mid-run
        time.sleep(0.1)
        if output_name == "out.jsonl" and output.exists() and output.stat().st_size > 0:
            break
        if output_name != "out.jsonl" and written_dir.exists() and any(written_dir.glob("*.parquet")):
            break
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL

    second = subprocess.run(command, env=plugin_env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    out = output_rows(output)
    problem_ids = [r["problem_id"] for r in out]
    assert sorted(problem_ids) == sorted(f"p{i}" for i in range(1500))
    assert len(set(r["response_id"] for r in out)) == 1500
    assert all(r["score"] == 1.0 for r in out)


def test_unknown_task_type_is_refused_before_any_work(tmp_path: Path, plugin_env):
    inputs = write_jsonl(tmp_path / "in.jsonl", [rollout("echo", "a", expected="a"), rollout("mystery", "b")])
    result = genesys("verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), env=plugin_env)
    assert result.returncode == 2
    assert "unknown task_type 'mystery'" in result.stderr and "in.jsonl:2" in result.stderr
    assert "echo" in result.stderr  # lists the known ones
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.jsonl").exists()


def test_skip_unknown_records_errors_and_goes_on(tmp_path: Path, plugin_env):
    inputs = write_jsonl(tmp_path / "in.jsonl", [rollout("echo", "a", expected="a"), rollout("mystery", "b")])
    result = genesys(
        "verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), "--skip-unknown", env=plugin_env
    )
    assert result.returncode == 0, result.stderr
    out = {r["task_type"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    assert out["echo"]["score"] == 1.0
    assert out["mystery"]["score"] is None and out["mystery"]["error"].startswith("unknown_task_type")


def test_malformed_lines_land_in_the_rejects_file(tmp_path: Path, plugin_env):
    good = json.dumps(rollout("echo", "a", expected="a"))
    (tmp_path / "in.jsonl").write_text(
        f"{good}\n{{broken\n[1, 2]\n{json.dumps({'prompt': 'no type'})}\n{good}\n"
    )
    result = genesys("verify", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), env=plugin_env)
    assert result.returncode == 0, result.stderr
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 2
    rejects = read_jsonl(tmp_path / "out.jsonl.rejects.jsonl")
    assert [r["location"] for r in rejects] == [f"{tmp_path / 'in.jsonl'}:{n}" for n in (2, 3, 4)]
    assert rejects[0]["raw"] == "{broken" and "invalid JSON" in rejects[0]["error"]
    assert "task_type" in rejects[2]["error"]
    assert "3 unreadable rows" in result.stderr


def test_parquet_and_glob_inputs_keep_every_column(tmp_path: Path, plugin_env):
    import pyarrow as pa

    rows = [
        rollout("echo", "a", expected="a", response_id="r1"),
        rollout("echo", "b", expected="a", response_id="r2"),
    ]
    for row in rows:
        row["extra_column"] = 7
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "part-a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[1:]), tmp_path / "part-b.parquet")
    result = genesys(
        "verify", str(tmp_path / "part-*.parquet"), "-o", str(tmp_path / "out.parquet"), env=plugin_env
    )
    assert result.returncode == 0, result.stderr
    out = {r["response_id"]: r for r in pq.read_table(tmp_path / "out.parquet").to_pylist()}
    assert out["r1"]["score"] == 1.0 and out["r2"]["score"] == 0.0
    assert out["r1"]["extra_column"] == 7 and out["r1"]["problem_id"] == rows[0]["problem_id"]
    assert json.loads(out["r1"]["verification_result_info"])["pid"] > 0
    assert not (tmp_path / "out.parquet.parts").exists()


def test_dict_valued_columns_read_without_conversion(tmp_path: Path, plugin_env):
    row = rollout("echo", "a", expected="a")
    row["verification_info"] = {"expected": "a"}
    row["metadata"] = {"source_dataset": "x"}
    inputs = write_jsonl(tmp_path / "in.jsonl", [row])
    result = genesys("verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), env=plugin_env)
    assert result.returncode == 0, result.stderr
    (out,) = read_jsonl(tmp_path / "out.jsonl")
    assert out["score"] == 1.0 and out["verification_info"] == {"expected": "a"}


def test_summary_counts_errors_and_timeouts_apart(tmp_path: Path, plugin_env):
    rows = [
        rollout("echo", "a", expected="a"),
        rollout("echo", "b", expected="a"),
        rollout("boom", "x"),
        rollout("hang", "x"),
    ]
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    result = genesys(
        "verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), "--workers", "2", env=plugin_env
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split()[1]: line for line in result.stderr.splitlines() if line.startswith("│")}
    assert lines["echo"].replace(" ", "").startswith("│echo│2│0.500│0│0│")
    assert lines["boom"].replace(" ", "").startswith("│boom│1│-│1│0│")
    assert lines["hang"].replace(" ", "").startswith("│hang│1│-│0│1│")


def test_missing_input_and_bad_option_exit_2_with_one_line(tmp_path: Path, plugin_env):
    missing = genesys("verify", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl"), env=plugin_env)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    inputs = write_jsonl(tmp_path / "in.jsonl", [rollout("echo", "a", expected="a")])
    bad = genesys("verify", str(inputs), "-o", str(tmp_path / "o.jsonl"), "-O", "novalue", env=plugin_env)
    assert bad.returncode == 2 and "-O/--option: expected key=value" in bad.stderr


def _processes_with_marker(marker: str) -> list[int]:
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_no_worker_outlives_a_killed_run_even_when_stuck(tmp_path: Path, plugin_env):
    import uuid

    marker = f"GENESYS_TEST_MARKER={uuid.uuid4().hex}"
    env = {**plugin_env, "GENESYS_TEST_MARKER": marker.split("=", 1)[1]}
    inputs = write_jsonl(tmp_path / "in.jsonl", [rollout("hang", "x", response_id=str(i)) for i in range(4)])
    run = subprocess.Popen(
        [
            GENESYS,
            "verify",
            str(inputs),
            "-o",
            str(tmp_path / "o.jsonl"),
            "--timeout",
            "100",
            "--workers",
            "2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while (
        len(_processes_with_marker(marker)) < 3 and time.monotonic() < deadline
    ):  # the run and its workers are up
        time.sleep(0.2)
    time.sleep(1.0)  # the workers are now spinning in Hang.verify
    run.kill()
    run.wait()
    deadline = time.monotonic() + 20
    while _processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_with_marker(marker) == []


def test_preloaded_modules_are_imported_once_before_workers_fork(tmp_path: Path, plugin_env):
    inputs = write_jsonl(
        tmp_path / "in.jsonl", [rollout("preloaded", "x", response_id=str(i)) for i in range(40)]
    )
    result = genesys(
        "verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), "--workers", "2", env=plugin_env
    )
    assert result.returncode == 0, result.stderr
    details = [r["verification_result_info"] for r in read_jsonl(tmp_path / "out.jsonl")]
    assert len({d["imported_in"] for d in details}) == 1  # one import, shared by every worker
    assert all(d["imported_in"] != d["pid"] for d in details)  # and not in the worker itself
    assert all(d["env"] == "yes" for d in details)  # what the import set in the environment stays
