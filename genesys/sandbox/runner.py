"""The in-sandbox runner: compiles a submission once and runs each of its tests under its own limits.

This file runs inside the sandbox with the sandbox's own interpreter (`python3 -I -S runner.py`; the
bwrap backend runs it as bytecode that interpreter compiled ahead, see `bwrap.compiled_runner`), so
it uses the standard library only. It serves submissions one after another over stdin/stdout:

    request:  one frame  {"language", "source", "tests", "limits", "compile_limits", "budget_s"}
    replies:  {"event": "compiled", ...}, one {"event": "test", ...} per test, then {"event": "done"}

    (the done frame carries "error" when the sandbox itself failed during the submission; frames
    are written together while the tests are quick, see `Replies`)

A frame is a 4-byte big-endian length and a UTF-8 JSON document. Expected outputs enter the
sandbox only for a task with a checker, and then only its process (see "checkers"); otherwise the
host compares what the runner reports. assert and pytest tests are judged here (see "judged tests").

The unit of isolation is the submission. Three kinds of process, each with one job:
- the runner (this process) reads submissions, supervises tests and writes replies; it never runs a
  program and never forks one;
- the template, forked from the runner before it reads anything, holds the warm interpreter (the
  common modules imported, streams made, type caches filled). In a sandbox (`--sandboxed`) it
  enters namespaces made for each submission (see `SubmissionSetup`): fresh mount, IPC and UTS
  namespaces, with a fresh tmpfs on every path a program can write (/tmp, /dev/shm) and its own
  /dev/mqueue and /proc, and a fresh pid namespace. It forks each test of the submission into them
  (compilers and compiled programs too, which exec at once), and reaps it; Python stdin/stdout
  tests run one after another in one fork of the submission's, its resident test process (see
  "resident tests");
- the submission's init, pid 1 of its pid namespace: a clone of the template that shares its memory
  and only waits, so that it costs no copy of the template's page tables. What a test leaves comes
  to it; its death takes every process of the namespace with it.
A test sets its own rlimits, drops to the programs' uid (`--uid`; the runner, template and init keep
theirs, so no program can signal, prlimit, renice or trace them) and runs. When the submission
ends the template kills its init, and the namespaces, their files and IPC objects go with the last
process: the template enters the next submission's only after that. Nothing a program can touch is
reused from one submission to the next (its own tests share its scratch files and, for Python stdin
tests, its resident test process); what is reused (the template's memory) no program can reach.
The system call filter (`confine`) is installed once, on the runner, and every process of the
sandbox inherits it.

Limits count every process of a test: the template reaps the test, whose own reaped children count
with it, and whatever it left comes to the init, which takes their CPU time with it when the
template reaps it in turn; while a test runs, the runner sums the CPU time and memory of all its
live processes and kills the test past either limit.
"""

import _signal
import _sitebuiltins
import _socket
import _thread
import atexit

# Imported here so that forked Python tests find them already loaded.
import bisect  # noqa: F401
import builtins
import collections  # noqa: F401
import ctypes
import functools
import gc
import heapq  # noqa: F401
import io
import itertools  # noqa: F401
import json
import marshal
import math  # noqa: F401
import operator
import os
import re  # noqa: F401
import resource
import select
import signal
import string  # noqa: F401
import struct
import sys
import time
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
STDERR_TAIL = 4096
READ_CHUNK = 1 << 16
QUIET_S = 0.01  # how long a test's output is left in its pipes before the runner reads it as it comes
FRAME_HOLD_S = 0.1  # how long a reply frame may wait to be written with the next ones (see Replies)
FRAME_HOLD_BYTES = 1 << 16
TREE_CHECK_S = 0.05  # how often the runner sums the CPU time and memory of a running test's processes
MEMORY_ERROR_EXIT = 3
MEMORY_MARKERS = (
    b"MemoryError",
    b"std::bad_alloc",
    b"memory allocation of",
    b"heap out of memory",
    b"Cannot allocate memory",
)
TEMPLATE_ANSWER_S = 10.0  # how long the template may take to answer before the runner gives up on it
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.clone.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
PAUSE = ctypes.cast(_libc.pause, ctypes.c_void_p).value  # what a submission's init runs (see SubmissionSetup)


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
    _write_all(fd, _frame_bytes(message))


def _frame_bytes(message):
    body = json.dumps(message).encode("utf-8")
    return struct.pack(">I", len(body)) + body


def _write_all(fd, data):
    while data:
        written = os.write(fd, data)
        data = data[written:]


class Replies:
    """A submission's reply frames, written together: most submissions end within milliseconds,
    and one write wakes the host once instead of at every test. A frame waits at most until the
    runner would otherwise wait for a test past QUIET_S (`_await_end` flushes then), FRAME_HOLD_S
    has passed since the oldest one waiting, or FRAME_HOLD_BYTES wait."""

    def __init__(self, fd):
        self.fd, self.pending, self.size, self.since = fd, [], 0, 0.0

    def add(self, message):
        frame = _frame_bytes(message)
        if not self.pending:
            self.since = time.monotonic()
        self.pending.append(frame)
        self.size += len(frame)
        if self.size >= FRAME_HOLD_BYTES or time.monotonic() - self.since >= FRAME_HOLD_S:
            self.flush()

    def flush(self):
        if self.pending:
            data, self.pending, self.size = b"".join(self.pending), [], 0
            _write_all(self.fd, data)


_replies = None  # this runner's Replies (see `main`); None where run_process runs without one


# --- processes ------------------------------------------------------------------------------------


def read_file(path):
    """All of a (/proc) file: open, read and close, the fewest system calls Python allows."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, READ_CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def children_of(pid):
    """Pids whose parent is `pid`, from /proc/PID/task/*/children."""
    found = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for tid in tasks:
        try:
            found.extend(int(child) for child in read_file("/proc/%d/task/%s/children" % (pid, tid)).split())
        except OSError:
            continue
    return found


def descendants_of(pid):
    """Every process under `pid` (not `pid` itself)."""
    stack, found = children_of(pid), []
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children_of(child))
    return found


def _stat(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None once it is gone."""
    try:
        stat = read_file("/proc/%d/stat" % pid)
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


# Indices into `_stat`'s fields (state is field 3 of /proc/PID/stat).
STAT_UTIME, STAT_STIME, STAT_CUTIME, STAT_CSTIME, STAT_THREADS, STAT_RSS = 11, 12, 13, 14, 17, 21


def kill_and_reap(pid):
    """SIGKILL our child `pid` (already dead or not) and reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(pid, 0)


def kill_strangers(spared):
    """Kill every process of this pid namespace but `spared` (and init) that we may signal, and
    those already dead aside: none of them comes from the runner, which runs every program in a
    namespace of its submission's own. (One can only come from outside, a `docker exec` say.)"""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared or entry == "1":
            continue
        fields = _stat(int(entry))
        if fields and fields[0] not in (b"Z", b"X"):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def wipe(path):
    """Remove everything under `path` that we may remove. Only outside a sandbox: there every
    submission gets a fresh tmpfs instead."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, 0o700)  # a program may have locked its own directory
                wipe(entry.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


# --- limits ---------------------------------------------------------------------------------------


def rlimits(limits, language):
    """The (resource, (soft, hard)) pairs a test of `language` runs under."""
    seconds = max(1, int(limits["time_limit"] + 0.999))
    memory = int(limits["memory_limit"]) << 20
    if language in ("javascript", "compile"):
        # V8 and compilers reserve large address ranges up front and run helper threads:
        # cap writable data (with room for thread stacks) instead of the address space.
        space = [(resource.RLIMIT_DATA, (memory + (256 << 20),) * 2), (resource.RLIMIT_STACK, (8 << 20,) * 2)]
    else:
        space = [
            (resource.RLIMIT_AS, (memory, memory)),
            (resource.RLIMIT_STACK, (min(memory // 4, 64 << 20),) * 2),
        ]
    return [
        (resource.RLIMIT_CPU, (seconds, seconds + 1)),
        *space,
        (resource.RLIMIT_FSIZE, (int(limits["disk_limit"]) << 20,) * 2),
        (resource.RLIMIT_NPROC, (int(limits["process_limit"]),) * 2),
        (resource.RLIMIT_NOFILE, (256, 256)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]


# --- confinement ---------------------------------------------------------------------------------

# Per machine: the audit architecture and the numbers of the system calls the filter looks at.
SYSCALLS = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "clone": 56,
            "ptrace": 101,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "unshare": 272,
            "setns": 308,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "clone3": 435,
            "pidfd_getfd": 438,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "unshare": 97,
            "ptrace": 117,
            "socket": 198,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "clone": 220,
            "setns": 268,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "clone3": 435,
            "pidfd_getfd": 438,
        },
    ),
}
# Refused outright: reaching into other processes, kernel keyrings (they outlive processes), namespaces.
DENIED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "add_key",
    "request_key",
    "keyctl",
)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x20000, 0x04000000, 0x08000000, 0x20000000
CLONE_NEW_NAMESPACES = 0x7E020080  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
# The namespaces the template makes for each submission. Only a process with CAP_SYS_ADMIN may make
# them, or enter one (which no test holds); a user namespace, which would let any process make the others, and
# network, cgroup and time namespaces, which the runner never makes, are refused to every process.
UNSHARED_BY_THE_TEMPLATE = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID
INET_FAMILIES = (2, 10)  # AF_INET, AF_INET6: no network, and closed TCP sockets linger (TIME_WAIT)
X32_SYSCALL_BIT = 0x40000000
EPERM, EACCES, ENOSYS = 1, 13, 38
BPF_LD_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000


@functools.cache
def seccomp_filter(machine):
    """The BPF program that confines the runner and everything it forks (see DENIED_SYSCALLS), as bytes.

    clone with a namespace flag is refused, clone3 (whose flags the filter cannot read) answers
    ENOSYS so that libc falls back to clone, `unshare` is refused any namespace but
    UNSHARED_BY_THE_TEMPLATE, `setns` any but a pid or mount namespace (the template's way back to
    its own before it makes the next submission's), sockets are Unix sockets only, and system
    calls of another ABI (32-bit, x32) are refused.
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
        (BPF_JEQ, "unshare", 0, numbers["unshare"]),
        (BPF_JEQ, "setns", 0, numbers["setns"]),
        (BPF_RET, 0, 0, SECCOMP_RET_ALLOW),
        "clone",
        (BPF_LD_ABS, 0, 0, 16),  # the low half of seccomp_data.args[0]: the flags
        (BPF_JSET, "eperm", 0, CLONE_NEW_NAMESPACES),
        (BPF_RET, 0, 0, SECCOMP_RET_ALLOW),
        "unshare",
        (BPF_LD_ABS, 0, 0, 16),  # the flags
        (BPF_JSET, "eperm", 0, CLONE_NEW_NAMESPACES & ~UNSHARED_BY_THE_TEMPLATE),
        (BPF_RET, 0, 0, SECCOMP_RET_ALLOW),
        "setns",
        (BPF_LD_ABS, 0, 0, 24),  # the low half of seccomp_data.args[1]: the namespace type
        (BPF_JEQ, 1, 0, CLONE_NEWPID),
        (BPF_JEQ, 0, "eperm", CLONE_NEWNS),
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


def filter_program():
    """The system call filter, ready for `confine` (the buffer it points into goes with it)."""
    code = seccomp_filter(os.uname().machine)
    program = ctypes.create_string_buffer(code, len(code))
    return _SockFprog(len(code) // 8, ctypes.addressof(program)), program


def confine(prepared=None):
    """Install the system call filter (`prepared` by `filter_program`, or made now) on this
    process; every process forked from it inherits it."""
    fprog, _ = prepared or filter_program()
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the system call filter")


CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP, CAP_SYS_CHROOT, CAP_SYS_ADMIN = 5, 6, 7, 8, 18, 21
# What the runner needs: fresh namespaces and mounts for each submission (SYS_ADMIN), a return to
# the sandbox's own mount namespace before each (SYS_CHROOT with SYS_ADMIN), tests that drop to the
# programs' uid (SETUID, SETGID), killing what a test left (KILL), and emptying the bounding set the
# template passes on (SETPCAP).
RUNNER_CAPABILITIES = (CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP, CAP_SYS_CHROOT, CAP_SYS_ADMIN)
# Where the programs keep the runner's uid (a non-root sandbox): no tests to drop to another uid.
SAME_UID_CAPABILITIES = (CAP_SETPCAP, CAP_SYS_CHROOT, CAP_SYS_ADMIN)
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def capability_sets(capabilities):
    """The arguments of the capset call that makes `capabilities` the only ones a process holds
    (effective and permitted; none inheritable)."""
    mask = 0
    for capability in capabilities:
        mask |= 1 << capability
    data = (_CapData * 2)(
        _CapData(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0), _CapData(mask >> 32, mask >> 32, 0)
    )
    return _CapHeader(_CAP_VERSION_3, 0), data


def keep_capabilities(capabilities, prepared=None):
    """Make `capabilities` the only ones this process holds (`prepared` by `capability_sets`)."""
    header, data = prepared or capability_sets(capabilities)
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "cannot set the runner's capabilities")


def drop_from_bounding_set(capabilities):
    """Drop `capabilities` from the bounding set: nothing this process runs can ever gain them."""
    for capability in capabilities:
        _libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)


def drop_privileges(uid):
    """Become `uid` for good (from root: every capability goes with the change)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


# --- namespaces ----------------------------------------------------------------------------------

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 0x4000, 1 << 18
SHM_BYTES = 64 << 20  # /dev/shm, as docker sizes it


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "%s: %s" % (what, os.strerror(errno)))


def _mount(source, target, fstype, flags, data=None):
    encode = lambda value: None if value is None else value.encode()  # noqa: E731
    _check(
        _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), "mount " + target
    )


def fresh_mounts(scratch_bytes, uid):
    """The mounts that give a submission fresh, empty file systems wherever a program can write:
    a tmpfs on /tmp (owned by the programs' `uid`), a tmpfs on /dev/shm, the new IPC namespace's
    own /dev/mqueue, and nothing on /sys. (Its /proc is PROC_MOUNT, see `SubmissionSetup`.) As
    `mount` arguments: (source, target, type, flags, data)."""
    owner = "" if uid is None else ",uid=%d,gid=%d" % (uid, uid)
    mounts = [
        ("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=0700%s" % (scratch_bytes, owner)),
        ("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=%d,mode=1777" % SHM_BYTES),
        ("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
    ]
    if os.path.ismount("/sys"):  # docker shows one; its cgroup files count what earlier submissions used
        mounts.append(
            ("tmpfs", "/sys", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4096,mode=0555")
        )
    return [_encoded(mount) for mount in mounts]


# A /proc of the submission's pid namespace: it shows the submission's processes only.
PROC_MOUNT = ("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
CLONE_VM, CLONE_FILES, SIGCHLD = 0x100, 0x400, 17
INIT_STACK_BYTES = 1 << 16


def _encoded(mount):
    return tuple(value if value is None or isinstance(value, int) else value.encode() for value in mount)


class SubmissionSetup:
    """The template's side of its submissions: what it does to enter each one's own namespaces,
    prepared once, so that entering one only makes the system calls (a page the template writes is
    a page it copies at its next fork), and what it does in each test it forks.

    Sandboxed: fresh mount, IPC and UTS namespaces with `fresh_mounts` (the mount namespace a copy
    of the sandbox's own, which the template returns to first); the working directory, made as the
    programs' `uid` in their /tmp; a fresh pid namespace whose pid 1, the submission's init, is a
    clone of the template that shares its memory (no page table to copy) and its file table (no fd
    of the template's kept open by it) and only waits in `pause`. What tests leave comes to the
    init; its death (SIGKILL, from the template) takes every process of the namespace with it, and
    the kernel reaps them into its own CPU times, which come to the template when it reaps the init.
    Only a process in a pid namespace can mount its /proc, so the first test forked there mounts it
    (see `in_test`). Outside a sandbox the template is a child subreaper: what tests leave comes to it."""

    def __init__(self, workdir, sandboxed, uid, scratch_bytes):
        self.sandboxed, self.uid = sandboxed, uid
        self.directories = [os.path.dirname(workdir), workdir]
        self.init = 0  # the pid of the submission's init; 0 outside a sandbox, or between submissions
        self.mount_proc = False  # whether the next test is the first of a pid namespace
        self.oom_score, self.own_oom_score = self._open_oom_score()  # see `fork_test`
        if not sandboxed:
            _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            return
        os.chdir("/")  # not the sandbox's /tmp, under every submission's: the tests inherit it
        self.mounts = fresh_mounts(scratch_bytes, uid)
        self.proc_mount = _encoded(PROC_MOUNT)
        self.no_capabilities = capability_sets(())
        self.own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.own_mounts = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        # The sandbox's /proc, where the inits' pids are the template's, whatever /proc later covers it.
        self.own_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.init_stack = ctypes.create_string_buffer(INIT_STACK_BYTES)
        self.stack_top = (ctypes.addressof(self.init_stack) + INIT_STACK_BYTES) & ~63
        self.children = -1  # an fd on the init's list of children: what tests left
        self.proc_device = None  # /proc's device before the first test of a pid namespace mounted its own

    def enter(self):
        """Leave the last submission (its init killed and reaped: none of its processes runs any
        more) for a new one's fresh namespaces; the new init's pid (0 outside a sandbox)."""
        if self.sandboxed:
            self.end_init()
            # A copy of the sandbox's own mount namespace, not of the last submission's: that one
            # goes at once with all its mounts (detaching them one by one from a copy cost each
            # `umount` an RCU grace period to wait out).
            _check(_libc.setns(self.own_mounts, CLONE_NEWNS), "setns")
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
            for source, target, fstype, flags, data in self.mounts:
                _check(_libc.mount(source, target, fstype, flags, data), "mount")
        if self.uid is None:
            self._make_directories()
        else:
            os.setresuid(-1, self.uid, -1)  # made as the programs' uid, in their /tmp; back to root after
            try:
                self._make_directories()
            finally:
                os.setresuid(-1, 0, -1)
        if self.sandboxed:
            self.new_pid_namespace()
        return self.init

    def new_pid_namespace(self):
        """Start a fresh pid namespace with an init of its own (the last one's, if any, killed and
        reaped first): the next test forked is the first there."""
        self.end_init()
        _check(_libc.setns(self.own_pid_namespace, CLONE_NEWPID), "setns")  # from the template's own
        _check(_libc.unshare(CLONE_NEWPID), "unshare")
        pid = _libc.clone(PAUSE, self.stack_top, CLONE_VM | CLONE_FILES | SIGCHLD, None)
        _check(0 if pid > 0 else -1, "clone")
        self.init = pid
        self.children = os.open(
            "%d/task/%d/children" % (pid, pid), os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.own_proc
        )
        self.proc_device = os.stat("/proc").st_dev
        self.mount_proc = True

    def end_init(self):
        """Kill the submission's init, which takes every process of its namespace with it, and reap it
        (and with it the CPU times of what tests left there)."""
        if not self.init:
            return
        kill_and_reap(self.init)  # the init ends only once no other process of its namespace is left
        os.close(self.children)
        self.init, self.children = 0, -1

    def proc_mounted(self):
        """After the first test of a pid namespace: whether it mounted the namespace's /proc."""
        self.mount_proc = False
        return os.stat("/proc").st_dev != self.proc_device

    def leftovers(self):
        """After a test's first process is reaped: whether processes of the test are left, alive or
        not reaped yet (the CPU time of those that ended, reaped here outside a sandbox, counts)."""
        if self.sandboxed:
            return bool(os.pread(self.children, 16, 0))
        try:
            while os.waitpid(-1, WNOHANG)[0] > 0:
                pass  # one that has ended: reaped here, its CPU time counts
        except ChildProcessError:
            return False
        return True

    def reap_leftovers(self):
        """Once the runner has killed what a test left: reap it (in a sandbox by ending the pid
        namespace, whose init reaps them, and starting a new one)."""
        if self.sandboxed:
            self.new_pid_namespace()
            return
        try:
            while os.waitpid(-1, 0)[0] > 0:
                pass
        except ChildProcessError:
            pass

    def in_test(self):
        """In a test just forked, before anything else: in a sandbox, mount the pid namespace's /proc
        if this is its first test and, where the test keeps the template's uid, drop every
        capability (one that drops to the programs' uid loses them all with it)."""
        if self.sandboxed:
            if self.mount_proc:
                source, target, fstype, flags, data = self.proc_mount
                _check(_libc.mount(source, target, fstype, flags, data), "mount /proc")
            if self.uid is None:
                keep_capabilities((), self.no_capabilities)

    def fork_test(self):
        """`os.fork()` for a test: the child starts with the highest OOM score, so that the kernel
        takes it first under memory pressure, while the template keeps its own. Raised here, around
        the fork, rather than in the child, which would open its /proc file for it (and copy the
        pages that touches). Where the template may not write its score, tests keep it."""
        if self.oom_score < 0:
            return os.fork()
        os.write(self.oom_score, b"1000")
        try:
            pid = os.fork()
        except OSError:
            os.write(self.oom_score, self.own_oom_score)
            raise
        if pid:
            os.write(self.oom_score, self.own_oom_score)
        return pid

    def _open_oom_score(self):
        """The template's /proc/self/oom_score_adj, open for writing, with its value; (-1, b"") where
        it may not write it (a /proc file its uid does not own: see PR_SET_DUMPABLE)."""
        try:
            fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return -1, b""
        try:
            value = os.read(fd, 16).strip()
            os.write(fd, value)  # what it will write back after each fork: refused here, or never
        except OSError:
            os.close(fd)
            return -1, b""
        return fd, value

    def _make_directories(self):
        for directory in self.directories:
            try:
                os.mkdir(directory)
            except FileExistsError:
                pass


# --- running one test -----------------------------------------------------------------------------


class Outcome:
    """What one run of a test (or compiler) produced."""

    def __init__(self):
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.result = bytearray()
        self.killed_for = None  # "time_limit" | "output_limit" | "memory_limit" when the runner killed it
        self.exit_code = None
        self.signal = None
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.memory_kb = 0


def run_process(submission, spec, stdin_data, limits, with_result_pipe=False):
    """Have the template fork a test of `submission` running `spec` (see `test_spec`) with fds
    0/1/2 (and 3 for a result) wired, and supervise it until it and every process it started have
    ended. Enforces the wall deadline, the output cap and the CPU time and memory of all its
    processes together."""
    output_limit = int(limits["output_limit"])
    stdin_fd = submission.stdin(stdin_data)
    pipes = [os.pipe() for _ in range(3 if with_result_pipe else 2)]
    started = time.monotonic()
    try:
        submission.fork_test([stdin_fd, *(write_end for _, write_end in pipes)], spec)
    except BaseException:
        for read_end, _ in pipes:
            os.close(read_end)
        raise
    finally:
        for _, write_end in pipes:
            os.close(write_end)
    outcome = Outcome()
    sinks = {pipes[0][0]: outcome.stdout, pipes[1][0]: outcome.stderr}
    caps = {pipes[0][0]: output_limit, pipes[1][0]: None}
    if with_result_pipe:
        sinks[pipes[2][0]], caps[pipes[2][0]] = outcome.result, output_limit
    poller = select.poll()
    try:
        status, maxrss_kb = _await_end(submission, outcome, sinks, caps, poller, limits, started)
        outcome.cpu_s = submission.finish_test()  # what the test left is killed and reaped first
        for fd in list(sinks):  # every writer is dead now: read what is left in the pipes
            while fd in sinks and select.select([fd], [], [], 0)[0]:
                if _pump(fd, sinks, caps, poller, final=True) == "over" and outcome.killed_for is None:
                    outcome.killed_for = "output_limit"
    finally:
        for fd in list(sinks):
            _close_sink(fd, sinks, poller)
    del outcome.stdout[output_limit:]
    outcome.memory_kb = max(outcome.memory_kb, maxrss_kb)
    if os.WIFSIGNALED(status):
        outcome.signal = os.WTERMSIG(status)
    else:
        outcome.exit_code = os.WEXITSTATUS(status)
    return outcome


def _await_end(submission, outcome, sinks, caps, poller, limits, started):
    """Pump output until the test ends, passes its wall limit, its output cap, or (all its processes
    together) its CPU time or memory; then kill all its processes. (wait status, peak RSS in kB) of
    the test's first process, as the template reports it once that has exited.

    For its first QUIET_S the output waits in its pipes: most tests end by then, and the runner
    wakes once, at the template's report, instead of at every write."""
    ended = submission.sock.fileno()  # readable once the template has reaped the test (or has gone)
    wall_limit = float(limits["wall_limit"])
    poller.register(ended, select.POLLIN)
    if submission.gone >= 0:  # readable once the template has exited (see `_answer`)
        poller.register(submission.gone, select.POLLIN)
    try:
        events = poller.poll(max(1, int(min(QUIET_S, wall_limit) * 1000)))
        if events:
            if not any(fd == ended for fd, _ in events):
                raise SubmissionLost()
            return submission.report(ready=True)
        for fd in sinks:
            poller.register(fd, select.POLLIN)
        if _replies is not None:  # the host hears of the tests before this one while it runs
            _replies.flush()
        submission.start_counting()
        next_check = time.monotonic() + TREE_CHECK_S
        while outcome.killed_for is None:
            now = time.monotonic()
            remaining = wall_limit - (now - started)
            if remaining <= 0:
                outcome.killed_for = "time_limit"
                break
            events = poller.poll(max(0, int(min(remaining, next_check - now) * 1000) + 1))
            for fd, _ in events:
                if fd != ended and _pump(fd, sinks, caps, poller) == "over":
                    outcome.killed_for = "output_limit"
            if any(fd == ended for fd, _ in events):
                outcome.wall_s = time.monotonic() - started
                return submission.report(ready=True)
            if any(fd == submission.gone for fd, _ in events):
                raise SubmissionLost()
            if time.monotonic() >= next_check:
                next_check += TREE_CHECK_S
                cpu_s, memory_kb = submission.usage_so_far()
                outcome.memory_kb = max(outcome.memory_kb, memory_kb)
                if cpu_s > float(limits["time_limit"]):
                    outcome.killed_for = "time_limit"
                elif memory_kb > int(limits["memory_limit"]) * 1024:
                    outcome.killed_for = "memory_limit"
    finally:
        poller.unregister(ended)
        if submission.gone >= 0:
            poller.unregister(submission.gone)
        if not outcome.wall_s:
            outcome.wall_s = time.monotonic() - started
    submission.kill_test()
    return submission.report()


def _pump(fd, sinks, caps, poller, final=False):
    """Move one chunk from a pipe into its buffer: 'more', 'eof', or 'over' (past its cap).
    `final`: every writer has gone, so a short read has emptied the pipe for good."""
    if fd not in sinks:
        return "eof"
    chunk = os.read(fd, READ_CHUNK)
    if not chunk:
        _close_sink(fd, sinks, poller)
        return "eof"
    sink, cap = sinks[fd], caps[fd]
    sink += chunk
    if cap is not None and len(sink) > cap:
        _close_sink(fd, sinks, poller)
        return "over"
    if cap is None and len(sink) > 2 * STDERR_TAIL:  # stderr: keep only its tail
        del sink[: len(sink) - STDERR_TAIL]
    if final and len(chunk) < READ_CHUNK:
        _close_sink(fd, sinks, poller)
        return "eof"
    return "more"


def _close_sink(fd, sinks, poller):
    try:
        poller.unregister(fd)
    except KeyError:
        pass
    os.close(fd)
    del sinks[fd]


def classify(outcome, limits):
    """The runner-side status of a finished run: ok (exited 0) or the limit or error it hit."""
    if outcome.killed_for:
        return outcome.killed_for
    if outcome.cpu_s > float(limits["time_limit"]) or outcome.signal == signal.SIGXCPU:
        return "time_limit"
    if outcome.signal == signal.SIGXFSZ:
        return "output_limit"
    if outcome.exit_code == 0 and outcome.signal is None:
        return "ok"
    memory_kb = int(limits["memory_limit"]) * 1024
    if (
        outcome.exit_code == MEMORY_ERROR_EXIT
        and b"MemoryError" in outcome.stderr
        or any(marker in outcome.stderr for marker in MEMORY_MARKERS)
        or outcome.signal == signal.SIGKILL  # the kernel's OOM killer: we did not send it
        or outcome.memory_kb >= memory_kb * 0.95
    ):
        return "memory_limit"
    return "runtime_error"


# --- the template and its submissions (see the module docstring) ---------------------------------


class SubmissionLost(Exception):
    """The template is gone, does not answer, or could not set up the submission: the sandbox
    itself failed."""


# How a test ended, as the template reports it, in the kernel's own layout (the template copies
# nothing): the wait status, whether processes of the test are left, the `struct rusage` of the
# test's first process and that of every process the template has reaped (see REAPED). A struct
# rusage: two timevals (user, system), then 14 longs, ru_maxrss (kB) first.
RUSAGE = struct.Struct("=4q14q")
# Every process the template has reaped (a `struct rusage`) and the pid of the submission's init
# (a new one once the runner has had what a test left reaped).
REAPED = struct.Struct("=%dsi" % RUSAGE.size)
REPORT = struct.Struct("=ii%ds%ds" % (RUSAGE.size, REAPED.size))
RUSAGE_CHILDREN, WNOHANG, WUNTRACED = -1, 1, 2


def _cpu_us(rusage):
    user_s, user_us, system_s, system_us, *_ = RUSAGE.unpack(rusage)
    return (user_s + system_s) * 1000000 + user_us + system_us


def _ask(sock, request, fds, size, gone=-1):
    """Send `request` (with file descriptors) and return the answer of `size` bytes, or SubmissionLost."""
    try:
        rights = (
            [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("%di" % len(fds), *fds))] if fds else []
        )
        sock.sendmsg([request], rights, _socket.MSG_NOSIGNAL)
    except OSError:
        raise SubmissionLost() from None
    return _answer(sock, size, gone=gone)


def _answer(sock, size, ready=False, gone=-1):
    """The template's answer of `size` bytes on `sock` (`ready`: known to be readable), or
    SubmissionLost when it does not come in time, or the template has exited (`gone`: a pidfd of
    it, readable then; -1 where there is none). An init outlives its template, and holds its end
    of the socket open: only the pidfd tells of the template's end."""
    try:
        if not ready:
            readable = select.select([sock] if gone < 0 else [sock, gone], [], [], TEMPLATE_ANSWER_S)[0]
            if sock not in readable:
                raise SubmissionLost()
        answer = sock.recv(size + 1)
    except OSError:
        raise SubmissionLost() from None
    if len(answer) != size:
        raise SubmissionLost()
    return answer


class Template:
    """The runner's end of its template, which serves one submission at a time."""

    def __init__(self, workdir, sandboxed, uid, scratch_bytes):
        self.sock, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        self.sandboxed, self.workdir = sandboxed, workdir
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                keep = theirs.fileno()
                os.closerange(3, keep)  # the runner's channel to the host among them
                os.closerange(keep + 1, 65536)
                code = template_main(theirs, workdir, sandboxed, uid, scratch_bytes)
            finally:
                os._exit(code)
        theirs.close()
        self.gone = _exit_watch(self.pid)

    def submission(self):
        """Have the template end the last submission (nothing of it runs once it answers) and set up
        the next (see `SubmissionSetup`); the runner's end of it."""
        mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        try:
            rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))]
            self.sock.sendmsg([b"Z"], rights, _socket.MSG_NOSIGNAL)
            reaped, init = REAPED.unpack(_answer(self.sock, REAPED.size, gone=self.gone))
        except (OSError, SubmissionLost):
            mine.close()
            raise SubmissionLost() from None
        finally:
            theirs.close()
        if init < 0:
            mine.close()
            raise OSError(-init, "cannot set up a submission: %s" % os.strerror(-init))
        return Submission(self, init, mine, _cpu_us(reaped))


def _exit_watch(pid):
    """A pidfd of child `pid`, readable once it has exited; -1 where there is none (a kernel before
    5.3, or the sandbox's Python 3.8)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


class Submission:
    """The runner's end of one submission, served by the template: its tests are forked there, into
    the submission's namespaces."""

    def __init__(self, template, init, sock, cpu_us):
        self.template, self.gone, self.init, self.sock = template.pid, template.gone, init, sock
        self.sandboxed, self.workdir = template.sandboxed, template.workdir
        self.cpu_us = cpu_us  # the CPU time of every process the template has reaped so far
        self._running = False  # whether a test was forked and its report not read yet
        self._leftovers = False
        self._counted_from = None
        self._stat = None  # an fd on the template's /proc stat file, opened for the first test that runs long
        self._stdin = None  # the memfd every test of the submission reads its stdin from (see `stdin`)
        self._spec_body = self._spec_rest = None  # the spec the template holds (see `fork_test`)
        self.resident = 0  # the pid of the process waiting to run the next Python stdin test, if any
        self._resident_us = 0  # its CPU time so far, as wait4 reported it when it stopped
        self._resident_ticks = 0  # its CPU time in clock ticks when `start_counting` was called
        self._memory_limit = 0  # bytes, of the last Python stdin test

    def fork_test(self, wiring, spec):
        """Start a test: `wiring` (fds 0, 1, 2 and maybe 3 of the test) and `spec` (see test_spec).

        The template keeps what a submission's tests share, the spec but its `call`, and is sent it
        only when it is not the one it holds: the same body (a compiled program or an argv, never
        changed once made) and the same rest, compared as marshalled bytes, which tell True from 1
        and 1.0 as == does not. A `call` (a function's arguments, a judged test's name) goes to
        the test alone, in a memfd of its own: the template never holds one test's inputs while it
        forks another."""
        shared = (spec[0], spec[1], None, *spec[3:])
        body, rest = spec[1], marshal.dumps((spec[0], *spec[3:]))
        call_fd = None
        try:
            if body is not self._spec_body or rest != self._spec_rest:
                self._send(b"S", [_memfd("spec", marshal.dumps(shared))], close=True)
                self._spec_body, self._spec_rest = body, rest
            self._running = True
            if spec[2] is None and spec[0] == "python" and self.sandboxed:
                self._memory_limit = dict(spec[3]).get(resource.RLIMIT_AS, (0, 0))[0]
                self._send(b"P", wiring)  # in the submission's resident process: see ResidentTest
            elif spec[2] is None:
                self._send(b"F", wiring)
            else:
                call_fd = _memfd("call", marshal.dumps(spec[2]))
                self._send(b"C", [*wiring, call_fd])
        except OSError:
            self._spec_body = self._spec_rest = None  # what the template holds is unknown
            raise SubmissionLost() from None
        finally:
            if call_fd is not None:
                os.close(call_fd)
        self._counted_from = None

    def stdin(self, data):
        """The memfd the next test reads `data` from, from its start: one per submission, rewritten
        for each test (making and freeing one per test cost more). Whatever a test wrote to its
        stdin goes with the rewrite, and nothing of the test that held it runs by then."""
        if self._stdin is None:
            self._stdin = os.memfd_create("stdin", 0)
        os.ftruncate(self._stdin, 0)
        os.pwrite(self._stdin, data, 0)
        os.lseek(self._stdin, 0, os.SEEK_SET)  # the test's fd 0 shares this file offset
        return self._stdin

    def _send(self, request, fds, close=False):
        try:
            rights = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("%di" % len(fds), *fds))
            self.sock.sendmsg([request], [rights], _socket.MSG_NOSIGNAL)
        finally:
            if close:
                for fd in fds:
                    os.close(fd)

    def report(self, ready=False):
        """(wait status, peak RSS in kB) of the test's first process once the template has reaped it
        (`ready`: its socket is known to be readable, or closed)."""
        status, flags, usage, reaped = REPORT.unpack(_answer(self.sock, REPORT.size, ready, self.gone))
        self._running = False
        self._leftovers, self._reaped, self.resident = bool(flags & 1), reaped, flags >> 1
        self._resident_us = _cpu_us(usage) if self.resident else 0
        if self.resident and not self._may_serve_again():
            self._leftovers = True  # killed with whatever else is left (see `finish_test`)
        return status, RUSAGE.unpack(usage)[4]

    def _may_serve_again(self):
        """Whether the resident process, stopped after a test, may run the next: it runs nothing else
        (one thread, no child; nothing left under the init, which the template has checked) and holds
        little memory (a quarter of the limit; what it holds counts in the next test's peak)."""
        stat = _stat(self.resident)
        if not stat or stat[0] != b"T" or stat[STAT_THREADS] != b"1":
            return False
        if int(stat[STAT_RSS]) * PAGE_SIZE > self._memory_limit // 4:
            return False
        try:
            return not read_file("/proc/%d/task/%d/children" % (self.resident, self.resident)).strip()
        except OSError:
            return False

    def finish_test(self):
        """Kill and reap whatever the test left running; the CPU seconds of all its processes."""
        reaped = self._reaped
        if self._leftovers:
            self.kill_test()
            reaped = _ask(self.sock, b"R", [], REAPED.size, self.gone)
        usage, self.init = REAPED.unpack(reaped)
        if self._leftovers:
            self.resident = self._resident_us = 0  # killed and reaped with the rest
        cpu_us = _cpu_us(usage) + self._resident_us  # every process the submission has had
        used, self.cpu_us = max(0, cpu_us - self.cpu_us), cpu_us
        return used / 1e6

    def start_counting(self):
        """Note what the template has reaped so far: `usage_so_far` counts from here."""
        fields = self._template_stat()
        self._counted_from = int(fields[STAT_CUTIME]) + int(fields[STAT_CSTIME]) if fields else 0
        stat = _stat(self.resident) if self.resident else None  # the test runs in it: count from here
        self._resident_ticks = int(stat[STAT_UTIME]) + int(stat[STAT_STIME]) if stat else 0

    def usage_so_far(self):
        """(CPU seconds, kB of memory) the running test's processes use together: those alive now
        and the CPU time of those reaped since `start_counting`."""
        fields = self._template_stat()
        ticks = int(fields[STAT_CUTIME]) + int(fields[STAT_CSTIME]) - self._counted_from if fields else 0
        ticks -= self._resident_ticks
        pages = 0
        for pid in self._test_processes():
            stat = _stat(pid)
            if stat:
                ticks += int(stat[STAT_UTIME]) + int(stat[STAT_STIME])
                pages += int(stat[STAT_RSS])
        return ticks / CLOCK_TICKS, pages * PAGE_SIZE // 1024

    def _test_processes(self):
        """Every process under the template but the init (which shares the template's memory and uses
        no CPU time): the running test's, and what it left."""
        return [pid for pid in descendants_of(self.template) if pid != self.init]

    def _template_stat(self):
        try:
            if self._stat is None:
                self._stat = os.open("/proc/%d/stat" % self.template, os.O_RDONLY | os.O_CLOEXEC)
            stat = os.pread(self._stat, READ_CHUNK, 0)
        except OSError:
            return None
        return stat[stat.rfind(b")") + 2 :].split()

    def kill_test(self):
        """Kill every process of the running test, and wait until none of them runs. (Not the init:
        the template reaps what it killed through it, see `SubmissionSetup.reap_leftovers`.)"""
        for _ in range(10000):
            running = [pid for pid in self._test_processes() if (_stat(pid) or [b"X"])[0] not in (b"Z", b"X")]
            if not running:
                return
            for pid in running:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.0005)
        raise RuntimeError("processes of a test outlive SIGKILL")

    def close(self):
        """End the submission on the runner's side: the template ends the rest (in a sandbox, killing
        the init takes every process of the namespace with it) before it sets up the next one."""
        if self._running or not self.sandboxed:  # the template waits for the test it forked
            self.kill_test()
        self.sock.close()
        for fd in (self._stat, self._stdin):
            if fd is not None:
                os.close(fd)
        if not self.sandboxed:
            wipe(self.workdir)


def _memfd(name, data):
    """A memfd holding `data`, read from its start."""
    fd = os.memfd_create(name, 0)
    try:
        os.pwrite(fd, data, 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def prepare_template(sandboxed, uid):
    """What the template does to itself once: in a sandbox it empties its bounding set (the runner
    left only RUNNER_CAPABILITIES there; the template keeps them in its permitted set, which is all
    it needs) and, with a programs' `uid`, its supplementary groups."""
    if sandboxed:
        drop_from_bounding_set(RUNNER_CAPABILITIES)
        if uid is not None:
            os.setgroups([])


def template_main(requests, workdir, sandboxed, uid, scratch_bytes):
    """Serve the runner until it goes away: for each request, enter a new submission (see
    `SubmissionSetup`), send REAPED with its init's pid (or -errno), and serve its tests until the
    runner closes its socket."""
    atexit._clear()  # what the runner's interpreter registered is not a program's to run at its end
    prepare_template(sandboxed, uid)
    _install_test_main(workdir)
    setup = SubmissionSetup(workdir, sandboxed, uid, scratch_bytes)
    buffers = ReportBuffers()
    recvmsg, space, socket = requests.recvmsg, _socket.CMSG_SPACE(4), _socket.socket
    try:
        while True:
            data, ancillary, _, _ = recvmsg(1, space)
            if not data:
                return 0
            sock = socket(fileno=memoryview(ancillary[0][2]).cast("i")[0])
            try:
                buffers.init.value = setup.enter()
            except OSError as exc:
                buffers.init.value = -(exc.errno or 1)
            buffers.getrusage(RUSAGE_CHILDREN, buffers.reaped)  # what the submission's CPU times count from
            try:
                requests.send(buffers.report[8 + RUSAGE.size :], _socket.MSG_NOSIGNAL)
                if buffers.init.value >= 0:
                    _serve_tests(sock, buffers, setup)
            except OSError:
                return 1  # the runner has gone
            finally:
                sock.close()
    finally:
        if sandboxed:
            setup.end_init()


class ReportBuffers:
    """Where the template's kernel calls write how a test ended (see REPORT), and the C functions
    that write there, made once: the template then makes little to serve a test (ctypes makes a
    function the first time it is named, and a buffer is many objects), and each page it writes
    after a fork is a page it copies."""

    def __init__(self):
        self.report = ctypes.create_string_buffer(REPORT.size)
        self.status = ctypes.c_int.from_buffer(self.report, 0)
        self.leftovers = ctypes.c_int.from_buffer(self.report, 4)
        self.init = ctypes.c_int.from_buffer(self.report, REPORT.size - 4)
        self.usage, self.reaped = ctypes.byref(self.report, 8), ctypes.byref(self.report, 8 + RUSAGE.size)
        self.at_status = ctypes.byref(self.status)
        self.wait4, self.getrusage = _libc.wait4, _libc.getrusage


def _serve_tests(sock, buffers, setup):
    """Serve one submission's tests: for each request fork a test, reap it, and report how it ended.

    Requests: "S" with a memfd holding a test spec (see `test_spec`) without its `call`, which the
    template keeps for the tests after it (a submission's tests mostly share theirs); "F" with a
    test's fds 0-2 (and 3), which forks a test running the spec kept last; "C", the same with a last
    fd, a memfd holding the test's own `call`; "P", the same as "F" for a Python stdin test of the
    spec kept last, run in the submission's resident test process (see `ResidentTest`; any other
    request ends that process first); "R", which reaps what the last test left once the runner has
    killed it. Only the tests read the memfds: the template serves every submission, and
    all it forks inherits its memory, so no submission's program or data may ever enter it (live or
    freed, for a later submission's tests to find).
    A test that could not be forked, or should have mounted its pid namespace's /proc and did not,
    ends the submission: the runner finds it lost."""
    report, leftovers, usage, reaped, init = (
        buffers.report,
        buffers.leftovers,
        buffers.usage,
        buffers.reaped,
        buffers.init,
    )
    at_status, wait4, getrusage = buffers.at_status, buffers.wait4, buffers.getrusage
    fork, close = setup.fork_test, os.close
    recvmsg, send, space = sock.recvmsg, sock.send, _socket.CMSG_SPACE(8 * 4)
    spec = -1  # the memfd of the spec kept last
    resident = ResidentTest(setup)
    try:
        while True:
            data, ancillary, _, _ = recvmsg(1, space)
            if not data:
                return
            if data == b"R":  # the runner killed what the last test left: reap it
                resident.end()
                setup.reap_leftovers()
                getrusage(RUSAGE_CHILDREN, reaped)
                init.value = setup.init
                send(report[8 + RUSAGE.size :], _socket.MSG_NOSIGNAL)
                continue
            fds = memoryview(ancillary[0][2]).cast("i").tolist() if ancillary else []
            if data == b"P":
                if not resident.run_test(fds, spec, buffers):
                    return
                for fd in fds:
                    close(fd)
                leftovers.value = setup.leftovers() | resident.pid << 1
                getrusage(RUSAGE_CHILDREN, reaped)
                init.value = setup.init
                send(report, _socket.MSG_NOSIGNAL)
                continue
            if resident.pid:  # only Python stdin tests of one spec, one after another, share it
                resident.end()
            if data == b"S":  # kept, not read: see above
                if spec >= 0:
                    close(spec)
                spec = fds[0]
                continue
            try:
                pid = fork()
            except OSError:  # no process to be had (the sandbox's own limit): the submission is lost
                for fd in fds:
                    close(fd)
                return
            if pid == 0:
                _become_test(fds, spec, data == b"C", setup)
            wait4(pid, at_status, 0, usage)
            for fd in fds:  # closed once the test has ended: the pages this writes are no longer shared
                close(fd)
            if setup.mount_proc and not setup.proc_mounted():
                return
            leftovers.value = setup.leftovers()
            getrusage(RUSAGE_CHILDREN, reaped)
            init.value = setup.init
            send(report, _socket.MSG_NOSIGNAL)
    finally:
        resident.end()
        if spec >= 0:
            close(spec)


class ResidentTest:
    """The template's side of a submission's resident test process: the one process that runs the
    submission's Python stdin/stdout tests one after another, instead of a fork for each (see
    "resident tests" in `serve_resident_tests`). It is forked into the submission's namespaces like
    any test, and ends with the submission, or sooner.

    After each test it stops itself (SIGSTOP), having first said on its channel with what exit code
    the program ended; the template wakes it for the next test by handing it the test's fds on the
    channel, then SIGCONT. The template reads only the stop and at most one message (`recv`, which
    takes in no fds a program might send): whatever the program writes there can at most end its
    own test early, with the exit code it chose. How much CPU time and memory the process used the
    template learns from the kernel (wait4 reports a stopped child's usage too), never from it."""

    def __init__(self, setup):
        self.setup, self.pid, self.channel = setup, 0, None
        self.peak = -1  # an fd on the process's /proc clear_refs, opened once (see `_forget_peak`)

    def run_test(self, wiring, spec, buffers):
        """Run a test with fds 0-2 `wiring` in the waiting process, or in a new one forked for it;
        False when none could be forked (the submission is lost). When it returns, the test's
        status is in `buffers` and `pid` is the process if it waits for another test, else 0."""
        if self.pid and not self._wake(wiring):
            self.end()
        if not self.pid:
            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
            try:
                pid = self.setup.fork_test()
            except OSError:
                ours.close()
                theirs.close()
                for fd in wiring:
                    os.close(fd)
                return False
            if pid == 0:
                _become_test(wiring, spec, False, self.setup, resident=theirs.fileno())
            theirs.close()
            self.pid, self.channel = pid, ours
        status = buffers.status
        while True:
            buffers.wait4(self.pid, buffers.at_status, WUNTRACED, buffers.usage)
            if status.value & 0xFF != 0x7F:  # ended (exited or killed): no longer waits
                self._forget()
                return True
            try:
                said = self.channel.recv(8, _socket.MSG_DONTWAIT)
            except OSError:
                said = b""
            if len(said) == 4 and status.value >> 8 == signal.SIGSTOP:
                status.value = (int.from_bytes(said, "little") & 0xFF) << 8  # as if it had exited
                return True
            # Stopped by the program, not at a test's end: it stays so until the runner kills it.

    def _wake(self, wiring):
        """Hand the waiting process a test's fds and let it go on; False when it cannot take them."""
        rights = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("%di" % len(wiring), *wiring))
        try:
            self.channel.sendmsg([b"T"], [rights], _socket.MSG_DONTWAIT | _socket.MSG_NOSIGNAL)
            self._forget_peak()
            os.kill(self.pid, signal.SIGCONT)
        except OSError:
            return False
        return True

    def _forget_peak(self):
        """Reset the process's peak memory to what it holds now, so that wait4 reports the next
        test's own peak. Best effort: where the kernel refuses, the peak reported is the process's."""
        try:
            if self.peak < 0:
                self.peak = os.open("%d/clear_refs" % self.pid, os.O_WRONLY, dir_fd=self.setup.own_proc)
            os.write(self.peak, b"5")
        except (OSError, AttributeError):
            pass

    def end(self):
        """Kill and reap the waiting process, if any (its CPU time then counts among the reaped)."""
        if not self.pid:
            return
        kill_and_reap(self.pid)
        self._forget()

    def _forget(self):
        """Close what the template holds of a process that has ended."""
        self.channel.close()
        if self.peak >= 0:
            os.close(self.peak)
        self.pid, self.channel, self.peak = 0, None, -1


def _install_test_main(workdir):
    """Make the empty `__main__` module every test runs its program in: once in the template, so
    that each test gets its own copy with the fork and has less to build (and fewer pages to copy);
    and in the resident test process after each test, for the next."""
    module = types.ModuleType("__main__")
    module.__file__ = os.path.join(workdir, "main.py")
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module


def test_spec(kind, body, limits, language, uid, workdir, call=None, files=()):
    """What a forked test needs to run: `kind` "python" (`body` compiled code, `call` None or a
    function's (name, arguments)), "exec" (`body` an argv; `files` (path, text) pairs it writes
    first) or one of HARNESSES (given `body` and `call`), under `limits` as for `language`, as
    `uid` (None: the template's own) in `workdir`."""
    return (kind, body, call, rlimits(limits, language), uid, workdir, tuple(files))


def _become_test(wiring, spec_fd, with_call, setup, resident=-1):
    """In a test the template forked: set up as `setup.in_test` says, its own process group, fds
    0/1/2 (and 3) `wiring` and nothing else open, the rlimits and uid of the spec in the memfd
    `spec_fd` (see `test_spec`); then the spec runs, with the `call` from the memfd last in `wiring`
    when `with_call`. With a `resident` channel (a Python stdin test's spec) the process goes on
    to serve the submission's next tests too (see `serve_resident_tests`). Never returns.

    One function with no closures, and the signal dispositions a fresh program has are the
    runner's own (see `main`): after the fork every page a test writes is a page it copies."""
    code = 127
    try:
        setup.in_test()
        spec = marshal.loads(os.pread(spec_fd, os.lseek(spec_fd, 0, os.SEEK_END), 0))
        kind, body, call, limits, uid, workdir, files = spec
        if with_call:  # read before any dup2 could put another fd where it is
            call_fd = wiring.pop()
            call = marshal.loads(os.pread(call_fd, os.lseek(call_fd, 0, os.SEEK_END), 0))
        os.setpgid(0, 0)
        if resident >= 0:  # first: the wiring's fds are all below it
            os.dup2(resident, RESIDENT_CHANNEL_FD, inheritable=False)
            limits = resident_limits(limits)
        os.dup2(wiring[0], 0)
        os.dup2(wiring[1], 1)
        os.dup2(wiring[2], 2)
        if len(wiring) > 3:
            os.dup2(wiring[3], 3)
        if resident >= 0:
            os.closerange(len(wiring), RESIDENT_CHANNEL_FD)
            os.closerange(RESIDENT_CHANNEL_FD + 1, 65536)
        else:
            os.closerange(len(wiring), 65536)
        for resource_kind, value in limits:
            resource.setrlimit(resource_kind, value)
        if uid is not None:  # the template has no supplementary groups left to drop
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        if resident >= 0:
            code = serve_resident_tests(body, workdir, limits)
        elif kind == "python":
            code = run_python(body, call, workdir)
        elif kind in HARNESSES:
            code = HARNESSES[kind](body, call, workdir)()
        else:
            os.chdir(workdir)
            for path, text in files:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(text)
            _signal.signal(  # not signal.signal: its enums cost a forked test page copies
                _signal.SIGXFSZ, _signal.SIG_DFL
            )  # Python ignores it; a program past its file size limit dies of it
            os.execve(body[0], body, CLEAN_ENV)
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the template
        try:
            os.write(2, ("runner: %r\n" % (exc,)).encode())
        except OSError:
            pass
    os._exit(code)


# --- resident tests ------------------------------------------------------------------------------
#
# A submission's Python stdin/stdout tests run one after another in one process of the submission
# (see `ResidentTest`), not in a fork each: a fork costs the template's page tables and the pages
# each test writes again (about 1.4 ms a test on a 2-core VM), a wake-up costs two context switches.
# The process belongs to the submission as a test does: made in its namespaces, as the programs'
# uid, under the test's rlimits, and killed with the submission at the latest. What the program
# can touch outside it (the scratch files) its tests already share; what it leaves in the process
# is reset to how it found it, or the process serves no further test. Its CPU time, memory and
# processes are counted from outside (wait4's usage of the stopped process, /proc), so nothing it
# says about itself counts but its exit code, which a program chooses anyway.

RESIDENT_CHANNEL_FD = 255  # the resident's end of its channel to the template (RLIMIT_NOFILE is 256)
RESIDENT_CPU_TESTS = 8  # how many tests' CPU time limits its RLIMIT_CPU holds (see `resident_limits`)
# At most how many more objects (allocated blocks) a test may leave for the process to free after
# it and still serve the next: freeing them one by one (a millisecond or two for these) is charged
# to the test, which a forked test, whose memory the kernel drops at once, is not.
RESIDENT_LEFT_BLOCKS = 100_000


def resident_limits(limits):
    """A test's rlimits for the resident process: the CPU time's hard limit raised to hold several
    tests (each test's own soft limit is set when it starts; the runner counts each test's CPU time)."""
    changed = []
    for resource_kind, (soft, hard) in limits:
        if resource_kind == resource.RLIMIT_CPU:
            hard = soft * RESIDENT_CPU_TESTS + 1
        changed.append((resource_kind, (soft, hard)))
    return changed


class ProcessState:
    """What a program can change in its process that a fresh interpreter would not have. Taken once,
    in the template (`_prepare_python_tests`): a resident process only compares with it, at C speed
    and touching few objects (after the fork, each page it writes, reference counts included, is a
    page it copies). `unchanged` tells whether a test left the process as it found it, but for what
    `restore` puts back; a program that changed more ends its process with its test."""

    def __init__(self):
        self.module_count = len(sys.modules)
        self.environ = os.environ
        self.environ_data = dict(os.environ._data)  # as the C environment has it: bytes to bytes
        self.builtins = tuple(vars(builtins_module()).values())
        self.path = tuple(sys.path)
        self.settings = self._settings()
        self.signals = tuple(_signal.valid_signals())
        self.handlers = tuple(map(_signal.getsignal, self.signals))
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.scheduling = self._scheduling()

    @staticmethod
    def _scheduling():
        """The process's priority, scheduling, CPUs, blocked signals and timers."""
        timers = (_signal.ITIMER_REAL, _signal.ITIMER_VIRTUAL, _signal.ITIMER_PROF)
        return (
            os.nice(0),
            os.sched_getscheduler(0),
            os.sched_getaffinity(0),
            _signal.pthread_sigmask(_signal.SIG_BLOCK, ()),
            tuple(map(_signal.getitimer, timers)),
        )

    @staticmethod
    def _settings():
        digits = getattr(sys, "get_int_max_str_digits", None)  # Python 3.11 on
        return (
            sys.getrecursionlimit(),
            sys.getswitchinterval(),
            digits() if digits else None,
            gc.isenabled(),
            gc.get_threshold(),
            sys.excepthook,
            sys.displayhook,
            sys.breakpointhook,
        )

    def unchanged(self, limits, session):
        """Whether the process can serve another test: no module imported, no thread left, no
        builtin, signal handler, trace hook, priority, scheduling, CPU affinity, blocked signal,
        timer or rlimit (`limits`, but for its CPU time, see `restore`) changed, still its own
        process group in `session` (as its pid namespace sees it); and CPU time left under its hard
        limit for a whole test more."""
        if len(sys.modules) != self.module_count or _thread._count() or atexit._ncallbacks():
            return False
        builtins = vars(builtins_module())  # compared by identity: no program's __eq__ runs here
        if len(builtins) != len(self.builtins) or not all(
            map(operator.is_, builtins.values(), self.builtins)
        ):
            return False
        if not all(map(operator.is_, map(_signal.getsignal, self.signals), self.handlers)):
            return False
        if sys.gettrace() is not None or sys.getprofile() is not None:
            return False
        if os.getpgid(0) != os.getpid() or os.getsid(0) != session or self._scheduling() != self.scheduling:
            return False
        (_, (cpu_seconds, cpu_hard)), *others = limits  # see `rlimits`: the CPU time first
        if any(resource.getrlimit(kind) != tuple(value) for kind, value in others):
            return False
        return math.ceil(_own_cpu_s()) + cpu_seconds + 1 <= cpu_hard

    def restore(self, limits):
        """Put back what the next test must find as a fresh interpreter has it: argv, environment,
        module path, interpreter settings and umask; and give it the CPU time its limit allows
        from here (the soft limit, over what the process has used)."""
        sys.argv = list(TEST_ARGV)
        environ = self.environ  # compared as stored (a mapping's decoded copy costs far more)
        if os.environ is not environ or environ._data != self.environ_data:
            os.environ = environ  # noqa: B003 - the interpreter's own mapping, put back
            environ.clear()
            environ.update(CLEAN_ENV)
        sys.path = list(self.path)  # set, not compared: comparing could run a program's code
        recursion, interval, digits, gc_enabled, threshold, *hooks = self.settings
        sys.setrecursionlimit(recursion)
        sys.setswitchinterval(interval)
        if digits is not None:
            sys.set_int_max_str_digits(digits)
        (gc.enable if gc_enabled else gc.disable)()
        gc.set_threshold(*threshold)
        sys.excepthook, sys.displayhook, sys.breakpointhook = hooks
        os.umask(self.umask)
        (_, (cpu_seconds, cpu_hard)), *_ = limits
        soft = min(math.ceil(_own_cpu_s()) + cpu_seconds, cpu_hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))


def builtins_module():
    return sys.modules["builtins"]


def _own_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def serve_resident_tests(body, workdir, limits):
    """In the resident process, set up as a test: run the program for this test, then for each test
    the template hands over (see `ResidentTest`), each in a fresh `__main__` with a fresh stdin,
    argv and environment. Between tests the program's fds are closed and fds 0-2 are /dev/null
    (what it still writes goes nowhere); the process reports the exit code and stops itself. The
    exit code of the last test is returned (to exit with) once the process cannot serve another:
    after a test that failed, left over RESIDENT_LEFT_BLOCKS objects, or left what `_left_as_found`
    cannot put back."""
    state, session = _process_state, os.getsid(0)
    space = _socket.CMSG_SPACE(4 * 4)
    gc.freeze()  # what it inherited: the collection after each test then walks only its own objects
    while True:
        blocks = sys.getallocatedblocks()
        code = run_python(body, None, workdir)
        if code != 0 or sys.getallocatedblocks() - blocks > RESIDENT_LEFT_BLOCKS:
            return code  # ends as a forked test does, its memory dropped by the kernel
        _quiet_fds()
        if not _left_as_found(state, limits, session, workdir):
            return code
        try:
            os.write(RESIDENT_CHANNEL_FD, code.to_bytes(4, "little"))
        except OSError:
            return code
        os.kill(os.getpid(), signal.SIGSTOP)
        code = 127  # past here, a failure is this next test's
        channel = _socket.socket(fileno=RESIDENT_CHANNEL_FD)
        try:
            _, ancillary, _, _ = channel.recvmsg(1, space)
        finally:
            channel.detach()
        wiring = memoryview(ancillary[0][2]).cast("i").tolist()
        for target, fd in enumerate(wiring):
            os.dup2(fd, target)
            os.close(fd)
        _install_streams(_text_streams())  # a new stdin: the last one's buffer may hold the last input


def _left_as_found(state, limits, session, workdir):
    """After a test that exited 0, with fds 0-2 on /dev/null: let go of all the test had (the
    program's `__main__`, the streams, its garbage, cycles included: what their finalizers print
    goes nowhere, and nothing of them is left to run in a later test), then tell whether the
    process can serve another test as a fresh interpreter would (see `ProcessState`), putting back
    what the program changed. False when it cannot, or anything here raised."""
    try:
        streams = _test_stdio
        sys.stdin = sys.stdout = sys.stderr = sys.__stdin__ = sys.__stdout__ = sys.__stderr__ = None
        _install_test_main(workdir)
        for stream in streams:  # flushed into /dev/null, not into the next test's pipes
            _closed(stream)
        gc.collect()
        _quiet_fds()  # again: what the program's objects closed or opened as they went
        state.restore(limits)
        return state.unchanged(limits, session)  # checked last: whatever ran before counts
    except BaseException:  # noqa: BLE001 - a program's leftovers broke it: the next test gets a fresh process
        return False


def _closed(stream):
    try:
        stream.close()
    except BaseException:  # noqa: BLE001 - detached, or its buffer closed by a program's own wrapper
        pass


def _quiet_fds():
    """In the resident process between tests: /dev/null as fds 0-2 (what is still written goes
    nowhere, and the next test's fds, which arrive at the lowest free numbers, land above them),
    no other fd open but the channel."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, RESIDENT_CHANNEL_FD)  # the program's own, and devnull


def _install_streams(streams):
    """Make `streams` what the program finds as sys.stdin, stdout and stderr (and sys.__stdin__ ...)."""
    global _test_stdio
    _test_stdio = streams
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


# How `python3` makes its standard streams when they are not a terminal (fd, mode, errors, line
# buffering): buffered, UTF-8 with the errors it uses in the sandbox's locale (C.UTF-8), "\n" the
# only newline (a "\r" read is kept), stderr line-buffered; each stream has its `mode`, and its raw
# file the name "<stdin>", "<stdout>" or "<stderr>".
STANDARD_STREAMS = (
    (0, "r", "surrogateescape", False),
    (1, "w", "surrogateescape", False),
    (2, "w", "backslashreplace", True),
)


def _text_streams():
    """What a Python program finds as sys.stdin, stdout and stderr: text streams over fds 0-2, as
    `python3` makes them (see STANDARD_STREAMS)."""
    streams = []
    for fd, mode, errors, line_buffering in STANDARD_STREAMS:
        raw = io.FileIO(fd, mode, closefd=False)
        raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
        buffer = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(buffer, "utf-8", errors, "\n", line_buffering)
        stream.mode = mode
        streams.append(stream)
    return tuple(streams)


# --- languages ------------------------------------------------------------------------------------


def run_python(code, call, workdir):
    """In a Python test: run the compiled module in this forked interpreter; `call` is None (a
    stdin/stdout test: the program is `__main__`) or the (name, arguments) of the function to call
    (the program is the module `solution`, as for assert tests: its `if __name__ == "__main__":`
    block, a driver of its own, does not run). The exit code."""
    os.chdir(workdir)
    # __main__ is empty (see _install_test_main); argv and streams are set too
    module = sys.modules["__main__"] if call is None else _solution_module(workdir)
    if call is not None:
        module.__builtins__ = LeetCodeBuiltins(vars(builtins))
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


# What LeetCode's Python environment gives a solution without an import: these modules, and the
# names they export (the typing generics, Counter, deque, heappush, bisect_left, cache, inf, ...),
# earlier modules first. A program called as a function (a function_call test, LeetCode's shape)
# finds them where it would find a builtin, after its own names and Python's builtins: they never
# shadow either, and a program that would have run without them runs as it did.
LEETCODE_MODULES = ("collections", "heapq", "bisect", "itertools", "functools", "math", "string", "typing")
LEETCODE_MODULE_NAMES = LEETCODE_MODULES + ("re", "random", "operator")


class LeetCodeBuiltins(dict):
    """Python's builtins, then (looked up on first use) what LeetCode's environment provides."""

    def __missing__(self, name):
        import importlib

        if name in LEETCODE_MODULE_NAMES:
            return importlib.import_module(name)
        for module_name in LEETCODE_MODULES:
            module = importlib.import_module(module_name)
            if name in getattr(module, "__all__", ()) or (
                not hasattr(module, "__all__") and not name.startswith("_") and hasattr(module, name)
            ):
                return getattr(module, name)
        raise KeyError(name)


def _solution_module(directory):
    """An empty module `solution`, in sys.modules, for a program loaded as a module rather than run
    as a script (its `if __name__ == "__main__":` block does not run)."""
    module = types.ModuleType("solution")
    module.__file__ = os.path.join(directory, "solution.py")
    module.__builtins__ = __builtins__
    sys.modules["solution"] = module
    return module


def _prepare_python_tests():
    """Set up, once, what every forked Python test starts from: a clean environment and text
    streams over fds 0-2 (each test child rewires those fds first). Made here rather than in
    every child, since each page a child writes is a copy-on-write fault."""
    global _process_state
    os.environ.clear()
    os.environ.update(CLEAN_ENV)
    # Streams remember what their fd was when made (seekable or not): make stdout and stderr over
    # a pipe, as the tests' own are, then put the runner's fds 1 and 2 back.
    saved = os.dup(1), os.dup(2)
    read_end, write_end = os.pipe()
    for fd in (1, 2):
        os.dup2(write_end, fd)
    try:
        streams = _text_streams()
    finally:
        for fd, original in zip((1, 2), saved):
            os.dup2(original, fd)
            os.close(original)
        os.close(read_end)
        os.close(write_end)
    # Installed here, once, and inherited by every test: a test that replaced the interpreter's own
    # streams and argv would free them, writing to many pages it shares with the template.
    _install_streams(streams)
    sys.argv = list(TEST_ARGV)
    _install_site_builtins()
    _warm_up_type_caches()
    _process_state = ProcessState()


_test_stdio = None  # the runner itself never uses these; see _prepare_python_tests
_process_state = None
TEST_ARGV = ("main.py",)

# What a small test usually does: read words and numbers from stdin, compute, print.
WARM_UP_PROGRAM = """
import sys
data = sys.stdin.read().split()
numbers = list(map(int, data[:2]))
lengths = {word: len(word) for word in data[2:]}
print(sum(numbers), max(lengths, key=lengths.get), sorted(lengths.items()), " ".join(map(str, numbers)))
"""


def _install_site_builtins():
    """The builtins the `site` module adds, which a program run as `python3 main.py` finds and the
    runner's interpreter (`-S`) lacks: `exit` and `quit` (end the program as `sys.exit` does),
    `help`, `copyright`, `credits` and `license`."""
    builtins = builtins_module()
    for name in ("exit", "quit"):
        setattr(builtins, name, _sitebuiltins.Quitter(name, "Ctrl-D (i.e. EOF)"))
    builtins.help = _sitebuiltins._Helper()
    builtins.copyright = _sitebuiltins._Printer("copyright", sys.copyright)
    for name in ("credits", "license"):
        setattr(builtins, name, _sitebuiltins._Printer(name, "See https://www.python.org/"))


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
    atexit hooks, flush sys.stdout and sys.stderr (a failure is an error) and the original ones (if
    the program swapped them; failures ignored). Closed, detached or None streams are left alone."""
    try:
        _finish_threads()
    except BaseException:  # noqa: BLE001 - as in python, trouble at exit does not change the outcome
        pass
    for current, original in zip((sys.stdout, sys.stderr), _test_stdio[1:]):
        if not _flushed(current):
            exit_code = exit_code or 1
        if original is not current:  # the program swapped it
            _flushed(original)
    return exit_code


def _flushed(stream):
    """Flush `stream` as interpreter shutdown does (None and closed streams are left alone);
    False when that failed."""
    try:
        if stream is not None and not stream.closed:
            stream.flush()
    except BaseException:  # noqa: BLE001
        return False
    return True


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
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and callable(getattr(value, fn_name, None))
            ):
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


# --- judged tests: assert and pytest ---------------------------------------------------------------
#
# An assert or pytest test runs in two processes. The judge is the test the template forks: it holds
# the verdict pipe (fd 3) and, before it reads the test's code (its stdin), forks the program's
# process. That process closes fd 3 and stdin at once, loads the program as the module `solution`,
# tells the judge its top-level names and from then on only answers the judge's requests over a
# socket: call this, get that attribute, iterate this. Values cross as plain data (exact builtin
# types, as tagged JSON); every other object stays in the program's process and crosses as a
# handle, which the judge never compares. Arguments are copies: the lists, dicts, sets and
# bytearrays a call changed in place come back with its value, and the judge changes its own the
# same way. The test's code runs in the judge alone, with the judge's own builtins and modules. So the program decides what its
# functions return and raise, and nothing else: not how the judge compares, not which code the
# judge runs, not the verdict, which only the judge can write. (docs/verifiers/sandbox-security.md)

JUDGED_TESTS = ("assert", "pytest")
# Modules a program's top-level name may stand for in the judge, which then binds its own copy:
# MBPP-style asserts use the modules the program imported (`math.isclose`), and the program's copy
# may have been patched.
JUDGE_MODULES = frozenset(
    "bisect cmath collections copy datetime decimal fractions functools heapq itertools json math"
    " operator random re statistics string typing".split()
)
MESSAGE_TAIL = 1000  # characters of an exception's text that cross from the program


class ProgramEnded(BaseException):
    """In the judge: the program's process ended (or broke its channel) before the test finished.
    Not an Exception: a test's `except Exception` does not swallow it."""


class ProgramError(Exception):
    """In the judge: the program raised an exception of a class the judge does not have."""


class Channel:
    """Length-prefixed JSON frames over a stream socket (judge <-> program); `limit` caps a frame."""

    def __init__(self, sock, limit):
        self.sock, self.limit = sock, limit

    def send(self, message):
        body = json.dumps(message).encode("utf-8")
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def receive(self):
        """The next frame's bytes; None when the other end has gone."""
        header = self._exact(4)
        if header is None:
            return None
        size = struct.unpack(">I", header)[0]
        if size > self.limit:
            raise ValueError("the program sent %d bytes, past the output limit" % size)
        return self._exact(size)

    def _exact(self, size):
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(min(size - len(data), 1 << 20))
            if not chunk:
                return None
            data += chunk
        return bytes(data)


def encode_value(value, other):
    """`value` as JSON-ready data: exact builtin types by value (tuples, dicts, sets, bytes,
    complex numbers and huge integers tagged), anything else as `other(value)` makes it."""
    kind = type(value)
    if value is None or kind is bool or kind is float or kind is str:
        return value
    if kind is int:
        return value if value.bit_length() < 8192 else {"i": "%x" % value}
    if kind is list:
        return [encode_value(item, other) for item in value]
    if kind is tuple:
        return {"t": [encode_value(item, other) for item in value]}
    if kind is dict:
        return {"d": [[encode_value(k, other), encode_value(v, other)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {"s" if kind is set else "f": [encode_value(item, other) for item in value]}
    if kind is bytes or kind is bytearray:
        return {"b" if kind is bytes else "y": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    return other(value)


def value_hook(reference, rebuild, lent):
    """The json object hook that turns tagged data back into values; `reference(tagged)` makes
    what a handle ("r") stands for, `lent(tagged)` what a lent function or iterator of the judge's
    ("j") stands for, `rebuild(name, value)` a known standard-library value ("x")."""
    makers = {
        "t": tuple,
        "s": set,
        "f": frozenset,
        "b": bytes.fromhex,
        "y": bytearray.fromhex,
        "d": dict,
        "c": lambda parts: complex(*parts),
        "i": lambda digits: int(digits, 16),
    }

    def hook(tagged):
        if "r" in tagged:
            return reference(tagged)
        if "j" in tagged:
            return lent(tagged)
        if "n" in tagged and len(tagged) == 1:
            return _named_tuple(*tagged["n"])
        if "x" in tagged and len(tagged) == 2:
            return rebuild(tagged["x"], tagged["v"])
        if len(tagged) != 1:
            raise ValueError("malformed value from the other process")
        ((tag, payload),) = tagged.items()
        return makers[tag](payload)

    return hook


# Standard-library values a program returns that cross by value: (module, class) -> how the program's
# process turns one into plain data; the judge rebuilds it with its own class.
STDLIB_VALUES = {
    ("collections", "Counter"): lambda value: list(value.items()),
    ("collections", "OrderedDict"): lambda value: list(value.items()),
    ("collections", "defaultdict"): lambda value: list(value.items()),
    ("collections", "deque"): list,
    ("fractions", "Fraction"): lambda value: [value.numerator, value.denominator],
    ("decimal", "Decimal"): str,
    ("builtins", "range"): lambda value: [value.start, value.stop, value.step],
    ("datetime", "date"): lambda value: value.isoformat(),
    ("datetime", "time"): lambda value: value.isoformat(),
    ("datetime", "datetime"): lambda value: value.isoformat(),
    ("datetime", "timedelta"): lambda value: [value.days, value.seconds, value.microseconds],
}


def stdlib_value(value, encode):
    """A known standard-library value as tagged plain data ("x"), or a named tuple ("n", by its
    type's name, its fields and its values), or None."""
    kind = type(value)
    if isinstance(value, tuple) and kind is not tuple and type(getattr(kind, "_fields", None)) is tuple:
        return {"n": [kind.__name__, list(kind._fields), encode(list(value))]}
    convert = STDLIB_VALUES.get((getattr(kind, "__module__", None), kind.__name__))
    if convert is None:
        return None
    return {"x": "%s.%s" % (kind.__module__, kind.__name__), "v": encode(convert(value))}


_NAMED_TUPLE_TYPES = {}  # (name, fields) -> the namedtuple type this process made for them


def _named_tuple(name, fields, values):
    """A named tuple the other process sent, of a type of this process's own (made once per name
    and fields by `collections.namedtuple`, which takes identifiers only)."""
    if type(name) is not str or type(fields) is not list or type(values) is not list:
        raise ValueError("a malformed named tuple")
    key = (name, tuple(fields))
    kind = _NAMED_TUPLE_TYPES.get(key)
    if kind is None:
        kind = _NAMED_TUPLE_TYPES[key] = collections.namedtuple(name, fields)
    return kind(*values)


def _rebuild_stdlib(name, value):
    module_name, _, class_name = name.partition(".")
    if (module_name, class_name) not in STDLIB_VALUES:
        raise ValueError("unknown value type %r" % (name,))
    cls = getattr(__import__(module_name), class_name)
    if class_name == "Fraction":
        numerator, denominator = value
        if type(numerator) is not int or type(denominator) is not int:
            raise ValueError("a Fraction of non-integers")
        return cls(numerator, denominator)
    if class_name == "Decimal":
        return cls(str(value))
    if class_name in ("range", "timedelta"):
        if type(value) is not list or not all(type(part) is int for part in value):
            raise ValueError("a %s of non-integers" % class_name)
        return cls(*value)
    if module_name == "datetime":
        return cls.fromisoformat(str(value))
    if class_name == "defaultdict":
        return cls(None, value)
    return cls(dict(value)) if class_name == "Counter" else cls(value)


# --- the program's side

PROGRAM_OPS = {
    "getattr": getattr,
    "setattr": setattr,
    "getitem": lambda target, key: target[key],
    "len": len,
    "iter": iter,
    "next": next,
    "contains": lambda target, item: item in target,
    "repr": repr,
    "str": str,
    "bool": bool,
    "isinstance": lambda cls, value: isinstance(value, cls),
    "issubclass": lambda cls, other: issubclass(other, cls),
    "fields": lambda value: [type(value), [getattr(value, field.name) for field in _compared_fields(value)]],
}


def _comparison(value):
    """How an object of the program's compares natively, where the judge can do the same on data:
    "i" by identity (its class keeps object's `__eq__`, or an Enum member), "f" field by field (a
    dataclass's generated `__eq__`); None otherwise. (Claimed by the program: a claim only ever
    makes the judge compare the program's own data, as the program's class would.)"""
    kind = type(value)
    if kind.__eq__ is object.__eq__ or isinstance(value, type):  # an Enum's members too
        return "i"
    params = getattr(kind, "__dataclass_params__", None)
    if params is not None and getattr(params, "eq", False):
        return "f"
    return None


def _compared_fields(value):
    import dataclasses

    return [field for field in dataclasses.fields(value) if field.compare]


def _exception_bases(cls, handle_of):
    """[the nearest builtin exception class's name, the nearest base of the program's (as a handle)
    or None]: what the judge makes its stand-in class from."""
    parent = None
    for base in cls.__mro__[1:]:
        if base.__module__ == "builtins":
            return [base.__name__, parent]
        if parent is None and issubclass(base, BaseException):
            parent = handle_of(base)
    return ["Exception", parent]


# Arguments a function may change in place, whose new contents go back to the judge after a call.
MUTABLE_ARGUMENTS = (list, dict, set, bytearray)
MUTABLE_ARGUMENTS_SET = frozenset(MUTABLE_ARGUMENTS)


def call_changing(target, args, kwargs, encode):
    """`target(*args, **kwargs)` in the program's process, and the arguments it changed in place:
    [[position or keyword, the argument's new contents, encoded], ...] (a test that passes a list to
    a function that sorts it in place looks at its own list afterwards)."""
    mutable = [
        (key, value) for key, value in [*enumerate(args), *kwargs.items()] if type(value) in MUTABLE_ARGUMENTS
    ]
    before = [_snapshot(value) for _, value in mutable]
    result = target(*args, **kwargs)
    return result, [
        [key, encode(value)] for (key, value), old in zip(mutable, before) if _changed(value, old)
    ]


def _changed(value, snapshot):
    try:
        return bool(value != snapshot)
    except Exception:  # noqa: BLE001 - an object of the program's that cannot be compared: sent again
        return True


def _snapshot(value):
    """A copy of a list, dict, set or bytearray deep enough to tell by `!=` whether it was changed
    since: the lists, dicts, sets and bytearrays in it copied too, anything else held as it is."""
    if type(value) is dict:
        copy = dict(value)
        if not MUTABLE_ARGUMENTS_SET.isdisjoint(map(type, copy.values())):
            for key, item in copy.items():
                if type(item) in MUTABLE_ARGUMENTS:
                    copy[key] = _snapshot(item)
        return copy
    copy = value.copy()
    if type(copy) is list and not MUTABLE_ARGUMENTS_SET.isdisjoint(map(type, copy)):
        for index, item in enumerate(copy):
            if type(item) in MUTABLE_ARGUMENTS:
                copy[index] = _snapshot(item)
    return copy


def serve_program(program, channel):
    """In the program's process: load the program as the module `solution`, report its top-level
    names (their values go to the judge one by one, as its test first uses each: a table the test
    never reads costs nothing), then answer the judge's requests until it closes the channel.
    It ends the process, with the program's exit code if the program exits."""
    objects, handles = [], {}

    def handle_of(value):
        if type(value) is Lent:
            return {"j": value.index}
        known = stdlib_value(value, encode)
        if known is not None:
            return known
        kind = type(value)
        handle = handles.get(id(value))
        if handle is None:
            handle = handles[id(value)] = len(objects)
            objects.append(value)
        tagged = {"r": handle, "k": kind.__name__, "c": callable(value)}
        if isinstance(value, types.ModuleType):
            tagged["m"] = value.__name__
        elif isinstance(value, type) and issubclass(value, BaseException):
            tagged["k"] = value.__name__
            tagged["e"] = _exception_bases(value, handle_of)
        compares = _comparison(value)
        if compares:
            tagged["q"] = compares
        return tagged

    def encode(value):
        return encode_value(value, handle_of)

    def reference(tagged):
        handle = tagged["r"]
        if type(handle) is not int or not 0 <= handle < len(objects):
            raise ValueError("no such object")
        return objects[handle]

    def answer(message):
        """The reply to one of the judge's requests (None: load the program)."""
        try:
            if message is None:
                exec(program, module.__dict__)
                return ["value", _loaded_names(vars(module), encode)]
            op, *args = message
            if op == "global":
                return ["value", encode(vars(module)[args[0]])]
            if op == "output":  # for capsys: what the program printed since (the first asks start it)
                return ["value", captured.read()]
            if op == "call":
                result, changed = call_changing(*args, encode)
                return ["value", encode(result), changed]
            return ["value", encode(PROGRAM_OPS[op](*args))]
        except SystemExit as exc:  # the program ends its process, here or deep in its calls
            code = _system_exit_code(exc)
            _send_quietly(channel, ["ended", code])
            _flushed(sys.stdout)
            os._exit(code)
        except BaseException as exc:  # noqa: BLE001 - the judge decides what a raise means
            reply = ["raised", _exception_name(exc), _exception_text(exc)]
            if type(exc).__module__ != "builtins":
                reply.append(handle_of(type(exc)))  # the judge raises its stand-in for the class
            return reply

    def send(reply):
        try:
            channel.send(reply)
        except (TypeError, ValueError) as exc:  # a value json cannot write (a recursive list, say)
            channel.send(["raised", type(exc).__name__, _exception_text(exc)])

    def receive():
        body = channel.receive()
        if body is None:  # the judge is done
            _flushed(sys.stdout)
            os._exit(0)
        return json.loads(body, object_hook=hook)

    def ask_judge(index, op, *args):
        """Have the judge run its lent function (or iterator) `index`, serving what it asks
        meanwhile; its value, or its exception raised here."""
        send(["callback", index, op, *(encode(arg) for arg in args)])
        while True:
            message = receive()
            if message and message[0] in ("value", "raised"):
                break
            send(answer(message))
        if message[0] == "value" and len(message) == 2:
            return message[1]
        cls = getattr(builtins, str(message[1]), None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            raise cls(str(message[2]))
        raise RuntimeError("%s: %s" % (message[1], message[2]))

    hook = value_hook(reference, _rebuild_stdlib, lambda tagged: Lent(tagged, ask_judge))
    captured = CapturedOutput(channel.limit)
    module = _solution_module(os.getcwd())
    send(answer(None))
    while True:
        send(answer(receive()))


# What crosses by value (see `encode_value` and `stdlib_value`). Of the program's top-level names, the
# judge gets with their list those that cross as handles (functions, classes, other objects: a
# handle is live); the others' values wait until the test reads them (see `ProgramNames`).
BY_VALUE = (bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset, type(None))


def _loaded_names(namespace, encode):
    """[{name: value} of the names whose values cross as handles, [the other names]] (see above)."""
    sent, held = {}, []
    for name, value in namespace.items():
        if name.startswith("__"):
            continue
        kind = type(value)
        if isinstance(value, BY_VALUE) or (getattr(kind, "__module__", None), kind.__name__) in STDLIB_VALUES:
            held.append(name)
        else:
            sent[name] = value
    return [encode(sent), held]


class CapturedOutput:
    """In the program's process, once a test's capsys first asks: `sys.stdout` and `sys.stderr`
    replaced by buffers (of at most `limit` characters each), which `read` empties."""

    def __init__(self, limit):
        self.limit, self.streams = limit, None

    def read(self):
        """[what the program wrote to stdout, to stderr] since the last read (or since capturing
        started, at the first)."""
        if self.streams is None:
            self.streams = sys.stdout, sys.stderr = _CappedText(self.limit), _CappedText(self.limit)
            return ["", ""]
        return [stream.take() for stream in self.streams]


class _CappedText(io.StringIO):
    """A text buffer that keeps its first `limit` characters (a program printing without end fills
    no memory) and is emptied by `take`."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def write(self, text):
        super().write(text[: max(0, self.limit - self.tell())])
        return len(text)

    def take(self):
        text = self.getvalue()
        self.seek(0)
        self.truncate()
        return text


class Lent:
    """In the program's process: a function or iterator of the test's that the judge lent it (a
    `key=`, a lambda, a generator); calling it, or asking its next item, has the judge do it."""

    __slots__ = ("index", "_callable", "_iterator", "_ask")

    def __init__(self, tagged, ask):
        self.index, self._ask = tagged["j"], ask
        self._callable, self._iterator = tagged.get("c") is True, tagged.get("i") is True

    def __call__(self, *args, **kwargs):
        if not self._callable:
            raise TypeError("the test's object is not callable")
        return self._ask(self.index, "call", list(args), kwargs)

    def __iter__(self):
        if not self._iterator:
            raise TypeError("the test's object is not iterable")
        return self

    def __next__(self):
        if not self._iterator:
            raise TypeError("the test's object is not an iterator")
        return self._ask(self.index, "next")


def _exception_name(exc):
    kind = type(exc)
    return kind.__name__ if kind.__module__ == "builtins" else "%s.%s" % (kind.__module__, kind.__qualname__)


def _exception_text(exc):
    try:
        return str(exc)[:MESSAGE_TAIL]
    except BaseException:  # noqa: BLE001 - a program's __str__ may raise
        return ""


def _send_quietly(channel, message):
    try:
        channel.send(message)
    except OSError:
        pass


# --- the judge's side


class Remote:
    """In the judge: an object that lives in the program's process, reached through its handle.
    It can be called, indexed, iterated, asked for attributes, `isinstance` and its truth (what the
    program answers there it could as well have returned as plain data). It is compared only where
    its class compares as the judge can on data (`compares`: "i" by identity, "f" a dataclass's
    fields; see `_comparison`), never by the program's own `__eq__`."""

    __slots__ = ("_link", "_handle", "_type", "_callable", "_compares")

    def __init__(self, link, handle, type_name, is_callable, compares):
        for name, value in zip(self.__slots__, (link, handle, type_name, is_callable, compares)):
            object.__setattr__(self, name, value)

    def _ask(self, op, *args):
        return self._link.ask(op, self, *args)

    def __call__(self, *args, **kwargs):
        return self._link.call(self, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", name, value)

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __len__(self):
        return self._ask("len")

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __contains__(self, item):
        return self._ask("contains", item)

    def __repr__(self):
        return self._ask("repr")

    def __str__(self):
        return self._ask("str")

    def _refuse(self, *_):
        raise TypeError(
            "the program returned a %s object: tests compare plain data (numbers, strings, lists, "
            "tuples, dicts, sets) only" % (self._type,)
        )

    def __bool__(self):
        return self._callable or self._truth("bool")

    def __instancecheck__(self, value):
        return self._truth("isinstance", value)

    def __subclasscheck__(self, other):
        return self._truth("issubclass", other)

    def _truth(self, op, *args):
        truth = self._ask(op, *args)
        if type(truth) is not bool:
            raise ValueError("the program's process broke the protocol")
        return truth

    def __eq__(self, other):
        if self._compares == "i":
            return other is self  # one Remote per handle: the same object in the program's process
        if self._compares == "f":
            if type(other) is not Remote or other._compares != "f":
                return False  # a dataclass's __eq__ compares instances of its own class only
            (mine, fields), (theirs, other_fields) = self._ask("fields"), other._ask("fields")
            return mine is theirs and fields == other_fields
        return self._refuse()

    def __ne__(self, other):
        return not self == other

    __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __hash__ = object.__hash__


# What the judge may lend the program to call: builtin functions of these modules but these names,
# builtin types and the methods of builtin types (`str.lower`), and operator's getters; besides the
# functions and generators of the test's own code. Never anything that reaches into objects or runs
# code given as data: the program chooses the arguments.
LENDABLE_MODULES = ("builtins", "math", "cmath", "operator")
UNLENDABLE = frozenset(
    "getattr setattr delattr hasattr vars dir eval exec compile globals locals __import__ open input"
    " print breakpoint help memoryview classmethod staticmethod property super type object __build_class__".split()
)
LENDABLE_TYPES = (
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    list,
    tuple,
    set,
    frozenset,
    dict,
    range,
    reversed,
    enumerate,
    zip,
    map,
    filter,
)


def lendable(value):
    """Whether the judge lends `value` to the program, which may then call it (or take its next
    item), never more (see `Lent`)."""
    kind = type(value)
    if kind is types.FunctionType:
        return value.__code__.co_filename == "<test>"
    if kind is types.GeneratorType:
        return value.gi_code.co_filename == "<test>"
    if kind is types.MethodType:
        return lendable(value.__func__)
    if kind is functools.partial:
        return lendable(value.func)
    if kind is types.BuiltinFunctionType:
        owner = value.__self__
        if isinstance(owner, types.ModuleType):
            return owner.__name__ in LENDABLE_MODULES and value.__name__ not in UNLENDABLE
        return type(owner) in LENDABLE_TYPES  # a bound method of a plain value: "abc".startswith
    if kind in (types.MethodDescriptorType, types.ClassMethodDescriptorType):
        return value.__objclass__ in LENDABLE_TYPES
    if kind is type:
        return value in LENDABLE_TYPES
    if kind in (operator.itemgetter, operator.attrgetter):
        return True
    return kind.__module__ in ("builtins", "itertools") and hasattr(kind, "__next__")


class Link:
    """In the judge: the channel to the program's process and the handles it has sent."""

    def __init__(self, channel, pid):
        self.channel, self.pid, self.ended = channel, pid, None
        self.remotes = {}
        self.stand_ins = {}  # the judge's exception class for an exception class of the program: its handle
        self.lent, self.lent_index = [], {}  # what the judge lent the program (see `Lent`), by id
        self.hook = value_hook(self._remote, _rebuild_stdlib, self._lent_object)
        self.exceptions = {
            name: value
            for name, value in vars(__import__("builtins")).items()
            if isinstance(value, type) and issubclass(value, Exception)
        }

    def _remote(self, tagged):
        handle = tagged["r"]
        if type(handle) is not int:
            raise ValueError("malformed handle from the program")
        module = tagged.get("m")
        if module in JUDGE_MODULES:
            return __import__(module)
        remote = self.remotes.get(handle)
        if remote is None:
            if "e" in tagged:
                remote = self._stand_in(handle, tagged)
            else:
                compares = tagged.get("q") if tagged.get("q") in ("i", "f") else None
                remote = Remote(self, handle, str(tagged.get("k")), tagged.get("c") is True, compares)
            self.remotes[handle] = remote
        return remote

    def _stand_in(self, handle, tagged):
        """The judge's own class for an exception class of the program's: a subclass of the builtin
        one the program's derives from (or of the stand-in of its base), so that `except`, `pytest.raises`
        and `isinstance` take it as they would take the program's class."""
        builtin, parent = tagged["e"] if type(tagged["e"]) is list and len(tagged["e"]) == 2 else ("", None)
        if isinstance(parent, type) and parent in self.stand_ins:
            base = parent
        else:
            base = self.exceptions.get(builtin if type(builtin) is str else "", Exception)
        try:
            stand_in = type(str(tagged.get("k")), (base,), {"__module__": "solution"})
        except TypeError:  # a name no class can have
            stand_in = type("ProgramException", (base,), {"__module__": "solution"})
        self.stand_ins[stand_in] = handle
        return stand_in

    def _reference(self, value):
        if type(value) is Remote and value._link is self:
            return {"r": value._handle}
        if isinstance(value, type) and value in self.stand_ins:
            return {"r": self.stand_ins[value]}
        if lendable(value):
            index = self.lent_index.get(id(value))
            if index is None:
                index = self.lent_index[id(value)] = len(self.lent)
                self.lent.append(value)
            return {"j": index, "c": callable(value), "i": hasattr(type(value), "__next__")}
        known = stdlib_value(value, lambda inner: encode_value(inner, self._reference))
        if known is not None:
            return known
        raise TypeError(
            "a %s cannot be passed to the program: only plain data and the program's own objects can"
            % type(value).__name__
        )

    def _lent_object(self, tagged):
        index = tagged["j"]
        if type(index) is not int or not 0 <= index < len(self.lent):
            raise ValueError("the program's process broke the protocol")
        return self.lent[index]

    def _run_lent(self, message):
        """Run what the program asked of a function or iterator the judge lent it, and answer."""
        op, args, kwargs = (message + [None, None])[2:5]
        if op == "call" and (len(message) != 5 or type(args) is not list or type(kwargs) is not dict):
            raise ValueError("the program's process broke the protocol")
        if op not in ("call", "next") or (op == "next" and len(message) != 3):
            raise ValueError("the program's process broke the protocol")
        target = self._lent_object({"j": message[1]})
        try:
            value = target(*args, **kwargs) if op == "call" else next(target)
            reply = encode_value(["value", value], self._reference)
        except Exception as exc:  # noqa: BLE001 - the program's to catch, as it would in one process
            reply = ["raised", type(exc).__name__, _exception_text(exc)]
        try:
            self.channel.send(reply)
        except OSError:
            pass  # the next reply tells why

    def load(self):
        """The program's top-level names (its reply to having been loaded), each fetched from its
        process when first read (see `ProgramNames`)."""
        names = self._reply()
        if type(names) is not list or len(names) != 2:
            raise ValueError("the program's process sent no names")
        sent, held = names
        if (
            type(sent) is not dict
            or type(held) is not list
            or not all(type(name) is str for name in [*sent, *held])
        ):
            raise ValueError("the program's process sent no names")
        return ProgramNames(self, sent, held)

    def output(self):
        """[out, err]: what the program printed since the last ask (see `CapturedOutput`)."""
        self._send(["output"])
        printed = self._reply()
        if type(printed) is not list or len(printed) != 2 or not all(type(part) is str for part in printed):
            raise ValueError("the program's process broke the protocol")
        return printed

    def global_value(self, name):
        """The value of the program's top-level `name`."""
        self._send(["global", name])
        return self._reply()

    def ask(self, op, remote, *args):
        """Have the program's process do `op` on `remote`; its value, or its exception raised here."""
        self._send([op, remote, *args])
        return self._reply()

    def call(self, remote, args, kwargs):
        """Call `remote` with `args` and `kwargs`; its value, once the arguments it changed in place
        (lists, dicts, sets, bytearrays) are changed the same way here (see `call_changing`)."""
        self._send(["call", remote, list(args), kwargs])
        value, changed = self._reply(changes=True)
        if type(changed) is not list:
            raise ValueError("the program's process broke the protocol")
        for change in changed:
            if type(change) is not list or len(change) != 2:
                raise ValueError("the program's process broke the protocol")
            key, contents = change
            if type(key) is int and 0 <= key < len(args):
                argument = args[key]
            elif type(key) is str and key in kwargs:
                argument = kwargs[key]
            else:
                raise ValueError("the program's process broke the protocol")
            if type(argument) not in MUTABLE_ARGUMENTS or type(contents) is not type(argument):
                raise ValueError("the program's process broke the protocol")
            update_in_place(argument, contents)
        return value

    def _send(self, message):
        if self.ended is not None:
            raise ProgramEnded(self.ended)
        try:
            self.channel.send(encode_value(message, self._reference))
        except OSError:
            pass  # the reply tells why

    def _reply(self, changes=False):
        """The value the program's process answered (and, for a call, the arguments it changed),
        once it has had the judge run what it lent it as often as it asked."""
        while True:
            reply = self._message()
            if type(reply) is not list or not reply or reply[0] != "callback":
                break
            self._run_lent(reply)
        if type(reply) is not list or not reply or reply[0] not in ("value", "raised", "ended"):
            raise ValueError("the program's process broke the protocol")
        if reply[0] == "value" and len(reply) == 2 + changes:
            return reply[1:] if changes else reply[1]
        if reply[0] == "ended":
            self.ended = (
                "the program ended its process before the test finished (exit code %r)"
                % (reply[1:2] or [None])[0]
            )
            raise ProgramEnded(self.ended)
        name, text = (str(part) for part in reply[1:3])
        cls = self.exceptions.get(name)
        if len(reply) == 4 and isinstance(reply[3], type) and reply[3] in self.stand_ins:
            cls = reply[3]
        try:
            exc = cls(text) if cls is not None else ProgramError("%s: %s" % (name, text))
        except Exception:  # noqa: BLE001 - a class that takes other arguments
            exc = ProgramError("%s: %s" % (name, text))
        raise exc

    def _message(self):
        try:
            body = self.channel.receive()
        except OSError:
            body = None
        if body is None:
            self.ended = "the program's process ended before the test finished" + self._exit_status()
            raise ProgramEnded(self.ended)
        return json.loads(body, object_hook=self.hook)

    def _exit_status(self):
        try:
            pid, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return ""
        if os.WIFSIGNALED(status):
            return " (signal %d)" % os.WTERMSIG(status)
        return " (exit code %d)" % os.WEXITSTATUS(status)


class ProgramNames(dict):
    """In the judge: the program's top-level names, as a namespace: those `sent` with the list, and
    the `held` ones, each fetched from the program's process when first read, and kept. A test's
    code runs with it as its globals (assert tests) or behind the module `solution` (pytest tests)."""

    def __init__(self, link, sent, held):
        super().__init__(sent)
        self.link, self.names = link, frozenset([*sent, *held])

    def __missing__(self, name):
        if name not in self.names:
            raise KeyError(name)
        value = self[name] = self.link.global_value(name)
        return value

    def module(self):
        """The program as the module `solution`: its names read through this namespace."""
        solution = types.ModuleType("solution")
        solution.__getattr__ = self._attribute
        solution.__all__ = sorted(name for name in self.names if not name.startswith("_"))
        return solution

    def _attribute(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError("module 'solution' has no attribute %r" % (name,)) from None


def update_in_place(argument, contents):
    """Make `argument` (a list, dict, set or bytearray) hold `contents`, of the same type, keeping the
    lists, dicts, sets and bytearrays in it that stay where they were (a test may hold one: a row of
    a matrix rotated in place)."""
    if type(argument) is list:
        for index in range(min(len(argument), len(contents))):
            _update_item(argument, index, contents[index])
        del argument[len(contents) :]
        argument.extend(contents[len(argument) :])
    elif type(argument) is dict:
        for key in [key for key in argument if key not in contents]:
            del argument[key]
        for key, value in contents.items():
            if key in argument:
                _update_item(argument, key, value)
            else:
                argument[key] = value
    elif type(argument) is set:
        argument.clear()
        argument.update(contents)
    else:
        argument[:] = contents


def _update_item(container, key, value):
    held = container[key]
    if type(held) in MUTABLE_ARGUMENTS and type(held) is type(value):
        update_in_place(held, value)
    else:
        container[key] = value


def judged_child(program, test, workdir):
    """Child body for an assert or pytest test, `test` = (kind, name, frame limit): fork the program's process,
    read the test's code from stdin, run it against the program, write the verdict on fd 3."""

    kind, name, limit = test

    def main():
        os.chdir(workdir)
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program's process cannot open our fds or memory
        mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(3)  # the verdict pipe: never the program's
                mine.close()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)  # the test's code stays the judge's
                os.close(null)
                serve_program(program, Channel(theirs, limit))  # ends the process itself
            finally:
                os._exit(code)
        theirs.close()
        code = read_to_end(0).decode("utf-8")
        verdict = run_judged(kind, name, code, Link(Channel(mine, limit), pid))
        os.write(3, json.dumps(verdict).encode("utf-8"))
        sys.stdout.flush()
        mine.close()  # the program's process sees the end of its channel and exits
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # reaped already
        return 0

    return main


def read_to_end(fd):
    chunks = []
    while chunk := os.read(fd, READ_CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def run_judged(kind, name, code, link):
    """Run an assert test's code, or one test of a pytest module, against the program; the verdict
    {"status": "passed" | "wrong_answer" | "runtime_error", "message"?}."""
    try:
        names = link.load()
        compiled = compile(code, "<test>", "exec", dont_inherit=True)
        if kind == "assert":
            names.update(__name__="__test__", __builtins__=__builtins__)
            exec(compiled, names)
        else:
            run_pytest_test(compiled, name, names)
    except AssertionError as exc:
        return {"status": "wrong_answer", "message": _failure(exc, code, "assertion failed")}
    except ProgramEnded as exc:
        return {"status": "runtime_error", "message": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - any other failure of the test fails it
        return {"status": "runtime_error", "message": _failure(exc, code, type(exc).__name__)}
    return {"status": "passed"}


def _failure(exc, code, what):
    """'<what> at line N: <the test's line>: <exception text>'."""
    import traceback

    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == "<test>":
            line = frame.lineno
    text = what
    if line is not None:
        lines = code.splitlines()
        shown = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        text += " at line %d: %s" % (line, shown[:200])
    detail = str(exc)
    if detail and detail != what:
        text += ": " + detail[:MESSAGE_TAIL]
    return text


def run_pytest_test(compiled, name, names):
    """Run the test `name` ("test_x" or "TestClass::test_x") of a pytest-style module, with the
    program importable as `solution` and a small `pytest` (raises, approx, fail, skip, mark.parametrize)."""
    sys.modules["solution"] = names.module()
    sys.modules["pytest"] = pytest_module()
    module = types.ModuleType("test_solution")
    module.__file__ = "test_solution.py"
    exec(compiled, module.__dict__)
    owner, _, method = name.partition("::")
    if not method:
        return _run_parametrized(getattr(module, owner), module, names.link)
    instance = getattr(module, owner)()
    target = getattr(instance, method)
    if hasattr(instance, "setup_method"):
        instance.setup_method(target)
    try:
        _run_parametrized(target, module, names.link)
    finally:
        if hasattr(instance, "teardown_method"):
            instance.teardown_method(target)


class SkippedTest(Exception):
    """pytest.skip in the judge: the test counts as passed, as pytest does not count it failed."""


def _run_parametrized(function, module, link):
    """Run `function` once per case of its parametrize marks, each with the fixtures of `module`
    its other arguments name (and the module's autouse fixtures) made afresh."""
    cases = [{}]
    for names, values in reversed(getattr(function, "_parametrize", [])):
        names = [part.strip() for part in names.split(",")] if isinstance(names, str) else list(names)
        expanded = []
        for value in values:
            if isinstance(value, _Param):
                value = value.values
            elif len(names) == 1:
                value = (value,)
            expanded.append(dict(zip(names, value)))
        cases = [dict(case, **more) for case in cases for more in expanded]
    autouse = [name for name, value in vars(module).items() if _fixture_of(value).get("autouse")]
    for case in cases:
        fixtures = Fixtures(module, link)
        try:
            for name in autouse:
                fixtures.value(name)
            wanted = [name for name in _parameters(function) if name not in case]
            function(**case, **{name: fixtures.value(name) for name in wanted})
        except SkippedTest:
            pass
        finally:
            fixtures.finish()


class Capsys:
    """pytest's capsys in the judge: `readouterr()` is what the program printed (to `sys.stdout`
    and `sys.stderr`, in its own process) since the last call, then what the test printed."""

    def __init__(self, link):
        self.link = link
        self.link.output()  # the program's process captures from here
        self.own = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()

    def readouterr(self):
        out, err = self.link.output()
        mine = [stream.getvalue() for stream in (sys.stdout, sys.stderr)]
        for stream in (sys.stdout, sys.stderr):
            stream.seek(0)
            stream.truncate()
        return CaptureResult(out + mine[0], err + mine[1])


CaptureResult = collections.namedtuple("CaptureResult", "out err")


def _fixture_of(value):
    """What `@pytest.fixture` noted on a function of the test's ({} for anything else)."""
    return value.__dict__.get("_fixture", {}) if type(value) is types.FunctionType else {}


def _parameters(function):
    """The names of `function`'s parameters (a bound method's but its first)."""
    code = function.__code__ if hasattr(function, "__code__") else function.__func__.__code__
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return names[1:] if isinstance(function, types.MethodType) else names


class Fixtures:
    """The fixtures of a test module one test asks for, made as pytest makes them: each once, its
    own arguments first; a generator's code after its `yield` runs once the test is done, the last
    made first. Every scope is the test's own (each test runs in a judge of its own). Of pytest's
    own fixtures there is `capsys` (see `Capsys`)."""

    def __init__(self, module, link):
        self.module, self.link, self.values, self.generators = module, link, {}, []

    def value(self, name):
        if name == "capsys" and not _fixture_of(getattr(self.module, name, None)):
            self.values.setdefault(name, Capsys(self.link))
        if name not in self.values:
            function = getattr(self.module, name, None)
            if not _fixture_of(function):
                raise NameError("fixture %r not found" % (name,))
            made = function(**{argument: self.value(argument) for argument in _parameters(function)})
            if isinstance(made, types.GeneratorType):
                self.generators.append(made)
                made = next(made)
            self.values[name] = made
        return self.values[name]

    def finish(self):
        while self.generators:
            next(self.generators.pop(), None)


class _Param:
    def __init__(self, *values, **_):
        self.values = values


class _ExceptionInfo:
    value = type = tb = None

    def match(self, pattern):
        if not re.search(pattern, str(self.value)):
            raise AssertionError("pattern %r not found in %r" % (pattern, str(self.value)))
        return True


class _Raises:
    def __init__(self, expected, match):
        self.expected, self.pattern, self.info = expected, match, _ExceptionInfo()

    def __enter__(self):
        return self.info

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError("DID NOT RAISE %r" % (self.expected,))
        if not issubclass(kind, self.expected):
            return False
        self.info.value, self.info.type, self.info.tb = value, kind, tb
        if self.pattern is not None:
            self.info.match(self.pattern)
        return True


class _Approx:
    def __init__(self, expected, rel=None, abs=None):  # noqa: A002 - pytest's own names
        self.expected = expected
        self.rel = 1e-6 if rel is None else rel
        self.abs = 1e-12 if abs is None else abs

    def __eq__(self, actual):
        return self._close(actual, self.expected)

    __hash__ = None

    def __repr__(self):
        return "approx(%r)" % (self.expected,)

    def _close(self, actual, expected):
        if isinstance(expected, dict):
            return (
                isinstance(actual, dict)
                and actual.keys() == expected.keys()
                and all(self._close(actual[k], expected[k]) for k in expected)
            )
        if isinstance(expected, (list, tuple)):
            return (
                isinstance(actual, (list, tuple))
                and len(actual) == len(expected)
                and all(self._close(a, e) for a, e in zip(actual, expected))
            )
        numbers = (int, float, complex)
        if isinstance(expected, numbers) and not isinstance(expected, bool):
            if not isinstance(actual, numbers) or isinstance(actual, bool):
                return False
            if actual == expected:
                return True
            return abs(actual - expected) <= max(self.rel * abs(expected), self.abs)
        return actual == expected


def pytest_module():
    """The small `pytest` a judged test module may import."""
    module = types.ModuleType("pytest")

    def raises(expected, *args, match=None, **kwargs):
        context = _Raises(expected, match)
        if not args:
            return context
        with context:
            args[0](*args[1:], **kwargs)
        return context.info

    def parametrize(names, values, **_):
        def mark(function):
            function._parametrize = [*getattr(function, "_parametrize", []), (names, list(values))]
            return function

        return mark

    def skip(reason=""):
        raise SkippedTest(reason)

    def fail(reason=""):
        raise AssertionError(reason)

    def skipped(function):
        def run(*_, **__):
            raise SkippedTest("marked skip")

        return run

    def skip_mark(*args, **_):  # @mark.skip, @mark.skip(reason=...), and xfail alike: not run
        return skipped(args[0]) if len(args) == 1 and callable(args[0]) else skipped

    def skipif(condition, *_, **__):
        return skipped if condition else (lambda function: function)

    def fixture(function=None, *, autouse=False, **_):  # @pytest.fixture, @pytest.fixture(...)
        def mark(target):
            target._fixture = {"autouse": bool(autouse)}
            return target

        return mark(function) if callable(function) else mark

    module.raises, module.approx, module.skip, module.fail = raises, _Approx, skip, fail
    module.param, module.fixture = _Param, fixture
    module.mark = types.SimpleNamespace(
        parametrize=parametrize,
        skip=skip_mark,
        skipif=skipif,
        xfail=skip_mark,
        timeout=lambda *_, **__: lambda f: f,
    )
    return module


# --- checkers ----------------------------------------------------------------------------------------
#
# A checker judges a stdin_stdout test whose task accepts many outputs, testlib-style: it runs as
# `checker INPUT OUTPUT ANSWER` (the test's input, the program's output, the expected output) and
# exits 0 to accept. It is built once per task (the runner keeps what it built in its own memory, out
# of every program's reach) in a submission's namespaces before that submission's program is compiled,
# and it runs after each of the program's tests, once every process of that test is gone, as a
# process of its own under its own limits. Its three files are memfds made in that process and its
# binary (or source) reaches it on stdin: nothing of it lies on a file system a program can write.

# How C++ is built, programs and checkers alike: GNU C++20 (C++17 programs build too, bar rare
# corners), with ONLINE_JUDGE defined as contest judges define it (a program that reads a local
# input.txt unless it is set finds its stdin).
CPP_FLAGS = ("-O2", "-std=gnu++20", "-DONLINE_JUDGE", "-pipe")

CHECKER_BINARY_LIMIT = 64 << 20  # bytes of a built checker
CHECKER_CACHE = 32  # checkers the runner keeps built
TESTLIB_FAIL_EXIT = 3  # testlib's exit code for a checker that failed (not the program)
_built_checkers = {}  # (language, source) -> the binary (cpp) or the source (python), as bytes


def build_checker(checker, toolchains, compile_limits, submission, uid, workdir):
    """(what `run_checker` runs, None) for the task's checker, built once per task; or (None, why not)."""
    language, source = checker["language"], checker["source"]
    built = _built_checkers.get((language, source))
    if built is not None:
        return built, None
    if language == "python":
        try:
            compile(source, "checker.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            return None, "the checker does not compile: %s: %s" % (type(exc).__name__, exc)
        built = source.encode("utf-8")
    elif language == "cpp" and toolchains.get("cpp"):
        limits = dict(compile_limits, output_limit=CHECKER_BINARY_LIMIT)
        argv = [toolchains["cpp"]["compile"], *CPP_FLAGS]
        spec = test_spec("checker_build", argv, limits, "compile", uid, workdir)
        outcome = run_process(submission, spec, source.encode("utf-8"), limits, with_result_pipe=True)
        if classify(outcome, limits) != "ok" or not outcome.result:
            message = bytes(outcome.stderr[-STDERR_TAIL:]).decode("utf-8", "replace").strip()
            return None, "the checker does not compile: %s" % (message or classify(outcome, limits))
        built = bytes(outcome.result)
    else:
        return None, "a checker in %s cannot run in this sandbox" % (language,)
    while len(_built_checkers) >= CHECKER_CACHE:
        _built_checkers.pop(next(iter(_built_checkers)))
    _built_checkers[(language, source)] = built
    return built, None


def run_checker(checker, test, output, workdir, submission, uid):
    """Run the built checker on one test's input, the program's `output` and the expected output;
    `checker` = (language, built, limits). Its report: status (ok = exit 0), exit_code, message."""
    language, built, limits = checker
    expected = test.get("output", "")
    if not isinstance(expected, str):
        expected = json.dumps(expected)
    payload = marshal.dumps((language, built, (_stdin_of(test), bytes(output), expected.encode("utf-8"))))
    spec = test_spec("checker_run", None, limits, language, uid, workdir)
    outcome = run_process(submission, spec, payload, limits)
    message = bytes(outcome.stderr[-STDERR_TAIL:]) or bytes(outcome.stdout[-STDERR_TAIL:])
    return {
        "status": classify(outcome, limits),
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "message": message.decode("utf-8", "replace").strip(),
        "time_s": round(outcome.cpu_s, 4),
    }


def checker_build_child(argv, _call, workdir):
    """Child body that compiles a C++ checker (source on stdin) in a directory of its own and
    writes the binary on fd 3; the directory goes with it."""

    def main():
        source = read_to_end(0)
        directory = os.path.join(os.path.dirname(workdir), "checker-build")
        os.mkdir(directory, 0o700)
        src, binary = os.path.join(directory, "checker.cpp"), os.path.join(directory, "checker")
        try:
            with open(src, "wb") as handle:
                handle.write(source)
            os.dup2(2, 1)  # the compiler's chatter goes to stderr
            pid = os.fork()
            if pid == 0:
                try:
                    os.execve(argv[0], [*argv, "-o", binary, src], CLEAN_ENV)
                finally:
                    os._exit(127)
            status = os.waitpid(pid, 0)[1]
            if not os.WIFEXITED(status) or os.WEXITSTATUS(status):
                return 1
            with open(binary, "rb") as handle:
                data = handle.read()
            while data:
                data = data[os.write(3, data) :]
            return 0
        finally:
            for path in (src, binary):
                try:
                    os.unlink(path)
                except OSError:
                    pass
            os.rmdir(directory)

    return main


def checker_run_child(_body, _call, workdir):
    """Child body that runs a checker: (language, built, (input, output, answer)) marshalled on
    stdin; the three become memfds of this process, named to the checker as /proc/self/fd paths."""

    def main():
        language, built, files = marshal.loads(read_to_end(0))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        paths = [_memfd_path(name, data) for name, data in zip(("input", "output", "answer"), files)]
        os.chdir(workdir)
        if language == "cpp":
            _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
            os.execve(_memfd_path("checker", built), ["checker", *paths], CLEAN_ENV)
        sys.argv = ["checker.py", *paths]
        module = sys.modules["__main__"]
        module.__file__ = "checker.py"
        try:
            exec(compile(built.decode("utf-8"), "checker.py", "exec", dont_inherit=True), module.__dict__)
        except SystemExit as exc:
            return _exit_like_python(_system_exit_code(exc))
        except BaseException:  # noqa: BLE001 - the checker failed: testlib's "fail"
            import traceback

            traceback.print_exc()
            return _exit_like_python(TESTLIB_FAIL_EXIT)
        return _exit_like_python(0)

    return main


def _memfd_path(name, data):
    """A memfd holding `data`, left open (and inherited across exec), as a path."""
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return "/proc/self/fd/%d" % fd


# The test bodies of the harnesses above, by spec kind (see `test_spec`).
HARNESSES = {"judged": judged_child, "checker_build": checker_build_child, "checker_run": checker_run_child}


def compile_submission(language, source, workdir, toolchains, compile_limits, limits, submission, uid):
    """Compile once (a compiler runs as a test of the submission would). Returns (argv or compiled
    code, error message or None, seconds)."""
    started = time.monotonic()
    if language == "python":
        try:
            return compile(source, os.path.join(workdir, "main.py"), "exec", dont_inherit=True), None, 0.0
        except (SyntaxError, ValueError) as exc:
            return None, "%s: %s" % (type(exc).__name__, exc), time.monotonic() - started
    tool = toolchains.get(language)
    if not tool:
        return None, "language %r is not available in this sandbox" % (language,), 0.0
    files = []
    if language == "javascript":
        src = os.path.join(workdir, "main.js")
        files.append((os.path.join(workdir, "call.js"), JS_CALL_HARNESS))
        source += JS_EXPORTS % json.dumps(_js_top_level_names(source))
        heap = "--max-old-space-size=%d" % int(limits["memory_limit"])
        argv, program = [tool["run"], "--check", src], [tool["run"], heap, src]
    elif language == "cpp":
        src, binary = os.path.join(workdir, "main.cpp"), os.path.join(workdir, "main")
        argv = [tool["compile"], *CPP_FLAGS, "-o", binary, src]
        program = [binary]
    elif language == "rust":
        src, binary = os.path.join(workdir, "main.rs"), os.path.join(workdir, "main")
        argv = [tool["compile"], "-O", "--edition", "2021", "-o", binary, src]
        if tool.get("linker"):
            argv[1:1] = ["-C", "linker=" + tool["linker"]]
        program = [binary]
    else:
        return None, "unknown language %r" % (language,), 0.0
    files.append((src, source))
    spec = test_spec("exec", argv, compile_limits, "compile", uid, workdir, files=files)
    outcome = run_process(submission, spec, b"", compile_limits)
    elapsed = time.monotonic() - started
    status = classify(outcome, compile_limits)
    if status != "ok":
        message = (bytes(outcome.stderr) + bytes(outcome.stdout)).decode("utf-8", "replace")[-STDERR_TAIL:]
        if status != "runtime_error":
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


def run_test(language, program, test, workdir, limits, submission, uid=None, checker=None):
    """Run one test of `submission`, forked by the template; returns the reply frame for it.
    `checker`: (language, built, limits) of the task's checker, run on the program's output."""
    is_call = test["type"] == "function_call"
    if test["type"] in JUDGED_TESTS:
        return run_judged_test(language, program, test, workdir, limits, submission, uid)
    if language == "python":
        call = (test["fn_name"], test["input"]) if is_call else None
        spec = test_spec("python", program, limits, "python", uid, workdir, call=call)
        outcome = run_process(
            submission, spec, b"" if is_call else _stdin_of(test), limits, with_result_pipe=is_call
        )
    elif language == "javascript" and is_call:
        argv = program[:-1] + [os.path.join(workdir, "call.js")]
        stdin = json.dumps({"fn_name": test["fn_name"], "args": _call_args(test["input"])}).encode("utf-8")
        outcome = run_process(
            submission,
            test_spec("exec", argv, limits, language, uid, workdir),
            stdin,
            limits,
            with_result_pipe=True,
        )
    elif is_call:
        return {
            "event": "test",
            "status": "runtime_error",
            "message": "function_call tests run only in python or javascript",
        }
    else:
        outcome = run_process(
            submission, test_spec("exec", program, limits, language, uid, workdir), _stdin_of(test), limits
        )
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
    elif checker is not None and status == "ok":
        reply["checker"] = run_checker(checker, test, outcome.stdout, workdir, submission, uid)
    return reply


def run_judged_test(language, program, test, workdir, limits, submission, uid):
    """Run an assert or pytest test (see "judged tests"): the verdict is the judge's, on fd 3."""
    if language != "python":
        return {
            "event": "test",
            "status": "runtime_error",
            "message": "%s tests run only in python" % test["type"],
        }
    call = (test["type"], test.get("name"), int(limits["output_limit"]))
    spec = test_spec("judged", program, limits, "python", uid, workdir, call=call)
    outcome = run_process(submission, spec, test["code"].encode("utf-8"), limits, with_result_pipe=True)
    reply = {
        "event": "test",
        "status": classify(outcome, limits),
        "stdout": bytes(outcome.stdout[-STDERR_TAIL:]).decode("utf-8", "replace"),
        "stderr": bytes(outcome.stderr[-STDERR_TAIL:]).decode("utf-8", "replace"),
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "time_s": round(outcome.cpu_s, 4),
        "wall_s": round(outcome.wall_s, 4),
        "memory_kb": outcome.memory_kb,
    }
    if reply["status"] == "ok":
        try:
            verdict = json.loads(bytes(outcome.result))
            status = verdict["status"]
        except (ValueError, TypeError, KeyError):
            verdict, status = {"message": "the test's judge reported no verdict"}, "runtime_error"
        reply["status"] = "ok" if status == "passed" else status
        if verdict.get("message"):
            reply["message"] = str(verdict["message"])[:STDERR_TAIL]
    return reply


def _stdin_of(test):
    value = test.get("input", "")
    if not isinstance(value, str):
        value = json.dumps(value)
    return value.encode("utf-8")


def _call_args(value):
    return value if isinstance(value, list) else [value]


# --- serving --------------------------------------------------------------------------------------


LOST = "the sandbox lost this submission's template or namespaces"


def serve_one(job, toolchains, submission, replies, uid):
    """Compile and run one submission in its own namespaces, replying frame by frame (see `Replies`)."""
    done = {"event": "done"}
    try:
        _compile_and_run(job, toolchains, submission, replies, uid)
    except SubmissionLost:
        done["error"] = LOST
    except BaseException:
        replies.flush()  # what was done reaches the host before the runner goes
        raise
    replies.add(done)
    replies.flush()


def _compile_and_run(job, toolchains, submission, replies, uid):
    deadline = time.monotonic() + float(job.get("budget_s", 1e9))
    workdir = submission.workdir
    checker, checker_error = None, None
    if job.get("checker"):  # built before the program is compiled, let alone run
        built, checker_error = build_checker(
            job["checker"], toolchains, job["compile_limits"], submission, uid, workdir
        )
        checker = (job["checker"]["language"], built, job["checker"]["limits"])
    program, error, seconds = None, None, 0.0
    if checker_error is None:
        program, error, seconds = compile_submission(
            job["language"],
            job["source"],
            workdir,
            toolchains,
            job["compile_limits"],
            job["limits"],
            submission,
            uid,
        )
    compiled = {"event": "compiled", "ok": error is None and checker_error is None, "message": error}
    if checker_error is not None:
        compiled["checker_error"] = checker_error
    replies.add(dict(compiled, time_s=round(seconds, 4)))
    # Time the budget keeps back, per test, for the checker's run after the program's.
    reserve = float(checker[2]["wall_limit"]) if checker is not None else 0.0
    if compiled["ok"]:
        for index, test in enumerate(job["tests"]):
            limits = dict(job["limits"])
            left = deadline - time.monotonic() - reserve
            if left <= 0.05:
                reply = {
                    "event": "test",
                    "status": "time_limit",
                    "message": "the submission's time budget ran out",
                }
            else:
                limits["wall_limit"] = min(float(limits["wall_limit"]), left)
                reply = run_test(job["language"], program, test, workdir, limits, submission, uid, checker)
            reply["index"] = index
            replies.add(reply)


def main(argv):
    """`runner.py TOOLCHAINS_JSON SCRATCH_DIR [--uid N] [--sandboxed]`: serve submissions until
    stdin closes.

    --sandboxed: each submission runs in namespaces made for it (see the module docstring); the
    runner needs CAP_SYS_ADMIN (and, with --uid, CAP_SETUID, CAP_SETGID and CAP_KILL) to make them,
    and keeps those capabilities only. Never pass it outside a sandbox.
    --uid: the programs' uid. In a sandbox the tests drop to it; outside one (started as root) the
    runner drops to it first, and everything it starts runs as it.
    """
    toolchains = json.loads(argv[1])
    scratch = argv[2]
    sandboxed = "--sandboxed" in argv
    uid = int(argv[argv.index("--uid") + 1]) if "--uid" in argv else None
    workdir = os.path.join(scratch, "work")
    if sandboxed:
        scratch_bytes = (
            os.statvfs("/tmp").f_blocks * os.statvfs("/tmp").f_frsize
        )  # the size the sandbox gave /tmp
        keep_capabilities(RUNNER_CAPABILITIES if uid is not None else SAME_UID_CAPABILITIES)
        drop_from_bounding_set(set(range(64)) - set(RUNNER_CAPABILITIES))
        # Once, for every submission's mount namespace (a copy of this one): nothing mounted there
        # reaches the sandbox's own mounts, nor the other way round.
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        confine()  # here, once: a filter installed in a fresh process costs it far more than inheriting one
    else:
        scratch_bytes = 0
        os.makedirs(workdir, exist_ok=True)
        if uid is not None:
            os.chown(scratch, uid, uid)
            os.chown(workdir, uid, uid)
            drop_privileges(uid)
            uid = None  # everything runs as it already
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace, no /proc/PID/mem; what we fork inherits it
    # Forked tests inherit these: default dispositions, as a fresh program would have them (and
    # SIGCHLD's, whatever started the runner left it, lets the template wait for its tests).
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    _prepare_python_tests()
    gc.freeze()  # forked tests then share the template's memory instead of copying it on the next collection
    template = Template(workdir, sandboxed, uid, scratch_bytes)  # before anything a program wrote is read
    submission = template.submission()  # made now, so that a sandbox that cannot make one fails at its start
    write_frame(out_fd, {"event": "ready", "pid": os.getpid(), "uid": os.getuid()})
    global _replies
    replies = _replies = Replies(out_fd)
    while True:
        job = read_frame(in_fd)
        if job is None:
            return 0
        if submission is None:  # the template is gone (see below): the host replaces this runner
            replies.add({"event": "done", "error": LOST})
            replies.flush()
            continue
        if sandboxed:
            kill_strangers({os.getpid(), template.pid, submission.init})
        serve_one(job, toolchains, submission, replies, uid if sandboxed else None)
        submission.close()
        # The template answers once the last submission's init is reaped: nothing of it runs then.
        # Killed from outside by then, it fails the next submission as it would have failed this one.
        try:
            submission = template.submission()
        except SubmissionLost:
            submission = None


def keep(argv):
    """`runner.py keep SECONDS [UID]`: a container's init; it lives until stdin closes or SECONDS pass.

    It runs as a uid of its own (UID, dropped to at once when started as root), and no process may
    trace it or read its memory."""
    if len(argv) > 3:
        drop_privileges(int(argv[3]))
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
