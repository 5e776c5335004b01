"""Host-wide leases held by lock files: sandbox uids and run ids.

A lease is an exclusive `flock` on a file in a lease directory shared by every genesys job on the
host (`$GENESYS_LEASE_DIR`, default /tmp/genesys-leases). The kernel drops the lock when its last
holder's descriptor closes, so a job that dies, however it dies, leaks nothing; lock files stay.
Locks are judged by file, not by pid, so jobs in other pid namespaces count; jobs that see another
file system at that path (another mount namespace or host) do not, so point them at a shared one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import re
import stat
import uuid
import weakref
from collections.abc import Collection
from typing import Self

from genesys.sandbox.base import SandboxUnavailable

DEFAULT_LEASE_DIR = "/tmp/genesys-leases"
# Sticky and world-writable, as /tmp: every user's jobs share it, none can remove another's files.
DIR_MODE = 0o1777
_RUN_ID = re.compile(r"[0-9a-f]{32}")


def lease_dir(name: str) -> str:
    """The lease directory `name` under the base directory, made if missing and checked trustworthy."""
    base = os.environ.get("GENESYS_LEASE_DIR") or DEFAULT_LEASE_DIR
    path = os.path.join(base, name)
    for directory in (base, path):
        try:
            os.mkdir(directory, DIR_MODE)
            os.chmod(directory, DIR_MODE)  # mkdir's mode is cut by the umask
        except FileExistsError:
            pass
        except OSError as exc:
            raise SandboxUnavailable(
                f"cannot make the lease directory {directory}: {exc}; set GENESYS_LEASE_DIR"
            ) from None
        _check_dir(directory)
    return path


def _check_dir(path: str) -> None:
    """Refuse a directory whose files others could remove or replace (a lock there proves nothing)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise SandboxUnavailable(
            f"the lease directory {path} is not a directory; remove it or set GENESYS_LEASE_DIR"
        )
    if info.st_uid not in (0, os.geteuid()):
        raise SandboxUnavailable(
            f"the lease directory {path} belongs to uid {info.st_uid}; remove it or set GENESYS_LEASE_DIR"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise SandboxUnavailable(
            f"the lease directory {path} is writable by others without the sticky bit; chmod +t it"
        )


def _open_lock_file(path: str) -> int | None:
    """A descriptor of the lock file at `path` (made if missing), or None when it is not one we can trust."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue  # made by someone else meanwhile: open theirs
            except OSError:
                return None
        except OSError:
            return None  # a link, or not ours to open
        info = os.fstat(fd)
        # Another user could unlink their own file while we hold a lock on it, freeing its name.
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.geteuid()):
            os.close(fd)
            return None
        return fd


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


class _Lease:
    """A held lock file descriptor, closed by `release()`, on leaving a `with` block, or when collected."""

    def __init__(self, fd: int) -> None:
        self._closer = weakref.finalize(self, os.close, fd)

    @property
    def held(self) -> bool:
        return self._closer.alive

    def release(self) -> None:
        """Give the lease up (idempotent)."""
        self._closer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class UidLease(_Lease):
    """One uid of `first .. first + count - 1`, no other genesys job on this host holds at once."""

    def __init__(self, first: int, count: int) -> None:
        directory = lease_dir("uids")
        start = random.randrange(count)
        for step in range(count):
            uid = first + (start + step) % count
            fd = _open_lock_file(os.path.join(directory, f"{uid}.lock"))
            if fd is None:
                continue
            if _try_lock(fd):
                self.uid = uid
                super().__init__(fd)
                return
            os.close(fd)
        raise SandboxUnavailable(
            f"all {count} sandbox uids from {first} are in use on this host (leases in {directory})"
        )


class CpuLease(_Lease):
    """One CPU that no other sandbox on this host holds at once (see `lease_cpu`)."""

    def __init__(self, cpu: int, fd: int) -> None:
        self.cpu = cpu
        super().__init__(fd)


def lease_cpu(cpus: Collection[int]) -> CpuLease | None:
    """The lowest CPU of `cpus` no other sandbox on this host holds, or None when all are held."""
    directory = lease_dir("cpus")
    for cpu in sorted(cpus):
        fd = _open_lock_file(os.path.join(directory, f"{cpu}.lock"))
        if fd is None:
            continue
        if _try_lock(fd):
            return CpuLease(cpu, fd)
        os.close(fd)
    return None


class RunLease(_Lease):
    """A fresh run id, held for the lease's lifetime so other jobs on this host can tell it is live."""

    def __init__(self) -> None:
        directory = lease_dir("runs")
        self.run_id = uuid.uuid4().hex
        self._path = os.path.join(directory, f"{self.run_id}.lock")
        # Locked before it gets its name: nobody ever sees the lock file of a live run unlocked.
        staging = os.path.join(directory, f"{self.run_id}.new")
        try:
            fd = os.open(staging, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot make a run lease in {directory}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(staging, self._path)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(staging)
            raise SandboxUnavailable(f"cannot make a run lease in {directory}: {exc}") from None
        super().__init__(fd)

    def release(self) -> None:
        if self.held:
            try:
                os.unlink(self._path)
            except OSError:
                pass
        super().release()

    @staticmethod
    def holder_dead(run_id: str) -> bool | None:
        """True when the run's holder is gone (its lock file is then removed), False while it lives,
        None when this host has no lock file for it (another host or mount namespace: cannot judge)."""
        if not _RUN_ID.fullmatch(run_id):
            return None
        try:
            path = os.path.join(lease_dir("runs"), f"{run_id}.lock")
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, SandboxUnavailable):
            return None
        try:
            if not _try_lock(fd):
                return False
            try:
                os.unlink(path)
            except OSError:
                pass
            return True
        finally:
            os.close(fd)

    @staticmethod
    def prune(keep: Collection[str] = ()) -> int:
        """Remove the lock files of dead runs on this host, except those of the runs in `keep`
        (whose containers are still to be judged); returns how many went."""
        try:
            names = os.listdir(lease_dir("runs"))
        except (OSError, SandboxUnavailable):
            return 0
        runs = [name.removesuffix(".lock") for name in names if name.endswith(".lock")]
        return sum(RunLease.holder_dead(run) is True for run in runs if run not in keep)
