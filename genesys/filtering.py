"""Difficulty filtering: offline by per-task pass rate, online by group signal.

Offline (`filter_tasks`, the `genesys filter` command): the rollouts of each task give its pass rate;
tasks whose rate lies in [min, max] are written as one task row each. A task is its `problem_id`, or
its prompt when `problem_id` is missing. Rollouts whose verification failed (score null) are left
out of the pass rate and counted in `n_errors`; a task with no scored rollout has no pass rate and is
dropped as unscored.

Online (`split_groups`, `fill_batch`, for a trainer): rollouts are grouped by task, and a group whose
rollouts all have the same value of the signal (by default binary correctness, score == 1) carries
no learning signal and is dropped; `fill_batch` refills a batch from further generation rounds.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from genesys.config import FilterConfig as PassRateFilter
from genesys.errors import InputError
from genesys.rewards import TARGET_LENGTH_COLUMN
from genesys.schema import JSON_COLUMNS, RESPONSE_COLUMNS, VERDICT_COLUMNS

if TYPE_CHECKING:
    import polars as pl

Row = dict[str, Any]

# Bounds are inclusive; the tolerance keeps a rate like 3/10 inside a bound written as 0.3.
_BOUND_TOLERANCE = 1e-9
_ADDED_COLUMNS = ("pass_rate", "n_samples", "n_errors")
# Per-rollout columns a task row does not keep (`target_length` is a generation setting, not the task's).
_ROLLOUT_ONLY_COLUMNS = frozenset(RESPONSE_COLUMNS + VERDICT_COLUMNS + ("completion", TARGET_LENGTH_COLUMN) + _ADDED_COLUMNS)
_ROW_INDEX = "__genesys_row"
_PROMPT_KEY = "__genesys_prompt_key"


# --- offline: pass-rate filtering ----------------------------------------------------------------


@dataclass(frozen=True)
class FilterSummary:
    """What a filter run read and kept. `rollouts` and `errors` are None for a task set with a rate column."""

    tasks: int
    kept: int
    too_hard: int
    too_easy: int
    unscored: int
    rollouts: int | None = None
    errors: int | None = None


def task_pass_rates(rollouts: pl.LazyFrame, metric: str = "score") -> pl.LazyFrame:
    """One row per task, in order of first appearance: its task columns, `pass_rate`, `n_samples`, `n_errors`.

    `n_samples` counts the scored rollouts the rate is taken over; `n_errors` those with a null score.
    """
    import polars as pl

    names = rollouts.collect_schema().names()
    if "score" not in names:
        raise InputError("the rollouts have no 'score' column: verify them first (genesys verify), or name a --pass-rate-column")
    if "problem_id" not in names and "prompt" not in names:
        raise InputError("the rollouts have neither 'problem_id' nor 'prompt': cannot tell which task a rollout belongs to")
    keys = [pl.col("problem_id")] if "problem_id" in names else []
    if "prompt" in names:
        prompt_key = pl.col("prompt") if not keys else pl.when(pl.col("problem_id").is_null()).then(pl.col("prompt"))
        keys.append(prompt_key.alias(_PROMPT_KEY))
    task_columns = [name for name in names if name not in _ROLLOUT_ONLY_COLUMNS]
    carried = [name for name in task_columns if name != "problem_id"]  # problem_id is a key already
    value = pl.col("score") if metric == "score" else (pl.col("score") == 1.0).cast(pl.Float64)
    return (
        rollouts.with_row_index(_ROW_INDEX)
        .group_by(keys)
        .agg(
            pl.col(_ROW_INDEX).min(),
            *[pl.col(name).first() for name in carried],
            value.mean().alias("pass_rate"),
            pl.col("score").count().alias("n_samples"),
            pl.col("score").null_count().alias("n_errors"),
        )
        .sort(_ROW_INDEX)
        .select(*task_columns, *_ADDED_COLUMNS)
    )


def filter_tasks(inputs: Sequence[str], output: str | Path, config: PassRateFilter = PassRateFilter()) -> FilterSummary:
    """Keep the tasks of `inputs` whose pass rate is within the bounds; write them to `output` (.jsonl or .parquet)."""
    import polars as pl

    from genesys.frames import scan_rollouts

    output = Path(output)
    if output.suffix not in (".jsonl", ".parquet"):
        raise InputError(f"output {str(output)!r}: expected a .jsonl or .parquet file")
    frame = scan_rollouts(inputs)
    rate_column = config.pass_rate_column
    if rate_column is None:
        tasks = _collect(task_pass_rates(frame, config.metric))
        rate_column = "pass_rate"
    else:
        tasks = _collect(_checked_rate_column(frame, rate_column))
    rate = pl.col(rate_column)
    too_hard = rate < config.min_pass_rate - _BOUND_TOLERANCE
    too_easy = rate > config.max_pass_rate + _BOUND_TOLERANCE
    counts = tasks.select(
        too_hard.sum().alias("too_hard"), too_easy.sum().alias("too_easy"), rate.null_count().alias("unscored")
    ).row(0, named=True)
    kept = tasks.filter(rate.is_not_null() & ~too_hard & ~too_easy)
    _write_tasks(kept, output)
    has_counts = config.pass_rate_column is None
    return FilterSummary(
        tasks=tasks.height,
        kept=kept.height,
        rollouts=int(tasks["n_samples"].sum() + tasks["n_errors"].sum()) if has_counts else None,
        errors=int(tasks["n_errors"].sum()) if has_counts else None,
        **counts,
    )


def _checked_rate_column(frame: pl.LazyFrame, column: str) -> pl.LazyFrame:
    import polars as pl

    schema = frame.collect_schema()
    if column not in schema:
        raise InputError(f"--pass-rate-column {column!r} is not a column of the input (columns: {', '.join(schema.names())})")
    if not schema[column].is_numeric():
        raise InputError(f"--pass-rate-column {column!r} must be numeric, got {schema[column]}")
    return frame.with_columns(pl.col(column).cast(pl.Float64))


def _collect(frame: pl.LazyFrame) -> pl.DataFrame:
    import polars as pl

    try:
        return frame.collect(engine="streaming")
    except pl.exceptions.PolarsError as exc:
        raise InputError(f"cannot read the input: {exc}") from None


def _write_tasks(tasks: pl.DataFrame, output: Path) -> None:
    """Write atomically: parquet keeps dict columns as JSON strings, jsonl as objects."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    if output.suffix == ".parquet":
        tasks.write_parquet(tmp)
    else:
        json_columns = [name for name in tasks.columns if name in JSON_COLUMNS]
        with open(tmp, "wb") as handle:
            for row in tasks.iter_rows(named=True):
                for name in json_columns:
                    if isinstance(row[name], str) and row[name]:
                        row[name] = orjson.loads(row[name])
                handle.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    os.replace(tmp, output)


# --- online: group filtering ---------------------------------------------------------------------


def task_key(row: Row) -> str:
    """The task a rollout belongs to: its `problem_id`, or a hash of its prompt when it has none."""
    problem_id = row.get("problem_id")
    if problem_id is not None:
        return str(problem_id)
    prompt = row.get("prompt")
    if prompt is None:
        raise InputError("a rollout has neither 'problem_id' nor 'prompt': cannot tell which task it belongs to")
    return "prompt-" + hashlib.blake2b(str(prompt).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def signal_value(row: Row, signal: str = "correct") -> float | None:
    """The value a group's signal is judged on: "correct" (score == 1), "score" or "reward"; None for an error."""
    if signal == "correct":
        score = row.get("score")
        return None if score is None else float(score == 1.0)
    if signal in ("score", "reward"):
        value = row.get(signal)
        return None if value is None else float(value)
    raise ValueError(f"signal must be 'correct', 'score' or 'reward', got {signal!r}")


def group_by_task(rows: Iterable[Row], key: Callable[[Row], str] = task_key) -> list[list[Row]]:
    """Rollouts grouped by task, groups in order of first appearance."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return list(groups.values())


def has_signal(group: Sequence[Row], signal: str = "correct") -> bool:
    """Whether the group's rollouts differ in the signal; rollouts without a value (errors) are not counted."""
    values = {value for value in (signal_value(row, signal) for row in group) if value is not None}
    return len(values) > 1


@dataclass
class GroupSplit:
    """Groups with signal (`kept`) and without (`dropped`)."""

    kept: list[list[Row]] = field(default_factory=list)
    dropped: list[list[Row]] = field(default_factory=list)

    @property
    def fraction_dropped(self) -> float:
        """Dropped groups over all groups (0.0 when there were none)."""
        total = len(self.kept) + len(self.dropped)
        return len(self.dropped) / total if total else 0.0


def split_groups(rows: Iterable[Row], signal: str = "correct", key: Callable[[Row], str] = task_key) -> GroupSplit:
    """Group rollouts by task and separate the groups with signal from those without."""
    split = GroupSplit()
    for group in group_by_task(rows, key):
        (split.kept if has_signal(group, signal) else split.dropped).append(group)
    return split


@dataclass
class FilledBatch:
    """A batch of groups with signal, and how it was filled.

    `surplus` holds kept groups beyond the batch size (pass them as `carry` to the next `fill_batch`).
    """

    groups: list[list[Row]]
    surplus: list[list[Row]]
    size: int
    rounds: int
    groups_seen: int
    groups_dropped: int

    @property
    def complete(self) -> bool:
        """Whether the batch reached its size within the round cap."""
        return len(self.groups) == self.size

    @property
    def fraction_dropped(self) -> float:
        """Dropped groups over all groups generated for this batch."""
        return self.groups_dropped / self.groups_seen if self.groups_seen else 0.0


def fill_batch(
    generate: Callable[[int], Iterable[Row]],
    size: int,
    *,
    max_rounds: int = 4,
    signal: str = "correct",
    carry: Sequence[list[Row]] = (),
    key: Callable[[Row], str] = task_key,
) -> FilledBatch:
    """Fill a batch of `size` groups with signal, calling `generate(n_missing)` for more rollouts.

    `generate` receives how many groups are still missing and returns verified rollouts (whole groups).
    It is called at most `max_rounds` times; a batch still short then comes back with `complete` False.
    Groups in `carry` (an earlier batch's surplus) are used first, without generating.
    """
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    kept = list(carry)
    rounds = seen = dropped = 0
    while len(kept) < size and rounds < max_rounds:
        rounds += 1
        split = split_groups(generate(size - len(kept)), signal, key)
        kept.extend(split.kept)
        seen += len(split.kept) + len(split.dropped)
        dropped += len(split.dropped)
    return FilledBatch(
        groups=kept[:size], surplus=kept[size:], size=size, rounds=rounds, groups_seen=seen, groups_dropped=dropped
    )
