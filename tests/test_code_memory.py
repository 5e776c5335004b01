"""Host memory while judging code: each test's output is judged as its reply arrives and dropped,
so a rollout's footprint is bounded by one test's output, not by the number of tests."""

from __future__ import annotations

import json
import struct
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from test_sandbox_backends import backend_skip_reason

from genesys.sandbox.base import Submission
from genesys.sandbox.protocol import RunnerSession, Transport
from genesys.schema import Rollout
from genesys.verifiers.code import CodeVerifier

MIB = 1 << 20
TESTS = 40
LINES = 8128  # 8128 lines of 1 KiB: 64 KiB under the default 8 MiB output limit
PROGRAM = 'import sys\nsys.stdout.write(("x" * 1023 + "\\n") * 8128)'
PEAK_LIMIT = 100 * MIB  # four tests' output; keeping every test's stdout would take over 300 MiB


def frame(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload).encode("utf-8")
    return struct.pack(">I", len(body)) + body


class FakeTransport(Transport):
    """Answers like a runner, making each frame only when the host reads it."""

    def __init__(self, frames: Iterator[bytes]) -> None:
        self.frames = frames

    def write(self, data: bytes) -> None:
        pass

    def read(self, timeout: float) -> bytes:
        return next(self.frames, b"")

    def close(self, force: bool = False) -> None:
        pass


def runner_frames(tests: int, stdout_bytes: int, finish: bool = True) -> Iterator[bytes]:
    yield frame({"event": "ready", "uid": 1000})
    yield frame({"event": "compiled", "ok": True, "time_s": 0.0})
    for index in range(tests):
        yield frame(
            {
                "event": "test",
                "index": index,
                "status": "ok",
                "stdout": str(index % 10) * stdout_bytes,
                "time_s": 0.01,
            }
        )
    if finish:
        yield frame({"event": "done"})


def test_session_applies_on_test_per_frame_and_keeps_only_its_result() -> None:
    seen: list[tuple[int, int]] = []

    def on_test(index: int, report: dict[str, Any]) -> dict[str, Any]:
        seen.append((index, len(report.get("stdout", ""))))
        return {"status": "passed" if report["stdout"].startswith(str(index % 10)) else "wrong_answer"}

    session = RunnerSession(FakeTransport(runner_frames(TESTS, 4 * MIB)))
    submission = Submission("python", "", [{"type": "stdin_stdout", "input": ""}] * TESTS, on_test=on_test)
    tracemalloc.start()
    try:
        result = session.run(submission)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == [(index, 4 * MIB) for index in range(TESTS)]
    assert result.tests == [{"status": "passed"}] * TESTS
    assert peak < PEAK_LIMIT, f"peak {peak / MIB:.0f} MiB"  # 40 x 4 MiB kept would be 160 MiB
    assert "on_test" not in submission.to_job()


def test_session_charges_a_lost_runner_through_on_test() -> None:
    def on_test(index: int, report: dict[str, Any]) -> dict[str, Any]:
        return {"index": index, "status": report["status"], "message": report.get("message")}

    session = RunnerSession(FakeTransport(runner_frames(2, 10, finish=False)))
    result = session.run(
        Submission("python", "", [{"type": "stdin_stdout", "input": ""}] * 4, on_test=on_test)
    )
    assert session.broken
    assert result.tests == [
        {"index": 0, "status": "ok", "message": None},
        {"index": 1, "status": "ok", "message": None},
        {"index": 2, "status": "runtime_error", "message": "the program killed the sandbox's test runner"},
        {"index": 3, "status": "runtime_error", "message": "not run: an earlier test killed the runner"},
    ]


def test_session_without_on_test_keeps_the_runner_frames() -> None:
    session = RunnerSession(FakeTransport(runner_frames(2, 3)))
    result = session.run(Submission("python", "", [{"type": "stdin_stdout", "input": ""}] * 2))
    assert [test["stdout"] for test in result.tests] == ["000", "111"]


@pytest.fixture(scope="module")
def verifier() -> Iterator[CodeVerifier]:
    reason = backend_skip_reason("bwrap")
    if reason:
        pytest.skip(reason)
    instance = CodeVerifier({"sandbox": "bwrap"})
    instance.setup()
    yield instance
    instance.teardown()


@pytest.mark.bwrap
def test_big_outputs_are_judged_without_keeping_them(verifier: CodeVerifier) -> None:
    expected = ("x" * 1023 + "\n") * LINES  # one string shared by every test case
    different = expected[:-2] + "y\n"
    cases = [{"type": "stdin_stdout", "input": "", "output": expected} for _ in range(TESTS - 1)]
    cases.append({"type": "stdin_stdout", "input": "", "output": different})
    rollout = Rollout(
        task_type="verifiable_code",
        verification_info={"language": "python", "test_cases": cases},
        completion=f"```python\n{PROGRAM}\n```\n",
    )
    tracemalloc.start()
    try:
        verdict = verifier.verify(rollout)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert verdict.error is None, verdict.error
    statuses = [test["status"] for test in verdict.details["tests"]]
    assert statuses == ["passed"] * (TESTS - 1) + ["wrong_answer"], verdict.details
    assert verdict.details["tests"][-1]["message"].startswith(f"line {LINES}: expected"), verdict.details[
        "tests"
    ][-1]
    assert (verdict.details["passed"], verdict.details["total"], verdict.details["status"]) == (
        TESTS - 1,
        TESTS,
        "wrong_answer",
    )
    assert verdict.score == pytest.approx((TESTS - 1) / TESTS)
    assert peak < PEAK_LIMIT, f"verifying {TESTS} tests of 8 MiB peaked at {peak / MIB:.0f} MiB"
