"""Per-session cgroups for the bubblewrap backend, where this machine lets us make them.

cgroup v2 needs a delegated subtree (controllers enabled for our own cgroup's children); cgroup v1
needs writable `memory` and `pids` hierarchies (as root they usually are). Neither is assumed:
`Cgroup.create` tries, and says why not when it cannot.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
_counter = itertools.count()


@dataclass
class Cgroup:
    """One cgroup (a directory per hierarchy) that caps memory and the number of processes."""

    dirs: list[str]

    @classmethod
    def create(cls, memory_bytes: int, max_pids: int) -> tuple[Cgroup | None, str]:
        """A fresh cgroup with the caps set, or None and the reason none could be made."""
        name = f"genesys-{os.getpid()}-{next(_counter)}"
        _remove_orphans()
        reasons = []
        for attempt in (_create_v2, _create_v1):
            try:
                return cls(attempt(name, memory_bytes, max_pids)), ""
            except OSError as exc:
                reasons.append(f"{attempt.__doc__}: {exc}")
        return None, "; ".join(reasons)

    def join(self) -> None:
        """Move the calling process into this cgroup (run between fork and exec)."""
        for directory in self.dirs:
            with open(os.path.join(directory, "cgroup.procs"), "w") as handle:
                handle.write("0")

    def remove(self) -> None:
        """Delete the cgroup directories, giving their last processes a moment to be reaped."""
        for directory in self.dirs:
            for _ in range(500):  # a second at most
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)


def _remove_orphans() -> None:
    """Delete the (empty) cgroups left by genesys processes that were killed before cleaning up."""
    for controller in ("", "memory", "pids"):
        own = _own_paths().get(controller)
        if own is None:
            continue
        parent = os.path.join(CGROUP_ROOT, controller, own.lstrip("/"))
        try:
            names = [name for name in os.listdir(parent) if name.startswith("genesys-")]
        except OSError:
            continue
        for name in names:
            pid = name.split("-")[1]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass


def _own_paths() -> dict[str, str]:
    """Controller (or '' for v2) -> this process's cgroup path."""
    paths = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _create_v2(name: str, memory_bytes: int, max_pids: int) -> list[str]:
    """cgroup v2"""
    if not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        raise OSError("this machine does not mount cgroup v2 at /sys/fs/cgroup")
    parent = os.path.join(CGROUP_ROOT, _own_paths().get("", "/").lstrip("/"))
    with open(os.path.join(parent, "cgroup.subtree_control")) as handle:
        enabled = handle.read().split()
    missing = [c for c in ("memory", "pids") if c not in enabled]
    if missing:
        _write(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in missing))
    directory = os.path.join(parent, name)
    os.mkdir(directory)
    try:
        _write(os.path.join(directory, "memory.max"), str(memory_bytes))
        _write(os.path.join(directory, "memory.swap.max"), "0")
        _write(os.path.join(directory, "pids.max"), str(max_pids))
    except OSError:
        os.rmdir(directory)
        raise
    return [directory]


def _create_v1(name: str, memory_bytes: int, max_pids: int) -> list[str]:
    """cgroup v1"""
    own = _own_paths()
    made: list[str] = []
    try:
        for controller, settings in (
            ("memory", {"memory.limit_in_bytes": memory_bytes, "memory.memsw.limit_in_bytes": memory_bytes}),
            ("pids", {"pids.max": max_pids}),
        ):
            if controller not in own:
                raise OSError(f"no cgroup v1 {controller} hierarchy")
            directory = os.path.join(CGROUP_ROOT, controller, own[controller].lstrip("/"), name)
            os.mkdir(directory)
            made.append(directory)
            for key, value in settings.items():
                path = os.path.join(directory, key)
                if os.path.exists(path) or key != "memory.memsw.limit_in_bytes":
                    _write(path, str(value))
    except OSError:
        for directory in made:
            os.rmdir(directory)
        raise
    return made
