"""The in-sandbox runner: compiles a submission once and runs each of its tests under its own limits.

This file runs inside the sandbox with the sandbox's own interpreter (`python3 -I -S runner.py`; the
bwrap backend runs it as bytecode that interpreter compiled ahead, see `bwrap.compiled_runner`), so
it uses the standard library only. It serves submissions one after another over stdin/stdout:

    request:  one frame  {"language", "source", "tests", "limits", "compile_limits", "budget_s"}
    replies:  {"event": "compiled", ...}, one {"event": "test", ...} per test, then {"event": "done"}

    (the done frame carries "retire": true when this runner cannot serve another submission)

A frame is a 4-byte big-endian length and a UTF-8 JSON document. Each test runs in a child process:
its own process group, rlimits (CPU, address space, processes, file size, open files), a wall-clock
deadline, capped output. When a test ends, every process it left behind is killed: the runner is a
child subreaper, so detached descendants are re-parented to it and found. In a sandbox
(`--sandboxed`) no other process, IPC object or file of the programs outlives a submission, and a
system call filter confines the runner and everything it starts (see `Slate` and `confine`).
Expected outputs never enter the sandbox; the host compares what the runner reports.

Where tests start from. Compiled programs (and compilers) are forked from the runner and exec'd at
once, so they start with no memory of it. A Python test forks from the zygote, an interpreter with
the common modules imported, so a test costs a fork instead of an interpreter start. The runner,
which reads submissions and every test's output, never forks a Python test: it forks the zygote at
its start, before it reads anything, and the zygote reads nothing a program wrote or chose: it gets
file descriptors to fork a test with, then reaps the test (its status and resource usage pass
through a raw buffer the zygote clears at once, never through a Python object). A test waits at a
gate until the runner has learnt its pid and set its rlimits, then loads its own compiled code (and
a function's name and arguments) from a memfd; its input is its stdin. The runner reads its output
and learns from the zygote's report that it ended. So a test's memory holds nothing of an earlier submission (its
source, input, output or how its tests ended) nor of another test of its own submission. The
zygote outlives submissions (killing leftovers and strangers spares it); a runner whose zygote a
program killed retires after that submission (see `Zygote`).
"""

import _signal
import _socket
import atexit
import ctypes
import gc
import io
import json
import marshal
import os
import resource
import select
import signal
import struct
import sys
import time

# Imported here so that forked Python tests find them already loaded.
import bisect  # noqa: F401
import collections  # noqa: F401
import functools  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import math  # noqa: F401
import re  # noqa: F401
import string  # noqa: F401
import types
import typing  # noqa: F401

# Not imported here: `threading` (its fork hooks would run in every forked test), `traceback`, and
# `socket` (`_socket` does without the modules `socket` imports, which every test would copy).

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
IPC_RMID = 0
STDERR_TAIL = 4096
READ_CHUNK = 1 << 16
EXIT_POLL_S = 0.005  # how often a child's exit is checked for where no pidfd can be had
QUIET_S = 0.01  # how long a child's output is left in its pipes before the runner reads it as it comes
MEMORY_ERROR_EXIT = 3
MEMORY_MARKERS = (b"MemoryError", b"std::bad_alloc", b"memory allocation of", b"heap out of memory", b"Cannot allocate memory")
# Stop signals a program may send; the runner and its zygote ignore them (SIGSTOP they cannot: the
# runner continues the zygote before waiting for it, and the host notices a silent runner).
STOP_SIGNALS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
ZYGOTE_ANSWER_S = 10.0  # how long the zygote may take to fork or reap before the runner gives up on it
ZYGOTE_NUDGE_S = 0.1  # how often the runner continues the zygote while a Python test runs
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

_libc = ctypes.CDLL(None, use_errno=True)


# --- framing --------------------------------------------------------------------------------------


def read_exact(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    header = read_exact(fd, 4)
    if header is None:
        return None
    body = read_exact(fd, struct.unpack(">I", header)[0])
    return None if body is None else json.loads(body.decode("utf-8"))


def write_frame(fd, message):
    body = json.dumps(message).encode("utf-8")
    data = struct.pack(">I", len(body)) + body
    while data:
        written = os.write(fd, data)
        data = data[written:]


# --- process hygiene ------------------------------------------------------------------------------


def children_of(pid):
    """Pids whose parent is `pid`, from /proc/PID/task/*/children (or a scan of /proc without it)."""
    found = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for tid in tasks:
        try:
            found.extend(int(child) for child in read_file("/proc/%d/task/%s/children" % (pid, tid)).split())
        except FileNotFoundError:
            return _scan_children(pid)
        except OSError:
            continue
    return found


def _scan_children(pid):
    found = []
    for entry in _pids():
        fields = _stat(entry)
        if fields and int(fields[1]) == pid:
            found.append(entry)
    return found


def read_file(path):
    """All of a (/proc) file: open, read and close, the fewest system calls Python allows (the
    runner reads several /proc files per test)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, READ_CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _pids():
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _stat(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None once it is gone."""
    try:
        stat = read_file("/proc/%d/stat" % pid)
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


_reopened = {}  # the /proc files the runner reads again and again, each with the fd kept open on it


def reread(path):
    """All of a /proc file the runner reads after every test or submission, from an fd it keeps
    open: one system call where read_file takes four."""
    fd = _reopened.get(path)
    if fd is None:
        fd = _reopened[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    chunks = [os.pread(fd, READ_CHUNK, 0)]
    while len(chunks[-1]) == READ_CHUNK:  # a short read is the end
        chunks.append(os.pread(fd, READ_CHUNK, READ_CHUNK * len(chunks)))
    return b"".join(chunks)


_zygote_pid = None  # the runner's zygote (see Zygote), which outlives every test and submission


def own_children():
    """children_of(this runner), which has a single thread."""
    try:
        return [int(child) for child in reread("/proc/thread-self/children").split()]
    except FileNotFoundError:
        return _scan_children(os.getpid())


def kill_leftovers():
    """Kill every descendant of this runner and reap them; orphans come to us as the subreaper.

    The zygote and its children are left alone: those are Python tests, which their supervision
    kills (their own children, orphaned, come to us).
    """
    for _ in range(100):
        stack, seen = [pid for pid in own_children() if pid != _zygote_pid], []
        while stack:
            pid = stack.pop()
            seen.append(pid)
            stack.extend(children_of(pid))
        if not seen:
            return
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap_children()


def kill_strangers():
    """Kill every other process in this pid namespace that we may signal but the zygote, those
    outside the runner's tree too, and wait until none of them runs; whether there was any. Only
    for a runner alone in its sandbox (which is why kill(-1) will not do: it would take the zygote).

    The killed are reaped only once none runs: until then they keep their place under the process
    limits, which a fork bomb would otherwise refill between two sweeps."""
    found = False
    for _ in range(1000):
        strangers = _strangers()
        if not any(running for _, running in strangers):
            reap_children()
            return found
        found = True
        for pid, _ in strangers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)
    raise RuntimeError("processes in the sandbox outlive SIGKILL")


def _strangers():
    """(pid, whether it runs) for every process here we may signal but init, ourselves and the zygote."""
    me, found = os.getpid(), []
    for pid in _pids():
        if pid in (1, me, _zygote_pid):
            continue
        try:
            os.kill(pid, 0)
        except OSError:
            continue  # gone, or not ours to signal
        fields = _stat(pid)
        if fields:
            found.append((pid, fields[0] not in (b"Z", b"X")))
    return found


def remove_ipc_objects():
    """Remove every System V shared memory segment, semaphore set and message queue of this IPC
    namespace (the sandbox's own; ids from /proc/sysvipc)."""
    removers = {
        "shm": lambda ipc_id: _libc.shmctl(ipc_id, IPC_RMID, None),
        "sem": lambda ipc_id: _libc.semctl(ipc_id, 0, IPC_RMID),
        "msg": lambda ipc_id: _libc.msgctl(ipc_id, IPC_RMID, None),
    }
    for kind, remove in removers.items():
        try:
            rows = reread("/proc/sysvipc/" + kind).splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            remove(int(row.split()[1]))


def reap_children():
    """Wait until every child of this process but the zygote is gone (they have been sent SIGKILL)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if all(child == _zygote_pid for child in own_children()):
                return
            time.sleep(0.001)


def wipe(path, keep=""):
    """Remove everything under `path` that we may remove, unreadable directories included.

    `keep` (a directory) and the directories leading to it stay, emptied.
    """
    try:
        if os.stat(path).st_uid == os.getuid():
            os.chmod(path, 0o700)  # a program may have locked its own directory
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                kept = keep == entry.path or keep.startswith(entry.path + "/")
                wipe(entry.path, keep)
                if not kept:
                    os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


# --- limits ---------------------------------------------------------------------------------------


def rlimits(limits, language):
    """The (resource, (soft, hard)) pairs a test of `language` runs under."""
    seconds = max(1, int(limits["time_s"] + 0.999))
    memory = int(limits["memory_mb"]) << 20
    if language in ("javascript", "compile"):
        # V8 and compilers reserve large address ranges up front and run helper threads:
        # cap writable data (with room for thread stacks) instead of the address space.
        space = [(resource.RLIMIT_DATA, (memory + (256 << 20),) * 2), (resource.RLIMIT_STACK, (8 << 20,) * 2)]
    else:
        space = [(resource.RLIMIT_AS, (memory, memory)), (resource.RLIMIT_STACK, (min(memory // 4, 64 << 20),) * 2)]
    return [
        (resource.RLIMIT_CPU, (seconds, seconds + 1)),
        *space,
        (resource.RLIMIT_FSIZE, (int(limits["disk_mb"]) << 20,) * 2),
        (resource.RLIMIT_NPROC, (int(limits["processes"]),) * 2),
        (resource.RLIMIT_NOFILE, (256, 256)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]


def apply_limits(limits, language):
    """Set this (child) process's rlimits; called between fork and exec."""
    for kind, value in rlimits(limits, language):
        resource.setrlimit(kind, value)


# --- confinement ---------------------------------------------------------------------------------

# Per machine: the audit architecture and the numbers of the system calls the filter looks at.
SYSCALLS = {
    "x86_64": (0xC000003E, {"socket": 41, "clone": 56, "ptrace": 101, "add_key": 248, "request_key": 249, "keyctl": 250,
                            "unshare": 272, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
                            "clone3": 435, "pidfd_getfd": 438}),
    "aarch64": (0xC00000B7, {"unshare": 97, "ptrace": 117, "socket": 198, "add_key": 217, "request_key": 218, "keyctl": 219,
                             "clone": 220, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271,
                             "clone3": 435, "pidfd_getfd": 438}),
}
# Refused outright: reaching into other processes, kernel keyrings (they outlive processes), namespaces.
DENIED_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "add_key", "request_key",
                   "keyctl", "unshare", "setns")
CLONE_NEW_NAMESPACES = 0x7E020080  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
INET_FAMILIES = (2, 10)  # AF_INET, AF_INET6: no network, and closed TCP sockets linger (TIME_WAIT)
X32_SYSCALL_BIT = 0x40000000
EPERM, EACCES, ENOSYS = 1, 13, 38
BPF_LD_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000


def seccomp_filter(machine):
    """The BPF program that confines the runner and its tests (see DENIED_SYSCALLS), as bytes.

    clone with a namespace flag is refused, clone3 (whose flags the filter cannot read) answers
    ENOSYS so that libc falls back to clone, sockets are Unix sockets only, and system calls of
    another ABI (32-bit, x32) are refused.
    """
    if machine not in SYSCALLS:
        raise RuntimeError("no system call filter for machine %r" % (machine,))
    arch, numbers = SYSCALLS[machine]
    lines = [
        (BPF_LD_ABS, 0, 0, 4),  # seccomp_data.arch
        (BPF_JEQ, 1, 0, arch),
        (BPF_RET, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
        (BPF_LD_ABS, 0, 0, 0),  # seccomp_data.nr
        (BPF_JGE, "eperm", 0, X32_SYSCALL_BIT),
    ]
    lines += [(BPF_JEQ, "eperm", 0, numbers[name]) for name in DENIED_SYSCALLS]
    lines += [
        (BPF_JEQ, "clone", 0, numbers["clone"]),
        (BPF_JEQ, "enosys", 0, numbers["clone3"]),
        (BPF_JEQ, "socket", 0, numbers["socket"]),
        (BPF_RET, 0, 0, SECCOMP_RET_ALLOW),
        "clone",
        (BPF_LD_ABS, 0, 0, 16),  # the low half of seccomp_data.args[0]: the flags
        (BPF_JSET, "eperm", 0, CLONE_NEW_NAMESPACES),
        (BPF_RET, 0, 0, SECCOMP_RET_ALLOW),
        "socket",
        (BPF_LD_ABS, 0, 0, 16),  # the address family
        *[(BPF_JEQ, "eacces", 0, family) for family in INET_FAMILIES],
        (BPF_RET, 0, 0, SECCOMP_RET_ALLOW),
        "eperm",
        (BPF_RET, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        "eacces",
        (BPF_RET, 0, 0, SECCOMP_RET_ERRNO | EACCES),
        "enosys",
        (BPF_RET, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
    ]
    return _assemble(lines)


def _assemble(lines):
    """BPF instructions (code, jump if true, jump if false, k) as bytes; a jump may name a label,
    a string line that marks the instruction after it."""
    labels, position = {}, 0
    for line in lines:
        if isinstance(line, str):
            labels[line] = position
        else:
            position += 1
    program = []
    for line in lines:
        if isinstance(line, str):
            continue
        code, true, false, k = line
        here = len(program) + 1
        true, false = (labels[j] - here if isinstance(j, str) else j for j in (true, false))
        program.append(struct.pack("=HBBI", code, true, false, k))
    return b"".join(program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def confine():
    """Install the system call filter on this process; every test forked from it inherits it."""
    code = seccomp_filter(os.uname().machine)
    program = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // 8, ctypes.addressof(program))
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the system call filter")


# --- running one process --------------------------------------------------------------------------


class Outcome:
    """What one run of a child process produced."""

    def __init__(self):
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.result = bytearray()
        self.killed_for = None  # "time_limit" | "output_limit" when the runner killed it
        self.exit_code = None
        self.signal = None
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.memory_kb = 0


def run_child(start, stdin_data, limits, with_result_pipe=False):
    """Start a child with fds 0/1/2 (and 3 for a result) wired, and supervise it until it ends.

    `start(stdin_fd, write_ends)` starts it and returns a handle with its `pid` and `reap(block)`:
    see `fork_child`, and `Zygote.starter` for Python tests. Enforces the wall deadline and the
    output cap; kills whatever the child left behind.
    """
    output_limit = int(limits["output_bytes"])
    stdin_fd = os.memfd_create("stdin", 0)
    os.write(stdin_fd, stdin_data)
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    pipes = [os.pipe() for _ in range(3 if with_result_pipe else 2)]
    started = time.monotonic()
    try:
        child = start(stdin_fd, [write_end for _, write_end in pipes])
    except BaseException:
        for read_end, _ in pipes:
            os.close(read_end)
        raise
    finally:
        for fd in (stdin_fd, *(write_end for _, write_end in pipes)):
            os.close(fd)
    res_r = pipes[2][0] if with_result_pipe else None
    outcome = Outcome()
    _supervise(child, outcome, pipes[0][0], pipes[1][0], res_r, limits, output_limit, started)
    return outcome


def fork_child(child_main):
    """A `start` for run_child: fork this process and run `child_main()` in the child."""

    def start(stdin_fd, write_ends):
        pid = os.fork()
        if pid == 0:
            become_child(stdin_fd, write_ends, child_main)
        return OwnChild(pid)

    return start


class OwnChild:
    """A child of this process."""

    def __init__(self, pid):
        self.pid = pid
        self.recheck_s = float("inf")  # its pidfd tells at once

    def watch(self):
        """An fd that turns readable once it has exited (a pidfd, closed with `unwatch`), or None
        where none can be had: then its exit is polled for."""
        return _exit_watch(self.pid)

    def unwatch(self, fd):
        os.close(fd)

    def reap(self, block):
        """(wait status, rusage) once it has exited, and whatever it left behind killed; None while
        it runs and `block` is false."""
        waited, status, rusage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        if not waited:
            return None
        kill_leftovers()
        return status, rusage


def become_child(stdin_fd, write_ends, child_main):
    """In a new child: own process group, fds 0/1/2 (and 3) wired and nothing else open, the
    signal dispositions a fresh program has; then `child_main()`. Never returns."""
    code = 127
    try:
        os.setpgid(0, 0)
        os.dup2(stdin_fd, 0)
        for target, fd in enumerate(write_ends, start=1):
            os.dup2(fd, target)
        os.closerange(len(write_ends) + 1, 65536)
        for number in (*STOP_SIGNALS, signal.SIGCHLD):  # the runner's processes ignore them
            _signal.signal(number, _signal.SIG_DFL)  # not signal.signal: its enums cost a forked test page copies
        code = child_main()
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the runner
        try:
            os.write(2, ("runner: %r\n" % (exc,)).encode())
        except OSError:
            pass
    os._exit(code)


def _supervise(child, outcome, out_r, err_r, res_r, limits, output_limit, started):
    """Collect the child's output into `outcome` until it ends or breaks a limit; then kill what is
    left of it and record how it ended. The read ends are closed whatever happens."""
    caps = {out_r: output_limit, err_r: None}
    sinks = {out_r: outcome.stdout, err_r: outcome.stderr}
    if res_r is not None:
        caps[res_r], sinks[res_r] = output_limit, outcome.result
    poller = select.poll()
    try:
        status, rusage = _await_end(child, outcome, sinks, caps, poller, float(limits["wall_s"]), started)
        for fd in list(sinks):  # every writer is dead now: read what is left in the pipes
            while fd in sinks and select.select([fd], [], [], 0)[0]:
                if _pump(fd, sinks, caps, poller) == "over" and outcome.killed_for is None:
                    outcome.killed_for = "output_limit"
    finally:
        for fd in list(sinks):
            _close_sink(fd, sinks, poller)
    del outcome.stdout[output_limit:]
    outcome.cpu_s = rusage.ru_utime + rusage.ru_stime
    outcome.memory_kb = rusage.ru_maxrss
    if os.WIFSIGNALED(status):
        outcome.signal = os.WTERMSIG(status)
    else:
        outcome.exit_code = os.WEXITSTATUS(status)


def _await_end(child, outcome, sinks, caps, poller, wall_limit, started):
    """Pump output until the child exits, passes its wall limit or its output cap (then kill its
    process group); (wait status, rusage) once it is reaped.

    For its first QUIET_S the output waits in its pipes: most tests end by then, and the runner
    wakes once, when the child has exited, instead of at every write. After that (or at once
    where the end cannot be watched) it is pumped as it comes."""
    exited = child.watch()  # readable once the child has exited
    if exited is not None:
        poller.register(exited, select.POLLIN)
    try:
        quiet = exited is not None and poller.poll(max(1, int(min(QUIET_S, wall_limit) * 1000)))
        for fd in sinks:
            poller.register(fd, select.POLLIN)
        if quiet:
            ended = child.reap(block=False)
            if ended:
                outcome.wall_s = time.monotonic() - started
                return ended
        while outcome.killed_for is None:
            remaining = wall_limit - (time.monotonic() - started)
            if remaining <= 0:
                outcome.killed_for = "time_limit"
                break
            wait_s = min(remaining, child.recheck_s if exited is not None else EXIT_POLL_S)
            events = poller.poll(max(1, int(wait_s * 1000)))
            for fd, _ in events:
                if fd != exited and _pump(fd, sinks, caps, poller) == "over":
                    outcome.killed_for = "output_limit"
            if exited is None or not events or any(fd == exited for fd, _ in events):
                ended = child.reap(block=False)
                if ended:  # what it left behind is killed already
                    outcome.wall_s = time.monotonic() - started
                    return ended
    finally:
        if exited is not None:
            poller.unregister(exited)
            child.unwatch(exited)
    _kill_group(child.pid)
    outcome.wall_s = time.monotonic() - started
    return child.reap(block=True)


def _pump(fd, sinks, caps, poller):
    """Move one chunk from a pipe into its buffer: 'more', 'eof', or 'over' (past its cap)."""
    if fd not in sinks:
        return "eof"
    chunk = os.read(fd, READ_CHUNK)
    if not chunk:
        _close_sink(fd, sinks, poller)
        return "eof"
    sink = sinks[fd]
    sink += chunk
    cap = caps[fd]
    if cap is None:  # stderr: keep only its tail
        if len(sink) > 2 * STDERR_TAIL:
            del sink[: len(sink) - STDERR_TAIL]
        return "more"
    if len(sink) > cap:
        _close_sink(fd, sinks, poller)
        return "over"
    return "more"


def _close_sink(fd, sinks, poller):
    poller.unregister(fd)
    os.close(fd)
    del sinks[fd]


def _kill_group(pid):
    """Kill a test's process group, and its leader even if it left the group."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
        except OSError:
            pass


def _exit_watch(pid):
    """A pidfd for `pid` (Linux 5.3+), or None where the kernel or a seccomp filter refuses one."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def classify(outcome, limits):
    """The runner-side status of a finished run: ok (exited 0) or the limit or error it hit."""
    if outcome.killed_for:
        return outcome.killed_for
    if outcome.cpu_s > float(limits["time_s"]) or outcome.signal == signal.SIGXCPU:
        return "time_limit"
    if outcome.signal == signal.SIGXFSZ:
        return "output_limit"
    if outcome.exit_code == 0 and outcome.signal is None:
        return "ok"
    memory_kb = int(limits["memory_mb"]) * 1024
    if (
        outcome.exit_code == MEMORY_ERROR_EXIT
        and b"MemoryError" in outcome.stderr
        or any(marker in outcome.stderr for marker in MEMORY_MARKERS)
        or outcome.signal == signal.SIGKILL  # the kernel's OOM killer: we did not send it
        or outcome.memory_kb >= memory_kb * 0.95
    ):
        return "memory_limit"
    return "runtime_error"


# --- the zygote: where Python tests fork from (see the module docstring) -----------------------------


class ZygoteLost(Exception):
    """The zygote is gone or does not answer (a program killed it): no more Python tests here."""


REAP_BYTES = 8 + 18 * ctypes.sizeof(ctypes.c_long)  # a wait status, padding, then a struct rusage
GATE_OPEN = b"+"  # what a Python test waits for before it loads its program


class Zygote:
    """The runner's end of its zygote. The zygote only ever forks tests and reports how they ended,
    and a program may have stopped it: the runner continues it before waiting for each answer."""

    def __init__(self, workdir):
        global _zygote_pid
        self.sock, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        self.pid = _zygote_pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                keep = theirs.fileno()
                os.closerange(3, keep)  # the runner's channel to the host among them
                os.closerange(keep + 1, 65536)
                code = zygote_main(theirs, workdir)
            finally:
                os._exit(code)
        theirs.close()

    def alive(self):
        """Whether it still serves: its socket turns readable only when it has gone."""
        return self.sock.fileno() >= 0 and not select.select([self.sock], [], [], 0)[0]

    def starter(self, code, test, limits):
        """A `start` for run_child that forks a Python test from the zygote. The test waits at a
        gate until we know its pid and have set its rlimits (it exits if we never open the gate),
        then loads its code (and a function's name and arguments) from a memfd: the less a test
        builds, the fewer of the zygote's pages it copies."""
        call = (test["fn_name"], test["input"]) if test["type"] == "function_call" else None
        spec = marshal.dumps((code, call))

        def start(stdin_fd, write_ends):
            spec_fd = os.memfd_create("test", 0)
            os.write(spec_fd, spec)
            os.lseek(spec_fd, 0, os.SEEK_SET)
            gate_r, gate = os.pipe()
            try:
                pid = struct.unpack("i", self._ask([stdin_fd, *write_ends, spec_fd, gate_r], 4))[0]
                if _limit_process(pid, limits):
                    os.write(gate, GATE_OPEN)
            except ZygoteLost:
                self.lose()
                raise
            finally:
                for fd in (spec_fd, gate_r, gate):
                    os.close(fd)
            return ZygoteChild(self, pid)

        return start

    def collect(self, block):
        """How the test it forked last ended, (wait status, rusage), once it has exited: the zygote
        reaps it on its own and sends that; None while it runs and `block` is false (the zygote is
        continued then); ZygoteLost if it does not answer."""
        answer = self._answer(REAP_BYTES) if block else self._answer_now(REAP_BYTES)
        if answer is None:
            return None
        status = struct.unpack_from("i", answer)[0]
        fields = struct.unpack_from("18l", answer, 8)
        usage = types.SimpleNamespace(ru_utime=fields[0] + fields[1] / 1e6, ru_stime=fields[2] + fields[3] / 1e6, ru_maxrss=fields[4])
        return status, usage

    def _ask(self, fds, size):
        """Send a request with file descriptors; its answer of `size` bytes, or ZygoteLost."""
        try:
            rights = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("%di" % len(fds), *fds))
            self.sock.sendmsg([b"F"], [rights], _socket.MSG_NOSIGNAL)
        except OSError:
            raise ZygoteLost() from None
        return self._answer(size)

    def _answer(self, size):
        """The zygote's next message, of `size` bytes (continued first: a program may have stopped
        it), or ZygoteLost."""
        if self.sock.fileno() < 0:
            raise ZygoteLost()  # lost already
        try:
            os.kill(self.pid, signal.SIGCONT)
            if not select.select([self.sock], [], [], ZYGOTE_ANSWER_S)[0]:
                raise ZygoteLost()
            answer = self.sock.recv(size + 1)
        except OSError:
            raise ZygoteLost() from None
        return _checked(answer, size)

    def _answer_now(self, size):
        """The zygote's next message if it has come, else None (and the zygote is continued: a
        program may have stopped it); ZygoteLost if it has gone."""
        if self.sock.fileno() < 0:
            raise ZygoteLost()
        try:
            answer = self.sock.recv(size + 1, _socket.MSG_DONTWAIT)
        except BlockingIOError:
            os.kill(self.pid, signal.SIGCONT)
            return None
        except OSError:
            raise ZygoteLost() from None
        return _checked(answer, size)

    def lose(self):
        """Give up on the zygote: kill it and reap it (what it forked is ours then, and killed with
        the rest of the submission's processes)."""
        global _zygote_pid
        if self.sock.fileno() < 0:
            return  # lost already
        _zygote_pid = None
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        self.sock.close()


def _checked(answer, size):
    """A message from the zygote, which is of `size` bytes unless the zygote has gone."""
    if len(answer) != size:
        raise ZygoteLost()
    return answer


def _limit_process(pid, limits):
    """Set the rlimits of a Python test waiting at its gate; False if it has gone already (then it
    never runs its program)."""
    try:
        for kind, value in rlimits(limits, "python"):
            resource.prlimit(pid, kind, value)
    except ProcessLookupError:
        return False
    return True


class ZygoteChild:
    """A Python test: a child of the zygote, which reaps it and sends how it ended. That message
    is how the runner learns that the test has exited."""

    def __init__(self, zygote, pid):
        self.zygote = zygote
        self.pid = pid
        self.recheck_s = ZYGOTE_NUDGE_S  # a stopped zygote says nothing: look again, continuing it

    def watch(self):
        """The zygote's socket: it turns readable once the zygote has reaped the test (or gone)."""
        return self.zygote.sock.fileno()

    def unwatch(self, fd):
        """The socket stays open for the next test."""

    def reap(self, block):
        """(wait status, rusage) once it has exited, and whatever it left behind killed; None while
        it runs and `block` is false (the zygote is continued then: the program may have stopped
        it). ZygoteLost if the zygote is gone."""
        ended = self.zygote.collect(block)  # waits, when `block`, until the test is dead and reaped
        if ended is not None:
            kill_leftovers()  # then what it left behind has come to us
        return ended


def zygote_main(requests, workdir):
    """Serve the runner until it goes away: for each set of file descriptors, fork a test, send its
    pid, wait for it to end and send how it did. A test's wait status and resource usage go from the
    kernel into `reaped` and out to the runner, and are cleared at once: no trace of how a test
    ended stays here."""
    atexit._clear()  # what the runner's interpreter registered is not a program's to run at its end
    _install_test_main(workdir)
    reaped = ctypes.create_string_buffer(REAP_BYTES)
    usage = ctypes.byref(reaped, 8)
    # Bound once: after every fork, each page this loop writes is a copy-on-write fault.
    wait4, memset, recvmsg, send, fork, close = _libc.wait4, ctypes.memset, requests.recvmsg, requests.send, os.fork, os.close
    space = _socket.CMSG_SPACE(8 * 4)
    while True:
        data, ancillary, _, _ = recvmsg(1, space)
        if not data:
            return 0
        fds = memoryview(ancillary[0][2]).cast("i").tolist() if ancillary else []
        pid = fork()
        if pid == 0:
            _become_test(fds, workdir)
        for fd in fds:
            close(fd)
        send(pid.to_bytes(4, sys.byteorder, signed=True))
        done = wait4(pid, reaped, 0, usage)
        send(reaped if done > 0 else b"?")
        memset(reaped, 0, REAP_BYTES)


def _install_test_main(workdir):
    """Make the empty `__main__` module every test runs its program in, here, once: each test
    gets its own copy of it with the fork, and has less to build (and fewer pages to copy)."""
    module = types.ModuleType("__main__")
    module.__file__ = os.path.join(workdir, "main.py")
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module


def _become_test(fds, workdir):
    """In a test the zygote forked: wait for the runner (which sets our rlimits), load the test
    from its memfd, run it. Never returns."""
    *wiring, spec_fd, gate_r = fds
    try:
        if os.read(gate_r, 1) != GATE_OPEN:
            os._exit(127)  # the runner never learnt our pid: we would run unwatched and unlimited
        code, call = marshal.loads(os.pread(spec_fd, os.lseek(spec_fd, 0, os.SEEK_END), 0))
    except BaseException:  # noqa: BLE001 - never return into the zygote
        os._exit(127)
    become_child(wiring[0], wiring[1:], python_child(code, call, workdir))


# --- languages ------------------------------------------------------------------------------------


def python_child(code, call, workdir):
    """Child body for a Python test: run the compiled module as __main__ in this forked interpreter;
    `call` is None (a stdin/stdout test) or the (name, arguments) of the function to call."""

    def main():
        os.chdir(workdir)
        module = sys.modules["__main__"]  # empty: see _install_test_main; argv and streams are set too
        exit_code = 0
        try:
            exec(code, module.__dict__)
            if call is not None:
                value = call_function(module, *call)
                os.write(3, json.dumps(value, default=json_default).encode("utf-8"))
        except SystemExit as exc:
            exit_code = _system_exit_code(exc)
        except MemoryError:
            sys.stderr.write("MemoryError\n")
            exit_code = MEMORY_ERROR_EXIT
        except BaseException:  # noqa: BLE001 - report the program's own error like python would
            import traceback

            traceback.print_exc()
            exit_code = 1
        return _exit_like_python(exit_code)

    return main


def _prepare_python_tests():
    """Set up, once, what every forked Python test starts from: a clean environment and text
    streams over fds 0-2 (each test child rewires those fds first). Made here rather than in
    every child, since each page a child writes is a copy-on-write fault."""
    global _test_stdio
    os.environ.clear()
    os.environ.update(CLEAN_ENV)
    # Streams remember what their fd was when made (seekable or not): make stdout and stderr over
    # a pipe, as the tests' own are, then put the runner's fds 1 and 2 back.
    saved = os.dup(1), os.dup(2)
    read_end, write_end = os.pipe()
    for fd in (1, 2):
        os.dup2(write_end, fd)
    try:
        _test_stdio = (
            io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8"),
            io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", write_through=True),
        )
    finally:
        for fd, original in zip((1, 2), saved):
            os.dup2(original, fd)
            os.close(original)
        os.close(read_end)
        os.close(write_end)
    # Installed here, once, and inherited by every test: a test that replaced the interpreter's own
    # streams and argv would free them, writing to many pages it shares with the zygote.
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = _test_stdio
    sys.argv = list(TEST_ARGV)
    _warm_up_type_caches()


_test_stdio = None  # the runner itself never uses these; see _prepare_python_tests
TEST_ARGV = ("main.py",)

# What a small test usually does: read words and numbers from stdin, compute, print.
WARM_UP_PROGRAM = """
import sys
data = sys.stdin.read().split()
numbers = list(map(int, data[:2]))
lengths = {word: len(word) for word in data[2:]}
print(sum(numbers), max(lengths, key=lengths.get), sorted(lengths.items()), " ".join(map(str, numbers)))
"""


def _warm_up_type_caches():
    """Run a small program once, here, with streams of the tests' own types. The interpreter's type
    attribute cache and the types' version tags it fills are then inherited by every test, which
    would otherwise write them itself: a copy-on-write fault for each page (about 15 of the 300 a
    small test takes)."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"3 4 alpha beta\n")
    os.close(write_end)
    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(read_end, "r")), encoding="utf-8")
    stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(os.devnull, "w")), encoding="utf-8")
    saved = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = stdin, stdout
    try:
        exec(compile(WARM_UP_PROGRAM, "warm_up.py", "exec"), types.ModuleType("warm_up").__dict__)
        stdout.flush()
    finally:
        sys.stdin, sys.stdout = saved
        stdin.close()
        stdout.close()


def _system_exit_code(exc):
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    sys.stderr.write("%s\n" % (exc.code,))
    return 1


def _exit_like_python(exit_code):
    """What interpreter shutdown does, however the program ended: wait for its threads, run its
    atexit hooks, flush sys.stdout (a failure is an error) and the original stdout (if the program
    swapped it; failures ignored). Closed, detached or None streams are left alone."""
    try:
        _finish_threads()
    except BaseException:  # noqa: BLE001 - as in python, trouble at exit does not change the outcome
        pass
    streams = [(sys.stdout, True)]
    if _test_stdio[1] is not sys.stdout:  # the program swapped it
        streams.append((_test_stdio[1], False))
    for stream, failure_counts in streams:
        try:
            if stream is None or stream.closed:
                continue
            stream.flush()
        except BaseException:  # noqa: BLE001
            if failure_counts:
                exit_code = exit_code or 1
    return exit_code


def _finish_threads():
    """Wait for the program's own threads, run its atexit hooks."""
    threading = sys.modules.get("threading")  # only there when the program imported it
    if threading is not None:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()


def call_function(module, fn_name, args):
    """Call a top-level function, or a method of a top-level class (LeetCode's `Solution`)."""
    target = getattr(module, fn_name, None)
    if not callable(target):
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == "__main__" and callable(getattr(value, fn_name, None)):
                target = getattr(value(), fn_name)
                break
    if not callable(target):
        raise NameError("no function or method named %r" % (fn_name,))
    if not isinstance(args, list):
        args = [args]
    return target(*args)


def json_default(value):
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError("result of type %s is not JSON-serialisable" % type(value).__name__)


JS_CALL_HARNESS = r"""
const fs = require('fs');
const mod = require('./main.js');
const spec = JSON.parse(fs.readFileSync(0, 'utf8'));
let target = (mod && typeof mod[spec.fn_name] === 'function') ? mod[spec.fn_name] : globalThis[spec.fn_name];
if (typeof target !== 'function') {
  for (const value of Object.values(mod || {})) {
    if (typeof value === 'function' && value.prototype && typeof value.prototype[spec.fn_name] === 'function') {
      const obj = new value(); target = obj[spec.fn_name].bind(obj); break;
    }
  }
}
if (typeof target !== 'function') { throw new Error('no function or method named ' + spec.fn_name); }
Promise.resolve(target(...spec.args)).then((value) => {
  fs.writeSync(3, JSON.stringify(value === undefined ? null : value));
});
"""

JS_EXPORTS = (
    "\n;try { if (typeof module !== 'undefined') { for (const __n of %s) {"
    " try { if (!(__n in module.exports)) module.exports[__n] = eval(__n); } catch (e) {} } } } catch (e) {}\n"
)


def compile_submission(language, source, workdir, toolchains, compile_limits, limits):
    """Compile once. Returns (argv or compiled code, error message or None, seconds)."""
    started = time.monotonic()
    if language == "python":
        try:
            return compile(source, os.path.join(workdir, "main.py"), "exec", dont_inherit=True), None, 0.0
        except (SyntaxError, ValueError) as exc:
            return None, "%s: %s" % (type(exc).__name__, exc), time.monotonic() - started
    tool = toolchains.get(language)
    if not tool:
        return None, "language %r is not available in this sandbox" % (language,), 0.0
    if language == "javascript":
        src = binary = os.path.join(workdir, "main.js")
        with open(os.path.join(workdir, "call.js"), "w", encoding="utf-8") as handle:
            handle.write(JS_CALL_HARNESS)
        source += JS_EXPORTS % json.dumps(_js_top_level_names(source))
        heap = "--max-old-space-size=%d" % int(limits["memory_mb"])
        argv, program = [tool["run"], "--check", src], [tool["run"], heap, src]
    elif language == "cpp":
        src, binary = os.path.join(workdir, "main.cpp"), os.path.join(workdir, "main")
        argv = [tool["compile"], "-O2", "-std=c++17", "-pipe", "-o", binary, src]
        program = [binary]
    elif language == "rust":
        src, binary = os.path.join(workdir, "main.rs"), os.path.join(workdir, "main")
        argv = [tool["compile"], "-O", "--edition", "2021", "-o", binary, src]
        if tool.get("linker"):
            argv[1:1] = ["-C", "linker=" + tool["linker"]]
        program = [binary]
    else:
        return None, "unknown language %r" % (language,), 0.0
    with open(src, "w", encoding="utf-8") as handle:
        handle.write(source)
    outcome = run_child(fork_child(_exec_child(argv, workdir, compile_limits, "compile")), b"", compile_limits)
    elapsed = time.monotonic() - started
    status = classify(outcome, compile_limits)
    if status != "ok" or not os.path.exists(binary):
        message = (bytes(outcome.stderr) + bytes(outcome.stdout)).decode("utf-8", "replace")[-STDERR_TAIL:]
        if status not in ("ok", "runtime_error"):
            message = "the compiler hit its %s\n%s" % (status.replace("_", " "), message)
        return None, message.strip() or "compilation failed", elapsed
    return program, None, elapsed


def _js_top_level_names(source):
    pattern = r"^(?:async\s+)?(?:function\s*\*?\s*([A-Za-z_$][\w$]*)|class\s+([A-Za-z_$][\w$]*)|(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=)"
    names = []
    for match in re.finditer(pattern, source, re.M):
        name = next(group for group in match.groups() if group)
        if name not in names:
            names.append(name)
    return names


def _exec_child(argv, workdir, limits=None, language=None):
    def main():
        os.chdir(workdir)
        if limits is not None:
            apply_limits(limits, language)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; a program past its file size limit dies of it
        os.execve(argv[0], argv, CLEAN_ENV)

    return main


def run_test(language, program, test, workdir, limits, zygote=None):
    """Run one test (a Python one forks from `zygote`); returns the reply frame for it."""
    is_call = test["type"] == "function_call"
    if language == "python":
        stdin = b"" if is_call else _stdin_of(test)
        outcome = run_child(zygote.starter(program, test, limits), stdin, limits, with_result_pipe=is_call)
    elif language == "javascript" and is_call:
        argv = program[:-1] + [os.path.join(workdir, "call.js")]
        spec = json.dumps({"fn_name": test["fn_name"], "args": _call_args(test["input"])}).encode("utf-8")
        outcome = run_child(fork_child(_exec_child(argv, workdir, limits, language)), spec, limits, with_result_pipe=True)
    elif is_call:
        return {"event": "test", "status": "runtime_error", "message": "function_call tests run only in python or javascript"}
    else:
        outcome = run_child(fork_child(_exec_child(program, workdir, limits, language)), _stdin_of(test), limits)
    status = classify(outcome, limits)
    reply = {
        "event": "test",
        "status": status,
        "stdout": bytes(outcome.stdout).decode("utf-8", "replace"),
        "stderr": bytes(outcome.stderr[-STDERR_TAIL:]).decode("utf-8", "replace"),
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "time_s": round(outcome.cpu_s, 4),
        "wall_s": round(outcome.wall_s, 4),
        "memory_kb": outcome.memory_kb,
    }
    if is_call:
        reply["stdout"] = reply["stdout"][-STDERR_TAIL:]
        reply["result"] = bytes(outcome.result).decode("utf-8", "replace") if status == "ok" else None
        if status == "ok" and not outcome.result:
            reply["status"] = "runtime_error"
            reply["message"] = "the function returned no result"
    return reply


def _stdin_of(test):
    value = test.get("input", "")
    if not isinstance(value, str):
        value = json.dumps(value)
    return value.encode("utf-8")


def _call_args(value):
    return value if isinstance(value, list) else [value]


# --- serving --------------------------------------------------------------------------------------


class Slate:
    """What the runner empties after every submission (and checks before the next): the scratch
    directory and the other directories programs can write to and, when the runner is alone in its
    sandbox (`sandboxed`: its own pid and IPC namespaces), every other process and IPC object there."""

    def __init__(self, scratch, wipe_dirs, sandboxed):
        self.scratch = scratch
        self.sandboxed = sandboxed
        # The scratch directory is emptied with the directory it is in, where that is one of them.
        inside = any(scratch.startswith(directory.rstrip("/") + "/") for directory in wipe_dirs)
        self.emptied = wipe_dirs if inside else [scratch, *wipe_dirs]

    def clean(self, keep=""):
        """After a submission: kill, remove and empty; `keep` (a directory) stays, emptied."""
        kill_leftovers()
        if self.sandboxed:
            kill_strangers()
            remove_ipc_objects()
        for directory in self.emptied:
            wipe(directory, keep)

    def check(self, keep=""):
        """Before a submission: no process of the programs runs (the last `clean` waited until none
        did), so one that does came from outside; kill it, and clean again what it may have left."""
        if self.sandboxed and kill_strangers():
            self.clean(keep)


def serve_one(job, toolchains, slate, zygote, out_fd):
    """Compile and run one submission, replying frame by frame; it finds nothing of an earlier one
    and leaves nothing behind. False when this runner cannot serve another (a program killed its
    zygote)."""
    deadline = time.monotonic() + float(job.get("budget_s", 1e9))
    workdir = os.path.join(slate.scratch, "work")
    slate.check(keep=workdir)
    os.makedirs(workdir, exist_ok=True)
    try:
        program, error, seconds = compile_submission(
            job["language"], job["source"], workdir, toolchains, job["compile_limits"], job["limits"]
        )
        write_frame(out_fd, {"event": "compiled", "ok": error is None, "message": error, "time_s": round(seconds, 4)})
        if error is None:
            for index, test in enumerate(job["tests"]):
                limits = dict(job["limits"])
                left = deadline - time.monotonic()
                if left <= 0.05:
                    reply = {"event": "test", "status": "time_limit", "message": "the submission's time budget ran out"}
                else:
                    limits["wall_s"] = min(float(limits["wall_s"]), left)
                    reply = _run_test_or_charge(job["language"], program, test, workdir, limits, zygote)
                reply["index"] = index
                write_frame(out_fd, reply)
    finally:
        slate.clean(keep=workdir)
    alive = zygote.alive()
    write_frame(out_fd, {"event": "done"} if alive else {"event": "done", "retire": True})
    return alive


def _run_test_or_charge(language, program, test, workdir, limits, zygote):
    """run_test; a test that finds the zygote lost fails (only a program can kill it)."""
    try:
        return run_test(language, program, test, workdir, limits, zygote)
    except ZygoteLost:
        zygote.lose()
        return {"event": "test", "status": "runtime_error", "message": "the program killed the sandbox's test runner"}


def drop_privileges(uid):
    """Become `uid` for good: empty the capability bounding set, then change every id."""
    for capability in range(64):
        _libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def main(argv):
    """`runner.py TOOLCHAINS_JSON SCRATCH_DIR [--uid N] [--wipe DIR]... [--sandboxed]`: serve
    submissions until stdin closes.

    --uid: drop to this uid first (when started as root). --wipe: more directories the programs can
    write to (a private /tmp, /dev/shm, /dev/mqueue), emptied at start and after every submission.
    --sandboxed: the runner is alone in its sandbox's pid and IPC namespaces: it installs the system
    call filter (see `confine`) and kills every other process it may signal there and removes
    every IPC object (see `Slate`). Never pass it outside a sandbox.
    """
    toolchains = json.loads(argv[1])
    scratch = argv[2]
    wipe_dirs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--wipe"]
    os.makedirs(scratch, exist_ok=True)
    if "--uid" in argv:
        uid = int(argv[argv.index("--uid") + 1])
        os.chmod(scratch, 0o700)
        os.chown(scratch, uid, uid)
        drop_privileges(uid)
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace, no /proc/PID/mem; what we fork inherits it
    slate = Slate(scratch, wipe_dirs, sandboxed="--sandboxed" in argv)
    if slate.sandboxed:
        confine()
    # Forked tests inherit these: default dispositions, as a fresh program would have them.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for number in STOP_SIGNALS:  # a program may send them to our process group; tests get the defaults back
        signal.signal(number, signal.SIG_IGN)
    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    _prepare_python_tests()
    gc.freeze()  # forked tests then share the zygote's memory instead of copying it on the next collection
    zygote = Zygote(os.path.join(scratch, "work"))  # before anything a program wrote is read
    slate.clean()  # what an earlier runner may have left
    write_frame(out_fd, {"event": "ready", "pid": os.getpid(), "uid": os.getuid()})
    while True:
        job = read_frame(in_fd)
        if job is None or not serve_one(job, toolchains, slate, zygote, out_fd):
            return 0


def keep(argv):
    """`runner.py keep SECONDS`: a container's init; it lives until stdin closes or SECONDS pass.

    It runs as a uid of its own, and no process may trace it or read its memory."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    deadline = time.monotonic() + float(argv[2])
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return 0
        ready = select.select([0], [], [], min(left, 1.0))[0]
        if ready and not os.read(0, 4096):
            return 0
        reap_exited()


def reap_exited():
    """Collect children that have exited, without waiting."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


if __name__ == "__main__":
    # Nothing of the runner needs finalizing (its frames are written unbuffered): exit at once, so
    # that a runner being replaced is gone sooner.
    os._exit(keep(sys.argv) if sys.argv[1:2] == ["keep"] else main(sys.argv))
