"""The bwrap sandbox's root as one view of hard links: what it holds, when a new one is made, when
none can be, and a sandbox on it (a dozen mounts per submission, not one per file, and nothing
written through it); without one the sandbox binds each path as before."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_sandbox_backends import backend_skip_reason

from genesys.sandbox import bwrap, root_view
from genesys.sandbox.backends import open_sandbox
from genesys.sandbox.base import Submission
from genesys.sandbox.toolchains import FileSet


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small host tree: a library, a header tree with a left-out directory and a symlink."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/libx.so.1").write_bytes(b"\x7fELF library")
    (tmp_path / "usr/include/keep").mkdir(parents=True)
    (tmp_path / "usr/include/hidden").mkdir()
    (tmp_path / "usr/include/keep/x.h").write_text("int x;\n")
    (tmp_path / "usr/include/hidden/y.h").write_text("int y;\n")
    (tmp_path / "usr/include/y.h").symlink_to("keep/x.h")
    return tmp_path


def file_set(host: Path) -> FileSet:
    return FileSet(
        roots=[str(host / "usr/lib/libx.so.1"), str(host / "usr/include")],
        links={str(host / "lib"): "usr/lib"},
        skip={str(host / "usr/include"): ("hidden",)},
    )


def test_the_same_files_listed_in_another_order_give_the_same_view(host: Path) -> None:
    files = file_set(host)
    files.links[str(host / "lib64")] = "usr/lib"
    again = FileSet(roots=files.roots[::-1], links=dict(reversed(files.links.items())), skip=files.skip)
    assert root_view.root_view(files) == root_view.root_view(again)
    assert len([path for path in (host / "cache/genesys").glob("view-*") if path.is_dir()]) == 1


def test_the_host_toolchains_give_one_view_whatever_the_hash_seed() -> None:
    """Each worker of each run names the view from its listing: a listing whose order moved with the
    seed of string hashes made a new view (thousands of links) every time, and left the old ones."""
    script = (
        "import hashlib\n"
        "from genesys.sandbox.host import host_toolchains\n"
        "from genesys.sandbox.root_view import _entries\n"
        "from genesys.sandbox.toolchains import file_set\n"
        "python = {'python': host_toolchains().toolchains['python']}\n"
        "print(hashlib.sha256(repr(_entries(file_set(python))).encode()).hexdigest())\n"
    )
    listings = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3", "4")
    }
    assert len(listings) == 1


def test_a_view_links_every_file_and_leaves_out_what_the_file_set_leaves_out(host: Path) -> None:
    umask = os.umask(0o077)  # the programs' uid must still reach every directory
    try:
        view = root_view.root_view(file_set(host), ("/opt/genesys/runner.pyc",))
    finally:
        os.umask(umask)
    assert view is not None

    def inside(path: Path | str) -> Path:
        return Path(view) / str(path).lstrip("/")

    for path in ("usr/lib/libx.so.1", "usr/include/keep/x.h"):
        assert inside(host / path).stat().st_ino == (host / path).stat().st_ino  # the same file
    assert not inside(host / "usr/include/hidden").exists()
    assert os.readlink(inside(host / "usr/include/y.h")) == "keep/x.h"
    assert os.readlink(inside(host / "lib")) == "usr/lib"
    assert inside("/opt/genesys/runner.pyc").read_bytes() == b""  # where the runner is bound
    assert all(inside(point).is_dir() for point in root_view.MOUNT_POINTS)
    for directory in (Path(view), inside(host), inside("/opt"), inside(host / "usr/include/keep")):
        assert directory.stat().st_mode & 0o777 == 0o755, directory


def test_the_same_files_give_the_same_view_and_a_changed_file_a_new_one(host: Path) -> None:
    first = root_view.root_view(file_set(host))
    assert root_view.root_view(file_set(host)) == first
    library = host / "usr/lib/libx.so.1"
    library.unlink()
    library.write_bytes(b"\x7fELF another library")  # replaced, as a package upgrade does
    second = root_view.root_view(file_set(host))
    assert second is not None and second != first
    assert (Path(second) / str(library).lstrip("/")).read_bytes() == b"\x7fELF another library"
    assert (Path(first) / str(library).lstrip("/")).read_bytes() == b"\x7fELF library"  # left to its users


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stamp the fixture's tree although it was just made (it would otherwise wait RACY_S)."""
    monkeypatch.setattr(root_view, "RACY_S", 0.0)


def changed_after_a_tick() -> None:
    time.sleep(0.02)  # a change in the tick of the stamp could keep its time on such a kernel


def test_an_unchanged_file_set_finds_its_view_by_its_stamp_without_listing_a_path(
    host: Path, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    """Every worker of every run asks for the view before its first submission: listing thousands
    of paths there cost each tens of milliseconds."""
    first = root_view.root_view(file_set(host))

    def listed(files: FileSet) -> None:
        raise AssertionError("listed every path again")

    with monkeypatch.context() as patched:
        patched.setattr(root_view, "_entries", listed)
        assert root_view.root_view(file_set(host)) == first


@pytest.mark.parametrize("change", ["file added", "file renamed", "directory made", "mode changed"])
def test_a_stamped_view_is_found_anew_once_a_shown_directory_changed(
    host: Path, change: str, settled: None
) -> None:
    first = root_view.root_view(file_set(host))
    changed_after_a_tick()
    keep = host / "usr/include/keep"
    if change == "file added":
        (keep / "z.h").write_text("int z;\n")
    elif change == "file renamed":
        (keep / "x.h").rename(keep / "w.h")
    elif change == "directory made":
        (keep / "deeper").mkdir()
    else:
        keep.chmod(0o700)
    second = root_view.root_view(file_set(host))
    assert second is not None and second != first
    shown = Path(second) / str(keep).lstrip("/")
    expected = {
        "file added": {"x.h", "z.h"},
        "file renamed": {"w.h"},
        "directory made": {"x.h", "deeper"},
        "mode changed": {"x.h"},
    }[change]
    assert {path.name for path in shown.iterdir()} == expected
    assert shown.stat().st_mode & 0o777 == (0o700 if change == "mode changed" else 0o755)
    assert root_view.root_view(file_set(host)) == second  # stamped anew


def test_a_file_changed_in_place_shows_through_the_stamped_view(host: Path, settled: None) -> None:
    first = root_view.root_view(file_set(host))
    changed_after_a_tick()
    header = host / "usr/include/keep/x.h"
    header.write_text("int x = 2;\n")  # the same inode
    assert root_view.root_view(file_set(host)) == first
    assert (Path(first) / str(header).lstrip("/")).read_text() == "int x = 2;\n"


def test_a_tree_changed_moments_ago_is_not_stamped_and_is_listed_again(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = root_view.root_view(file_set(host))  # the fixture made the tree just now
    assert not list((host / "cache/genesys").glob("view-stamp-*"))
    listed = []
    entries = root_view._entries
    monkeypatch.setattr(root_view, "_entries", lambda files: listed.append(1) or entries(files))
    assert root_view.root_view(file_set(host)) == first
    assert listed == [1]


def test_no_view_where_a_file_cannot_be_linked(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cross_device(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(root_view.os, "link", cross_device)
    assert root_view.root_view(file_set(host)) is None
    assert not list((host / "cache/genesys").glob("view-*"))  # nothing half made is left


def test_no_view_where_the_file_set_holds_a_special_file(host: Path) -> None:
    os.mkfifo(host / "usr/include/keep/pipe")
    assert root_view.root_view(file_set(host)) is None


# Counts the mounts of the submission's namespace; writes through the view where it can.
MOUNTS_AND_WRITES = """
import os, sys
print(sum(1 for _ in open("/proc/self/mountinfo")))
target = os.path.realpath(sys.executable)
try:
    with open(target, "r+b") as handle:
        handle.write(b"x")
    print("wrote", target)
except OSError as exc:
    print("refused", exc.errno in (13, 30))
"""


def run_python(source: str) -> tuple[dict, list[str]]:
    """The test's result, and the sandbox's notes."""
    with open_sandbox("bwrap") as sandbox:
        result = sandbox.run(
            Submission("python", textwrap.dedent(source), [{"type": "stdin_stdout", "input": "3\n1 2 3\n"}])
        )
        notes = sandbox.notes()
    assert result.compiled, result.compile_message
    return result.tests[0], notes


@pytest.mark.bwrap
def test_a_submission_on_a_view_has_a_dozen_mounts_and_writes_nothing_through_it() -> None:
    if backend_skip_reason("bwrap"):
        pytest.skip(backend_skip_reason("bwrap"))
    ran, notes = run_python(MOUNTS_AND_WRITES)
    assert not any("no view" in note for note in notes), notes
    mounts, written = ran["stdout"].splitlines()
    assert int(mounts) < 30, ran  # one per shown path would be well over a hundred
    assert written == "refused True", ran


@pytest.mark.bwrap
def test_without_a_view_the_sandbox_binds_each_path(monkeypatch: pytest.MonkeyPatch) -> None:
    if backend_skip_reason("bwrap"):
        pytest.skip(backend_skip_reason("bwrap"))
    monkeypatch.setattr(bwrap, "root_view", lambda *args: None)
    ran, notes = run_python(MOUNTS_AND_WRITES + "print(sum(map(int, sys.stdin.read().split()[1:])))\n")
    assert any("no view" in note for note in notes), notes  # it did run without one
    assert ran["status"] == "ok", ran
    _, written, total = ran["stdout"].splitlines()
    assert written == "refused True" and total == "6", ran
