"""Submissions served one after another by the same sandbox cannot reach each other: nothing a
submission leaves in the kernel (IPC objects, keys, sockets, processes) is there for the next one,
whatever the runner reuse, and the sandbox's own processes and namespaces are out of reach."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from test_sandbox_backends import (
    BACKENDS,
    PROGRAMS,
    SUM_TESTS,
    backend_skip_reason,
    code_rollout,
    host_processes_with,
    opened_sandbox,
)
from test_sandbox_lifecycle import wait_until

from genesys.sandbox.backends import open_sandbox
from genesys.sandbox.base import DEFAULT_REUSE, Sandbox, SandboxError, Submission
from genesys.sandbox.limits import Limits
from genesys.verifiers.code import CodeVerifier

SECRET = "answer-4f2a"

# Publishes its input everywhere a later submission could look; prints what it managed.
PUBLISHER = """
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
secret = sys.stdin.read().encode()
done = []
shm = libc.shmget(0x6E5E, 4096, 0o1000 | 0o666)
address = libc.shmat(shm, None, 0) if shm >= 0 else None
if address not in (None, ctypes.c_void_p(-1).value):
    ctypes.memmove(address, secret, len(secret))
    done.append("shm")
if libc.semget(0x6E5F, 1, 0o1000 | 0o666) >= 0:
    done.append("sem")
queue = libc.msgget(0x6E60, 0o1000 | 0o666)
message = (1).to_bytes(8, "little") + secret  # struct msgbuf: mtype 1, then the text
if queue >= 0 and libc.msgsnd(queue, message, len(secret), 0) == 0:
    done.append("msg")
mq = libc.mq_open(b"/genesys-leak", os.O_CREAT | os.O_RDWR, 0o666, None)
if mq >= 0 and libc.mq_send(mq, secret, len(secret), 0) == 0:
    done.append("mqueue")
if libc.syscall(248, b"user", b"genesys-leak", secret, len(secret), -4) >= 0:  # add_key to the user keyring
    done.append("keyring")
try:
    server = socket.socket()
    server.bind(("127.0.0.1", 40000 + int.from_bytes(secret[:2], "big") % 20000))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    server.accept()[0].close()
    client.close()  # the port now waits in TIME_WAIT, listed in /proc/net/tcp
    done.append("time_wait")
except OSError:
    pass
print(*done)
"""

# Looks for anything a publisher could have left; prints it, or "nothing".
SNOOPER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
found = []
for kind in ("shm", "sem", "msg"):
    try:
        rows = open("/proc/sysvipc/" + kind).read().splitlines()[1:]
    except OSError:
        rows = []
    found += [kind + " " + " ".join(row.split()[:2]) for row in rows]
for directory in ("/dev/mqueue", "/dev/shm", "/tmp", "/var/tmp"):
    try:
        found += [directory + "/" + name for name in os.listdir(directory) if name != "genesys"]
    except OSError:
        pass
mq = libc.mq_open(b"/genesys-leak", os.O_RDONLY | os.O_NONBLOCK, 0, None)
if mq >= 0:
    found.append("mqueue /genesys-leak")
key = libc.syscall(249, b"user", b"genesys-leak", None, 0)  # request_key
if key >= 0:
    found.append("key %d" % key)
for table in ("tcp", "tcp6", "udp", "udp6", "unix"):
    try:
        rows = open("/proc/net/" + table).read().splitlines()[1:]
    except OSError:
        rows = []
    # Not the runner's channel to its template, there from its start: a connected unnamed SOCK_SEQPACKET pair.
    found += [table + " " + row.strip() for row in rows if not (table == "unix" and row.split()[4:6] == ["0005", "03"] and len(row.split()) == 7)]
print(" | ".join(found) or "nothing")
"""

CPP_PUBLISHER = """
#include <sys/ipc.h>
#include <sys/shm.h>
#include <mqueue.h>
#include <fcntl.h>
#include <cstring>
#include <iostream>
int main() {
    std::string secret;
    std::cin >> secret;
    int id = shmget(0x6E61, 4096, IPC_CREAT | 0666);
    if (id >= 0) { char* p = (char*)shmat(id, nullptr, 0); if (p != (char*)-1) std::strcpy(p, secret.c_str()); }
    mqd_t mq = mq_open("/genesys-leak-cpp", O_CREAT | O_RDWR, 0666, nullptr);
    if (mq != (mqd_t)-1) mq_send(mq, secret.c_str(), secret.size(), 0);
    std::cout << (id >= 0) << (mq != (mqd_t)-1) << std::endl;
}
"""


def run_one(sandbox: Sandbox, source: str, stdin: str = "", language: str = "python") -> dict:
    result = sandbox.run(
        Submission(language, textwrap.dedent(source), [{"type": "stdin_stdout", "input": stdin}])
    )
    assert result.compiled, result.compile_message
    return result.tests[0]


def programs_uid(sandbox: Sandbox) -> str:
    """The uid the sandbox's programs run as (its runner keeps it)."""
    return run_one(sandbox, "import os\nprint(os.getuid())")["stdout"].strip()


ONE_TEST = [{"type": "stdin_stdout", "input": ""}]


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((kind, reuse), marks=getattr(pytest.mark, kind), id=f"{kind}-reuse{reuse}")
        for kind in ("docker", "bwrap")
        for reuse in (DEFAULT_REUSE, 1)
    ],
)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    kind, reuse = request.param
    yield from opened_sandbox(kind, reuse=reuse)


def test_a_submission_finds_nothing_an_earlier_one_published(sandbox: Sandbox) -> None:
    clean = run_one(sandbox, SNOOPER)
    assert clean["stdout"] == "nothing\n", clean
    published = run_one(sandbox, PUBLISHER, SECRET)
    assert published["status"] == "ok" and "shm" in published["stdout"], published  # it did publish
    snooped = run_one(sandbox, SNOOPER)
    assert snooped["stdout"] == "nothing\n", (published["stdout"], snooped)


def test_a_compiled_submission_leaves_nothing_either(sandbox: Sandbox) -> None:
    if "cpp" not in sandbox.languages():
        pytest.skip(f"no C++ in the {sandbox.name} sandbox here")
    published = run_one(sandbox, CPP_PUBLISHER, SECRET, language="cpp")
    assert published["stdout"] == "11\n", published
    snooped = run_one(sandbox, SNOOPER)
    assert snooped["stdout"] == "nothing\n", snooped


# Every directory a program can create a file in.
WRITABLE = """
import os
for directory, subdirectories, _ in os.walk("/"):
    if directory in ("/proc", "/sys"):
        subdirectories.clear()
        continue
    try:
        os.close(os.open(os.path.join(directory, ".probe"), os.O_CREAT | os.O_WRONLY, 0o600))
        os.unlink(os.path.join(directory, ".probe"))
        print(directory)
    except OSError:
        pass
"""


def test_programs_write_only_where_the_runner_wipes(sandbox: Sandbox) -> None:
    walked = sandbox.run(
        Submission("python", WRITABLE, [{"type": "stdin_stdout", "input": ""}], limits=Limits(time_limit=30))
    )
    writable = walked.tests[0]["stdout"].split()
    assert walked.tests[0]["status"] == "ok" and "/tmp" in writable, walked.tests
    assert all(path.startswith(("/tmp", "/dev/shm", "/dev/mqueue")) for path in writable), writable


# Fills the sandbox's memory with shared memory segments that no process holds.
SHM_BOMB = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = 0
for key in range(6):
    segment = libc.shmget(0x7E00 + key, 400 << 20, 0o1000 | 0o600)
    address = libc.shmat(segment, None, 0) if segment >= 0 else None
    if address in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(address, 1, 400 << 20)
    libc.shmdt(ctypes.c_void_p(address))
    made += 1
print(made)
"""
ALLOCATE_400MB = (
    "memory = bytearray(400 << 20)\nmemory[::4096] = bytes(len(range(0, 400 << 20, 4096)))\nprint('fits')"
)


@pytest.mark.slow
def test_memory_an_earlier_submission_left_in_shared_memory_is_freed(sandbox: Sandbox) -> None:
    # 2.4 GB of segments plus 400 MB is more than the sandbox's whole memory (about 2.5 GB).
    bomb = sandbox.run(
        Submission("python", SHM_BOMB, [{"type": "stdin_stdout", "input": ""}], limits=Limits(time_limit=30))
    )
    assert bomb.tests[0]["status"] in ("ok", "memory_limit", "runtime_error"), bomb.tests
    allocated = run_one(sandbox, ALLOCATE_400MB)
    assert allocated["status"] == "ok" and allocated["stdout"] == "fits\n", (bomb.tests, allocated)


# Tries to reach every process that is not its own: trace it, read its memory, signal it.
TRACER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
reached = []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    pid = int(entry)
    if libc.ptrace(0x4206, pid, None, None) == 0:  # PTRACE_SEIZE
        reached.append("traced %d" % pid)
    buffer = ctypes.create_string_buffer(8)
    local = (ctypes.c_void_p * 2)(ctypes.cast(buffer, ctypes.c_void_p), 8)
    remote = (ctypes.c_void_p * 2)(0x400000, 8)
    if libc.process_vm_readv(pid, local, 1, remote, 1, 0) >= 0 or ctypes.get_errno() == 14:  # EFAULT: allowed, bad address
        reached.append("read %d" % pid)
print(" | ".join(reached) or "unreachable")
"""


def test_the_sandbox_processes_cannot_be_traced(sandbox: Sandbox) -> None:
    traced = run_one(sandbox, TRACER)
    assert traced["stdout"] == "unreachable\n", traced


# A process that is not dumpable keeps its /proc files (memory, map, environment) from its own uid:
# the submission's init among them, whose memory is the template's.
PEEKER = """
import os
readable = []
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        for name in ("environ", "maps", "mem"):
            try:
                with open("/proc/%s/%s" % (entry, name), "rb"):
                    readable.append(entry + "/" + name)
            except OSError:
                pass
print(readable)
"""


def test_the_runner_template_and_init_keep_their_proc_files_closed(sandbox: Sandbox) -> None:
    peeked = run_one(sandbox, PEEKER)
    assert peeked["stdout"] == "[]\n", peeked


@pytest.mark.docker
def test_the_container_init_is_out_of_reach_even_without_the_filter() -> None:
    reason = backend_skip_reason("docker")
    if reason:
        pytest.skip(reason)
    with open_sandbox("docker") as opened:
        uid = programs_uid(opened)
        (container,) = opened.containers()
        # A process of the programs' uid started by docker exec: docker's own filter allows ptrace.
        code, output = container.exec_run(
            [opened.toolchains["python"]["run"], "-c", TRACER], user=f"{uid}:{uid}"
        )
    assert code == 0 and output.decode() == "unreachable\n", output


NAMESPACES = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
made = []
for name, flag in [("user", 0x10000000), ("mount", 0x20000), ("net", 0x40000000), ("ipc", 0x08000000), ("pid", 0x20000000), ("uts", 0x04000000)]:
    if libc.unshare(flag) == 0:
        made.append(name)
    try:  # or enter one: its own again, the only one a program can open
        fd = os.open("/proc/self/ns/" + {"mount": "mnt"}.get(name, name), os.O_RDONLY)
    except OSError:
        continue
    if libc.setns(fd, flag) == 0:
        made.append("entered " + name)
print(" ".join(made) or "refused")
"""


def test_programs_cannot_make_namespaces(sandbox: Sandbox) -> None:
    made = run_one(sandbox, NAMESPACES)
    assert made["stdout"] == "refused\n", made


# --- processes that did not come from the runner --------------------------------------------------

MARKER = f"genesys-stranger-{os.getpid()}"
SLEEPER = f"import time; time.sleep(300)  # {MARKER}"
FIND_STRANGERS = f"""
import os
found = []
for pid in os.listdir("/proc"):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as handle:
            if {MARKER!r}.encode() in handle.read():
                found.append(pid)
    except OSError:
        pass
print(found or "none")
"""


def plant_stranger(sandbox: Sandbox, uid: str) -> subprocess.Popen | None:
    """Start, from outside, a process of the programs' uid inside the sandbox: what a program that
    escaped the runner's process tree would leave."""
    python = sandbox.toolchains["python"]["run"]
    if sandbox.name == "docker":
        (container,) = sandbox.containers()
        container.exec_run([python, "-c", SLEEPER], user=f"{uid}:{uid}", detach=True)
        return None
    if os.geteuid() != 0 or not shutil.which("nsenter"):
        pytest.skip("planting a process in a bwrap sandbox needs root and nsenter")
    bwrap = sandbox._session.transport.process.pid
    with open(f"/proc/{bwrap}/task/{bwrap}/children") as handle:
        (init,) = handle.read().split()  # the sandbox's pid 1
    command = ["nsenter", "--target", init, "--pid", "--setuid", uid, "--setgid", uid, python, "-c", SLEEPER]
    return subprocess.Popen(command, start_new_session=True)


def _owned_by(pids: list[int], uid: int) -> list[int]:
    owned = []
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                owned.append(pid)
        except OSError:
            pass
    return owned


@pytest.fixture(params=BACKENDS)
def own_sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A sandbox of each real backend opened for one test alone (skipped where it cannot run)."""
    yield from opened_sandbox(request.param)


def test_processes_the_runner_did_not_start_are_killed(own_sandbox: Sandbox) -> None:
    uid = programs_uid(own_sandbox)
    planted = plant_stranger(own_sandbox, uid)
    # nsenter's own command line holds the marker too: wait for the process running as the programs' uid
    assert wait_until(lambda: _owned_by(host_processes_with(MARKER), int(uid)), 60), (
        "the planted process never started"
    )
    seen = run_one(own_sandbox, FIND_STRANGERS)
    assert seen["stdout"] == "none\n", seen  # the next submission starts without it
    assert wait_until(lambda: not host_processes_with(MARKER), 30)
    if planted is not None:
        planted.wait(timeout=30)


def _status_field(pid: str, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next((line.split()[1] for line in handle if line.startswith(name + ":")), None)
    except OSError:
        return None


def _programs_processes(uid: str) -> set[str]:
    """The host pids of the processes running as the programs' uid."""
    return {pid for pid in filter(str.isdigit, os.listdir("/proc")) if _status_field(pid, "Uid") == uid}


def _template_of_next_test(uid: str) -> Callable[[], int | None]:
    """Poll for the host pid of the template: the parent of the first process running as the programs'
    uid that was not running at the call (a process of the last submission may still be ending)."""
    earlier = _programs_processes(uid)

    def template() -> int | None:
        for pid in _programs_processes(uid) - earlier:
            parent = _status_field(pid, "PPid")
            if parent:
                return int(parent)
        return None

    return template


def _first_of(poll: Callable[[], int | None], seconds: float) -> int | None:
    """The first value other than None `poll` gives within `seconds`; None if it gives none."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = poll()
        if value is not None:
            return value
        time.sleep(0.02)
    return None


def test_a_template_killed_from_outside_is_a_sandbox_error_at_once(own_sandbox: Sandbox) -> None:
    # The submission's init, which runs in the template's memory and file table, outlives a template
    # killed from outside and holds the template's end of the runner's socket open: the runner must
    # not wait out the test's wall limit and its answer timeout to notice.
    killed: list[int] = []

    def kill_template() -> None:
        pid = _first_of(template, 60)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    template = _template_of_next_test(programs_uid(own_sandbox))
    killer = threading.Thread(target=kill_template)
    started = time.monotonic()
    killer.start()
    sleeper = Submission("python", "import time\ntime.sleep(30)", ONE_TEST, Limits(time_limit=10))
    try:
        with pytest.raises(SandboxError, match="lost this submission's template"):
            own_sandbox.run(sleeper)  # a wall limit of 21 s
    finally:
        killer.join()
    assert killed, "the test's process never showed up"
    assert time.monotonic() - started < 15  # not the wall limit, then the 10 s answer timeout
    assert run_one(own_sandbox, "print(7)")["stdout"] == "7\n"  # a fresh runner takes its place


def test_a_template_killed_between_submissions_fails_the_next_one_as_a_sandbox_error(
    own_sandbox: Sandbox,
) -> None:
    # As soon as a submission is done, the runner has the template set up the next one: a template
    # killed then (here: as the host reads the last test's report) fails the next submission with a
    # sandbox error, as one killed during it would, instead of ending the runner with a traceback.
    template = _template_of_next_test(programs_uid(own_sandbox))
    found: list[int | None] = []
    watcher = threading.Thread(target=lambda: found.append(_first_of(template, 60)))
    watcher.start()

    def kill_template(index: int, report: dict) -> dict:
        watcher.join()
        if found[0] is not None:
            os.kill(found[0], signal.SIGKILL)
        return report

    # Long enough for the watcher's looks through /proc to find it on a busy machine.
    sleeper = Submission("python", "import time\ntime.sleep(3)\nprint(1)", ONE_TEST, on_test=kill_template)
    assert own_sandbox.run(sleeper).tests[0]["stdout"] == "1\n"
    assert found[0] is not None, "the test's process never showed up"
    with pytest.raises(SandboxError, match="lost this submission's template"):
        run_one(own_sandbox, "print(7)")
    assert run_one(own_sandbox, "print(7)")["stdout"] == "7\n"  # a fresh runner takes its place


# What the system call filter must leave working: threads (clone3 refused, libc falls back to clone),
# fork, subprocesses, Unix sockets, asyncio, multiprocessing (its semaphores live in /dev/shm).
ORDINARY = """
import asyncio, multiprocessing, os, socket, subprocess, sys, threading
seen = []
thread = threading.Thread(target=seen.append, args=("thread",))
thread.start()
thread.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
seen.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
seen.append(subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True).stdout.strip())
left, right = socket.socketpair()
left.send(b"pair")
seen.append(right.recv(4).decode())
seen.append(asyncio.run(asyncio.sleep(0, "asyncio")))
with multiprocessing.Pool(2) as pool:
    seen.append(sum(pool.map(abs, [-1, -2])))
print(*seen)
"""


def test_ordinary_programs_still_work(sandbox: Sandbox) -> None:
    ran = run_one(sandbox, ORDINARY)
    assert ran["stdout"] == "thread 7 child pair asyncio 3\n", ran


# --- the memory of the processes that run a test, and programs that stop them ---------------------

BUDGET_S = 40.0  # seconds per submission; a runner that stops answering must not cost all of it


@pytest.fixture(scope="module", params=BACKENDS)
def verifier(request: pytest.FixtureRequest) -> Iterator[CodeVerifier]:
    reason = backend_skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    instance = CodeVerifier({"sandbox": request.param, "time_limit": 1, "budget": BUDGET_S})
    instance.setup()
    yield instance
    instance.teardown()


# Prints every string in its own writable memory that looks like an answer, an input or a source
# that another submission (or another test) had: what freed buffers of the process it was forked
# from would hold.
MEMORY_SCANNER = r"""
import ctypes, re
pattern = re.compile(rb"(?:ANSWER|INPUT|SOURCE)=[0-9a-f]{32}")
found = set()
for line in open("/proc/self/maps").read().splitlines():
    fields = line.split()
    if not fields[1].startswith("rw") or (len(fields) > 5 and not fields[5].startswith("[heap")):
        continue  # anonymous memory and the heap: where freed buffers stay
    start, end = (int(x, 16) for x in fields[0].split("-"))
    for offset in range(start, end, 1 << 22):
        chunk = ctypes.string_at(offset, min(end, offset + (1 << 22) + 64) - offset)
        found.update(match.decode() for match in pattern.findall(chunk))
print(" ".join(sorted(found)) or "nothing")
"""

# Answers with its input; its source carries a mark of its own.
PUBLISHER_OF_ANSWERS = "# SOURCE={mark}\nimport sys\nprint('ANSWER=' + sys.stdin.read().strip()[6:])\n\ndef answer(x):\n    return 'ANSWER=' + x[6:]\n"


def test_nothing_of_an_earlier_submission_is_in_a_test_s_memory(verifier: CodeVerifier) -> None:
    answer, call_answer = secrets.token_hex(16), secrets.token_hex(16)
    publisher = PUBLISHER_OF_ANSWERS.format(mark=secrets.token_hex(16))
    tests = [
        {"type": "stdin_stdout", "input": f"INPUT={answer}", "output": f"ANSWER={answer}"},
        {
            "type": "function_call",
            "fn_name": "answer",
            "input": [f"INPUT={call_answer}"],
            "output": f"ANSWER={call_answer}",
        },
    ]
    assert verifier.verify(code_rollout("python", publisher, tests)).score == 1.0
    scan = verifier.verify(
        code_rollout("python", MEMORY_SCANNER, [{"type": "stdin_stdout", "input": "", "output": "nothing"}])
    )
    assert scan.score == 1.0, scan.details


# The pids above a test, its parent first, up to the runner (whose parent is outside the sandbox
# or its init).
ANCESTORS = """
def ancestors():
    found, pid = [], os.getppid()
    while pid > 1:
        found.append(pid)
        pid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
    return found
"""

# Programs that stop, wedge, signal or kill the processes that run them, then print a wrong answer.
# Whatever they do, they fail (score 0, a reason given), quickly, and the next submission is fine.
STOPPERS = {
    "stop the parent": "os.kill(os.getppid(), signal.SIGSTOP)",
    "stop every ancestor": "for pid in ancestors():\n    os.kill(pid, signal.SIGSTOP)",
    "stop the runner": "os.kill(ancestors()[-1], signal.SIGSTOP)",
    "stop everything": "os.kill(-1, signal.SIGSTOP)",
    "stop the parent's group": "os.killpg(os.getpgid(os.getppid()), signal.SIGSTOP)",
    "terminal stop of everything": "os.kill(-1, signal.SIGTSTP)\nos.kill(-1, signal.SIGTTIN)\nos.kill(-1, signal.SIGTTOU)",
    "stop everything from a leftover": "if os.fork() == 0:\n    time.sleep(0.2)\n    os.kill(-1, signal.SIGSTOP)\n    os._exit(0)",
    "terminate everything": "os.kill(-1, signal.SIGTERM)",
    "interrupt everything": "os.kill(-1, signal.SIGINT)",
    "hang up everything": "os.kill(-1, signal.SIGHUP)",
    "kill every ancestor but the runner": "for pid in ancestors()[:-1]:\n    os.kill(pid, signal.SIGKILL)",
    "ptrace the parent": "import ctypes\nctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0)  # PTRACE_ATTACH would stop it",
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow)
        if name in ("stop everything from a leftover", "stop the parent's group")  # about 6 s each
        else name
        for name in sorted(STOPPERS)
    ],
)
def test_a_program_that_stops_its_runner_fails(verifier: CodeVerifier, name: str) -> None:
    source = "import os, signal, time\n" + ANCESTORS + STOPPERS[name] + "\nprint(41)\ntime.sleep(0.5)\n"
    tests = [{"type": "stdin_stdout", "input": "", "output": "42"}] * 2
    started = time.monotonic()
    verdict = verifier.verify(code_rollout("python", source, tests))
    elapsed = time.monotonic() - started
    assert verdict.error is None and verdict.score == 0.0, (verdict.error, verdict.details)
    assert all(test["status"] != "passed" for test in verdict.details["tests"])
    assert elapsed < BUDGET_S / 2, elapsed  # the runner is not waited on for the whole budget
    for _ in range(2):  # the runner or its replacement scores what comes next
        assert verifier.verify(code_rollout("python", PROGRAMS["python"]["correct"], SUM_TESTS)).score == 1.0


# What a submission's first Python test starts with, whatever an earlier submission did to its own
# process: its streams only (fd 3 is the listing itself, fd 255 the resident test process's channel
# to the template, see test_sandbox_resident.py), the fixed environment, modules as first imported.
STATE_PROBE = """
import builtins, collections, math, os, sys
marks = (math, builtins, sys, collections, os.environ.__class__)
leaked = sorted({type(module).__name__ for module in marks if hasattr(module, "left_by_another")})
print(sorted(os.listdir("/proc/self/fd")), leaked, sorted(os.environ))
for module in marks:
    module.left_by_another = 1
os.environ["LEFT_BY_ANOTHER"] = "1"
"""


def test_a_submission_inherits_only_its_own_streams_and_pristine_state(verifier: CodeVerifier) -> None:
    expected = "['0', '1', '2', '255', '3'] [] ['HOME', 'LANG', 'LC_ALL', 'PATH']"
    tests = [{"type": "stdin_stdout", "input": "", "output": expected}]
    for _ in range(3):
        verdict = verifier.verify(code_rollout("python", STATE_PROBE, tests))
        assert verdict.score == 1.0, verdict.details


# --- the runner's own parts, in this process (no sandbox around them) ---------------------------


FILTER_PROBE = """
import ctypes, os, socket, threading
from genesys.sandbox import runner
runner.confine()
libc = ctypes.CDLL(None, use_errno=True)
refused = {
    "user namespace": libc.unshare(0x10000000) == -1 and ctypes.get_errno() == 1,
    "trace": libc.ptrace(0x4206, os.getppid(), None, None) == -1 and ctypes.get_errno() == 1,
    "keyring": libc.syscall(250, 0, -4, 0) == -1 and ctypes.get_errno() == 1,  # KEYCTL_GET_KEYRING_ID
}
try:
    socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
except PermissionError:
    refused["inet socket"] = True
socket.socketpair()[0].close()  # Unix sockets work
thread = threading.Thread(target=refused.setdefault, args=("thread ran", True))
thread.start()
thread.join()
print(" ".join(sorted(name for name, ok in refused.items() if ok)), end="")
"""


def test_the_filter_refuses_what_it_must_and_keeps_the_rest(tmp_path) -> None:
    from test_sandbox_runner import template_replies

    [reply] = template_replies(FILTER_PROBE, 1, tmp_path)
    assert reply["stdout"] == "inet socket keyring thread ran trace user namespace", reply


def test_outside_a_sandbox_the_runner_leaves_other_processes_and_ipc_objects_alone(tmp_path) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE: an object of this process's
    neighbour = subprocess.Popen(["sleep", "60"])
    try:
        with open_sandbox("subprocess") as opened:
            result = opened.run(
                Submission(
                    "python",
                    "open('left', 'w').write('x')\nprint('ok')",
                    [{"type": "stdin_stdout", "input": ""}],
                )
            )
            workdir = os.path.join(opened._scratch, "work")
        assert result.tests[0]["status"] == "ok", result.tests
        assert neighbour.poll() is None  # not a stranger to kill outside a sandbox
        assert libc.shmctl(segment, 2, ctypes.create_string_buffer(256)) >= 0  # IPC_STAT: still there
        assert not os.path.exists(os.path.join(workdir, "left"))
    finally:
        neighbour.kill()
        libc.shmctl(segment, 0, None)
