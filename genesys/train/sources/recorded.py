"""Recorded rollouts (the offline mode): the groups of rollout files made by `genesys generate --verify`.

`RecordedRollouts` reads the files once, checks each rollout for what training needs (an
InputError names the first file:line that lacks it), keeps the groups of one task with at least two
rewarded samples (with signal, when the online filter is on) and serves them in a seeded order. With
`data.require_proofs` it drops, and counts, every rollout a `genesys.proofs.requirement.ProofRequirement`
does not count (attested under the trust key, marked valid by `genesys validate --tasks`, of a task of
`data.tasks` when given); with `data.keep_tasks` (a task file, as `genesys filter` writes) it keeps
only the rollouts of those tasks, matched as `genesys filter` groups them (`group_key`: problem_id, or
prompt without one).
Nothing generates (a `FileSource`): `start`, `publish` and `close` have nothing to do.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from genesys.data.identity import group_key, response_id, task_key
from genesys.data.inputs import resolve_inputs
from genesys.data.io import iter_rows
from genesys.errors import InputError
from genesys.proofs.requirement import ProofRequirement
from genesys.schema import Row, SchemaError, parse_json_field
from genesys.train.config import TrainConfig
from genesys.train.distributed import World
from genesys.train.groups import group_by_task, has_signal
from genesys.train.order import ItemOrder
from genesys.train.sources.base import FileSource, StepRollouts, usable

log = logging.getLogger(__name__)


class RecordedRollouts(FileSource):
    """Serve the groups of recorded rollout files (the offline mode), in a seeded order."""

    def __init__(self, config: TrainConfig, world: World) -> None:
        self.config = config
        requirement = (
            ProofRequirement.load(config.proofs.trust_key, config.data.tasks)
            if config.data.require_proofs
            else None
        )
        rows, self.rows_unproven = load_recorded_rows(
            config.data.rollouts or [], config.sampling.temperature, requirement, config.sampling.top_p
        )
        if config.data.keep_tasks is not None:
            rows = keep_tasks_of(rows, config.data.keep_tasks)
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

    def next_batch(self, size: int) -> StepRollouts:
        groups = [self.groups[index] for _, index in self.order.take(size)]
        return StepRollouts(
            groups=groups,
            groups_seen=len(groups),
            rounds=0,
            errors=sum(len(g) - len(usable(g)) for g in groups),
        )


def keep_tasks_of(rows: list[Row], task_file: str) -> list[Row]:
    """The rollouts of `rows` whose task is in `task_file` (`group_key`); InputError when none is."""
    wanted = set()
    for record in iter_rows(resolve_inputs([task_file])):
        if record.row is None:
            raise InputError(f"data.keep_tasks: {record.location}: {record.error}")
        wanted.add(group_key(record.row))
    kept = [row for row in rows if group_key(row) in wanted]
    if not kept:
        raise InputError(
            f"data.keep_tasks: none of the {len(rows)} recorded rollouts belongs to one of the {len(wanted)} tasks "
            f"of {task_file} (tasks are matched by problem_id, or by prompt when it has none)"
        )
    log.info("data.keep_tasks: %d of %d rollouts are of the tasks of %s", len(kept), len(rows), task_file)
    return kept


REQUIRED_RECORDED = ("prompt_ids", "completion_ids", "completion_logprobs", "reward")


def load_recorded_rows(
    patterns: Sequence[str],
    temperature: float,
    requirement: ProofRequirement | None = None,
    top_p: float = 1.0,
) -> tuple[list[Row], int]:
    """Every rollout of the files, checked for what offline training needs (an InputError names
    the first file:line that lacks it), and how many `requirement` (when given) did not count and
    were dropped first; the first of them is logged with its reason."""
    rows = []
    unproven = 0
    first_unproven = ""
    for record in iter_rows(resolve_inputs(patterns)):
        if record.row is None:
            raise InputError(f"{record.location}: {record.error}")
        row = record.row
        problem = requirement.problem(row) if requirement is not None else None
        if problem:
            unproven += 1
            first_unproven = first_unproven or f"{record.location}: {problem}"
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
        problem = _recorded_problem(row, temperature, top_p)
        if problem:
            raise InputError(f"{record.location}: {problem}")
        row.setdefault("response_id", response_id(task_key(row), len(rows)))
        rows.append(row)
    if not rows:
        proofs = (
            f" that data.require_proofs counts ({unproven} dropped; the first: {first_unproven})"
            if unproven
            else ""
        )
        raise InputError(f"data.rollouts: no rollouts{proofs} in {', '.join(patterns)}")
    if unproven:
        log.warning(
            "data.require_proofs: %d rollouts not proven dropped, %d kept; the first: %s",
            unproven,
            len(rows),
            first_unproven,
        )
    return rows, unproven


def _recorded_problem(row: Row, temperature: float, top_p: float) -> str | None:
    prompt, completion, logprobs, reward = (row[name] for name in REQUIRED_RECORDED)
    if not _int_list(prompt) or not prompt:
        return "prompt_ids must be a non-empty list of token ids"
    if not _int_list(completion):
        return "completion_ids must be a list of token ids"
    if logprobs is None or not isinstance(logprobs, list) or len(logprobs) != len(completion):
        return f"completion_logprobs must be a list of one logprob per completion token ({len(completion)}), got {_describe(logprobs)}"
    if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in logprobs):
        return "completion_logprobs must hold numbers"
    bad = next((i for i, value in enumerate(logprobs) if not math.isfinite(value)), None)
    if bad is not None:
        return f"completion_logprobs[{bad}] is {logprobs[bad]}: logprobs must be finite"
    mask = row.get("completion_mask")
    if mask is not None and (
        not isinstance(mask, list)
        or len(mask) != len(completion)
        or any(value not in (0, 1) for value in mask)
    ):
        return f"completion_mask must be a list of one 0 or 1 per completion token ({len(completion)}), got {_describe(mask)}"
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
    ):
        return f"reward must be a finite number or null, got {reward!r}"
    try:
        recorded = parse_json_field(row.get("generation_config"), "generation_config")
    except SchemaError as exc:
        return str(exc)
    if recorded.get("temperature") not in (None, temperature):
        return f"sampled at temperature {recorded['temperature']}, but sampling.temperature is {temperature}: the logprobs are those of the sampling temperature, set sampling.temperature = {recorded['temperature']}"
    if recorded.get("top_p") not in (None, top_p):
        return f"sampled at top_p {recorded['top_p']}, but sampling.top_p is {top_p}: the logprobs are those of the sampling nucleus, set sampling.top_p = {recorded['top_p']}"
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
