"""A bubblewrap sandbox's root file system as one directory of hard links, made once per host.

The bwrap sandbox shows the toolchains' files (`toolchains.file_set`). Bound one by one, with their
left-out directories covered, they are about 150 mounts, and every submission's fresh mount namespace
copies all of them when it is made and unmounts all of them when it ends. A view is one directory
holding that same tree: the directories made anew (mode 0755 for those on the way, the host's mode
for those inside a shown tree), every file a hard link to the host's file (the same inode: nothing
is copied), every symlink written again; left-out directories are absent. The sandbox then binds the
view, read-only, as its root: about a dozen mounts in all.

A view lives in the cache directory, named by a digest of what it links (each path with its device,
inode, size and modification time; each symlink's target), so a file the host changed or replaced
gives a new view rather than a stale one. Where any file cannot be linked (it lies on another file
system, or this user may not link it), no view is made and the sandbox binds each path as before.

A view's files are the host's own files: nothing may write through it. The sandbox binds it
read-only, and its programs run as a uid that owns none of them. Views are not removed (a running
sandbox of another job may be showing one); `rm -r ~/.cache/genesys/view-*` when no job runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat

from genesys.sandbox.host import cache_dir
from genesys.sandbox.toolchains import FileSet

VERSION = 1
# Directories bwrap mounts on: a view is read-only, so they are made in it.
MOUNT_POINTS = ("/proc", "/dev", "/tmp")


def root_view(files: FileSet, mount_files: tuple[str, ...] = ()) -> str | None:
    """The view of `files` (made now unless it exists), or None where one cannot be made here.

    `mount_files`: paths of files the sandbox binds something on (an empty file is made at each)."""
    entries = _entries(files)
    if entries is None:
        return None
    hasher = hashlib.sha256(f"{VERSION}:{sorted(mount_files)}".encode())
    for path, info in entries:
        hasher.update(f"{path}\0{info}\n".encode())
    view = os.path.join(cache_dir(), f"view-{hasher.hexdigest()[:20]}")
    if os.path.isdir(view):
        return view
    building = f"{view}.{os.getpid()}.tmp"
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        shutil.rmtree(building, ignore_errors=True)
        os.mkdir(building, 0o755)
        _build(building, entries, mount_files)
        os.rename(building, view)
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
        return view if os.path.isdir(view) else None  # another process may have made it meanwhile
    return view


def _entries(files: FileSet) -> list[tuple[str, str]] | None:
    """(path, what identifies its content) of everything the view holds, sorted by path (so a
    directory comes before what it holds, and the digest depends on what the view holds, not on the
    order it was listed in); None when something is neither a directory, a regular file nor a symlink."""
    entries = []
    for path in files.entries():
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            entries.append((path, "link:" + os.readlink(path)))
        elif stat.S_ISDIR(info.st_mode):
            entries.append((path, "dir:%o" % stat.S_IMODE(info.st_mode)))
        elif stat.S_ISREG(info.st_mode):
            entries.append(
                (path, "file:%d:%d:%d:%d" % (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns))
            )
        else:
            return None  # a device, socket or fifo: binding shows it, a view could not
    for link, target in files.links.items():
        entries.append((link, "link:" + target))
    return sorted(entries)


def _build(view: str, entries: list[tuple[str, str]], mount_files: tuple[str, ...]) -> None:
    def inside(path: str) -> str:
        return os.path.join(view, path.lstrip("/"))

    def make_dir(directory: str, mode: int = 0o755) -> None:
        os.mkdir(directory)
        os.chmod(directory, mode)  # whatever the umask: the programs' uid must reach what it holds

    def parents(path: str) -> None:
        missing = []
        directory = os.path.dirname(inside(path))
        while not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for directory in reversed(missing):
            make_dir(directory)

    for directory in MOUNT_POINTS:
        make_dir(inside(directory))
    for path in mount_files:
        parents(path)
        with open(inside(path), "x"):
            pass
    for path, info in entries:
        parents(path)
        kind, _, detail = info.partition(":")
        if kind == "dir":
            make_dir(inside(path), int(detail, 8))
        elif kind == "link":
            os.symlink(detail, inside(path))
        else:
            os.link(path, inside(path), follow_symlinks=False)
    os.chmod(view, 0o755)
