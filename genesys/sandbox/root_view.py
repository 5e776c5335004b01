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

Listing and checking thousands of paths in every worker of every run takes tens of milliseconds
on the way to its first submission, so beside each view lies its stamp: the file set it was made
from, and the device, inode and change time of each of its directories, files named as roots and
symlinks named as links. While all of those are as stamped, the view still holds the same paths: no
entry of a directory can be added, removed, renamed or replaced, and no directory's mode changed,
without changing its change time, and a root or link replaced is another inode. A file changed in
place is the same inode, which the view's link shows as it is now. Then the stamp names the view,
and nothing is listed; otherwise the view is found as above, and stamped anew. A view is not
stamped while any of those changed in the last RACY_S seconds: a kernel that keeps change times in
clock ticks could give a change in the same tick the same time (the view is listed again instead).

A view's files are the host's own files: nothing may write through it. The sandbox binds it
read-only, and its programs run as a uid that owns none of them. Views are not removed (a running
sandbox of another job may be showing one); `rm -r ~/.cache/genesys/view-*` when no job runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time

from genesys.sandbox.host import cache_dir
from genesys.sandbox.toolchains import FileSet

VERSION = 1
RACY_S = 2.0  # how long a path must have been unchanged to be stamped (see the module docstring)
# Directories bwrap mounts on: a view is read-only, so they are made in it.
MOUNT_POINTS = ("/proc", "/dev", "/tmp")


def root_view(files: FileSet, mount_files: tuple[str, ...] = ()) -> str | None:
    """The view of `files` (made now unless it exists), or None where one cannot be made here.

    `mount_files`: paths of files the sandbox binds something on (an empty file is made at each)."""
    stamp = _stamp_path(files, mount_files)
    stamped = _stamped_view(stamp)
    if stamped is not None:
        return stamped
    entries = _entries(files)
    if entries is None:
        return None
    hasher = hashlib.sha256(f"{VERSION}:{sorted(mount_files)}".encode())
    for path, info in entries:
        hasher.update(f"{path}\0{info}\n".encode())
    view = os.path.join(cache_dir(), f"view-{hasher.hexdigest()[:20]}")
    if os.path.isdir(view):
        _write_stamp(stamp, view, files, entries)
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
    _write_stamp(stamp, view, files, entries)
    return view


def _stamp_path(files: FileSet, mount_files: tuple[str, ...]) -> str:
    """Where the stamp of the view of `files` lies: named by the file set itself (not by what its
    directories hold), in the order-free form the view's digest uses."""
    listing = [VERSION, sorted(mount_files), sorted(files.roots), sorted(files.links.items())]
    listing.append(sorted((root, sorted(names)) for root, names in files.skip.items()))
    digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:20]
    return os.path.join(cache_dir(), f"view-stamp-{digest}.json")


def _identity(path: str) -> list[int]:
    """Device, inode and change time of `path` itself; [] where nothing is there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return []
    return [info.st_dev, info.st_ino, info.st_ctime_ns]


def _stamped_view(stamp: str) -> str | None:
    """The view `stamp` names while everything it stamped is as it was (see the module docstring)."""
    try:
        with open(stamp) as handle:
            data = json.load(handle)
        view, stamped = data["view"], data["paths"]
        if not os.path.isdir(view) or any(_identity(path) != identity for path, identity in stamped):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return view


def _write_stamp(stamp: str, view: str, files: FileSet, entries: list[tuple[str, str]]) -> None:
    """Stamp `view` with the identity of every directory it holds, root and link (best effort: a
    read-only cache only means listing again next time)."""
    paths = [path for path, info in entries if info.startswith("dir:")]
    paths += [*files.roots, *files.links]
    try:
        stamped = [(path, _identity(path)) for path in sorted(set(paths))]
        if (
            max((identity[2] for _, identity in stamped if identity), default=0)
            > time.time_ns() - RACY_S * 1e9
        ):
            return  # changed too recently to tell a later change by its time
        data = {"view": view, "paths": stamped}
        temporary = f"{stamp}.{os.getpid()}.tmp"
        with open(temporary, "w") as handle:
            json.dump(data, handle)
        os.replace(temporary, stamp)
    except OSError:
        pass


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
