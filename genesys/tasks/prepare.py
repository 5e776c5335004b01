"""Task preparation, one for every command that runs tasks (`genesys generate`, `genesys train`).

`select_tasks` loads the task sources (`genesys.tasks.sources`) and mixes them
(`genesys.tasks.mix`); `prepare_tasks` checks each selected row against the task schema (an error
names the task: `task 3 of 'tasks.jsonl': ...`), parses its JSON fields into dicts, computes its
key (`genesys.data.identity.task_key`) and, when asked, drops the tasks that repeat an earlier
one, refuses the tasks the reward cannot be computed for and the task types no installed verifier
serves: all before any model is loaded or any sample generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genesys.config import RewardConfig, VerifyConfig
from genesys.data.identity import task_key
from genesys.errors import InputError
from genesys.schema import SchemaError, Task

if TYPE_CHECKING:
    from genesys.tasks.sources import Reject

Selected = tuple[str, int, dict[str, Any]]  # (source spec, row index in it, row)


@dataclass
class PreparedTask:
    """A checked task row (its JSON fields parsed), where it came from, and its key."""

    spec: str
    index: int
    row: dict[str, Any]
    key: str


@dataclass
class PreparedTasks:
    """The tasks to run, in order, and how many repeats of earlier tasks were dropped."""

    tasks: list[PreparedTask] = field(default_factory=list)
    duplicates: int = 0

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [task.row for task in self.tasks]


def select_tasks(
    specs: Sequence[str],
    *,
    mix: Sequence[float] | None = None,
    max_tasks: int | None = None,
    seed: int = 0,
    reject: Reject | None = None,
) -> list[Selected]:
    """Every `--tasks` source loaded and mixed, in the run's order; unreadable rows of task files go
    to `reject` (without it they are an InputError)."""
    from genesys.tasks.mix import mix_tasks
    from genesys.tasks.sources import load_source

    return mix_tasks(
        [load_source(spec, reject) for spec in specs], ratios=mix, max_tasks=max_tasks, seed=seed
    )


def prepare_tasks(
    selected: Sequence[Selected],
    *,
    dedupe: bool = False,
    reward: RewardConfig | None = None,
    verify: VerifyConfig | None = None,
) -> PreparedTasks:
    """The selected tasks checked, in order. Each row gets its `verification_info` and `metadata`
    as dicts, whatever they arrived as. With `dedupe`, a task whose key an earlier one has is dropped
    and counted; with `reward`, a task the reward cannot be computed for is refused; with `verify`,
    so are task types no installed verifier serves (unless `verify.skip_unknown`)."""
    prepared = PreparedTasks()
    seen: set[str] = set()
    for spec, index, row in selected:
        try:
            task = Task.from_row(row)
        except SchemaError as exc:
            raise InputError(f"task {index} of {spec!r}: {exc}") from None
        if not task.prompt:
            raise InputError(f"task {index} of {spec!r}: field 'prompt' is missing or empty")
        row.update(verification_info=task.verification_info, metadata=task.metadata)
        key = task_key(row)
        if dedupe and key in seen:
            prepared.duplicates += 1
            continue
        seen.add(key)
        if reward is not None:
            _check_reward(spec, index, row, reward)
        prepared.tasks.append(PreparedTask(spec, index, row, key))
    if verify is not None:
        check_verifiable(selected, verify)
    return prepared


def check_verifiable(selected: Sequence[Selected], verify: VerifyConfig) -> None:
    """Refuse, before any work, task types no installed verifier serves (unless skip_unknown)."""
    from genesys.plugins.registry import verifier_entries
    from genesys.verification.task_types import TaskTypeCensus, refuse_unknown

    if verify.skip_unknown:
        return
    census = TaskTypeCensus()
    for spec, index, row in selected:
        census.add(row["task_type"], f"task {index} of {spec!r}")
    refuse_unknown(census, verifier_entries())


def _check_reward(spec: str, index: int, row: dict[str, Any], reward: RewardConfig) -> None:
    from genesys.rewards import reward_problem

    problem = reward_problem({**row, "completion_ids": []}, reward)
    if problem:
        raise InputError(f"task {index} of {spec!r}: reward ({reward.describe()}): {problem}")
