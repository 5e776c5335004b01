"""The generation actor: one generation backend in a Ray actor, for `genesys generate` and for the
rollout workers of training alike.

The actor builds its backend with the factory it is given (a picklable callable such as
`functools.partial(create_backend, name, model, style, options)`), so this package knows no
backend, and plays environment tasks with the function it is given (such as
`genesys.generate.episodes.generate_and_play`). `generate(requests, weights, tasks)` returns the
results of a chunk of requests; given the requests' task rows (`tasks`, by request key) they go
through that function, so a task of an environment's type is played on this actor, its model turns
batched with the chunk's others. Given
`weights` (a published version, `genesys.cluster.weights.PublishedWeights`) it first loads them
unless it holds them or newer ones already. So no job runs on weights older than those published
when it was sent, and an actor that Ray restarted (its constructor loads the starting model again)
catches up by itself when Ray sends it the job again. `load_weights` fetches and loads a published
version; rollout workers run it in a lane of its own (`WEIGHTS_LANE`, a Ray concurrency group), so
new weights arrive while a job generates and the backend swaps them in between two of its batches.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

WEIGHTS_LANE = "weights"
LANES = {WEIGHTS_LANE: 1}  # the concurrency groups of an actor that takes new weights while it generates


@dataclass
class Generated:
    """What one `generate` call returns: the backend's results in the order they finished, the
    oldest weights version that sampled them, and the seconds spent generating."""

    results: list[Any]
    weights_version: int
    seconds: float


class GenerationActor:
    """A generation backend on this actor's devices (Ray sets CUDA_VISIBLE_DEVICES)."""

    def __init__(
        self, make_backend: Callable[[], Any], play: Callable[..., AsyncIterator[Any]] | None = None
    ) -> None:
        self.backend = make_backend()
        self.play = play  # (backend, requests, task rows) -> results, environment tasks played
        self._loading = threading.Lock()
        self._loaded_at = time.time()

    def info(self) -> dict[str, Any]:
        return self.backend.info()

    def pid(self) -> int:
        return os.getpid()

    def restarted(self) -> bool:
        """Whether Ray restarted this actor (this is not the first run of its constructor)."""
        import ray

        return ray.get_runtime_context().was_current_actor_reconstructed

    def generate(
        self, requests: list[Any], weights: Any = None, tasks: dict[str, Any] | None = None
    ) -> Generated:
        """The results of `requests`, on `weights` or newer ones when given; with their task rows
        (`tasks`), environment tasks are played."""
        if weights is not None:
            self._load(weights)
        started = time.perf_counter()
        if tasks is None:
            results = asyncio.run(_collect(self.backend.generate(requests)))
        else:
            if self.play is None:
                raise ValueError("this generation actor was given no function to play environment tasks with")
            results = asyncio.run(_collect(self.play(self.backend, requests, tasks)))
        version = min((result.weights_version for result in results), default=self.backend.weights_version)
        return Generated(results, version, time.perf_counter() - started)

    def load_weights(self, weights: Any) -> tuple[int, float]:
        """Load a published version unless this actor holds it or a newer one; returns the version
        held and when it was loaded."""
        self._load(weights)
        return self.backend.weights_version, self._loaded_at

    def _load(self, weights: Any) -> None:
        """Fetch, check and load `weights` when newer than the backend's."""
        with self._loading:
            if weights.version <= self.backend.weights_version:
                return
            import ray

            from genesys.cluster.weights import verified_weights

            tensors = verified_weights(ray.get(weights.ref), weights.digests, weights.version)
            asyncio.run(self.backend.update_weights(tensors, weights.version))
            self._loaded_at = time.time()


async def _collect(results: AsyncIterator[Any]) -> list[Any]:
    return [result async for result in results]
