"""`genesys verify` on code rollouts through the real sandboxes: the sample rows score as they
should, and hostile rollouts in the same run do not disturb the scoring of the others."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import GENESYS, REPO, read_jsonl, write_jsonl
from test_sandbox_backends import BACKENDS, PROGRAMS, SUM_TESTS, backend_skip_reason, host_processes_with
from test_sandbox_lifecycle import wait_until

pytestmark = pytest.mark.slow  # each runs `genesys verify` on a sandbox: 4 to 10 s

SAMPLES = REPO / "genesys" / "tasks" / "data" / "sample_rollouts.jsonl"
EXPECTED_SAMPLES = {
    "code-sum-py": 1.0,
    "code-sum-py-wrong": 2 / 3,
    "code-sum-cpp": 1.0,
    "code-sum-rust": 1.0,
    "code-two-sum-py": 1.0,
    "code-sum-js-slow": 0.0,
    "cop-1": 1.0,
    "cop-2": 0.0,
}
HOSTILE = {
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "hog = []\nwhile True:\n    hog.append(bytearray(64 << 20))",
    "kill_runner": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "output_flood": "while True:\n    print('y' * 10000)",
    "cpu_spin": "while True:\n    pass",
}


def verify(inputs: Path, output: Path, kind: str, *extra: str) -> list[dict]:
    done = subprocess.run(
        [GENESYS, "verify", str(inputs), "-o", str(output), "--sandbox", kind, "--no-progress", *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return read_jsonl(output)


def info(row: dict) -> dict:
    value = row["verification_result_info"]
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.parametrize("kind", BACKENDS)
def test_sample_code_rollouts(kind: str, tmp_path: Path) -> None:
    reason = backend_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    from genesys.sandbox.backends import open_sandbox

    with open_sandbox(kind) as sandbox:
        languages = set(sandbox.languages())
    rows = [
        row
        for row in read_jsonl(SAMPLES)
        if row["problem_id"] in EXPECTED_SAMPLES
        and json.loads(row["verification_info"]).get("language", "python") in languages
    ]
    out = verify(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", kind)
    scores = {row["problem_id"]: row["score"] for row in out}
    errors = {row["problem_id"]: row["error"] for row in out if row["error"]}
    assert scores == pytest.approx(
        {row["problem_id"]: EXPECTED_SAMPLES[row["problem_id"]] for row in rows}
    ), errors
    assert {"code-sum-py", "code-two-sum-py", "cop-1", "cop-2"} <= set(scores)
    assert all(row["error"] is None for row in out)
    slow = next((row for row in out if row["problem_id"] == "code-sum-js-slow"), None)
    assert slow is None or {test["status"] for test in info(slow)["tests"]} == {"time_limit"}


def row(name: str, source: str) -> dict:
    fence = "```"
    return {
        "problem_id": name,
        "task_type": "verifiable_code",
        "prompt": "add two numbers",
        "verification_info": json.dumps({"language": "python", "test_cases": SUM_TESTS}),
        "llm_response": f"{fence}python\n{source}\n{fence}",
        "response_id": name,
    }


@pytest.mark.parametrize("kind", BACKENDS)
def test_hostile_rollouts_do_not_disturb_the_run(kind: str, tmp_path: Path) -> None:
    reason = backend_skip_reason(kind)
    if reason:
        pytest.skip(reason)

    rows = []
    for index, (name, source) in enumerate(HOSTILE.items()):
        rows.append(row(name, source))
        rows.append(row(f"good-{index}", PROGRAMS["python"]["correct"]))
    out = verify(
        write_jsonl(tmp_path / "in.jsonl", rows),
        tmp_path / "out.jsonl",
        kind,
        "--workers",
        "2",
        "--time-limit",
        "1",
    )
    by_id = {row["problem_id"]: row for row in out}
    assert len(by_id) == len(rows)
    for name in HOSTILE:
        assert by_id[name]["error"] is None and by_id[name]["score"] == 0.0, (name, info(by_id[name]))
    for index in range(len(HOSTILE)):
        assert by_id[f"good-{index}"]["score"] == 1.0, info(by_id[f"good-{index}"])


@pytest.mark.parametrize("kind", BACKENDS)
def test_engine_deadline_kills_the_sandbox_with_the_worker(kind: str, tmp_path: Path) -> None:
    reason = backend_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    marker = f"genesys-deadline-check-{kind}-{tmp_path.name}"
    sleeper = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}])"
    rows = [row("sleeper", sleeper), row("good", PROGRAMS["python"]["correct"])]
    out = verify(
        write_jsonl(tmp_path / "in.jsonl", rows),
        tmp_path / "out.jsonl",
        kind,
        "--workers",
        "1",
        "--timeout",
        "4",
        "--time-limit",
        "30",
    )
    by_id = {row["problem_id"]: row for row in out}
    assert by_id["sleeper"]["score"] is None and by_id["sleeper"]["error"].startswith("timeout")
    assert by_id["good"]["score"] == 1.0
    assert wait_until(lambda: not host_processes_with(marker), 20), (
        "the sleeping program outlived its killed worker"
    )
    if kind == "docker":
        import docker

        from genesys.sandbox.docker_backend import LABEL, RUN_LABEL
        from genesys.sandbox.leases import RunLease

        def orphans() -> list:
            containers = docker.from_env().containers.list(all=True, filters={"label": LABEL})
            runs = [c.labels.get(RUN_LABEL, "") for c in containers]
            return [c for c, run in zip(containers, runs) if run and RunLease.holder_dead(run) is not False]

        assert wait_until(lambda: not orphans(), 20), "containers of the killed worker remain"
