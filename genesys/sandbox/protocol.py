"""The host side of the runner protocol: length-prefixed JSON frames over a byte stream."""

from __future__ import annotations

import abc
import json
import struct
import time
from typing import Any, NoReturn

import orjson

from genesys.sandbox.base import RunResult, SandboxError, Submission

# How long past a submission's own budget the host waits before declaring the sandbox stuck.
ANSWER_MARGIN_S = 10.0
# How long past a test's wall-clock limit the host waits for that test's reply. The runner kills a
# test at its limit and answers within milliseconds; one that stays silent this long while its
# sandbox still runs was stopped or wedged by the program (SIGSTOP, say), which fails the test.
STALL_MARGIN_S = 5.0
STARTUP_TIMEOUT_S = 30.0
# Bytes asked of the runner's stream per read. A larger request costs more than it saves: a 1 MiB
# read allocates (and gives back) a 1 MiB buffer for a frame of a few hundred bytes.
READ_CHUNK = 1 << 16
# Frames up to this size are read by orjson (several times faster than json on a report of a few
# hundred bytes); larger ones by json, which needs far less memory on a report holding megabytes.
ORJSON_FRAME_LIMIT = 1 << 16


class Transport(abc.ABC):
    """A byte stream to and from one runner process."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes to the runner's stdin."""

    @abc.abstractmethod
    def read(self, timeout: float) -> bytes:
        """Some bytes of the runner's stdout; b"" at end of stream; TimeoutError after `timeout` s."""

    @abc.abstractmethod
    def close(self, force: bool = False) -> None:
        """End the stream; the runner exits when its stdin closes (`force`: kill it, do not wait)."""

    def diagnostics(self) -> str:
        """What the runner wrote to stderr, for error messages."""
        return ""


class RunnerSession:
    """One live runner: sends submissions and collects the frames it answers with.

    After a protocol failure the session is `broken` and its owner must replace it (and, for a
    container, the container too).
    """

    def __init__(self, transport: Transport, startup_timeout: float = STARTUP_TIMEOUT_S) -> None:
        self.transport = transport
        self.broken = False
        self.served = 0
        self._buffer = bytearray()
        ready = self._frame(time.monotonic() + startup_timeout)
        if ready is None or ready.get("event") != "ready":
            why = ready or transport.diagnostics() or "no answer"
            self.close()
            raise SandboxError(f"the sandbox runner did not start: {why}")
        self.uid = ready.get("uid")

    def run(self, submission: Submission) -> RunResult:
        """Run one submission; a runner that dies mid-test is charged to the test that was running."""
        body = json.dumps(submission.to_job()).encode("utf-8")
        deadline = time.monotonic() + submission.budget_s + ANSWER_MARGIN_S
        try:
            self.transport.write(struct.pack(">I", len(body)) + body)
            result = self._collect(submission, deadline)
        except (OSError, TimeoutError) as exc:
            self.broken = True
            raise SandboxError(f"the sandbox stopped answering: {exc or type(exc).__name__}") from None
        except BaseException:
            self.broken = True  # the submission's frames are left half read: the stream is unusable
            raise
        self.served += 1
        return result

    def _collect(self, submission: Submission, deadline: float) -> RunResult:
        compiled = self._frame(deadline)
        if compiled is None:
            self.broken = True
            raise SandboxError(
                f"the sandbox runner exited during compilation: {self.transport.diagnostics() or 'no output'}"
            )
        if compiled.get("event") == "done":  # it could not even start this submission (its template is gone)
            self._failed(compiled)
        result = RunResult(
            compiled=bool(compiled.get("ok")),
            compile_message=compiled.get("message"),
            compile_time_s=float(compiled.get("time_s") or 0.0),
            checker_error=compiled.get("checker_error"),
        )
        n_tests = len(submission.tests)
        test_allowance = submission.limits.wall_seconds + STALL_MARGIN_S
        while True:
            pending = result.compiled and len(result.tests) < n_tests
            try:
                frame = self._frame(min(deadline, time.monotonic() + test_allowance) if pending else deadline)
            except TimeoutError:
                if not pending:
                    raise  # no program was running: the sandbox itself is stuck
                self.broken = True
                self._charge(
                    submission,
                    result,
                    "the sandbox's test runner stopped answering: the program stopped or wedged it",
                    "stopped",
                )
                return result
            if frame is None:  # the program killed its runner: charge the running test, skip the rest
                self.broken = True
                self._charge(submission, result, "the program killed the sandbox's test runner", "killed")
                return result
            if frame.get("event") == "done":
                if frame.get("error"):
                    self._failed(frame)
                return result
            self._keep(submission, result, frame)
            del frame  # a report can hold megabytes of stdout: not kept while the next one is read

    def _failed(self, done: dict[str, Any]) -> NoReturn:
        """The sandbox itself failed (the `done` frame says how): an error, never a score."""
        self.broken = True
        raise SandboxError(
            f"the sandbox failed during the submission: {done.get('error') or 'no reason given'}"
        )

    @staticmethod
    def _keep(submission: Submission, result: RunResult, report: dict[str, Any]) -> None:
        """Add one test's report to `result`, through the submission's `on_test` when it has one."""
        index = len(result.tests)
        result.tests.append(report if submission.on_test is None else submission.on_test(index, report))

    @classmethod
    def _charge(cls, submission: Submission, result: RunResult, message: str, what: str) -> None:
        """Fail the test that was running when the runner was lost, and mark the rest not run."""
        if not result.compiled:
            return
        n_tests = len(submission.tests)
        if len(result.tests) < n_tests:
            cls._keep(
                submission,
                result,
                {"status": "runtime_error", "message": message, "index": len(result.tests)},
            )
        while len(result.tests) < n_tests:
            cls._keep(
                submission,
                result,
                {
                    "status": "runtime_error",
                    "message": f"not run: an earlier test {what} the runner",
                    "index": len(result.tests),
                },
            )

    def _frame(self, deadline: float) -> dict[str, Any] | None:
        while True:
            if len(self._buffer) >= 4:
                size = struct.unpack(">I", self._buffer[:4])[0]
                if len(self._buffer) >= 4 + size:
                    body = self._buffer[4 : 4 + size]  # one copy: json reads a bytearray as it does bytes
                    del self._buffer[: 4 + size]
                    return decode_frame(body)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer before the deadline")
            chunk = self.transport.read(remaining)
            if not chunk:
                return None
            self._buffer += chunk

    def close(self) -> None:
        self.transport.close(force=self.broken)


def decode_frame(body: bytes | bytearray) -> Any:
    """A frame's JSON document. Its numbers are the runner's own (counts, codes, seconds: a
    program's values travel as text), so orjson reads a small frame as json would; what orjson
    refuses (NaN, lone surrogates escaped) json reads."""
    if len(body) <= ORJSON_FRAME_LIMIT:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body)
