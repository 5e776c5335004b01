"""A CPU-time budget for deciding one math answer.

Some answers are cheap to write and costly to decide (`\\gcd(p^{99999}, q^{99999})` repeated,
`(1+10^{-30})^{10^{30}}` against `e`): the parser or the comparison works for minutes. Such an
answer is the policy's doing, so it must score 0, not run into the engine's deadline and come back
as an error. The budget counts the CPU time of this process (`ITIMER_PROF`), not the wall clock,
so a busy machine does not turn a decidable answer into an undecided one: when the machine is too
busy for the verifier to spend its budget before the engine's deadline, that deadline still
records an error, which is what an infrastructure failure is.

The budget needs the main thread (Python runs signal handlers there only) and a free profiling
timer; elsewhere it is not armed and the caller's own deadline is the only one.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

# After the budget runs out the timer keeps firing at this interval (CPU seconds), so code that
# swallows the first interruption (a bare `except:` in a library) is interrupted again.
REPEAT_S = 0.25
_spending: list[float] = []  # the budget being spent (one at most), while one is


class DecisionTooCostly(BaseException):
    """The budget ran out. A BaseException, so the `except Exception` clauses of sympy and the
    LaTeX parser let it through."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"not decided within {seconds:g} CPU seconds")
        self.seconds = seconds


def _expired(signum: int, frame: FrameType | None) -> None:
    """The SIGPROF handler: interrupt the work, unless no budget is being spent or the timer fired
    inside this module (while a budget is being armed or disarmed)."""
    if _spending and (frame is None or frame.f_code.co_filename != __file__):
        raise DecisionTooCostly(_spending[0])


def can_arm() -> bool:
    """Whether a budget can be armed here: the main thread, no profiling timer already running and
    no other SIGPROF handler (a profiler's) installed."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
        and signal.getsignal(signal.SIGPROF) in (signal.SIG_DFL, _expired)
    )


class CpuBudget:
    """A context manager: DecisionTooCostly is raised in its body once the body has used `seconds`
    of CPU time (None: no budget). The handler stays installed afterwards; it does nothing while no
    budget is being spent, so a signal still pending at the end is harmless."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.armed = False

    def __enter__(self) -> CpuBudget:
        if self.seconds is not None and can_arm():
            signal.signal(signal.SIGPROF, _expired)
            _spending.append(self.seconds)
            signal.setitimer(signal.ITIMER_PROF, self.seconds, REPEAT_S)
            self.armed = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_PROF, 0)
            _spending.clear()
            self.armed = False
