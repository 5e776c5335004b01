"""Where a step's groups of rewarded rollouts come from.

`OnlineRollouts` samples tasks in a seeded order, generates with a genesys backend, verifies with
the verification pool and shapes rewards with `genesys.rewards`; groups without signal are dropped
and refilled (`genesys.train.groups.fill_batch`). `RecordedRollouts` reads rollout files made by
`genesys generate --verify` and serves their groups in a seeded order; with `data.require_proofs` it
drops, and counts, every rollout `genesys validate` did not mark valid. Both keep their position in
a small state dict, so a resumed run reads on exactly where it stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from genesys.data.identity import response_id, task_key
from genesys.data.inputs import resolve_inputs
from genesys.data.io import iter_rows
from genesys.errors import InputError
from genesys.generate.backend import Backend, GenerationRequest, iterate
from genesys.generate.prompts import build_messages
from genesys.generate.runner import PlannedTask, RowBuilder, request_seed
from genesys.rewards import RewardStage
from genesys.schema import Row, SchemaError, parse_json_field
from genesys.train.config import TrainConfig
from genesys.train.distributed import World
from genesys.train.groups import fill_batch, group_by_task, has_signal
from genesys.train.order import ItemOrder
from genesys.verification.pool import VerificationPool

log = logging.getLogger(__name__)
DRAW_COLUMN = "train_draw"  # the task's position in the run's task stream: one group per draw


@dataclass
class StepRollouts:
    """The groups of one step on this rank and how they were obtained."""

    groups: list[list[Row]]
    groups_seen: int = 0
    groups_dropped: int = 0
    rounds: int = 0
    errors: int = 0  # rollouts whose verification failed (reward None): never trained on
    generated_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # metrics of the asynchronous mode, logged as they are


def usable(group: Sequence[Row]) -> list[Row]:
    """The rollouts of a group that have a reward."""
    return [row for row in group if row.get("reward") is not None]


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

    def state(self) -> dict[str, Any]:
        return {"taken": self.order.taken, "carry": self.carry}

    def load_state(self, state: dict[str, Any]) -> None:
        self.order.taken = state["taken"]
        self.carry = state["carry"]

    def next_batch(self, size: int) -> StepRollouts:
        """`size` groups for this rank (fewer when refilling could not find enough with signal)."""
        step = self._current = StepRollouts(groups=[])
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
        step.timings["generate_seconds"] = step.timings.get("generate_seconds", 0.0) + finished - started
        step.timings["verify_seconds"] = (
            step.timings.get("verify_seconds", 0.0) + time.perf_counter() - finished
        )
        return verified


@dataclass
class GeneratedRows:
    """Unverified rollouts of some tasks, their completion tokens, and the oldest weights version
    that sampled them (`None` when there were no tasks)."""

    rows: list[Row]
    tokens: int
    weights_version: int | None


def generate_rows(
    backend: Backend, builder: RowBuilder, config: TrainConfig, draws: Sequence[tuple[int, Row]]
) -> GeneratedRows:
    """`sampling.n` rollouts of each (stream position, task) draw, each row marked with its draw."""
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
    out = GeneratedRows([], 0, None)
    for result in iterate(backend.generate(requests)):
        out.rows.extend(builder.rows(plans[result.request.key], result))
        out.tokens += sum(len(c.completion_ids or ()) for c in result.completions)
        out.weights_version = (
            result.weights_version
            if out.weights_version is None
            else min(out.weights_version, result.weights_version)
        )
    return out


def row_builder(config: TrainConfig, backend_name: str) -> RowBuilder:
    """The row builder of the run's rollouts (model, generation settings, backend)."""
    return RowBuilder(
        config.model,
        {"backend": backend_name, **config.sampling.as_dict()},
        {"backend": backend_name},
    )


def _draw(row: Row) -> int:
    return row[DRAW_COLUMN]


class RecordedRollouts:
    """Serve the groups of recorded rollout files (the offline mode), in a seeded order."""

    def __init__(self, config: TrainConfig, world: World) -> None:
        self.config = config
        rows, self.rows_unproven = load_recorded_rows(
            config.data.rollouts or [], config.sampling.temperature, config.data.require_proofs
        )
        if self.rows_unproven:
            log.warning(
                "data.require_proofs: %d rollouts without a valid TOPLOC proof dropped, %d kept",
                self.rows_unproven,
                len(rows),
            )
        groups = [group for group in group_by_task(rows) if len(usable(group)) >= 2]
        self.groups_dropped_on_load = 0
        if config.rollout.filter_groups:
            kept = [group for group in groups if has_signal(group, config.rollout.filter_signal)]
            self.groups_dropped_on_load = len(groups) - len(kept)
            groups = kept
        if not groups:
            raise InputError(
                f"data.rollouts: no group of rollouts of one task with at least two rewarded samples{' that differ in ' + config.rollout.filter_signal if config.rollout.filter_groups else ''}; nothing to train on"
            )
        self.groups = groups
        self.order = ItemOrder(len(groups), config.sampling.seed, world.rank, world.size)

    def state(self) -> dict[str, Any]:
        return {"taken": self.order.taken}

    def load_state(self, state: dict[str, Any]) -> None:
        self.order.taken = state["taken"]

    def next_batch(self, size: int) -> StepRollouts:
        groups = [self.groups[index] for _, index in self.order.take(size)]
        return StepRollouts(
            groups=groups,
            groups_seen=len(groups),
            rounds=0,
            errors=sum(len(g) - len(usable(g)) for g in groups),
        )


def load_tasks(config: TrainConfig) -> list[Row]:
    """The tasks of `data.tasks`, mixed and checked: each has a prompt, a verifier serves its type
    (unless verify.skip_unknown), and the reward can be computed for it. Errors name the task."""
    from genesys.generate.runner import check_verifiable
    from genesys.rewards import reward_problem
    from genesys.schema import Task
    from genesys.tasks.mix import mix_tasks
    from genesys.tasks.sources import load_source

    selected = mix_tasks(
        [load_source(spec) for spec in config.data.tasks or []],
        ratios=config.data.mix,
        seed=config.sampling.seed,
    )
    tasks = []
    for spec, index, row in selected:
        try:
            task = Task.from_row(row)
        except SchemaError as exc:
            raise InputError(f"task {index} of {spec!r}: {exc}") from None
        if not task.prompt:
            raise InputError(f"task {index} of {spec!r}: field 'prompt' is missing or empty")
        row.update(verification_info=task.verification_info, metadata=task.metadata)
        problem = reward_problem({**row, "completion_ids": []}, config.reward)
        if problem:
            raise InputError(f"task {index} of {spec!r}: reward ({config.reward.describe()}): {problem}")
        tasks.append(row)
    if not tasks:
        raise InputError(f"data.tasks: no tasks in {', '.join(config.data.tasks or [])}")
    check_verifiable(selected, config.verify_config())
    return tasks


REQUIRED_RECORDED = ("prompt_ids", "completion_ids", "completion_logprobs", "reward")


def load_recorded_rows(
    patterns: Sequence[str], temperature: float, require_proofs: bool = False
) -> tuple[list[Row], int]:
    """Every rollout of the files, checked for what offline training needs (an InputError names
    the first file:line that lacks it), and how many were dropped first for want of a valid TOPLOC
    proof (`toploc_valid` not true) when `require_proofs`."""
    rows = []
    unproven = 0
    for record in iter_rows(resolve_inputs(patterns)):
        if record.row is None:
            raise InputError(f"{record.location}: {record.error}")
        row = record.row
        if require_proofs and row.get("toploc_valid") is not True:
            unproven += 1
            continue
        missing = [name for name in REQUIRED_RECORDED if name not in row]
        if missing:
            hint = (
                " (the behaviour policy's logprobs: generate with a backend that records them, e.g. transformers or vllm)"
                if "completion_logprobs" in missing
                else ""
            )
            hint = hint or (
                " (verify the rollouts: genesys generate --verify, or genesys verify)"
                if missing == ["reward"]
                else ""
            )
            raise InputError(f"{record.location}: rollout has no {', '.join(missing)}{hint}")
        problem = _recorded_problem(row, temperature)
        if problem:
            raise InputError(f"{record.location}: {problem}")
        row.setdefault("response_id", response_id(task_key(row), len(rows)))
        rows.append(row)
    if not rows:
        proofs = (
            f" with a valid TOPLOC proof ({unproven} without: check them with genesys validate)"
            if unproven
            else ""
        )
        raise InputError(f"data.rollouts: no rollouts{proofs} in {', '.join(patterns)}")
    return rows, unproven


def _recorded_problem(row: Row, temperature: float) -> str | None:
    prompt, completion, logprobs, reward = (row[name] for name in REQUIRED_RECORDED)
    if not _int_list(prompt) or not prompt:
        return "prompt_ids must be a non-empty list of token ids"
    if not _int_list(completion):
        return "completion_ids must be a list of token ids"
    if logprobs is None or not isinstance(logprobs, list) or len(logprobs) != len(completion):
        return f"completion_logprobs must be a list of one logprob per completion token ({len(completion)}), got {_describe(logprobs)}"
    if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in logprobs):
        return "completion_logprobs must hold numbers"
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        return f"reward must be a number or null, got {reward!r}"
    try:
        recorded = parse_json_field(row.get("generation_config"), "generation_config")
    except SchemaError as exc:
        return str(exc)
    if recorded.get("temperature") not in (None, temperature):
        return f"sampled at temperature {recorded['temperature']}, but sampling.temperature is {temperature}: the logprobs are those of the sampling temperature, set sampling.temperature = {recorded['temperature']}"
    return None


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _describe(value: Any) -> str:
    return (
        "null"
        if value is None
        else f"{type(value).__name__} of {len(value)}"
        if isinstance(value, list)
        else type(value).__name__
    )
