"""Building the Docker sandbox image.

Online: the `Dockerfile` shipped next to this module (Debian with python3, g++, rustc, node).
Offline: an image `FROM scratch` holding exactly the host toolchains' files (see
`toolchains.file_set`), so no registry is needed. Both carry the runner and a
`genesys.toolchains` label telling the runner where each language's tools are.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from genesys.sandbox.docker_backend import DEFAULT_IMAGE, RUNNER_IN_IMAGE, docker_client
from genesys.sandbox.process import RUNNER_PATH, runner_digest
from genesys.sandbox.toolchains import FileSet, discover, file_set, runner_commands

HERE = os.path.dirname(os.path.abspath(__file__))
DOCKERFILE = os.path.join(HERE, "Dockerfile")
ONLINE_BASE = "debian:bookworm-slim"
ONLINE_TOOLCHAINS = {
    "python": {"run": "/usr/bin/python3"},
    "cpp": {"compile": "/usr/bin/g++", "linker": "/usr/bin/gcc"},
    "rust": {"compile": "/usr/bin/rustc", "linker": "/usr/bin/gcc"},
    "javascript": {"run": "/usr/bin/node"},
}


@dataclass
class BuildReport:
    """What `build_image` did."""

    tag: str
    mode: str  # "offline" | "online" | "cached"
    languages: list[str]
    missing: dict[str, str]
    size_mb: float


def _digest(files: FileSet, toolchains: dict[str, dict[str, str]]) -> str:
    """A fingerprint of what goes into the offline image, to skip rebuilding an identical one."""
    hasher = hashlib.sha256()
    for source in (RUNNER_PATH, os.path.abspath(__file__)):  # the runner and this image layout
        with open(source, "rb") as handle:
            hasher.update(handle.read())
    hasher.update(json.dumps(toolchains, sort_keys=True).encode())
    for root in files.roots:
        stat = os.lstat(root)
        hasher.update(f"{root}:{stat.st_size}:{int(stat.st_mtime)}\n".encode())
    hasher.update(json.dumps(files.links, sort_keys=True).encode())
    return hasher.hexdigest()[:16]


def _dockerfile(labels: dict[str, str]) -> str:
    lines = [
        "FROM scratch",
        "COPY rootfs/ /",
        'ENV PATH="/usr/local/bin:/usr/bin:/bin" HOME="/tmp" LANG="C.UTF-8"',
    ]
    lines += [f"LABEL {key}={json.dumps(value)}" for key, value in labels.items()]
    lines += ["USER 65534:65534", "WORKDIR /tmp"]
    return "\n".join(lines) + "\n"


def _add_dirs(tar: tarfile.TarFile, paths: Iterable[str], done: set[str]) -> None:
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            directory = "/".join(parts[:depth])
            if directory in done:
                continue
            done.add(directory)
            info = tarfile.TarInfo("rootfs/" + directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)


def _write_context(handle: Any, files: FileSet, dockerfile: str, progress: Callable[[int], None]) -> None:
    done: set[str] = set()
    with tarfile.open(fileobj=handle, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        tmp = tarfile.TarInfo("rootfs/tmp")
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777  # docker gives the tmpfs over /tmp this mode
        tar.addfile(tmp)
        done.add("tmp")
        _add_dirs(tar, [os.path.dirname(RUNNER_IN_IMAGE) + "/x"], done)
        tar.add(RUNNER_PATH, arcname="rootfs" + RUNNER_IN_IMAGE, recursive=False)
        for link in sorted(files.links):
            _add_dirs(tar, [os.path.dirname(link) + "/x"], done)
            tar.add(link, arcname="rootfs" + link, recursive=False)
        for count, path in enumerate(files.entries()):
            _add_dirs(tar, [os.path.dirname(path) + "/x"], done)
            if path.strip("/") in done:
                continue
            info = tar.gettarinfo(path, arcname="rootfs" + path)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode &= 0o755  # nothing writable or setuid for anyone
            if info.isdir():
                done.add(path.strip("/"))
                info.mode |= 0o555
                tar.addfile(info)
            elif info.isreg():
                info.mode |= 0o444
                with open(path, "rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
            if count % 500 == 0:
                progress(count)


def existing_digest(client: Any, tag: str) -> str | None:
    try:
        return (client.images.get(tag).labels or {}).get("genesys.digest")
    except Exception:  # noqa: BLE001 - ImageNotFound
        return None


def build_offline(
    tag: str = DEFAULT_IMAGE,
    *,
    languages: Iterable[str] | None = None,
    python: str | None = None,
    force: bool = False,
    progress: Callable[[str], None] = lambda message: None,
) -> BuildReport:
    """Build the image FROM scratch out of the host's own toolchains; no registry involved."""
    client = docker_client(timeout=600)
    progress("finding toolchains")
    found, missing = discover(python=python, languages=languages)
    commands = runner_commands(found)
    files = file_set(found)
    digest = _digest(files, commands)
    if not force and existing_digest(client, tag) == digest:
        return BuildReport(tag, "cached", sorted(found), missing, _size_mb(client, tag))
    labels = {
        "genesys.toolchains": json.dumps(commands),
        "genesys.digest": digest,
        "genesys.runner": runner_digest(),
        "genesys.sandbox.image": "offline",
    }
    with tempfile.TemporaryFile() as context:
        _write_context(context, files, _dockerfile(labels), lambda n: progress(f"packing files ({n} so far)"))
        context.seek(0)
        progress(f"building {tag} ({context.seek(0, os.SEEK_END) >> 20} MiB of files)")
        context.seek(0)
        _docker_build(client, tag, fileobj=context, custom_context=True)
    return BuildReport(tag, "offline", sorted(found), missing, _size_mb(client, tag))


def build_online(
    tag: str = DEFAULT_IMAGE, progress: Callable[[str], None] = lambda message: None
) -> BuildReport:
    """Build from the shipped Dockerfile (needs the registry for its Debian base image)."""
    client = docker_client(timeout=1800)
    progress(f"pulling {ONLINE_BASE}")
    client.images.pull(ONLINE_BASE)
    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as tar:
            tar.add(DOCKERFILE, arcname="Dockerfile")
            tar.add(RUNNER_PATH, arcname="runner.py")
        context.seek(0)
        progress(f"building {tag} from {DOCKERFILE}")
        _docker_build(
            client, tag, fileobj=context, custom_context=True, buildargs={"RUNNER_DIGEST": runner_digest()}
        )
    return BuildReport(tag, "online", sorted(ONLINE_TOOLCHAINS), {}, _size_mb(client, tag))


def registry_reachable(timeout: float = 20.0) -> bool:
    """Whether the base image of the shipped Dockerfile can be pulled."""
    client = docker_client(timeout=timeout)
    try:
        client.images.pull(ONLINE_BASE)
    except Exception:  # noqa: BLE001 - no network, no DNS, rate limits: all mean "no"
        return False
    return True


def _docker_build(client: Any, tag: str, **kwargs: Any) -> None:
    """Build and tag the image; the image the tag named before is removed unless still in use."""
    from docker.errors import BuildError, DockerException

    try:
        previous = client.images.get(tag).id
    except DockerException:
        previous = None
    try:
        image, _ = client.images.build(tag=tag, rm=True, forcerm=True, **kwargs)
    except BuildError as exc:
        log = "".join(str(item.get("stream") or item.get("error") or "") for item in exc.build_log)
        raise RuntimeError(f"docker build of {tag} failed: {exc.msg}\n{log[-2000:]}") from None
    if previous and previous != image.id:
        try:
            client.images.remove(previous)
        except DockerException:
            pass  # a container still runs it; `docker image prune` will get it later


def _size_mb(client: Any, tag: str) -> float:
    return round(client.images.get(tag).attrs.get("Size", 0) / 1e6, 1)
