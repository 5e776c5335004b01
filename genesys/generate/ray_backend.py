"""`genesys generate` on Ray: the generation backend spread over `cluster.rollout_workers` actors.

`RayBackend` has the interface of a backend, so the generation run (its resume, its atomic writes,
its verification) is the same as on one machine. Requests go in chunks to the actor with the fewest
chunks in flight; results come back as chunks finish. An actor that dies has its chunk sent to a
replacement, so no request is lost; the run writes each result once, so none is duplicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from genesys.cluster import actor_options, ray_session
from genesys.config import ClusterConfig, PromptStyle
from genesys.generate.backend import GenerationRequest, GenerationResult, Weights, create_backend, iterate

log = logging.getLogger(__name__)
CHUNK_REQUESTS = 8
CHUNKS_PER_ACTOR = 2  # one running, one queued behind it, so an actor never waits for the driver
MAX_SENDS = 3


class GenerationActor:
    """One backend in a Ray actor: generates a chunk of requests, returns their results."""

    def __init__(self, name: str, model: str, style: PromptStyle, options: dict[str, Any]) -> None:
        self.backend = create_backend(name, model, style, options)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return list(iterate(self.backend.generate(requests)))

    def info(self) -> dict[str, Any]:
        return self.backend.info()

    def pid(self) -> int:
        return os.getpid()


@dataclass
class _Chunk:
    requests: list[GenerationRequest]
    actor: int  # the slot it was sent to
    handle: Any = None  # the actor that had the slot then
    sends: int = 1


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
        self.cluster = cluster
        self.chunk_requests = chunk_requests
        self._args = (name, model, style, options)
        self._session = contextlib.ExitStack()
        self.ray = self._session.enter_context(
            ray_session(
                cluster,
                cluster.rollout_workers * cluster.rollout_cpus
                + cluster.verifier_workers * cluster.verifier_cpus,
            )
        )
        self.actors = [self._new_actor() for _ in range(cluster.rollout_workers)]
        self.replaced = 0
        self._info = {
            **self.ray.get(self.actors[0].info.remote()),
            "ray_actors": len(self.actors),
        }  # waits for the model to load

    def info(self) -> dict[str, Any]:
        return self._info

    async def update_weights(self, weights: Weights, version: int | None = None) -> None:
        raise NotImplementedError(
            "the Ray generation backend serves `genesys generate`; training on Ray sends weights to its own rollout workers"
        )

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        self._session.close()

    async def generate(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]:
        chunks = _chunks(requests, self.chunk_requests)
        retry: deque[_Chunk] = deque()
        flying: dict[Any, _Chunk] = {}
        while True:
            self._fill(flying, retry, chunks)
            if not flying:
                return
            done, _ = await asyncio.to_thread(self.ray.wait, list(flying), num_returns=1)
            chunk = flying.pop(done[0])
            try:
                results = self.ray.get(done[0])
            except self.ray.exceptions.RayActorError as exc:
                retry.append(self._after_death(chunk, exc))
                continue
            for result in results:
                yield result

    def _fill(
        self, flying: dict[Any, _Chunk], retry: deque[_Chunk], chunks: Iterator[list[GenerationRequest]]
    ) -> None:
        """Send chunks (resent ones first) while an actor has fewer than CHUNKS_PER_ACTOR in flight."""
        while True:
            load = [0] * len(self.actors)
            for chunk in flying.values():
                load[chunk.actor] += 1
            actor = min(range(len(load)), key=load.__getitem__)
            if load[actor] >= CHUNKS_PER_ACTOR:
                return
            if retry:
                chunk = retry.popleft()
                chunk.actor = actor
            else:
                requests = next(chunks, None)
                if requests is None:
                    return
                chunk = _Chunk(requests, actor)
            chunk.handle = self.actors[actor]
            flying[chunk.handle.generate.remote(chunk.requests)] = chunk

    def _after_death(self, chunk: _Chunk, exc: Exception) -> _Chunk:
        """Replace the dead actor (once, whichever of its chunks reports it first); the chunk, to resend."""
        if chunk.sends >= MAX_SENDS:
            raise RuntimeError(
                f"generation actors died {chunk.sends} times on the same {len(chunk.requests)} requests; the last: {exc}"
            ) from exc
        if self.actors[chunk.actor] is chunk.handle:  # not replaced yet by another of its chunks
            log.warning(
                "generation actor %d died (%s); starting a replacement and resending its requests",
                chunk.actor,
                type(exc).__name__,
            )
            self.actors[chunk.actor] = self._new_actor()
            self.replaced += 1
        chunk.sends += 1
        return chunk

    def _new_actor(self) -> Any:
        cluster = self.cluster
        return (
            self.ray.remote(GenerationActor)
            .options(**actor_options(cluster.rollout_cpus, cluster.rollout_gpus))
            .remote(*self._args)
        )


def _chunks(requests: Iterable[GenerationRequest], size: int) -> Iterator[list[GenerationRequest]]:
    iterator = iter(requests)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
