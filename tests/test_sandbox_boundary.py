"""Hostile pairs on one worker: a correct program A that also publishes its answer through some state
the sandbox keeps, then a wrong program B that only reads that state. Every submission must start
afresh, so B fails; and no program can change how later ones are run or what their tests cost."""

from __future__ import annotations

import random
import secrets
import textwrap
from collections.abc import Iterator

import pytest
from test_sandbox_backends import PROGRAMS, SUM_TESTS, backend_skip_reason, code_rollout

from genesys.sandbox.base import Submission
from genesys.schema import Verdict
from genesys.verifiers.code import CodeVerifier

BACKENDS = [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bwrap", marks=pytest.mark.bwrap)]
# Every directory a program can write to, or own: where A publishes and B looks.
WRITABLE_DIRS = '("/tmp", "/tmp/genesys", "/tmp/genesys/work", "/dev/shm", "/dev/mqueue", os.getcwd(), os.path.expanduser("~"))'
# Every process a program can see but its own: its parent (the submission's init, or a test's
# process that forked it) first.
OTHER_PIDS = """
def other_pids():
    pids = [os.getppid()] + sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return [pid for pid in dict.fromkeys(pids) if pid not in (0, os.getpid())]
"""


@pytest.fixture(params=BACKENDS)
def verifier(request: pytest.FixtureRequest) -> Iterator[CodeVerifier]:
    """A fresh worker with the default settings (limits, runner reuse)."""
    reason = backend_skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    instance = CodeVerifier({"sandbox": request.param})
    instance.setup()
    yield instance
    instance.teardown()


def verify(verifier: CodeVerifier, source: str, tests: list[dict]) -> Verdict:
    """The verdict on a Python program, which the sandbox scored (no sandbox error)."""
    verdict = verifier.verify(code_rollout("python", textwrap.dedent(source).strip(), tests))
    assert verdict.error is None, verdict.error
    return verdict


def output_task(expected: str) -> list[dict]:
    """One test whose expected output B cannot compute: the input is a nonce, the answer is in A only."""
    return [{"type": "stdin_stdout", "input": secrets.token_hex(8), "output": expected}]


def assert_b_cannot_copy_a(verifier: CodeVerifier, a: str, b: str, tests: list[dict]) -> None:
    """B fails alone, A passes, and B still fails right after A on the same worker."""
    alone = verify(verifier, b, tests)
    assert alone.score == 0.0, ("B alone", alone.details)
    first = verify(verifier, a, tests)
    assert first.score == 1.0, ("A", first.details)
    second = verify(verifier, b, tests)
    assert second.score == 0.0, ("B after A", second.details)


# --- 1. scratch directories that survive the wipe ---------------------------------------------------


def test_an_extended_attribute_on_a_scratch_directory_does_not_reach_the_next_submission(
    verifier: CodeVerifier,
) -> None:
    answer = secrets.token_hex(16)
    a = f"""
    import os
    answer = {answer!r}
    print(answer)
    for directory in {WRITABLE_DIRS}:
        try:
            os.setxattr(directory, "user.x", answer.encode())
        except OSError:
            pass
    """
    b = f"""
    import os
    found = "nothing"
    for directory in {WRITABLE_DIRS}:
        try:
            found = os.getxattr(directory, "user.x").decode()
        except OSError:
            pass
    print(found)
    """
    assert_b_cannot_copy_a(verifier, a, b, output_task(answer))


def test_a_scratch_directory_s_mtime_does_not_reach_the_next_submission(verifier: CodeVerifier) -> None:
    answer = random.randrange(100_000, 1_000_000)
    a = f"""
    import os
    answer = {answer}
    print(answer)
    for directory in {WRITABLE_DIRS}:
        try:
            os.utime(directory, (1_000_000_000 + answer,) * 2)
        except OSError:
            pass
    """
    b = f"""
    import os
    found = "nothing"
    for directory in {WRITABLE_DIRS}:
        try:
            mtime = int(os.stat(directory).st_mtime)
        except OSError:
            continue
        if 1_000_000_000 <= mtime < 1_001_000_000:
            found = mtime - 1_000_000_000
    print(found)
    """
    assert_b_cannot_copy_a(verifier, a, b, output_task(str(answer)))


# --- 2. the processes that run tests, within the programs' reach ------------------------------------

# What a test starts with that an earlier program could have changed in the processes around it:
# every rlimit, its niceness, scheduling policy and CPUs. The same before and after any program.
STATE_PROBE = """
import os, resource
names = sorted(name for name in dir(resource) if name.startswith("RLIMIT_"))
print(*("%s=%s" % (name, resource.getrlimit(getattr(resource, name))) for name in names))
print("nice", os.getpriority(os.PRIO_PROCESS, 0), "policy", os.sched_getscheduler(0), "cpus", sorted(os.sched_getaffinity(0)))
"""

POISONS = {
    "data limit": "resource.prlimit(pid, resource.RLIMIT_DATA, (4 << 20, 4 << 20))",
    "address space limit": "resource.prlimit(pid, resource.RLIMIT_AS, (48 << 20, 48 << 20))",
    # Spares the parent (where a non-root sandbox leaves it in reach): the runner alone is left short.
    "runner address space limit": "pid == os.getppid() or resource.prlimit(pid, resource.RLIMIT_AS, (24 << 20, 24 << 20))",
    "soft memory limits": "[resource.prlimit(pid, kind, (4 << 20, resource.prlimit(pid, kind)[1])) for kind in (resource.RLIMIT_DATA, resource.RLIMIT_AS)]",
    "niceness": "os.setpriority(os.PRIO_PROCESS, pid, 19)",
    "affinity": "os.sched_setaffinity(pid, {min(os.sched_getaffinity(0))})",
    "scheduler": "os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))",
}

# Right answers that later come to the same worker: the sum task; the sum task solved in some 40 MB,
# well within the default 512; the sum of 2 million ones (4 MB of input for the runner to pass on).
LATER = [
    (PROGRAMS["python"]["correct"], SUM_TESTS),
    ("a, b = map(int, input().split())\nvalues = list(range(1 << 20))\nprint(a + b + values[0])", SUM_TESTS),
    (
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))",
        [{"type": "stdin_stdout", "input": "1 " * 2_000_000, "output": "2000000"}],
    ),
]
# Solves the sum task, after poisoning every process it can reach.
POISONER = """
for pid in other_pids():
    try:
        {poison}
    except OSError:
        pass
a, b = map(int, input().split())
print(a + b)
"""


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_program_cannot_change_how_later_programs_run(verifier: CodeVerifier, poison: str) -> None:
    probe = Submission("python", STATE_PROBE, [{"type": "stdin_stdout", "input": ""}], limits=verifier.limits)
    pristine = verifier.sandbox.run(probe).tests[0]
    assert pristine["status"] == "ok", pristine
    poisoner = "import os, resource\n" + OTHER_PIDS + POISONER.format(poison=POISONS[poison])
    verify(verifier, poisoner, SUM_TESTS)  # its own score does not matter
    for source, tests in LATER:
        later = verify(verifier, source, tests)
        assert later.score == 1.0, (source, later.details)
    after = verify(
        verifier, STATE_PROBE, [{"type": "stdin_stdout", "input": "", "output": pristine["stdout"]}]
    )
    assert after.score == 1.0, (pristine["stdout"], after.details)


# Soft limits nothing uses (POSIX message queue bytes, real-time CPU): A writes its answer into
# those of every process it reaches, B reads them from its own and from every process it sees.
RLIMIT_PUBLISHER = """
answer = {answer}
print(answer)
for pid in other_pids():
    for kind in (resource.RLIMIT_MSGQUEUE, resource.RLIMIT_RTTIME):
        try:
            resource.prlimit(pid, kind, (700_000 + answer, resource.prlimit(pid, kind)[1]))
        except OSError:
            pass
"""
RLIMIT_READER = """
found = "nothing"
for pid in [0] + other_pids():
    for kind in (resource.RLIMIT_MSGQUEUE, resource.RLIMIT_RTTIME):
        try:
            soft = resource.prlimit(pid, kind)[0]
        except OSError:
            continue
        if 700_000 <= soft < 800_000:
            found = soft - 700_000
print(found)
"""


def test_the_rlimits_of_the_runner_s_processes_carry_nothing_to_the_next_submission(
    verifier: CodeVerifier,
) -> None:
    answer = random.randrange(10_000, 100_000)
    prelude = "import os, resource\n" + OTHER_PIDS
    a, b = prelude + RLIMIT_PUBLISHER.format(answer=answer), prelude + RLIMIT_READER
    assert_b_cannot_copy_a(verifier, a, b, output_task(str(answer)))


# The warm process every test is forked from must never have held a submission's program: A's
# code, with its constants (here a mark of its own; a right answer, in a sibling), would be in the
# memory B's process inherits, live or freed, for B to find (or to run).
MARKED = """
mark = "sibling-{mark}" * 20
a, b = map(int, input().split())
print(a + b)
"""
MEMORY_SEARCH = """
import ctypes, re
found = set()
for line in open("/proc/self/maps"):
    span, perms = line.split()[:2]
    if perms.startswith("rw"):
        start, end = (int(part, 16) for part in span.split("-"))
        found.update(re.findall(rb"sibling-[0-9a-f]{16}", ctypes.string_at(start, end - start)))
print(sorted(mark.decode() for mark in found) or "nothing")
"""


def test_no_test_inherits_an_earlier_submission_s_program(verifier: CodeVerifier) -> None:
    mark = secrets.token_hex(8)
    assert verify(verifier, MARKED.format(mark=mark), SUM_TESTS).score == 1.0
    for _ in range(2):  # the next submission's tests, the first of them and a later one
        searched = verify(
            verifier, MEMORY_SEARCH, [{"type": "stdin_stdout", "input": "", "output": "nothing"}] * 2
        )
        assert searched.score == 1.0, searched.details


# A test's stdin is a file it may write (and extend), and a process it leaves may go on writing it
# until the test's end: the next test of the submission, and the next submission, read their own.
STDIN_SCRIBBLER = """
import os, sys
print(sys.stdin.read().strip())
sys.stdout.flush()
os.lseek(0, 0, os.SEEK_SET)
os.write(0, b"scribbled " * 10000)
if os.fork() == 0:
    while True:
        os.pwrite(0, b"scribbled ", 0)
"""


def test_what_a_test_writes_to_its_stdin_reaches_no_later_test(verifier: CodeVerifier) -> None:
    inputs = [secrets.token_hex(8) for _ in range(3)]
    tests = [{"type": "stdin_stdout", "input": value + "\n", "output": value + "\n"} for value in inputs]
    scribbled = verify(verifier, STDIN_SCRIBBLER, tests)
    assert scribbled.score == 1.0, scribbled.details  # each test read its own input, whole
    echo = verify(verifier, "import sys\nprint(sys.stdin.read().strip())", tests)
    assert echo.score == 1.0, echo.details


# --- 3. the pid counter -----------------------------------------------------------------------------


def test_the_pid_counter_carries_nothing_to_the_next_submission(verifier: CodeVerifier) -> None:
    answer = random.randrange(500, 1000)  # far from the pids of a fresh pid namespace
    a = f"""
    import os
    answer = {answer}
    print(answer, flush=True)
    for _ in range(3000):  # until the next pid handed out ends in the answer
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        if (pid + 1) % 1000 == answer:
            break
    """
    b = """
    import os
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    print((pid - 1) % 1000)
    """
    assert_b_cannot_copy_a(verifier, a, b, output_task(str(answer)))


# --- 4. CPU time counts every process of a test -----------------------------------------------------

# Three children burn 0.8 CPU-s each: 2.4 in all, past the default 2 s, each well within it. One
# core does it in half the default wall limit (5 s), so a loaded machine or docker's single CPU
# still lets them finish.
BURNERS = """
import os, time
done_r, done_w = os.pipe()
for _ in range(3):
    if os.fork() == 0:
        os.close(done_r)
        while time.process_time() < 0.8:
            pass
        os._exit(0)
os.close(done_w)
{wait}
print("done")
"""
WAITS = {
    "never waited for": "os.read(done_r, 1)  # end of file once every child has exited; none is waited for",
    "waited for": "for _ in range(3):\n    os.wait()",
}


@pytest.mark.slow
@pytest.mark.parametrize("children", sorted(WAITS))
def test_the_cpu_time_of_a_test_s_children_counts(verifier: CodeVerifier, children: str) -> None:
    source = BURNERS.format(wait=WAITS[children])
    verdict = verify(verifier, source, [{"type": "stdin_stdout", "input": "", "output": "done"}])
    (test,) = verdict.details["tests"]
    # Charged for its children's CPU time; on a machine too busy to give them 2.4 s before the wall
    # limit, stopped there instead (the code that counted one process passed it, at 0.002 s).
    assert test["status"] == "time_limit", test
    assert (
        test["time_s"] >= verifier.limits.time_limit or test["wall_s"] >= 0.95 * verifier.limits.wall_seconds
    ), test


# A test is charged what its own processes use: the tests of earlier submissions on the worker, and
# what they left (a child still burning when its test ends), count for nothing in later ones.
BURNS_AND_LEAVES = """
import os, time
if os.fork() == 0:
    while time.process_time() < 0.4:
        pass
    os._exit(0)
while time.process_time() < 0.4:
    pass
print("done")
"""


@pytest.mark.slow
def test_a_test_is_charged_nothing_of_earlier_submissions(verifier: CodeVerifier) -> None:
    tests = [{"type": "stdin_stdout", "input": "", "output": "done"}] * 2
    burned = verify(verifier, BURNS_AND_LEAVES, tests)
    assert all(test["time_s"] >= 0.4 for test in burned.details["tests"]), burned.details
    quick = verify(verifier, "print('done')", tests)
    assert quick.score == 1.0, quick.details
    assert all(test["time_s"] < 0.3 for test in quick.details["tests"]), quick.details


# --- memory counts every process of a test ----------------------------------------------------------

# Four children hold 200 MB each: 800 MB in all, past the default 512 MB, each well within it.
HOARDERS = """
import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(200 << 20)  # zero-filled: every page touched
        time.sleep(3)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print("done")
"""


def test_the_memory_of_a_test_s_children_counts(verifier: CodeVerifier) -> None:
    verdict = verify(verifier, HOARDERS, [{"type": "stdin_stdout", "input": "", "output": "done"}])
    (test,) = verdict.details["tests"]
    assert test["status"] == "memory_limit", test
    assert test["memory_kb"] > verifier.limits.memory_limit * 1024, test
