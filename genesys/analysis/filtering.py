"""Offline difficulty filtering by per-task pass rate (`filter_tasks`, the `genesys filter` command).

The rollouts of each task give its pass rate; tasks whose rate lies in [min, max] are written as one
task row each. A task is its `problem_id`, or its prompt when `problem_id` is missing
(`genesys.data.identity.group_key`). Rollouts whose verification failed (score null) are left out of the
pass rate and counted in `n_errors`; a task with no scored rollout has no pass rate and is dropped as
unscored. A score that is not a number in 0..1 is refused, naming its `file:line`. With
`require_proofs`, only rollouts a `genesys.proofs.requirement.ProofRequirement` counts (attested
under the trust key, marked valid, of a trusted task) are kept; the others are dropped first and
counted in `unproven`, the first with its reason. With `emit = "rollouts"`, the output holds the
rollouts of the kept tasks (each once, in input order) instead of task rows: what `genesys train`
learns from offline.

The output is written whole, atomically (`-` writes JSON lines to stdout). Unlike the row-by-row
commands, a filter run cannot resume, so an existing output is refused unless `overwrite` is given.

The online group filter of the trainer (`fill_batch`, `split_groups`) lives in `genesys.train.groups`.
"""

from __future__ import annotations

__all__ = ["PassRateFilter", "filter_tasks"]

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from genesys.config import FilterConfig as PassRateFilter
from genesys.data.identity import group_key_columns
from genesys.data.inputs import InputFile, resolve_inputs
from genesys.errors import InputError
from genesys.rewards import TARGET_LENGTH_COLUMN
from genesys.schema import JSON_COLUMNS, RESPONSE_COLUMNS, VERDICT_COLUMNS

if TYPE_CHECKING:
    import polars as pl

    from genesys.proofs.requirement import ProofRequirement

# Bounds are inclusive; the tolerance keeps a rate like 3/10 inside a bound written as 0.3.
_BOUND_TOLERANCE = 1e-9
_ADDED_COLUMNS = ("pass_rate", "n_samples", "n_errors")
# Per-rollout columns a task row does not keep (`target_length` is a generation setting, not the task's).
_ROLLOUT_ONLY_COLUMNS = frozenset(
    RESPONSE_COLUMNS + VERDICT_COLUMNS + ("completion", TARGET_LENGTH_COLUMN) + _ADDED_COLUMNS
)
_ROW_INDEX = "__genesys_row"
_OUT_OF_RANGE = "__genesys_out_of_range"


@dataclass(frozen=True)
class FilterSummary:
    """What a filter run read and kept. `rollouts` and `errors` are None for a task set with a rate column;
    `unproven` (rollouts dropped for want of a valid TOPLOC proof) is None unless proofs were required."""

    tasks: int
    kept: int
    too_hard: int
    too_easy: int
    unscored: int
    rollouts: int | None = None
    errors: int | None = None
    unproven: int | None = None
    first_unproven: str | None = None  # where the first dropped rollout is, and why
    repeats: int = 0  # rollouts read more than once (the same response_id), counted once
    emitted: int = 0  # rows written: kept tasks, or their rollouts
    histogram: tuple[int, ...] = ()  # tasks per pass-rate tenth: [0, 0.1), ..., [0.9, 1.0]


def pass_rate_histogram(rates: pl.Series, bins: int = 10) -> tuple[int, ...]:
    """How many of `rates` (nulls left out) fall in each of `bins` equal ranges of 0..1, 1.0 in the last."""
    counts = [0] * bins
    for rate in rates.drop_nulls().to_list():
        counts[min(int(rate * bins + 1e-9), bins - 1)] += 1  # 0.3 in [0.3, 0.4) though 0.3 * 10 < 3
    return tuple(counts)


def task_pass_rates(rollouts: pl.LazyFrame, metric: str = "score") -> pl.LazyFrame:
    """One row per task, in order of first appearance: its task columns, `pass_rate`, `n_samples`, `n_errors`.

    `n_samples` counts the scored rollouts the rate is taken over; `n_errors` those with a null score.
    """
    return _task_rows(rollouts, metric).drop(_OUT_OF_RANGE)


def _task_rows(rollouts: pl.LazyFrame, metric: str) -> pl.LazyFrame:
    """`task_pass_rates` plus a column counting each task's scores outside 0..1."""
    import polars as pl

    names = rollouts.collect_schema().names()
    if "score" not in names:
        raise InputError(
            "the rollouts have no 'score' column: verify them first (genesys verify), or name a --pass-rate-column"
        )
    keys = group_key_columns(names)
    task_columns = [name for name in names if name not in _ROLLOUT_ONLY_COLUMNS]
    value = pl.col("score") if metric == "score" else (pl.col("score") == 1.0).cast(pl.Float64)
    return (
        rollouts.with_row_index(_ROW_INDEX)
        .group_by(keys)
        .agg(
            pl.col(_ROW_INDEX).min(),
            *[pl.col(name).first() for name in task_columns],
            value.mean().alias("pass_rate"),
            pl.col("score").count().alias("n_samples"),
            pl.col("score").null_count().alias("n_errors"),
            score_out_of_range(pl.col("score")).sum().alias(_OUT_OF_RANGE),
        )
        .sort(_ROW_INDEX)
        .select(*task_columns, *_ADDED_COLUMNS, _OUT_OF_RANGE)
    )


def score_out_of_range(score: pl.Expr) -> pl.Expr:
    """True where a score is outside 0..1 (NaN included), null where it is null."""
    return (score < 0.0) | (score > 1.0) | score.is_nan()


def score_problem(row: dict[str, Any]) -> str | None:
    """Why a rollout's score is unusable (not a number in 0..1), or None; a null score is fine."""
    score = row.get("score")
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return f"score {orjson.dumps(score, default=str).decode()} is not a number (scores are numbers in 0..1, or null)"
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        return f"score {score!r} is outside 0..1"
    return None


def refuse_out_of_range(count: int, files: Sequence[InputFile]) -> None:
    """Raise InputError when `count` rollouts of `files` have a score outside 0..1, naming the first."""
    from genesys.data.frames import first_bad_row

    if count:
        where = first_bad_row(files, score_problem)
        raise InputError(f"{count:,} rollout(s) have a score outside 0..1; the first: {where}")


STDOUT = "-"


def check_filter_output(output: str | Path, overwrite: bool) -> None:
    """Refuse an output `genesys filter` cannot write, or one that exists without `overwrite`."""
    if str(output) == STDOUT:
        return
    output = Path(output)
    if output.suffix not in (".jsonl", ".parquet"):
        raise InputError(
            f"output {str(output)!r}: unknown extension {output.suffix or '(none)'!r}; genesys filter writes a "
            ".jsonl or .parquet file, or - for JSON lines on stdout"
        )
    if output.exists() and not overwrite:
        raise InputError(
            f"output {str(output)!r} exists; genesys filter writes its output whole and cannot resume it: "
            "give --overwrite to replace it, or write to another path"
        )


def filter_tasks(
    inputs: Sequence[str],
    output: str | Path,
    config: PassRateFilter | None = None,
    requirement: ProofRequirement | None = None,
    overwrite: bool = False,
) -> FilterSummary:
    """Keep the tasks of `inputs` whose pass rate is within the bounds; write them (or, with
    `config.emit = "rollouts"`, their rollouts) to `output` (.jsonl, .parquet, or `-` for stdout).

    With `config.require_proofs`, `requirement` says which rollouts count (by default, those attested
    under the trust key `genesys validate` made)."""
    config = config or PassRateFilter()
    import polars as pl

    from genesys.data.frames import collect, distinct_rollouts, scan_rollouts

    check_filter_output(output, overwrite)
    files = resolve_inputs(inputs)
    frame, repeats = distinct_rollouts(scan_rollouts(files), files)
    unproven = first_unproven = None
    if config.require_proofs:
        if requirement is None:
            from genesys.proofs.requirement import ProofRequirement

            requirement = ProofRequirement.load(None, None)
        frame, unproven, first_unproven = _proven(frame, files, requirement)
    rate_column = config.pass_rate_column
    if rate_column is None:
        tasks = collect(_task_rows(frame, config.metric), files, score_problem)
        refuse_out_of_range(int(tasks[_OUT_OF_RANGE].sum()), files)
        tasks = tasks.drop(_OUT_OF_RANGE)
        rate_column = "pass_rate"
    else:
        tasks = collect(_checked_rate_column(frame, rate_column), files)
    rate = pl.col(rate_column)
    too_hard = rate < config.min_pass_rate - _BOUND_TOLERANCE
    too_easy = rate > config.max_pass_rate + _BOUND_TOLERANCE
    counts = tasks.select(
        too_hard.sum().alias("too_hard"),
        too_easy.sum().alias("too_easy"),
        rate.null_count().alias("unscored"),
    ).row(0, named=True)
    kept = tasks.filter(rate.is_not_null() & ~too_hard & ~too_easy)
    written = kept if config.emit == "tasks" else collect(_rollouts_of(frame, kept), files)
    _write_rows(written, output)
    has_counts = config.pass_rate_column is None
    return FilterSummary(
        tasks=tasks.height,
        kept=kept.height,
        rollouts=int(tasks["n_samples"].sum() + tasks["n_errors"].sum()) if has_counts else None,
        errors=int(tasks["n_errors"].sum()) if has_counts else None,
        unproven=unproven,
        first_unproven=first_unproven,
        repeats=repeats,
        emitted=written.height,
        histogram=pass_rate_histogram(tasks[rate_column]) if kept.height == 0 else (),
        **counts,
    )


def _proven(
    frame: pl.LazyFrame, files: Sequence[InputFile], requirement: ProofRequirement
) -> tuple[pl.LazyFrame, int, str | None]:
    """The rollouts `requirement` counts, how many others there were, and where the first is and why.
    A `response_id` counts only when every row carrying it does."""
    import polars as pl

    from genesys.data.frames import collect
    from genesys.data.io import iter_rows

    counted: set[str] = set()
    refused: set[str] = set()
    first = None
    for record in iter_rows(files):
        if record.row is None:
            continue  # unreadable: the pass-rate scan names it
        problem = requirement.problem(record.row)
        rid = record.row.get("response_id")
        if problem is None and rid is not None:
            counted.add(str(rid))
        else:
            refused.add(str(rid))
            first = first or f"{record.location}: {problem or 'it has no response_id'}"
    kept = counted - refused
    if "response_id" in frame.collect_schema():
        valid = pl.col("response_id").cast(pl.String).is_in(list(kept)).fill_null(False)
    else:
        valid = pl.lit(False)
    dropped = int(collect(frame.select((~valid).sum()), files).item())
    return frame.filter(valid), dropped, first


def _checked_rate_column(frame: pl.LazyFrame, column: str) -> pl.LazyFrame:
    import polars as pl

    schema = frame.collect_schema()
    if column not in schema:
        raise InputError(
            f"--pass-rate-column {column!r} is not a column of the input (columns: {', '.join(schema.names())})"
        )
    if not schema[column].is_numeric():
        raise InputError(f"--pass-rate-column {column!r} must be numeric, got {schema[column]}")
    return frame.with_columns(pl.col(column).cast(pl.Float64))


def _rollouts_of(rollouts: pl.LazyFrame, tasks: pl.DataFrame) -> pl.LazyFrame:
    """The rows of `rollouts` whose task (`group_key`) is one of `tasks`, in their order."""
    keys = group_key_columns(rollouts.collect_schema().names())
    names = [key.meta.output_name() for key in keys]
    wanted = tasks.lazy().select(group_key_columns(tasks.columns)).unique()
    return (
        rollouts.with_row_index(_ROW_INDEX)
        .with_columns(keys)
        .join(wanted, on=names, how="semi", nulls_equal=True)
        .sort(_ROW_INDEX)
        .drop(_ROW_INDEX, *names)
    )


def _write_rows(rows: pl.DataFrame, output: str | Path) -> None:
    """Write atomically (or to stdout for `-`): parquet keeps dict columns as JSON strings, jsonl as objects."""
    import sys

    if str(output) == STDOUT:
        _write_jsonl(rows, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    if output.suffix == ".parquet":
        rows.write_parquet(tmp)
    else:
        with open(tmp, "wb") as handle:
            _write_jsonl(rows, handle)
    os.replace(tmp, output)


def _write_jsonl(rows: pl.DataFrame, handle: Any) -> None:
    json_columns = [name for name in rows.columns if name in JSON_COLUMNS]
    for row in rows.iter_rows(named=True):
        for name in json_columns:
            if isinstance(row[name], str) and row[name]:
                row[name] = orjson.loads(row[name])
        handle.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
