"""A submission's Python stdin/stdout tests run one after another in one process of the submission
(the resident test process): each test still starts as a fresh interpreter would, is charged only
its own CPU time and memory, and a program that changes its process so that this cannot hold, or
that fakes the end of a test, gets a fresh process for its next test and nothing else. The process
is the submission's: a later submission never finds it, nor anything left in it."""

from __future__ import annotations

import secrets
import textwrap
from collections.abc import Iterator

import pytest
from test_sandbox_backends import opened_sandbox

from genesys.sandbox.base import Sandbox, Submission
from genesys.sandbox.limits import Limits


@pytest.fixture(
    scope="module",
    params=[pytest.param(kind, marks=getattr(pytest.mark, kind)) for kind in ("docker", "bwrap")],
)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    yield from opened_sandbox(request.param)


def run_tests(sandbox: Sandbox, source: str, inputs: list[str], limits: Limits | None = None) -> list[dict]:
    """Every test's report of one Python submission with a stdin test per input."""
    tests = [{"type": "stdin_stdout", "input": text} for text in inputs]
    submission = Submission("python", textwrap.dedent(source).strip() + "\n", tests)
    if limits is not None:
        submission.limits = limits
    result = sandbox.run(submission)
    assert result.compiled, result
    return result.tests


def pids(reports: list[dict]) -> list[str]:
    """The pid each test printed first."""
    return [report["stdout"].split()[0] for report in reports]


# Changes everything a fresh interpreter would have otherwise, then prints what it found first.
STATE_CHANGER = """
import gc, os, sys
print(os.getpid(), sorted(os.listdir("/proc/self/fd")), sys.argv, sorted(os.environ), sys.path[-1], sys.getrecursionlimit(), gc.isenabled(),
      oct(os.umask(0o077)), sys.excepthook is sys.__excepthook__, os.getcwd(), sys.stdin.read().strip())
sys.argv.append("left")
os.environ["LEFT"] = "1"
sys.path.append("/left")
sys.setrecursionlimit(77)
gc.disable()
sys.excepthook = print
os.chdir("/")
kept = open(os.devnull)
"""


def test_later_tests_run_in_the_same_process_and_find_it_as_a_fresh_interpreter(sandbox: Sandbox) -> None:
    reports = run_tests(sandbox, STATE_CHANGER, ["first", "second", "third"])
    assert [report["status"] for report in reports] == ["ok"] * 3, reports
    assert len(set(pids(reports))) == 1, reports  # one process ran them all
    found = [report["stdout"].split(" ", 1)[1].rsplit(" ", 1)[0] for report in reports]
    assert found[0] == found[1] == found[2], found  # argv, environment, path, settings, cwd as at first
    assert [report["stdout"].split()[-1] for report in reports] == ["first", "second", "third"]


# Each of these changes what cannot be put back; the next test must run in a fresh process.
UNRESTORABLE = {
    "signal handler": "import signal\nsignal.signal(signal.SIGTERM, lambda *_: None)",
    "new module": "import fractions",
    "builtin": "import builtins\nbuiltins.input = lambda: 'stale'",
    "builtin equal to all": "import builtins\nclass Same:\n    __eq__ = lambda self, other: True\nbuiltins.input = Same()",
    "lowered rlimit": "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))",
    "trace hook": "import sys\nsys.settrace(lambda *_: None)",
    "timer": "import signal\nsignal.setitimer(signal.ITIMER_REAL, 30)",
    "blocked signal": "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGXCPU])",
    "cpu affinity": "import os\nos.sched_setaffinity(0, [min(os.sched_getaffinity(0))])",
    "lower priority": "import os\nos.nice(5)",
}


@pytest.mark.parametrize("change", sorted(UNRESTORABLE))
def test_a_test_that_changes_what_cannot_be_put_back_leaves_the_next_a_fresh_process(
    sandbox: Sandbox, change: str
) -> None:
    source = "import os, resource, builtins\nprint(os.getpid(), resource.getrlimit(resource.RLIMIT_NOFILE), builtins.input.__name__)\n"
    if change == "cpu affinity":
        cpus = run_tests(sandbox, "import os\nprint(len(os.sched_getaffinity(0)))", [""])[0]["stdout"]
        if cpus.strip() == "1":
            pytest.skip("this sandbox runs its programs on one CPU: no affinity to narrow")
    reports = run_tests(sandbox, source + UNRESTORABLE[change], ["", ""])
    assert [report["status"] for report in reports] == ["ok", "ok"], reports
    assert reports[0]["stdout"].split()[1:] == reports[1]["stdout"].split()[1:], reports  # as it first was
    assert pids(reports)[0] != pids(reports)[1], reports


# What correct programs do to their streams and interpreter (fast-I/O idioms among them): every
# later test must still pass, whether the process can serve it or a fresh one does.
REBOUND = {
    "stdout rewrapped": "sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding='utf-8')",
    "stdout detached": "sys.stdout = io.TextIOWrapper(sys.stdout.detach(), encoding='utf-8')",
    "stdout reopened": "sys.stdout = open(1, 'w')",
    "stdin and stdout reopened": "sys.stdin = open(0)\nsys.stdout = open(1, 'w')",
    "stdin detached": "sys.stdin = io.TextIOWrapper(sys.stdin.detach(), encoding='utf-8')",
    "stderr rewrapped": "sys.stderr = io.TextIOWrapper(sys.stderr.buffer, encoding='utf-8')",
    "module path unusable": "sys.path = None",
}


@pytest.mark.parametrize("change", sorted(REBOUND))
def test_a_correct_program_that_rebinds_its_streams_passes_every_test(sandbox: Sandbox, change: str) -> None:
    source = f"import io, sys\n{REBOUND[change]}\nprint(sys.stdin.read().strip())\n"
    reports = run_tests(sandbox, source, ["first", "second", "third"])
    assert [(report["status"], report["stdout"]) for report in reports] == [
        ("ok", "first\n"),
        ("ok", "second\n"),
        ("ok", "third\n"),
    ], reports


def test_a_test_that_leaves_many_objects_leaves_the_next_a_fresh_process(sandbox: Sandbox) -> None:
    # Freeing 300,000 objects one by one would be charged to the test (a forked test's memory
    # the kernel drops at once): the process ends with such a test instead.
    source = """
    import os, sys
    size = int(sys.stdin.read())
    kept = list(map(str, range(size)))
    print(os.getpid(), len(kept))
    """
    reports = run_tests(sandbox, source, ["10", "300000", "10", "10"])
    assert [report["status"] for report in reports] == ["ok"] * 4, reports
    first, big, after, last = pids(reports)
    assert first == big and after == last and big != after, reports


def test_garbage_a_test_leaves_is_collected_before_the_next_test_starts(sandbox: Sandbox) -> None:
    # A cycle only the garbage collector frees, with a finalizer that prints: freed after its own
    # test (into nothing), it never runs inside a later one, as with a fresh process per test.
    source = """
    import os, sys
    class Loud:
        def __del__(self):
            print("late")
    loud = Loud()
    loud.me = loud
    print(os.getpid(), sys.stdin.read().strip())
    junk = [[] for _ in range(50000)]  # (in a later test: allocations that start collections)
    """
    reports = run_tests(sandbox, source, ["first", "second", "third"])
    assert [report["status"] for report in reports] == ["ok"] * 3, reports
    assert [report["stdout"].split()[1:] for report in reports] == [["first"], ["second"], ["third"]], reports
    assert len(set(pids(reports))) == 1, reports  # and the process still served them all


def test_a_process_holding_much_memory_after_a_test_serves_no_other(sandbox: Sandbox) -> None:
    # Kept where no check in the process looks (an attribute of a module it had): the runner's look
    # from outside, at what the process holds (over a quarter of the 512 MB limit), ends it.
    source = """
    import collections, os, sys
    if sys.stdin.read() == "hold":
        collections.held = bytearray(160 << 20)
        collections.held[:: 4096] = b"x" * len(collections.held[:: 4096])
    print(os.getpid(), getattr(collections, "held", None) is not None)
    """
    reports = run_tests(sandbox, source, ["hold", "", ""])
    assert [report["status"] for report in reports] == ["ok"] * 3, reports
    # What the first test held is gone: the second ran in a fresh process (whose pid may be the
    # same number: killing what a test left starts a fresh pid namespace).
    assert [report["stdout"].split()[1] for report in reports] == ["True", "False", "False"], reports


def test_a_thread_left_running_never_writes_into_the_next_test(sandbox: Sandbox) -> None:
    source = """
    import os, sys, threading, time
    def late():
        time.sleep(1.0)
        print("late from", os.getpid(), flush=True)
    threading.Thread(target=late, daemon=True).start()
    data = sys.stdin.read()
    print(os.getpid(), data)
    if data == "wait":  # long enough for the thread of a reused process to write here
        time.sleep(2.5)
    """
    reports = run_tests(sandbox, source, ["a", "wait", "c"])
    assert all(report["stdout"].count("late") <= 1 for report in reports), reports  # its own thread's only
    assert len(set(pids(reports))) == 3, reports  # a process with a thread left serves no other test


def test_a_child_left_running_is_killed_and_never_writes_into_the_next_test(sandbox: Sandbox) -> None:
    source = """
    import os, sys, time
    if os.fork() == 0:
        time.sleep(1.0)
        print("late child", flush=True)
        os._exit(0)
    print(os.getpid(), sys.stdin.read())
    """
    reports = run_tests(sandbox, source, ["a", "b"])
    assert all("late" not in report["stdout"] for report in reports), reports
    assert [report["status"] for report in reports] == ["ok", "ok"], reports


def test_each_test_is_charged_its_own_cpu_time_not_the_process_total(sandbox: Sandbox) -> None:
    # 0.6 s of CPU a test under a 1 s limit: four tests in one process use 2.4 s together.
    source = """
    import os, time
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
    print(os.getpid())
    """
    reports = run_tests(sandbox, source, ["", "", "", ""], Limits(time_limit=1.0, wall_limit=20.0))
    assert [report["status"] for report in reports] == ["ok"] * 4, reports
    assert len(set(pids(reports))) == 1, reports
    assert all(0.5 <= report["time_s"] < 1.0 for report in reports), reports


def test_a_test_past_its_time_limit_is_a_time_limit_in_a_reused_process_too(sandbox: Sandbox) -> None:
    source = """
    import sys
    if sys.stdin.read() == "spin":
        while True:
            pass
    print("done")
    """
    reports = run_tests(sandbox, source, ["quick", "spin", "quick"], Limits(time_limit=1.0, wall_limit=20.0))
    assert [report["status"] for report in reports] == ["ok", "time_limit", "ok"], reports
    assert reports[1]["time_s"] >= 1.0, reports


def test_each_test_reports_its_own_peak_memory(sandbox: Sandbox) -> None:
    source = """
    import os, sys
    if sys.stdin.read() == "big":
        block = bytearray(96 << 20)
        block[:: 4096] = b"x" * len(block[:: 4096])
        del block
    print(os.getpid())
    """
    reports = run_tests(sandbox, source, ["big", "small", "small"])
    assert [report["status"] for report in reports] == ["ok"] * 3, reports
    assert reports[0]["memory_kb"] > 96 << 10, reports
    assert all(report["memory_kb"] < 64 << 10 for report in reports[1:]), reports


def test_work_done_after_faking_the_end_of_a_test_is_charged(sandbox: Sandbox) -> None:
    # The program says its test ended (on the process's channel to the template) and stops itself, as
    # the process does between tests; woken for the next test, it spins in its own code instead.
    source = """
    import os, signal, time
    print(os.getpid())
    try:
        os.write(255, (0).to_bytes(4, "little"))
        os.kill(os.getpid(), signal.SIGSTOP)
    except OSError:
        pass
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass
    """
    reports = run_tests(sandbox, source, ["", "", ""], Limits(time_limit=2.0, wall_limit=20.0))
    assert max(report["time_s"] for report in reports) >= 0.95, reports  # the spin, in the test it ran in


def test_a_program_closing_its_streams_and_channel_only_ends_its_own_process(sandbox: Sandbox) -> None:
    source = """
    import os, sys
    data = sys.stdin.read()
    print(os.getpid(), data, flush=True)
    os.closerange(0, 1024)
    """
    reports = run_tests(sandbox, source, ["a", "b", "c"])
    assert [report["stdout"].split()[1] for report in reports] == ["a", "b", "c"], reports
    assert [report["status"] for report in reports] == ["ok"] * 3, reports


def test_nothing_left_in_the_process_reaches_the_next_submission(sandbox: Sandbox) -> None:
    secret = secrets.token_hex(8)
    leaver = f"""
    import builtins, os
    builtins.left_over = {secret!r}
    print(os.getpid())
    """
    finder = """
    import builtins, os
    print(os.getpid(), getattr(builtins, "left_over", None))
    """
    run_tests(sandbox, leaver, ["", ""])
    found = run_tests(sandbox, finder, ["", ""])
    assert [report["stdout"].split()[1] for report in found] == ["None", "None"], found
