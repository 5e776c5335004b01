"""The `bwrap` backend: the runner inside a bubblewrap sandbox.

Every namespace is unshared (no network: a fresh, empty network namespace), the file system shows
the toolchains' files only (see `toolchains.file_set`): one read-only bind of their `root_view` as
the root, or, where no view can be made, a fresh read-only tmpfs root holding a read-only bind per
path (about 150 mounts, which every submission's mount namespace would copy), a read-only /dev, a
private size-capped /tmp and /dev/shm and the IPC namespace's /dev/mqueue (the runner empties those three), all capabilities are dropped and the
runner and its tests run as a non-root uid. Run as root, bwrap needs no user namespace: the runner
keeps CAP_SETUID, SETGID, CHOWN and SETPCAP just long enough to empty its bounding set and drop to
its own uid; its system call filter then refuses new namespaces (see `runner.confine`). A cgroup
caps the session's memory and processes where this machine allows one; rlimits cap each test
regardless.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess

from genesys.sandbox.base import (
    RUNNER_CAPABILITIES,
    RUNNER_ENV,
    SAME_UID_CAPABILITIES,
    SANDBOXED_RUNNER_ARGS,
    SandboxUnavailable,
)
from genesys.sandbox.cgroups import Cgroup
from genesys.sandbox.host import cache_dir
from genesys.sandbox.limits import COMPILE_LIMITS, Limits
from genesys.sandbox.process import RUNNER_PATH, LocalSandbox
from genesys.sandbox.protocol import RunnerSession
from genesys.sandbox.root_view import root_view
from genesys.sandbox.toolchains import FileSet, Toolchain, file_set, runner_commands

SANDBOX_DIR = "/opt/genesys"
SCRATCH = "/tmp/genesys"
SHM_MB = 64  # /dev/shm, as docker sizes it
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
# Run by the sandbox's interpreter on the host: compile runner.py (argv 1) to argv 2, naming it argv 3.
COMPILE_RUNNER = (
    "import py_compile, sys; py_compile.compile(sys.argv[1], sys.argv[2], sys.argv[3], doraise=True)"
)


def find_bwrap() -> str:
    """The bwrap executable, or SandboxUnavailable saying why it cannot be used."""
    path = shutil.which("bwrap")
    if not path:
        raise SandboxUnavailable("bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    _probe(path)
    return path


@functools.cache
def _probe(path: str) -> None:
    """Check, once per process and executable, that `path` can create namespaces here."""
    probe = subprocess.run(
        [path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        raise SandboxUnavailable(f"bubblewrap cannot create namespaces here: {probe.stderr.strip()}")


def compiled_runner(python: str) -> str:
    """runner.py compiled by the sandbox's interpreter `python`, cached on disk (keyed by the source
    and the interpreter); runner.py itself where that cannot be done (a read-only home, say).

    A runner started from its source keeps in memory what the compiler left (about 3 MB: live code
    objects scattered among freed ones). Its template and every Python test forked from it inherit
    those pages, and each fork copies, and each exit drops, their page-table entries.
    """
    real = os.path.realpath(python)
    with open(RUNNER_PATH, "rb") as handle:
        hasher = hashlib.sha256(handle.read())
    try:
        stat = os.stat(real)
        hasher.update(f"{real}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        path = os.path.join(cache_dir(), f"runner-{hasher.hexdigest()[:20]}.pyc")
        if not os.path.exists(path):
            os.makedirs(cache_dir(), exist_ok=True)
            shown_as = os.path.join(SANDBOX_DIR, "runner.py")  # the file name its tracebacks give
            subprocess.run(
                [real, "-I", "-S", "-c", COMPILE_RUNNER, RUNNER_PATH, path, shown_as],
                capture_output=True,
                timeout=60,
                check=True,
            )
    except (OSError, subprocess.SubprocessError):
        return RUNNER_PATH
    return path


class BwrapSandbox(LocalSandbox):
    """Runs submissions in a bubblewrap sandbox that shows the toolchains and nothing else."""

    name = "bwrap"

    def __init__(
        self,
        toolchains: dict[str, Toolchain],
        *,
        limits: Limits | None = None,
        scratch_mb: int = 256,
        files: FileSet | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(runner_commands(toolchains), **kwargs)  # type: ignore[arg-type]
        self.bwrap = find_bwrap()
        self.files = files or file_set(toolchains)
        self.runner = compiled_runner(self.toolchains["python"]["run"])
        self._sandbox_runner = os.path.join(
            SANDBOX_DIR, "runner.pyc" if self.runner.endswith(".pyc") else "runner.py"
        )
        self.view = root_view(self.files, (self._sandbox_runner,))  # None: each path is bound instead
        self._hidden_dirs = [] if self.view else self.files.skipped_dirs()
        self.scratch_mb = scratch_mb
        limits = limits or Limits()
        self._cgroup_memory = (max(limits.memory_limit, COMPILE_LIMITS.memory_limit) + scratch_mb + 256) << 20
        self._cgroup_pids = max(limits.process_limit, COMPILE_LIMITS.process_limit) + 16
        self._cgroup: Cgroup | None = None
        self.cgroup_note = ""

    def sandbox_argv(self) -> list[str]:
        """bwrap and its options for the sandbox itself (namespaces, file system, no capabilities),
        without a command: what `command` starts the runner in, with the runner's own settings."""
        argv = [
            self.bwrap,
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]
        argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
        for key, value in ENV.items():
            argv += ["--setenv", key, value]
        if self.view:
            argv += ["--ro-bind", self.view, "/"]  # every file the sandbox shows, in one mount
        argv += ["--proc", "/proc", "--dev", "/dev", "--mqueue", "/dev/mqueue"]
        for directory, size_mb in (("/tmp", self.scratch_mb), ("/dev/shm", SHM_MB)):
            argv += ["--perms", "1777", "--size", str(size_mb << 20), "--tmpfs", directory]
        argv += ["--remount-ro", "/dev"]  # in our own user namespace, the sandbox's user owns /dev
        if not self.view:
            argv += self._bind_each_path()
        argv += ["--ro-bind", self.runner, self._sandbox_runner, "--remount-ro", "/", "--cap-drop", "ALL"]
        if self._uid is None:
            argv += ["--unshare-user", "--disable-userns"]
        return argv + ["--chdir", "/tmp"]

    def _bind_each_path(self) -> list[str]:
        """bwrap options that show the file set path by path on a fresh root (where there is no view)."""
        argv = []
        for directory in _parents([*self.files.roots, *self.files.links, self._sandbox_runner]):
            argv += ["--perms", "0755", "--dir", directory]  # bwrap would make them 0700
        for link, target in sorted(self.files.links.items()):
            argv += ["--symlink", target, link]
        for root in self.files.roots:
            argv += ["--ro-bind", root, root]
        for hidden in self._hidden_dirs:
            argv += ["--tmpfs", hidden]
            if self._uid is None:  # made in our own user namespace, the sandbox's user owns it
                argv += ["--remount-ro", hidden]
        return argv

    def command(self) -> list[str]:
        argv = self.sandbox_argv()
        for capability in RUNNER_CAPABILITIES if self._uid is not None else SAME_UID_CAPABILITIES:
            argv += ["--cap-add", capability]  # the runner keeps these only (see the module docstring)
        for key, value in RUNNER_ENV.items():
            argv += ["--setenv", key, value]
        argv += [self.toolchains["python"]["run"], "-I", "-S", "-B"]
        return argv + self.runner_args(self._sandbox_runner, SCRATCH) + SANDBOXED_RUNNER_ARGS

    def notes(self) -> list[str]:
        notes = [f"rlimits only, no cgroup: {self.cgroup_note}"] if self.cgroup_note else []
        if self.view is None:
            notes.append("a bind per toolchain path (no view of hard links here): slower submissions")
        return notes

    def _start(self) -> RunnerSession:
        self._cgroup, self.cgroup_note = Cgroup.create(self._cgroup_memory, self._cgroup_pids)
        return super()._start()

    def prepare_child(self) -> None:
        if self._cgroup is not None:
            self._cgroup.join()

    def session_finished(self) -> None:
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None


def _parents(paths: list[str]) -> list[str]:
    """Every ancestor directory of `paths`, parents first."""
    found: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", "") and parent not in found:
            found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found)
