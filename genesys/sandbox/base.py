"""The sandbox interface every backend implements, and what goes in and out of it."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from genesys.sandbox.limits import CHECKER_LIMITS, COMPILE_LIMITS, Limits

LANGUAGES = ("python", "cpp", "rust", "javascript")
# Submissions one runner process serves before a fresh one takes over (1: a runner per submission).
# It changes no guarantee, only speed: every submission runs in namespaces of its own whatever it is
# (see the runner), and a fresh runner (bubblewrap's binds, an interpreter start: about 100 ms of
# CPU, the cost of some 40 Python tests) buys nothing, so it comes rarely.
DEFAULT_REUSE = 1000
# The runner's arguments in a real sandbox: every submission in namespaces made for it (see `runner`).
SANDBOXED_RUNNER_ARGS = ["--sandboxed"]
# The runner's interpreter only (tests and compiled programs get the runner's own fixed environment):
# every symbol bound at start, so a forked test does not bind its own on first call, writing (and
# copying) the template's pages of binding tables.
RUNNER_ENV = {"LD_BIND_NOW": "1"}
# The capabilities a sandbox gives the runner where it runs as root (with the programs' uid apart):
# fresh namespaces and mounts per submission (and a return to the sandbox's own mount namespace
# before each), tests that drop to the programs' uid, and killing
# what a test left, and emptying the bounding set. The runner and its template keep these only, and
# every test drops them with its uid.
RUNNER_CAPABILITIES = (
    "CAP_SYS_ADMIN",
    "CAP_SYS_CHROOT",
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_KILL",
    "CAP_SETPCAP",
)
# Where programs keep the runner's uid (a non-root sandbox): no dropping to another uid.
SAME_UID_CAPABILITIES = ("CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_SETPCAP")


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program in it): the verdict is an error, not a score."""


class SandboxUnavailable(SandboxError):
    """A backend that cannot run on this machine; the message says why and what to do."""


@dataclass
class Submission:
    """One program and the inputs of its tests. Expected outputs stay on the host.

    `tests` holds dicts `{"type": "stdin_stdout", "input": str}`,
    `{"type": "function_call", "fn_name": str, "input": [args]}`, `{"type": "assert", "code": str}`
    or `{"type": "pytest", "code": str, "name": str}`. With a `checker` ({"language", "source"}),
    stdin_stdout tests carry their `output` too: the checker judges in the sandbox, under
    `checker_limits`, once the program's run has ended. `budget_s` bounds compile plus all tests
    together; tests left when it runs out are reported as `time_limit`.
    `on_test(index, report)`, when set, turns each test's report into what `RunResult.tests` keeps,
    as the report arrives (a verdict instead of the whole stdout); it stays on the host.
    """

    language: str
    source: str
    tests: list[dict[str, Any]]
    limits: Limits = field(default_factory=Limits)
    compile_limits: Limits = COMPILE_LIMITS
    budget_s: float = 60.0
    checker: dict[str, str] | None = None
    checker_limits: Limits = CHECKER_LIMITS
    on_test: Callable[[int, dict[str, Any]], dict[str, Any]] | None = field(
        default=None, repr=False, compare=False
    )

    def to_job(self) -> dict[str, Any]:
        """The request frame the in-sandbox runner reads."""
        job = {
            "language": self.language,
            "source": self.source,
            "tests": self.tests,
            "limits": self.limits.to_runner(),
            "compile_limits": self.compile_limits.to_runner(),
            "budget_s": self.budget_s,
        }
        if self.checker is not None:
            job["checker"] = {**self.checker, "limits": self.checker_limits.to_runner()}
        return job


@dataclass
class RunResult:
    """What the runner reported: the compile step, then one dict per test in order.

    Each test dict is the runner's report, or what the submission's `on_test` made of it. A report
    has `status` (ok, time_limit, memory_limit, runtime_error, output_limit), `stdout`, `stderr`
    (tail), `exit_code`, `signal`, `time_s` (CPU), `wall_s`, `memory_kb`, for function_call
    tests `result` (the return value as JSON text), for assert and pytest tests `message` (why
    one failed: its status is the judge's verdict, ok when it passed), and for tests a checker
    judged `checker` (its `status`, `exit_code`, `message`). `checker_error`: the task's checker
    could not be built (then nothing ran and `compiled` is false).
    """

    compiled: bool
    checker_error: str | None = None
    compile_message: str | None = None
    compile_time_s: float = 0.0
    tests: list[dict[str, Any]] = field(default_factory=list)


class Sandbox(abc.ABC):
    """Runs submissions in isolation. Use as a context manager or call `close()`."""

    name: str = ""

    @abc.abstractmethod
    def run(self, submission: Submission) -> RunResult:
        """Compile and run every test of `submission`; raises SandboxError when the sandbox fails."""

    @abc.abstractmethod
    def languages(self) -> list[str]:
        """The languages this sandbox can run."""

    def notes(self) -> list[str]:
        """What makes this sandbox weaker or slower here than where it is at its best."""
        return []

    def warm_up(self) -> None:  # noqa: B027 - optional hook
        """Start what the first submission would otherwise wait for."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release containers and processes."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
