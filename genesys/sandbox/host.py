"""The host's toolchains and the files they need, found once and cached on disk.

Finding them means compiling probe programs and running `ldd` (seconds), too slow to repeat in
every worker process. The cache is keyed by the tools' paths, sizes and modification times and
is used only while every path it names still exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from functools import lru_cache

from genesys.sandbox.toolchains import PYTHON_CANDIDATES, FileSet, Toolchain, discover, file_set

TOOLS = ("g++", "gcc", "node", "rustc")
CACHE_VERSION = 3


@dataclass
class HostToolchains:
    """What `discover` and `file_set` found on this machine."""

    toolchains: dict[str, Toolchain]
    missing: dict[str, str]
    files: FileSet


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "genesys")


def _fingerprint(python: str | None) -> str:
    hasher = hashlib.sha256(f"{CACHE_VERSION}:{python}:{os.environ.get('PATH', '')}".encode())
    for name in (*((python,) if python else PYTHON_CANDIDATES), *TOOLS):
        path = shutil.which(name)
        if path:
            real = os.path.realpath(path)
            stat = os.stat(real)
            hasher.update(f"{name}={real}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return hasher.hexdigest()[:20]


def _load(path: str) -> HostToolchains | None:
    try:
        with open(path) as handle:
            data = json.load(handle)
        toolchains = {
            name: Toolchain(**{**tool, "skip": tuple(tool["skip"])})
            for name, tool in data["toolchains"].items()
        }
        files = FileSet(
            data["files"]["roots"],
            data["files"]["links"],
            {k: tuple(v) for k, v in data["files"]["skip"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(os.path.lexists(path) for path in [*files.roots, *files.links]):
        return None
    return HostToolchains(toolchains, data["missing"], files)


def _store(path: str, found: HostToolchains) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(asdict(found), handle)
    os.replace(temporary, path)


@lru_cache(maxsize=4)
def host_toolchains(python: str | None = None) -> HostToolchains:
    """The host's toolchains, from the on-disk cache when it is still valid; raises ToolchainError."""
    path = os.path.join(cache_dir(), f"toolchains-{_fingerprint(python)}.json")
    cached = _load(path)
    if cached is not None:
        return cached
    toolchains, missing = discover(python=python)
    found = HostToolchains(toolchains, missing, file_set(toolchains))
    try:
        _store(path, found)
    except OSError:
        pass  # a read-only home: find them again next time
    return found
