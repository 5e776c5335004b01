"""Finding the host's interpreters and compilers, and every file they need to run elsewhere.

The offline image and the bubblewrap sandbox show a program exactly the same files: the
toolchains found here, at their host paths, with the shared libraries `ldd` names and the
symlinks on the way. Nothing else of the host is visible.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

# Parts of a Python installation a submission never needs (and that can be large).
PYTHON_SKIP = (
    "site-packages",
    "dist-packages",
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
)
# Under the generic /usr/include only the C library's own header directories are kept.
C_INCLUDE_SUBDIRS = ("linux", "asm-generic", "sys", "bits", "gnu", "arpa", "net", "netinet", "rpc", "scsi")
PROBE_HEADERS = (
    "bits/stdc++.h",
    "unistd.h",
    "pthread.h",
    "sys/time.h",
    "sys/resource.h",
    "sys/mman.h",
    "sys/wait.h",
    "fcntl.h",
)
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3", "python3")


class ToolchainError(RuntimeError):
    """A toolchain that was asked for but cannot be used."""


@dataclass
class Toolchain:
    """One language's tools: the commands the runner calls and the host files they need."""

    language: str
    version: str
    commands: dict[str, str]
    paths: list[str] = field(default_factory=list)
    skip: tuple[str, ...] = ()  # directory names left out of directory trees in `paths`


def _run(argv: list[str], **kwargs: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise ToolchainError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout


def find_python(python: str | None = None) -> Toolchain:
    """The interpreter that runs the in-sandbox runner and Python submissions."""
    errors = []
    for candidate in (python,) if python else PYTHON_CANDIDATES:
        exe = shutil.which(candidate)
        if not exe:
            errors.append(f"{candidate}: not found")
            continue
        probe = (
            "import json, sys, sysconfig; print(json.dumps([sys.executable, sysconfig.get_paths()['stdlib'],"
            " sysconfig.get_config_var('DESTSHARED') or '', sys.version_info[:2], sys.version.split()[0]]))"
        )
        try:
            executable, stdlib, dynload, major_minor, version = json.loads(
                _run([exe, "-I", "-S", "-c", probe])
            )
        except (ToolchainError, ValueError, OSError) as exc:
            errors.append(f"{candidate}: {exc}")
            continue
        if tuple(major_minor) < (3, 8):
            errors.append(f"{candidate}: Python {version} is older than 3.8")
            continue
        paths = [os.path.realpath(executable), stdlib] + ([dynload] if dynload else [])
        return Toolchain("python", version, {"run": os.path.realpath(executable)}, paths, PYTHON_SKIP)
    raise ToolchainError("no usable Python interpreter for the sandbox: " + "; ".join(errors))


def find_cpp() -> Toolchain:
    """g++ with its compiler passes, binutils, headers and the C/C++ runtime it links against."""
    gxx, gcc = shutil.which("g++"), shutil.which("gcc")
    if not gxx or not gcc:
        raise ToolchainError("g++/gcc not found")
    version = _run([gxx, "-dumpfullversion"]).strip()
    paths = [gxx, gcc]
    for prog in ("cc1", "cc1plus", "collect2", "lto-wrapper", "as", "ld"):
        found = _run([gxx, f"-print-prog-name={prog}"]).strip()
        resolved = found if os.path.isabs(found) else shutil.which(found)
        if resolved:
            paths.append(resolved)
    paths.append(os.path.dirname(_run([gxx, "-print-libgcc-file-name"]).strip()))
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.cpp")
        with open(probe, "w") as handle:
            handle.writelines(f"#include <{header}>\n" for header in PROBE_HEADERS)
            handle.write("int main() { std::cout << std::sqrt(2.0) << std::endl; }\n")
        verbose = subprocess.run(
            [
                gxx,
                "-std=gnu++20",
                "-O2",
                "-v",
                "-Wl,--trace",
                "-o",
                os.path.join(tmp, "probe"),
                probe,
                "-lm",
                "-lpthread",
                "-lrt",
                "-ldl",
                "-lutil",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if verbose.returncode != 0:
            raise ToolchainError(f"g++ cannot compile a test program: {verbose.stderr.strip()[-500:]}")
        paths += _include_paths(verbose.stderr)
        paths += [line.strip() for line in verbose.stdout.splitlines() if line.strip().startswith("/")]
        headers = _run([gxx, "-std=gnu++20", "-M", probe])
        paths += [
            word for word in headers.replace("\\\n", " ").split() if word.startswith("/") and word != probe
        ]
    return Toolchain("cpp", version, {"compile": gxx, "linker": gcc}, paths, _other_libraries_headers(paths))


def _include_paths(verbose: str) -> list[str]:
    block = re.search(r"#include <\.\.\.> search starts here:\n(.*?)End of search list", verbose, re.S)
    return [
        line.strip() for line in (block.group(1).splitlines() if block else []) if os.path.isdir(line.strip())
    ]


def _other_libraries_headers(paths: list[str]) -> tuple[str, ...]:
    """Subdirectory names of the generic /usr/include to leave out: the headers of other libraries.

    /usr/include is shown whole (one bind, not one per header) but for these. Since a left-out
    name is left out at every depth of every directory in `paths`, a name that also occurs below
    the top of /usr/include or anywhere in the other directories is kept.
    """
    real = {os.path.realpath(path) for path in paths}  # g++ may print /usr/lib/gcc/.../../../../include
    if "/usr/include" not in real:
        return ()
    needed = {
        os.path.relpath(path, "/usr/include").split("/")[0]
        for path in real
        if path.startswith("/usr/include/")
    }
    others = [path for path in real if os.path.isdir(path) and path != "/usr/include"]
    elsewhere = {name for path in others for _, dirs, _ in os.walk(path) for name in dirs}
    nested = {
        name for current, dirs, _ in os.walk("/usr/include") if current != "/usr/include" for name in dirs
    }
    kept = {*C_INCLUDE_SUBDIRS, *needed, *elsewhere, *nested}
    return tuple(
        sorted(
            entry.name
            for entry in os.scandir("/usr/include")
            if entry.is_dir(follow_symlinks=False) and entry.name not in kept
        )
    )


def find_rust(cpp: Toolchain | None) -> Toolchain:
    """rustc from its sysroot (not a rustup proxy), linking through gcc."""
    if cpp is None:
        raise ToolchainError("rustc needs the C toolchain (gcc) to link")
    rustc = shutil.which("rustc")
    if not rustc:
        raise ToolchainError("rustc not found")
    sysroot = _run([rustc, "--print", "sysroot"]).strip()
    info = _run([rustc, "-vV"])
    host = re.search(r"^host: (\S+)", info, re.M)
    version = re.search(r"^release: (\S+)", info, re.M)
    real = os.path.join(sysroot, "bin", "rustc")
    if not host or not os.path.isfile(real):
        raise ToolchainError(f"cannot make sense of the rust toolchain at {sysroot}")
    libdir = os.path.join(sysroot, "lib")
    paths = [real, os.path.join(libdir, "rustlib", host.group(1))]
    paths += [entry.path for entry in os.scandir(libdir) if entry.is_file() and ".so" in entry.name]
    return Toolchain(
        "rust",
        version.group(1) if version else "?",
        {"compile": real, "linker": cpp.commands["linker"]},
        paths,
    )


def find_node() -> Toolchain:
    node = shutil.which("node")
    if not node:
        raise ToolchainError("node not found")
    version = _run([node, "--version"]).strip().lstrip("v")
    return Toolchain("javascript", version, {"run": os.path.realpath(node)}, [node])


def discover(
    python: str | None = None, languages: Iterable[str] | None = None
) -> tuple[dict[str, Toolchain], dict[str, str]]:
    """The host's toolchains by language, and why each missing one is missing."""
    wanted = set(languages or ("python", "cpp", "rust", "javascript"))
    found: dict[str, Toolchain] = {}
    missing: dict[str, str] = {}
    finders = {
        "python": lambda: find_python(python),
        "cpp": find_cpp,
        "rust": lambda: find_rust(found.get("cpp")),
        "javascript": find_node,
    }
    if "rust" in wanted:
        wanted.add("cpp")
    for language in ("python", "cpp", "rust", "javascript"):
        if language in wanted:
            try:
                found[language] = finders[language]()
            except (ToolchainError, OSError, subprocess.SubprocessError) as exc:
                missing[language] = str(exc)
    if "python" not in found:
        raise ToolchainError(missing["python"])
    return found, missing


def runner_commands(toolchains: dict[str, Toolchain]) -> dict[str, dict[str, str]]:
    """What the runner needs to know: each language's commands."""
    return {language: tool.commands for language, tool in toolchains.items()}


# --- the files a set of toolchains needs ----------------------------------------------------------


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def _ldd(paths: list[str]) -> set[str]:
    libs: set[str] = set()
    for start in range(0, len(paths), 200):
        done = subprocess.run(
            ["ldd", *paths[start : start + 200]], capture_output=True, text=True, check=False
        )
        for line in done.stdout.splitlines():
            match = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(0x", line)
            if match:
                libs.add(match.group(1))
    return libs


def walk(root: str, skip: tuple[str, ...] = ()) -> Iterator[str]:
    """Everything under directory `root` (not following symlinks), leaving out directories named in `skip`."""
    for current, dirs, files in os.walk(root):
        dirs[:] = [name for name in dirs if name not in skip]
        for name in dirs + files:
            yield os.path.join(current, name)


def path_chain(path: str) -> list[str]:
    """The symlinks met on the way to `path`, then its real path; all absolute."""
    chain: list[str] = []
    pending = os.path.abspath(path)
    for _ in range(40):
        parts = pending.strip("/").split("/")
        prefix = ""
        for index, part in enumerate(parts):
            prefix += "/" + part
            if os.path.islink(prefix):
                chain.append(prefix)
                target = os.readlink(prefix)
                target = target if os.path.isabs(target) else os.path.join(os.path.dirname(prefix), target)
                pending = os.path.normpath("/".join([target, *parts[index + 1 :]]))
                break
        else:
            chain.append(pending)
            return chain
    raise ToolchainError(f"too many symlinks resolving {path}")


@dataclass
class FileSet:
    """The host paths a sandbox shows: real files and directories, and the symlinks leading to them."""

    roots: list[str]  # real files, and directories shown whole except for `skip`
    links: dict[str, str]  # symlink path -> its target as written
    skip: dict[str, tuple[str, ...]]  # directory root -> names of subdirectories left out

    def skipped_dirs(self) -> list[str]:
        """The directories inside `roots` that are left out."""
        found = []
        for root, names in self.skip.items():
            for current, dirs, _ in os.walk(root):
                found += [os.path.join(current, name) for name in dirs if name in names]
                dirs[:] = [name for name in dirs if name not in names]
        return found

    def entries(self) -> Iterator[str]:
        """Every path under `roots` to copy, directories before what they hold."""
        for root in self.roots:
            yield root
            if os.path.isdir(root):
                yield from walk(root, self.skip.get(root, ()))


def file_set(toolchains: dict[str, Toolchain], extra: Iterable[str] = ()) -> FileSet:
    """What the toolchains need: their paths, the libraries `ldd` names, and the symlinks on the way."""
    roots: set[str] = set()
    links: dict[str, str] = {}
    skip: dict[str, tuple[str, ...]] = {}
    elves: list[str] = []

    def add(path: str) -> str:
        *hops, real = path_chain(path)
        for hop in hops:
            links[hop] = os.readlink(hop)
        return real

    pending = [(path, tool.skip) for tool in toolchains.values() for path in tool.paths] + [
        (path, ()) for path in extra
    ]
    for path, names in pending:
        if not os.path.lexists(path):
            continue
        real = add(path)
        roots.add(real)
        if os.path.isdir(real):
            skip[real] = tuple(names)
            for inner in walk(real, names):
                if os.path.islink(inner):
                    target = add(inner)
                    if not _inside(target, roots):
                        roots.add(target)
                    inner = target
                if (
                    os.path.isfile(inner)
                    and (os.access(inner, os.X_OK) or ".so" in os.path.basename(inner))
                    and _is_elf(inner)
                ):
                    elves.append(inner)
        elif _is_elf(real):
            elves.append(real)
    for lib in sorted(_ldd(sorted(set(elves)))):  # in one order whatever the hash seed
        roots.add(add(lib))
    # A root inside another root is already shown by the outer one.
    ordered = sorted(roots)
    kept = [root for root in ordered if not _inside(root, [other for other in ordered if other != root])]
    kept_links = {link: target for link, target in links.items() if not _inside(link, kept)}
    return FileSet(roots=kept, links=kept_links, skip={root: skip[root] for root in kept if root in skip})


def _inside(path: str, roots: Iterable[str]) -> bool:
    return any(path.startswith(root.rstrip("/") + "/") for root in roots if os.path.isdir(root))
