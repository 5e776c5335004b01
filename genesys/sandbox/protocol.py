"""The host side of the runner protocol: length-prefixed JSON frames over a byte stream."""

from __future__ import annotations

import abc
import json
import struct
import time
from typing import Any

from genesys.sandbox.base import RunResult, SandboxError, Submission

# How long past a submission's own budget the host waits before declaring the sandbox stuck.
ANSWER_MARGIN_S = 10.0
STARTUP_TIMEOUT_S = 30.0


class Transport(abc.ABC):
    """A byte stream to and from one runner process."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes to the runner's stdin."""

    @abc.abstractmethod
    def read(self, timeout: float) -> bytes:
        """Some bytes of the runner's stdout; b"" at end of stream; TimeoutError after `timeout` s."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the stream; the runner exits when its stdin closes."""

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
        self.served += 1
        return result

    def _collect(self, submission: Submission, deadline: float) -> RunResult:
        compiled = self._frame(deadline)
        if compiled is None:
            self.broken = True
            raise SandboxError(f"the sandbox runner exited during compilation: {self.transport.diagnostics() or 'no output'}")
        result = RunResult(
            compiled=bool(compiled.get("ok")),
            compile_message=compiled.get("message"),
            compile_time_s=float(compiled.get("time_s") or 0.0),
        )
        while True:
            frame = self._frame(deadline)
            if frame is None:  # the program killed its runner: charge the running test, skip the rest
                self.broken = True
                self._charge_crash(result, len(submission.tests))
                return result
            if frame.get("event") == "done":
                return result
            result.tests.append(frame)

    @staticmethod
    def _charge_crash(result: RunResult, n_tests: int) -> None:
        if not result.compiled:
            return
        crash = {"status": "runtime_error", "message": "the program killed the sandbox's test runner"}
        if len(result.tests) < n_tests:
            result.tests.append({**crash, "index": len(result.tests)})
        while len(result.tests) < n_tests:
            result.tests.append({"status": "runtime_error", "message": "not run: an earlier test killed the runner", "index": len(result.tests)})

    def _frame(self, deadline: float) -> dict[str, Any] | None:
        while True:
            if len(self._buffer) >= 4:
                size = struct.unpack(">I", self._buffer[:4])[0]
                if len(self._buffer) >= 4 + size:
                    body = bytes(self._buffer[4 : 4 + size])
                    del self._buffer[: 4 + size]
                    return json.loads(body)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer before the deadline")
            chunk = self.transport.read(remaining)
            if not chunk:
                return None
            self._buffer += chunk

    def close(self) -> None:
        self.transport.close()
