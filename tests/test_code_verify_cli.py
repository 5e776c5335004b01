"""`genesys verify` on code rollouts through the real sandboxes: the sample rows score as they
should, and hostile rollouts in the same run do not disturb the scoring of the others."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import GENESYS, REPO, read_jsonl, write_jsonl
from test_sandbox_backends import PROGRAMS, SUM_TESTS, backend_skip_reason

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


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
def test_sample_code_rollouts(kind: str, tmp_path: Path) -> None:
    reason = backend_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    rows = [row for row in read_jsonl(SAMPLES) if row["problem_id"] in EXPECTED_SAMPLES]
    out = verify(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", kind)
    scores = {row["problem_id"]: row["score"] for row in out}
    assert scores == pytest.approx(EXPECTED_SAMPLES)
    assert all(row["error"] is None for row in out)
    slow = next(row for row in out if row["problem_id"] == "code-sum-js-slow")
    assert {test["status"] for test in info(slow)["tests"]} == {"time_limit"}


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
def test_hostile_rollouts_do_not_disturb_the_run(kind: str, tmp_path: Path) -> None:
    reason = backend_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    fence = "```"

    def row(name: str, source: str) -> dict:
        return {
            "problem_id": name,
            "task_type": "verifiable_code",
            "prompt": "add two numbers",
            "verification_info": json.dumps({"language": "python", "test_cases": SUM_TESTS}),
            "llm_response": f"{fence}python\n{source}\n{fence}",
            "response_id": name,
        }

    rows = []
    for index, (name, source) in enumerate(HOSTILE.items()):
        rows.append(row(name, source))
        rows.append(row(f"good-{index}", PROGRAMS["python"]["correct"]))
    out = verify(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", kind, "--workers", "2", "--time-limit", "1")
    by_id = {row["problem_id"]: row for row in out}
    assert len(by_id) == len(rows)
    for name in HOSTILE:
        assert by_id[name]["error"] is None and by_id[name]["score"] == 0.0, (name, info(by_id[name]))
    for index in range(len(HOSTILE)):
        assert by_id[f"good-{index}"]["score"] == 1.0, info(by_id[f"good-{index}"])
