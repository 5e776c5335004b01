"""The rollout actor: a generation backend in a Ray actor that takes new weights in place.

The actor has two lanes (Ray concurrency groups): `generate` runs one job at a time, and
`load_weights` fetches a published version from the object store, checks it and loads it while a
job may still be generating (the backend swaps the weights between two of its batches). A job
waits until the actor holds at least the version it asks for, so no job runs on weights older
than those published when it was sent; every rollout is stamped with the policy step (the weights
version) that sampled it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray

from genesys.config import PromptStyle
from genesys.schema import Row
from genesys.train.config import TrainConfig
from genesys.train.rollouts import generate_rows, row_builder

POLICY_STEP_COLUMN = "policy_step"
WAIT_FOR_WEIGHTS_S = 600.0


@dataclass
class JobResult:
    """What one generation job returns: its rows (stamped), tokens, and seconds spent generating."""

    rows: list[Row]
    tokens: int
    weights_version: int
    busy_seconds: float


@ray.remote(concurrency_groups={"generate": 1, "weights": 1})
class RolloutActor:
    """Generation with the run's backend on this actor's device."""

    def __init__(self, config: TrainConfig, model: str, options: dict[str, Any], style: PromptStyle) -> None:
        from genesys.generate.backend import create_backend

        self.config = config
        self.backend = create_backend(config.backend, model, style, options)
        self.builder = row_builder(config, self.backend.name)
        self._loaded = threading.Condition()

    def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="weights")
    def load_weights(self, version: int, checksum: str, refs: list[Any]) -> tuple[int, float]:
        """Fetch version `version` (`refs[0]`, in a list so Ray does not fetch it before the call),
        check it and load it unless a newer one is loaded; returns the version held and when it was loaded."""
        from genesys.train.broadcast import verified_weights

        if version > self.backend.weights_version:
            weights = verified_weights(ray.get(refs[0]), checksum, version)
            asyncio.run(self.backend.update_weights(weights, version))
        with self._loaded:
            self._loaded.notify_all()
        return self.backend.weights_version, time.time()

    @ray.method(concurrency_group="generate")
    def generate(self, draws: list[tuple[int, Row]], min_version: int) -> JobResult:
        """Rollouts of the (stream position, task) draws, once weights of `min_version` or newer are loaded."""
        with self._loaded:
            if not self._loaded.wait_for(
                lambda: self.backend.weights_version >= min_version, timeout=WAIT_FOR_WEIGHTS_S
            ):
                raise TimeoutError(
                    f"weights version {min_version} did not arrive within {WAIT_FOR_WEIGHTS_S:.0f} s (holding {self.backend.weights_version})"
                )
        started = time.perf_counter()
        generated = generate_rows(self.backend, self.builder, self.config, draws)
        version = (
            generated.weights_version
            if generated.weights_version is not None
            else self.backend.weights_version
        )
        for row in generated.rows:
            row[POLICY_STEP_COLUMN] = version
        return JobResult(generated.rows, generated.tokens, version, time.perf_counter() - started)
