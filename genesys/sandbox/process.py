"""Sandboxes whose runner is a local child process (bubblewrap, plain subprocess)."""

from __future__ import annotations

import abc
import hashlib
import json
import os
import select
import signal
import subprocess
import tempfile
from typing import Any

from genesys.sandbox.base import (
    DEFAULT_REUSE,
    RunResult,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    Submission,
)
from genesys.sandbox.leases import CpuLease, UidLease, lease_cpu
from genesys.sandbox.protocol import READ_CHUNK, RunnerSession, Transport

RUNNER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
# Unprivileged uids the runner drops to when genesys runs as root, one leased per live sandbox.
SANDBOX_UID_BASE = 62000
SANDBOX_UID_COUNT = 3000


def runner_digest() -> str:
    """A fingerprint of the in-sandbox runner; an image with another runner must be rebuilt."""
    with open(RUNNER_PATH, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:16]


class PipeTransport(Transport):
    """The stdin/stdout pipes of a local runner process."""

    def __init__(self, process: subprocess.Popen[bytes], stderr_file: Any) -> None:
        self.process = process
        self._stderr = stderr_file
        assert process.stdin is not None and process.stdout is not None
        self._in = process.stdin.fileno()
        self._out = process.stdout.fileno()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._in, view)
            view = view[written:]

    def read(self, timeout: float) -> bytes:
        if not select.select([self._out], [], [], timeout)[0]:
            raise TimeoutError(f"no answer within {timeout:.0f}s")
        return os.read(self._out, READ_CHUNK)

    def diagnostics(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode("utf-8", "replace").strip()

    def close(self, force: bool = False) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        if force:
            _kill_process_group(self.process.pid)
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            _kill_process_group(self.process.pid)
            self.process.wait()
        self._stderr.close()


def _kill_process_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


class LocalSandbox(Sandbox):
    """A sandbox whose runner is a child process; the runner is restarted when it misbehaves."""

    def __init__(self, toolchains: dict[str, dict[str, str]], reuse: int = DEFAULT_REUSE) -> None:
        self.toolchains = toolchains
        self.reuse = reuse
        self._session: RunnerSession | None = None
        self._uid_lease: UidLease | None = None
        self._uid: int | None = None
        self._cpu_lease: CpuLease | None = None
        self._lease_uid()

    def _lease_uid(self) -> None:
        """Run as root, hold a uid no other sandbox on this host has (see `leases`)."""
        if os.geteuid() == 0 and self._uid_lease is None:
            self._uid_lease = UidLease(SANDBOX_UID_BASE, SANDBOX_UID_COUNT)
            self._uid = self._uid_lease.uid

    def _lease_cpu(self) -> None:
        """Hold a CPU no other sandbox on this host holds, where one is free (see `_in_child`)."""
        if self._cpu_lease is None:
            try:
                self._cpu_lease = lease_cpu(os.sched_getaffinity(0))
            except SandboxUnavailable:  # no lease directory we can trust: a matter of speed only
                self._cpu_lease = None

    def _in_child(self) -> None:
        """Between fork and exec of the runner: pin it to the leased CPU, then `prepare_child`.

        A submission's processes run one at a time (runner, template, test, template, runner),
        each waking the next: on one CPU none waits for another CPU to wake, a forked test starts
        where its template's pages are in the cache, and sandboxes with CPUs of their own do not
        crowd one another. Without a free CPU the runner runs wherever the scheduler puts it."""
        if self._cpu_lease is not None:
            try:
                os.sched_setaffinity(0, {self._cpu_lease.cpu})
            except OSError:
                pass  # gone offline since: a matter of speed only
        self.prepare_child()

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The argv that starts a runner."""

    def runner_args(self, runner: str, scratch: str) -> list[str]:
        """The runner's own arguments, after the interpreter."""
        args = [runner, json.dumps(self.toolchains), scratch]
        return args + (["--uid", str(self._uid)] if self._uid is not None else [])

    def prepare_child(self) -> None:
        """Runs in the child between fork and exec (joins cgroups and the like)."""

    def session_finished(self) -> None:
        """Called after a runner process has exited."""

    def languages(self) -> list[str]:
        return sorted(self.toolchains)

    def _start(self) -> RunnerSession:
        stderr = tempfile.TemporaryFile()
        try:
            process = subprocess.Popen(
                self.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=self._in_child,  # noqa: PLW1509 - needs to run in the child
                env={"PATH": "/usr/bin:/bin"},
            )
        except OSError as exc:
            stderr.close()
            raise SandboxError(f"cannot start the {self.name} sandbox: {exc}") from None
        return RunnerSession(PipeTransport(process, stderr))

    def _ensure_session(self) -> RunnerSession:
        if self._session is None or self._session.broken or self._session.served >= self.reuse:
            self._stop()
            self._lease_uid()  # again when reused after `close()`
            self._lease_cpu()
            try:
                self._session = self._start()
            except SandboxError:
                self.session_finished()
                raise
        return self._session

    def run(self, submission: Submission) -> RunResult:
        session = self._ensure_session()
        try:
            return session.run(submission)
        finally:
            if session.broken:
                self._stop()

    def warm_up(self) -> None:
        self._ensure_session()

    def _stop(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()
            self.session_finished()

    def close(self) -> None:
        self._stop()
        if self._uid_lease is not None:
            self._uid_lease.release()
            self._uid_lease = None
        if self._cpu_lease is not None:
            self._cpu_lease.release()
            self._cpu_lease = None
