"""Online rollouts (the on-policy mode): generated, verified and rewarded in the trainer's process.

`OnlineRollouts` samples tasks in a seeded order, generates with a genesys backend on this rank's
device, verifies with the verification engine and shapes rewards with `genesys.rewards`; groups
without signal are dropped and refilled (`genesys.train.groups.fill_batch`). After each batch's
optimizer steps the backend takes the new weights in place. `draw_requests` and `draw_rows`, the
requests of some task draws and the rows of their results, serve the asynchronous mode too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from genesys.cluster.weights import engine_weights
from genesys.data.identity import request_seed, task_key
from genesys.errors import InputError
from genesys.generate.backend import Backend, GenerationRequest, GenerationResult, iterate
from genesys.generate.episodes import generate_and_play
from genesys.generate.rows import PlannedTask, RowBuilder
from genesys.rewards import RewardStage
from genesys.schema import Row
from genesys.tasks.prompts import build_messages
from genesys.train.config import TrainConfig
from genesys.train.distributed import World
from genesys.train.groups import fill_batch, group_by_task
from genesys.train.order import ItemOrder
from genesys.train.sources.base import DRAW_COLUMN, NamedParameters, RewardTally, StepRollouts
from genesys.verification.pool import VerificationPool


class OnlineRollouts:
    """Generate, verify and reward groups for each step (the on-policy mode)."""

    def __init__(
        self,
        config: TrainConfig,
        tasks: Sequence[Row],
        backend: Backend,
        pool: VerificationPool,
        world: World,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.backend = backend
        self.pool = pool
        self.rewards = RewardStage(config.reward)
        self.order = ItemOrder(len(tasks), config.sampling.seed, world.rank, world.size)
        self.carry: list[list[Row]] = []
        self.builder = row_builder(config, backend.name)
        self._current: StepRollouts | None = None

    @classmethod
    def open(
        cls, config: TrainConfig, world: World, tasks: Sequence[Row], source_model: str, device: Any
    ) -> OnlineRollouts:
        """The run's backend on `device` (`source_model`'s weights) and a verification engine."""
        from genesys.generate.backend import create_backend, resolve_backend_name
        from genesys.train.memory_plan import default_engine_share
        from genesys.verification.engine import VerificationEngine

        backend_name = resolve_backend_name(config.backend)
        options = config.backend_options.for_backend(backend_name)
        if backend_name == "transformers":
            options.setdefault(
                "batch_size",
                config.rollout.prompts_per_step * config.sampling.n // world.size,
            )
            options.setdefault("device", str(device))
            options.setdefault("worker_thread", False)  # nothing to overlap; see TransformersBackend
        if backend_name == "vllm":
            share = default_engine_share(config, world.size, device)
            options.update(colocated_vllm_options(config, options.get("engine_args"), share))
        backend = create_backend(backend_name, source_model, config.style, options)
        try:
            pool = VerificationEngine(config.verify_config())
            pool.start()
        except BaseException:
            backend.close()
            raise
        return cls(config, tasks, backend, pool, world)

    def start(self, named_parameters: NamedParameters, step: int) -> None:
        """Hand the backend the trainer's weights: one that cannot take weights in place fails here,
        before any work."""
        self.publish(named_parameters, step)

    def publish(self, named_parameters: NamedParameters, version: int) -> None:
        try:
            asyncio.run(self.backend.update_weights(engine_weights(named_parameters)))
        except NotImplementedError as exc:
            raise InputError(
                f"backend {self.config.backend!r} cannot take new weights in place ({exc}); on-policy training needs one that can (transformers, vllm)"
            ) from None

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            self.backend.close()

    def state(self) -> dict[str, Any]:
        return {"taken": self.order.taken, "carry": self.carry}

    def load_state(self, state: dict[str, Any]) -> None:
        self.order.taken = state["taken"]
        self.carry = state["carry"]

    def next_batch(self, size: int) -> StepRollouts:
        """`size` groups for this rank (fewer when refilling could not find enough with signal)."""
        step = self._current = StepRollouts(groups=[], generated_rewards=RewardTally())
        rollout = self.config.rollout
        if not rollout.filter_groups:
            step.groups = group_by_task(self._generate(size), key=_draw)
            step.groups_seen = len(step.groups)
            step.rounds = 1
            return step
        filled = fill_batch(
            self._generate,
            size,
            max_rounds=rollout.max_refill_rounds,
            signal=rollout.filter_signal,
            carry=self.carry,
            key=_draw,
        )
        self.carry = filled.surplus
        step.groups, step.groups_seen, step.groups_dropped, step.rounds = (
            filled.groups,
            filled.groups_seen,
            filled.groups_dropped,
            filled.rounds,
        )
        return step

    def _generate(self, count: int) -> list[Row]:
        """Verified, rewarded rollouts of the next `count` tasks (whole groups)."""
        step = self._current
        assert step is not None
        started = time.perf_counter()
        generated = generate_rows(
            self.backend,
            self.builder,
            self.config,
            [(position, self.tasks[index]) for position, index in self.order.take(count)],
        )
        step.generated_tokens += generated.tokens
        finished = time.perf_counter()
        verified = [self.rewards.apply(row) for row in self.pool.verify_rows(generated.rows)]
        step.errors += sum(row.get("reward") is None for row in verified)
        assert step.generated_rewards is not None
        step.generated_rewards.add(verified)
        step.timings["generate_seconds"] = step.timings.get("generate_seconds", 0.0) + finished - started
        step.timings["verify_seconds"] = (
            step.timings.get("verify_seconds", 0.0) + time.perf_counter() - finished
        )
        return verified


def colocated_vllm_options(
    config: TrainConfig, engine_args: dict[str, Any] | None, gpu_share: float | None = None
) -> dict[str, Any]:
    """The vLLM backend's settings in a training run: the engine in this process (so new weights go
    in place), seeded with the run, its weights in the training precision unless `engine_args`
    (backend_options.args) name a dtype, and on a GPU `gpu_share` of it (the memory plan's
    `default_engine_share`) unless they name its memory; every other engine argument passes through
    as given."""
    dtype = "bfloat16" if config.precision == "bf16" else "float32"
    defaults: dict[str, Any] = {"dtype": dtype}
    if gpu_share is not None:
        defaults["gpu_memory_utilization"] = gpu_share
    return {
        "colocate": True,
        "seed": config.sampling.seed,
        "engine_args": {**defaults, **(engine_args or {})},
    }


@dataclass
class GeneratedRows:
    """Unverified rollouts of some tasks, their completion tokens, and the oldest weights version
    that sampled them (`None` when there were no tasks)."""

    rows: list[Row]
    tokens: int
    weights_version: int | None


def draw_requests(
    config: TrainConfig, draws: Sequence[tuple[int, Row]]
) -> tuple[list[GenerationRequest], dict[str, PlannedTask]]:
    """The generation requests of (stream position, task) draws, `sampling.n` samples each,
    and the plans their rows are built from (each row marked with its draw)."""
    sampling = config.sampling
    plans: dict[str, PlannedTask] = {}
    requests = []
    for position, task in draws:
        row = {**task, DRAW_COLUMN: position}
        plans[str(position)] = PlannedTask(task_key(task), row, list(range(sampling.n)))
        messages = build_messages(row["prompt"], config.data.system_prompt)
        requests.append(
            GenerationRequest(
                str(position),
                messages,
                list(range(sampling.n)),
                request_seed(sampling.seed, str(position)),
                sampling,
            )
        )
    return requests, plans


def draw_rows(
    builder: RowBuilder, plans: dict[str, PlannedTask], results: Iterable[GenerationResult]
) -> GeneratedRows:
    """The rows of the results of `draw_requests`, their tokens and the oldest weights version."""
    out = GeneratedRows([], 0, None)
    for result in results:
        out.rows.extend(builder.rows(plans[result.request.key], result))
        out.tokens += sum(c.sampled_tokens for c in result.completions)
        out.weights_version = (
            result.weights_version
            if out.weights_version is None
            else min(out.weights_version, result.weights_version)
        )
    return out


def generate_rows(
    backend: Backend, builder: RowBuilder, config: TrainConfig, draws: Sequence[tuple[int, Row]]
) -> GeneratedRows:
    """`sampling.n` rollouts of each (stream position, task) draw, each row marked with its draw; a
    task of an environment's type is played in it (its rows are trajectories)."""
    requests, plans = draw_requests(config, draws)
    tasks = {key: plan.row for key, plan in plans.items()}
    return draw_rows(builder, plans, iterate(generate_and_play(backend, requests, tasks)))


def row_builder(config: TrainConfig, backend_name: str) -> RowBuilder:
    """The row builder of the run's rollouts (model, generation settings, backend)."""
    return RowBuilder(
        config.model,
        {"backend": backend_name, **config.sampling.as_dict()},
        {"backend": backend_name},
    )


def _draw(row: Row) -> int:
    return row[DRAW_COLUMN]
