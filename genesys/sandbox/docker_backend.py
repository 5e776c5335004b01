"""The `docker` backend: a warm pool of hardened long-lived containers, driven through the docker SDK.

Each container starts with no network, a read-only root, a size-capped tmpfs for scratch,
memory (swap included), process and CPU caps, every capability dropped, no-new-privileges and a
non-root uid of its own for the runner and the programs. Its init is the runner's `keep` mode
(as nobody, not dumpable: out of the programs' reach), which exits when the stdin this
process holds attached closes, so containers die with their owner even when it is SIGKILLed;
`auto_remove` then deletes them. Submissions go over one long-lived `docker exec` of the runner per
container, reused for `reuse` submissions (the runner serves one submission at a time; a fresh
exec per submission costs more than the tests of a typical submission). A runner that breaks takes its container with it: the container is
removed and a fresh one takes its place. Containers left by dead owners are reaped on start.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import struct
import threading
import time
from typing import Any

from genesys.sandbox.base import (
    DEFAULT_REUSE,
    RUNNER_CAPABILITIES,
    RUNNER_ENV,
    SANDBOXED_RUNNER_ARGS,
    RunResult,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    Submission,
)
from genesys.sandbox.leases import RunLease, UidLease
from genesys.sandbox.limits import COMPILE_LIMITS, Limits
from genesys.sandbox.process import runner_digest
from genesys.sandbox.protocol import READ_CHUNK, RunnerSession, Transport

# $GENESYS_SANDBOX_IMAGE names another default tag (e.g. one image per checkout under test).
DEFAULT_IMAGE = os.environ.get("GENESYS_SANDBOX_IMAGE") or "genesys-sandbox:latest"
LABEL = "genesys.sandbox"
# The run id of the sandbox that made a container (see `leases.RunLease`).
RUN_LABEL = "genesys.run"
RUNNER_IN_IMAGE = "/opt/genesys/runner.py"
SCRATCH = "/tmp/genesys"
# The uids containers' runners and programs run as, one leased per container (apart from bwrap's).
CONTAINER_UID_BASE = 20000
CONTAINER_UID_COUNT = 30000
# The container's init runs as another uid than the runner and the programs, out of their reach.
INIT_UID = 65534
# A container lives at most this long even if its owner never lets go of it.
DEFAULT_LIFETIME_S = 6 * 3600


def docker_client(timeout: float = 30.0) -> Any:
    """A docker SDK client for a daemon that answers, or SandboxUnavailable saying why not."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailable(f"the docker SDK is not installed: {exc}") from None
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no daemon"
        raise SandboxUnavailable(
            f"no Docker daemon answers ({exc}); start dockerd or use --sandbox bwrap"
        ) from None
    return client


def _expires(labels: dict[str, str]) -> float:
    try:
        return float(labels.get("genesys.expires", "inf"))
    except ValueError:
        return float("inf")


def reap_stale(client: Any) -> int:
    """Remove genesys containers whose lifetime is over or whose run's holder on this host is gone,
    then the lock files of dead runs without containers.

    A run this host cannot judge (no lock file here: another host or mount namespace) is left alone.
    """
    removed = 0
    dead: dict[str, bool | None] = {}  # holder_dead removes a dead run's lock file: ask once per run
    # A container listed may be gone before it is inspected (another run ending: its containers
    # remove themselves): ignored, or the sandbox that reaps fails to start.
    containers = client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
    for container in containers:
        labels = container.labels or {}
        if _expires(labels) >= time.time():
            run = labels.get(RUN_LABEL, "")
            if run not in dead:
                dead[run] = RunLease.holder_dead(run)
            if dead[run] is not True:
                continue
        try:
            container.remove(force=True)
            removed += 1
        except Exception:  # noqa: BLE001 - it may be going away on its own
            pass
    RunLease.prune(keep={(container.labels or {}).get(RUN_LABEL, "") for container in containers})
    return removed


class ExecTransport(Transport):
    """The hijacked socket of a `docker exec` with stdin attached; demultiplexes stdout from stderr."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._sock: socket.socket = getattr(raw, "_sock", raw)
        self._sock.setblocking(True)
        self._pending = bytearray()
        self._stderr = bytearray()

    def write(self, data: bytes) -> None:
        self._sock.sendall(data)

    def read(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            payload = self._next_stdout()
            if payload:
                return payload
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._sock], [], [], remaining)[0]:
                raise TimeoutError(f"no answer within {timeout:.0f}s")
            chunk = self._sock.recv(READ_CHUNK)
            if not chunk:
                return b""
            self._pending += chunk

    def _next_stdout(self) -> bytes:
        """Pop complete stream frames; return stdout payload bytes (stderr is kept for diagnostics)."""
        out = bytearray()
        while len(self._pending) >= 8:
            stream, size = self._pending[0], struct.unpack(">I", self._pending[4:8])[0]
            if len(self._pending) < 8 + size:
                break
            payload = self._pending[8 : 8 + size]
            del self._pending[: 8 + size]
            if stream == 1:
                out += payload
            else:
                self._stderr = (self._stderr + payload)[-4000:]
        return bytes(out)

    def diagnostics(self) -> str:
        return self._stderr.decode("utf-8", "replace").strip()

    def close(self, force: bool = False) -> None:
        """Close the exec's stream (a forced close changes nothing: its container is removed then)."""
        for closable in (self._sock, self._raw):
            try:
                closable.close()
            except OSError:
                pass


class _Slot:
    """One pool container, the stdin keeping it alive, the uid its runner and programs run as
    (and its lease), and its runner session."""

    def __init__(self, container: Any, keepalive: Any, uid_lease: UidLease) -> None:
        self.container = container
        self.keepalive = keepalive
        self.uid_lease = uid_lease
        self.uid = uid_lease.uid
        self.session: RunnerSession | None = None


class DockerSandbox(Sandbox):
    """Runs submissions in a pool of warm hardened containers of the genesys sandbox image."""

    name = "docker"

    def __init__(
        self,
        image: str = DEFAULT_IMAGE,
        *,
        pool_size: int = 1,
        limits: Limits | None = None,
        scratch_mb: int = 256,
        cpus: float = 1.0,
        lifetime_s: float = DEFAULT_LIFETIME_S,
        reuse: int = DEFAULT_REUSE,
    ) -> None:
        self.client = docker_client()
        self.image_name = image
        try:
            image_obj = self.client.images.get(image)
        except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound and friends
            raise SandboxUnavailable(
                f"the sandbox image {image!r} is missing; build it with `genesys sandbox build`"
            ) from None
        labels = image_obj.labels or {}
        if "genesys.toolchains" not in labels:
            raise SandboxUnavailable(
                f"image {image!r} is not a genesys sandbox image (no genesys.toolchains label)"
            )
        if labels.get("genesys.runner") != runner_digest():
            raise SandboxUnavailable(
                f"image {image!r} holds another version of the sandbox runner; rebuild it with `genesys sandbox build`"
            )
        self.toolchains: dict[str, dict[str, str]] = json.loads(labels["genesys.toolchains"])
        self.limits = limits or Limits()
        self.scratch_mb = scratch_mb
        self.cpus = cpus
        self.lifetime_s = lifetime_s
        self.reuse = reuse
        self._run = RunLease()
        self._idle: queue.Queue[_Slot] = queue.Queue()
        self._all: list[_Slot] = []
        self._lock = threading.Lock()
        self._pool_size = pool_size
        reap_stale(self.client)

    def languages(self) -> list[str]:
        return sorted(self.toolchains)

    # --- containers -------------------------------------------------------------------------------

    def _container_kwargs(self) -> dict[str, Any]:
        memory = (max(self.limits.memory_limit, COMPILE_LIMITS.memory_limit) + self.scratch_mb + 256) << 20
        api = self.client.api
        host_config = api.create_host_config(
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={self.scratch_mb}m,mode=1777"},
            mem_limit=memory,
            memswap_limit=memory,
            pids_limit=max(self.limits.process_limit, COMPILE_LIMITS.process_limit) + 16,
            nano_cpus=int(self.cpus * 1e9),
            cap_drop=["ALL"],
            cap_add=list(
                RUNNER_CAPABILITIES
            ),  # the runner's only (see `_start_session`); programs drop them all
            security_opt=["no-new-privileges"],
            ipc_mode="private",
            auto_remove=True,
        )
        python = self.toolchains["python"]["run"]
        return {
            "image": self.image_name,
            # Root only to start: an exec gets the capabilities of the container's first user, and the
            # runner needs RUNNER_CAPABILITIES; the init drops to INIT_UID itself at once.
            "command": [
                python,
                "-I",
                "-S",
                "-B",
                RUNNER_IN_IMAGE,
                "keep",
                str(int(self.lifetime_s)),
                str(INIT_UID),
            ],
            "user": "0:0",
            "stdin_open": True,
            "detach": False,  # makes docker close the container's stdin when our attachment ends
            "network_disabled": True,
            "working_dir": "/tmp",
            "hostname": "sandbox",
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"},
            "labels": {
                LABEL: "1",
                RUN_LABEL: self._run.run_id,
                "genesys.expires": str(time.time() + self.lifetime_s + 60),
            },
            "host_config": host_config,
        }

    def _new_slot(self) -> _Slot:
        uid_lease = UidLease(CONTAINER_UID_BASE, CONTAINER_UID_COUNT)
        api = self.client.api
        try:
            created = api.create_container(**self._container_kwargs())
            keepalive = api.attach_socket(created["Id"], params={"stdin": 1, "stream": 1})
            api.start(created["Id"])
            container = self.client.containers.get(created["Id"])
        except Exception as exc:  # noqa: BLE001 - docker.errors.APIError and connection errors
            uid_lease.release()
            raise SandboxError(f"cannot start a sandbox container: {exc}") from None
        slot = _Slot(container, keepalive, uid_lease)
        with self._lock:
            self._all.append(slot)
        return slot

    def _start_session(self, slot: _Slot) -> RunnerSession:
        api = self.client.api
        python = self.toolchains["python"]["run"]
        command = [
            python,
            "-I",
            "-S",
            "-B",
            RUNNER_IN_IMAGE,
            json.dumps(self.toolchains),
            SCRATCH,
            *SANDBOXED_RUNNER_ARGS,
        ]
        command += [
            "--uid",
            str(slot.uid),
        ]  # the programs' uid; the runner stays root with RUNNER_CAPABILITIES only
        user = "0:0"
        try:
            exec_id = api.exec_create(
                slot.container.id,
                command,
                stdin=True,
                stdout=True,
                stderr=True,
                workdir="/tmp",
                user=user,
                environment=RUNNER_ENV,
            )
            raw = api.exec_start(exec_id["Id"], socket=True)
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"cannot start the runner in its container: {exc}") from None
        return RunnerSession(ExecTransport(raw))

    def _discard(self, slot: _Slot) -> None:
        if slot.session is not None:
            slot.session.close()
        for closable in (getattr(slot.keepalive, "_sock", None), slot.keepalive):
            try:
                closable.close()  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001
                pass
        try:
            slot.container.remove(force=True)
        except Exception:  # noqa: BLE001 - auto_remove may have beaten us to it
            pass
        slot.uid_lease.release()
        with self._lock:
            if slot in self._all:
                self._all.remove(slot)

    def _acquire(self) -> _Slot:
        """An idle container, a new one while the pool is below its size, else wait for one."""
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                can_grow = len(self._all) < self._pool_size
            if can_grow:
                return self._new_slot()
            try:
                return self._idle.get(timeout=0.5)
            except queue.Empty:
                continue  # a container may have been discarded meanwhile: look again

    # --- running ----------------------------------------------------------------------------------

    def run(self, submission: Submission) -> RunResult:
        slot = self._acquire()
        healthy = False
        try:
            if slot.session is None or slot.session.served >= self.reuse:
                if slot.session is not None:
                    slot.session.close()
                slot.session = self._start_session(slot)
            result = slot.session.run(submission)
            healthy = not slot.session.broken
            if not healthy and not self._still_running(slot):
                # The runner's end came from outside the program: the container or the daemon went away.
                raise SandboxError("the sandbox container stopped during the submission")
            return result
        finally:
            if healthy:
                self._idle.put(slot)
            else:
                self._discard(slot)  # misbehaved or broke: kill it; a fresh one is made on demand

    def _still_running(self, slot: _Slot, grace_s: float = 1.0) -> bool:
        """Whether the container outlives its runner (the runner may end a moment before it does)."""
        try:
            slot.container.wait(timeout=grace_s)
            return False  # it stopped
        except Exception:  # noqa: BLE001 - a read timeout (still running), or gone, or no daemon
            pass
        try:
            slot.container.reload()
        except Exception:  # noqa: BLE001
            return False
        return slot.container.status == "running"

    def containers(self) -> list[Any]:
        """The pool's containers (docker SDK objects)."""
        with self._lock:
            return [slot.container for slot in self._all]

    def warm_up(self) -> None:
        """Start the whole pool now instead of on first use."""
        slots = []
        while len(self._all) < self._pool_size:
            slot = self._new_slot()
            slot.session = self._start_session(slot)
            slots.append(slot)
        for slot in slots:
            self._idle.put(slot)

    def close(self) -> None:
        with self._lock:
            slots = list(self._all)
        for slot in slots:
            self._discard(slot)
        self._run.release()
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass
