"""`genesys generate` on Ray: the generation backend spread over `cluster.rollout_workers` actors.

`RayBackend` has the interface of a backend, so the generation run (its resume, its atomic writes,
its verification) is the same as on one machine. Requests go in chunks to the generation actor
(`genesys.cluster.generation`) with the fewest chunks out; results come back as chunks finish.
Environment tasks go the same way with their task rows (`play`): each actor plays the rollouts of
its chunks, its backend batching their model turns, and returns whole trajectories.
The actors form one `genesys.cluster.pool.ActorPool`: an actor that dies is restarted by Ray, which
sends it again the chunks it held, so no request is lost; the run writes each result once, so none
is duplicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from genesys.cluster.generation import Generated, GenerationActor
from genesys.cluster.pool import ActorPool
from genesys.cluster.session import ray_session
from genesys.config import ClusterConfig, PromptStyle
from genesys.generate.backend import GenerationRequest, GenerationResult, Weights, create_backend
from genesys.generate.episodes import generate_and_play

if TYPE_CHECKING:
    from genesys.plugins.specs import Environment
    from genesys.schema import Row, Task

CHUNK_REQUESTS = 8
CHUNKS_PER_ACTOR = 2  # one running, one queued behind it, so an actor never waits for the driver


class RayBackend:
    """The backend `name` on Ray actors, one model copy each (`cluster.rollout_*` resources)."""

    def __init__(
        self,
        name: str,
        model: str,
        style: PromptStyle,
        options: dict[str, Any],
        cluster: ClusterConfig,
        chunk_requests: int = CHUNK_REQUESTS,
    ) -> None:
        self.name = name
        self.weights_version = 0
        self.chunk_requests = chunk_requests
        self._session = contextlib.ExitStack()
        ray = self._session.enter_context(
            ray_session(
                cluster,
                cluster.rollout_workers * cluster.rollout_cpus
                + cluster.verifier_workers * cluster.verifier_cpus,
            )
        )
        self.pool = ActorPool(
            ray,
            GenerationActor,
            (functools.partial(create_backend, name, model, style, options), generate_and_play),
            size=cluster.rollout_workers,
            cpus=cluster.rollout_cpus,
            gpus=cluster.rollout_gpus,
            role="generation actor",
        )
        self._info = {
            **ray.get(self.pool.actors[0].info.remote()),
            "ray_actors": len(self.pool),
        }  # waits for the model to load

    @property
    def actors(self) -> list[Any]:
        return self.pool.actors

    @property
    def restarts(self) -> int:
        """How often Ray restarted one of the actors, as far as their results told."""
        return self.pool.restarts

    def info(self) -> dict[str, Any]:
        return self._info

    async def update_weights(self, weights: Weights, version: int | None = None) -> None:
        raise NotImplementedError(
            "the Ray generation backend serves `genesys generate`; training on Ray sends weights to its own rollout workers"
        )

    def close(self) -> None:
        self.pool.close()
        self._session.close()

    def generate(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]:
        return self._run(requests, None)

    def play(
        self, requests: Iterable[GenerationRequest], episodes: Mapping[str, tuple[type[Environment], Task]]
    ) -> AsyncIterator[GenerationResult]:
        """Environment tasks played on the actors: each plays the rollouts of its chunks, their model
        turns batched through its backend (with token trajectories on a token backend)."""
        tasks = {key: task.to_row() for key, (_, task) in episodes.items()}
        return self._run(requests, tasks)

    async def _run(
        self, requests: Iterable[GenerationRequest], tasks: dict[str, Row] | None
    ) -> AsyncIterator[GenerationResult]:
        chunks = _chunks(requests, self.chunk_requests)
        while True:
            self._fill(chunks, tasks)
            done = await asyncio.to_thread(self.pool.ready, None, 1)
            if not done:
                return
            for ref, call in done:
                generated: Generated = self.pool.result(ref, call)
                for result in generated.results:
                    yield result

    def _fill(self, chunks: Iterator[list[GenerationRequest]], tasks: dict[str, Row] | None) -> None:
        """Send chunks (with their task rows, to be played) while an actor has fewer than
        CHUNKS_PER_ACTOR out."""
        while self.pool.least_loaded()[1] < CHUNKS_PER_ACTOR:
            requests = next(chunks, None)
            if requests is None:
                return
            if tasks is None:
                self.pool.submit("generate", requests)
            else:
                self.pool.submit("generate", requests, None, {r.key: tasks[r.key] for r in requests})


def _chunks(requests: Iterable[GenerationRequest], size: int) -> Iterator[list[GenerationRequest]]:
    iterator = iter(requests)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
