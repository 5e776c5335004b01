"""The trusted task set: whatever an untrusted worker may not choose comes from here, never from its row.

A rollout names its task by its `response_id`, `<task key>-<sample>`, where the task key hashes what
defines the task (`genesys.data.identity.task_key`): the key of a task in the set the trusted side
gave out. `genesys validate --tasks` rebuilds each row from its trusted task (every column of the
task row: prompt, gold, task type, metadata, ...) and only what the worker produced
(`WORKER_COLUMNS`: the response columns, the proofs and the sampling proof, the target length, each then checked); the
worker's own copies of task columns that differ from the trusted task are a problem of the row, its
verdict columns are dropped. A row naming no task of the set, or repeating a sample, is invalid.

Consumers of validated rows (`--require-proofs` with `--tasks` in filter and train) use
`TrustedTasks.problem` to count only rows of tasks in their own trusted set, unchanged.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from genesys.data.attestation import canonical_value
from genesys.schema import RESPONSE_COLUMNS, TASK_COLUMNS, TRAJECTORY_COLUMNS, Row

# What the worker's row contributes: its response, its proofs, the target length it was asked for, and
# a trajectory's columns and mask (whose environment side validation replays, `genesys.proofs.trajectories`).
WORKER_COLUMNS = (
    *RESPONSE_COLUMNS,
    "toploc_proofs",
    "toploc_config",
    "sampling_proof",
    "target_length",
    *TRAJECTORY_COLUMNS,
    "completion_mask",
)
_SAMPLE_ID = re.compile(r"([0-9a-f]{20})-(\d+)")


class TrustedTasks:
    """The tasks the trusted side gave out, by task key."""

    def __init__(self, tasks: dict[str, Row], specs: Sequence[str] = ()) -> None:
        self.tasks = tasks
        self.specs = list(specs)

    @classmethod
    def load(cls, specs: Sequence[str]) -> TrustedTasks:
        """Every task of the sources `specs` (as `--tasks` names them for generate), checked; an
        unreadable or malformed task is an InputError naming it."""
        from genesys.tasks.prepare import prepare_tasks, select_tasks

        prepared = prepare_tasks(select_tasks(specs))
        return cls({task.key: task.row for task in prepared.tasks}, specs)

    def find(self, row: Row) -> tuple[str, Row] | str:
        """The row's task key and trusted task, or why it has none."""
        rid = row.get("response_id")
        match = _SAMPLE_ID.fullmatch(str(rid)) if rid is not None else None
        if match is None and _SAMPLE_ID.fullmatch(str(rid).partition("#")[0]):
            return f"it repeats the response_id of an earlier row ({str(rid).partition('#')[0]})"
        if match is None:
            return (
                f"response_id {rid!r} names no task: rows of a trusted task set are named "
                "<task key>-<sample> (as genesys generate names them)"
            )
        key = match.group(1)
        task = self.tasks.get(key)
        if task is None:
            return f"its task {key} (response_id {rid!r}) is not in the trusted task set ({', '.join(self.specs)})"
        return key, task

    def bind(self, row: Row) -> tuple[Row, str | None, list[str]]:
        """`row` rebuilt from its trusted task and its `WORKER_COLUMNS`, its task key (None when the
        task is unknown: the row comes back as it was), and the problems found: an unknown task, task
        columns of the worker's row that differ from the trusted task's."""
        found = self.find(row)
        if isinstance(found, str):
            return row, None, [found]
        key, task = found
        differing = [
            name
            for name in dict.fromkeys((*TASK_COLUMNS, *task))
            if name not in WORKER_COLUMNS
            and name in row
            and canonical_value(name, row[name]) != canonical_value(name, task.get(name))
        ]
        problems = (
            [
                f"the row's {', '.join(differing)} differ{'s' if len(differing) == 1 else ''} from its trusted task's"
            ]
            if differing
            else []
        )
        bound = {name: _copy(value) for name, value in task.items()}
        bound.update({name: row[name] for name in WORKER_COLUMNS if name in row})
        return bound, key, problems

    def problem(self, row: Row) -> str | None:
        """Why a validated row does not belong to this task set unchanged, or None."""
        found = self.find(row)
        if isinstance(found, str):
            return found
        _, task = found
        for name in dict.fromkeys((*TASK_COLUMNS, *task)):
            if canonical_value(name, row.get(name)) != canonical_value(name, task.get(name)):
                return f"its {name} differs from its trusted task's"
        return None


def _copy(value: Any) -> Any:
    return copy.deepcopy(value) if isinstance(value, (dict, list)) else value
