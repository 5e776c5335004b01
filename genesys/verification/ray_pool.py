"""A verification pool spread over Ray actors (`[cluster] backend = "ray"`).

Each `VerifierActor` runs the verification engine (`genesys.verification.engine`) on its own
machine; `RayVerificationPool` cuts the submitted rows into chunks, sends each to the actor with
the fewest rows in flight and hands the verified rows back as they come. An actor that dies takes
no row with it: its chunks go to a replacement. The pool has the interface of the engine, so
`genesys verify` writes, resumes and counts exactly as it does with local processes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from genesys.cluster import actor_options, import_ray, ray_session
from genesys.config import ClusterConfig, VerifyConfig
from genesys.plugins.specs import Verifier
from genesys.schema import Row
from genesys.verification.pool import VerificationPool
from genesys.verification.stats import TypeStats

log = logging.getLogger(__name__)
CHUNK_ROWS = 64
MAX_RESENDS = 3  # a chunk whose actors keep dying is an infrastructure failure, not a row's fault


class VerifierActor:
    """The verification engine in a Ray actor: verifies a list of rows, returned in their order."""

    def __init__(
        self,
        config: VerifyConfig,
        verifiers: Mapping[str, type[Verifier]] | None,
        expected_types: Collection[str] | None,
    ) -> None:
        from genesys.verification.engine import VerificationEngine

        self.engine = VerificationEngine(config, verifiers, expected_types)
        self.engine.start()

    def verify(self, rows: list[Row]) -> tuple[list[Row], dict[str, TypeStats]]:
        """The rows verified, in their order, and the totals of this call per task_type."""
        before = {task_type: replace(stats) for task_type, stats in self.engine.stats.items()}
        for index, row in enumerate(rows):
            self.engine.submit(index, row)
        verified: list[Row] = list(rows)
        for index, row in self.engine.drain():
            verified[index] = row  # type: ignore[index]
        return verified, {
            task_type: _minus(stats, before.get(task_type)) for task_type, stats in self.engine.stats.items()
        }

    def pid(self) -> int:
        import os

        return os.getpid()


def start_verifier(
    cluster: ClusterConfig,
    config: VerifyConfig,
    verifiers: Mapping[str, type[Verifier]] | None = None,
    expected_types: Collection[str] | None = None,
) -> Any:
    """A new verifier actor with the resources `cluster` declares for one."""
    ray = import_ray()
    local = replace(config, cluster=ClusterConfig(), progress=False)
    return (
        ray.remote(VerifierActor)
        .options(**actor_options(cluster.verifier_cpus))
        .remote(local, verifiers, expected_types)
    )


def _minus(total: TypeStats, earlier: TypeStats | None) -> TypeStats:
    if earlier is None:
        return replace(total)
    return TypeStats(**{f.name: getattr(total, f.name) - getattr(earlier, f.name) for f in fields(TypeStats)})


def _add(total: TypeStats, part: TypeStats) -> None:
    for f in fields(TypeStats):
        setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


@dataclass
class _Chunk:
    keys: list[Hashable]
    rows: list[Row]
    actor: int  # the slot it was sent to
    handle: Any = None  # the actor that had the slot then
    sends: int = 1


class RayVerificationPool(VerificationPool):
    """Verifies rows on `cluster.verifier_workers` Ray actors; use as a context manager."""

    def __init__(
        self,
        config: VerifyConfig,
        verifiers: Mapping[str, type[Verifier]] | None = None,
        expected_types: Collection[str] | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        super().__init__()
        if verifiers is None:
            from genesys.plugins.registry import verifier_entries

            verifiers = {task_type: entry.cls for task_type, entry in verifier_entries().items()}
        self.config = config
        self.verifiers = dict(verifiers)
        self.expected_types = expected_types
        self.chunk_rows = chunk_rows
        self.actors: list[Any] = []
        self.replaced = 0
        self._stats: dict[str, TypeStats] = {}
        self._session = contextlib.ExitStack()
        self._ray: Any = None
        self._open: list[tuple[Hashable, Row]] = []
        self._flying: dict[Any, _Chunk] = {}
        self._done: list[tuple[Hashable, Row]] = []

    @property
    def known_task_types(self) -> set[str]:
        return set(self.verifiers)

    @property
    def stats(self) -> dict[str, TypeStats]:
        return self._stats

    @property
    def outstanding(self) -> int:
        return len(self._open) + sum(len(chunk.rows) for chunk in self._flying.values()) + len(self._done)

    def start(self) -> None:
        cluster = self.config.cluster
        self._ray = self._session.enter_context(
            ray_session(cluster, cluster.verifier_workers * cluster.verifier_cpus)
        )
        self.actors = [self._new_actor() for _ in range(cluster.verifier_workers)]

    def shutdown(self) -> None:
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
        self._session.close()

    def submit(self, key: Hashable, row: Row) -> None:
        self._open.append((key, row))
        if len(self._open) >= self.chunk_rows:
            self._send_open()
        while self.outstanding - len(self._done) > self.config.max_pending_rows:
            self._collect(1.0)

    def poll(self, timeout: float = 0.0) -> list[tuple[Hashable, Row]]:
        self._send_open()
        if not self._done:
            self._collect(timeout)
        done, self._done = self._done, []
        return done

    def _new_actor(self) -> Any:
        return start_verifier(self.config.cluster, self.config, self.verifiers, self.expected_types)

    def _send_open(self) -> None:
        if self._open:
            keys, rows = zip(*self._open)
            self._open = []
            self._send(_Chunk(list(keys), list(rows), self._least_loaded()))

    def _least_loaded(self) -> int:
        load = [0] * len(self.actors)
        for chunk in self._flying.values():
            load[chunk.actor] += len(chunk.rows)
        return min(range(len(load)), key=load.__getitem__)

    def _send(self, chunk: _Chunk) -> None:
        chunk.handle = self.actors[chunk.actor]
        self._flying[chunk.handle.verify.remote(chunk.rows)] = chunk

    def _collect(self, timeout: float) -> None:
        """Take the chunks that finished within `timeout` seconds; resend those whose actor died."""
        if not self._flying:
            return
        ready, _ = self._ray.wait(list(self._flying), num_returns=len(self._flying), timeout=timeout)
        for ref in ready:
            chunk = self._flying.pop(ref)
            try:
                rows, stats = self._ray.get(ref)
            except self._ray.exceptions.RayActorError as exc:
                self._resend(chunk, exc)
                continue
            self._done.extend(zip(chunk.keys, rows))
            for task_type, part in stats.items():
                _add(self._stats.setdefault(task_type, TypeStats()), part)

    def _resend(self, chunk: _Chunk, exc: Exception) -> None:
        if chunk.sends > MAX_RESENDS:
            raise RuntimeError(
                f"verifier actors died {chunk.sends} times on the same {len(chunk.rows)} rows; the last: {exc}"
            ) from exc
        if self.actors[chunk.actor] is chunk.handle:  # not replaced yet by another of its chunks
            log.warning(
                "verifier actor %d died (%s); starting a replacement and resending its rows",
                chunk.actor,
                type(exc).__name__,
            )
            self.actors[chunk.actor] = self._new_actor()
            self.replaced += 1
        chunk.sends += 1
        self._send(chunk)
