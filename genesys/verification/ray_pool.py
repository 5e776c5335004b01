"""A verification pool spread over Ray actors (`[cluster] backend = "ray"`).

Each `VerifierActor` runs the verification engine (`genesys.verification.engine`) on its own
machine; `RayVerificationPool` cuts the submitted rows into chunks, sends each to the actor with
the fewest rows out and hands the verified rows back as they come. The actors form one
`genesys.cluster.pool.ActorPool`: an actor that dies takes no row with it, since Ray restarts it
and sends it its chunks again (a chunk is verified from scratch by whichever engine gets it). The
pool has the interface of the engine, so `genesys verify` writes, resumes and counts exactly as it
does with local processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Hashable, Mapping
from dataclasses import fields, replace
from typing import Any

from genesys.cluster.pool import ActorPool
from genesys.cluster.session import ray_session
from genesys.config import ClusterConfig, VerifyConfig
from genesys.plugins.specs import Verifier
from genesys.schema import Row
from genesys.verification.pool import VerificationPool
from genesys.verification.stats import TypeStats

CHUNK_ROWS = 64


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

    def restarted(self) -> bool:
        """Whether Ray restarted this actor (this is not the first run of its constructor)."""
        import ray

        return ray.get_runtime_context().was_current_actor_reconstructed


def _minus(total: TypeStats, earlier: TypeStats | None) -> TypeStats:
    if earlier is None:
        return replace(total)
    return TypeStats(**{f.name: getattr(total, f.name) - getattr(earlier, f.name) for f in fields(TypeStats)})


def _add(total: TypeStats, part: TypeStats) -> None:
    for f in fields(TypeStats):
        setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


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
        self.pool: ActorPool | None = None
        self._stats: dict[str, TypeStats] = {}
        self._session = contextlib.ExitStack()
        self._open: list[tuple[Hashable, Row]] = []
        self._out = 0  # rows in chunks out to the actors
        self._done: list[tuple[Hashable, Row]] = []

    @property
    def known_task_types(self) -> set[str]:
        return set(self.verifiers)

    @property
    def stats(self) -> dict[str, TypeStats]:
        return self._stats

    @property
    def outstanding(self) -> int:
        return len(self._open) + self._out + len(self._done)

    @property
    def actors(self) -> list[Any]:
        return self.pool.actors if self.pool is not None else []

    @property
    def restarts(self) -> int:
        """How often Ray restarted one of the actors, as far as their results told."""
        return self.pool.restarts if self.pool is not None else 0

    def start(self) -> None:
        cluster = self.config.cluster
        ray = self._session.enter_context(
            ray_session(cluster, cluster.verifier_workers * cluster.verifier_cpus)
        )
        local = replace(self.config, cluster=ClusterConfig(), progress=False)
        self.pool = ActorPool(
            ray,
            VerifierActor,
            (local, self.verifiers, self.expected_types),
            size=cluster.verifier_workers,
            cpus=cluster.verifier_cpus,
            role="verifier actor",
        )

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.close()
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

    def _send_open(self) -> None:
        if self._open:
            keys, rows = zip(*self._open)
            self._open = []
            assert self.pool is not None
            self.pool.submit("verify", list(rows), load=len(rows), tag=list(keys))
            self._out += len(rows)

    def _collect(self, timeout: float) -> None:
        """Take the chunks that finished within `timeout` seconds."""
        assert self.pool is not None
        for ref, call in self.pool.ready(timeout):
            rows, stats = self.pool.result(ref, call)
            self._out -= len(rows)
            self._done.extend(zip(call.tag, rows))
            for task_type, part in stats.items():
                _add(self._stats.setdefault(task_type, TypeStats()), part)
