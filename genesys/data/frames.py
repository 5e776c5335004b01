"""Rollout files as one polars LazyFrame, for whole-dataset work (filtering, reports).

Row-by-row reading with locations lives in `genesys.data.io`; this module is the columnar view of the
same files, as `genesys.data.inputs.resolve_inputs` finds them (jsonl, parquet, saved HF datasets).
Dict-valued columns become JSON strings whatever the file held (objects in jsonl, strings or structs
in parquet), so inputs of either format combine into one frame.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from genesys.data.inputs import InputFile
from genesys.data.io import iter_rows
from genesys.errors import InputError
from genesys.schema import JSON_COLUMNS

# Why a row is unusable for the caller, or None.
RowCheck = Callable[[dict[str, Any]], str | None]

# Columns whose type must agree across files, whatever a reader would infer from the first rows.
_FIXED_TYPES: dict[str, pl.DataType] = {
    "problem_id": pl.String(),
    "source": pl.String(),
    "task_type": pl.String(),
    "prompt": pl.String(),
    "score": pl.Float64(),
    "reward": pl.Float64(),
    "error": pl.String(),
    **{name: pl.String() for name in JSON_COLUMNS},
}


def scan_rollouts(files: Sequence[InputFile]) -> pl.LazyFrame:
    """All rows of the input files (from `genesys.data.inputs.resolve_inputs`) as one lazy frame.

    Columns missing from some files are null there. Dict-valued columns are JSON strings.
    """
    frames = [_SCANNERS[file.format](file.path) for file in files]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


def collect(frame: pl.LazyFrame, files: Sequence[InputFile], check: RowCheck | None = None) -> pl.DataFrame:
    """`frame` (over `files`) collected on the streaming engine. When polars cannot read the input,
    the InputError names the first bad row (`file:line: reason`) as the row reader finds it: one it
    cannot parse, or one `check` finds fault with."""
    try:
        return frame.collect(engine="streaming")
    except pl.exceptions.PolarsError as exc:
        raise InputError(first_bad_row(files, check) or f"cannot read the input: {exc}") from None


def first_bad_row(files: Sequence[InputFile], check: RowCheck | None = None) -> str | None:
    """`file:line: reason` of the first row of `files` that cannot be parsed or that `check` refuses."""
    for record in iter_rows(files):
        problem = record.error
        if problem is None and check is not None:
            problem = check(record.row)  # type: ignore[arg-type]
        if problem:
            return f"{record.location}: {problem}"
    return None


def _scan_jsonl(path: Path) -> pl.LazyFrame:
    """A jsonl file with every object-valued column read as its JSON text.

    Types are inferred from the first rows; a column that is null there is read as text, so values
    appearing later (objects included) still fit.
    """
    try:
        inferred = pl.scan_ndjson(path).collect_schema()
    except pl.exceptions.PolarsError as exc:
        where = first_bad_row([InputFile(path, "jsonl")])
        raise InputError(where or f"input {str(path)!r} is not readable as jsonl: {exc}") from None
    overrides = {
        name: _FIXED_TYPES.get(name, pl.String())
        for name, dtype in inferred.items()
        if name in _FIXED_TYPES or isinstance(dtype, (pl.Struct, pl.Null))
    }
    return pl.scan_ndjson(path, schema_overrides=overrides)


def _scan_parquet(path: Path) -> pl.LazyFrame:
    return _normalise(pl.scan_parquet(path))


def _scan_hf_dataset(path: Path) -> pl.LazyFrame:
    from datasets import load_from_disk

    return _normalise(pl.from_arrow(load_from_disk(str(path)).data.table).lazy())


def _normalise(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Struct columns as JSON strings and the fixed-type columns cast, so files combine."""
    casts = []
    for name, dtype in frame.collect_schema().items():
        if isinstance(dtype, pl.Struct):
            casts.append(pl.col(name).struct.json_encode())
        elif name in _FIXED_TYPES and dtype != _FIXED_TYPES[name]:
            casts.append(pl.col(name).cast(_FIXED_TYPES[name]))
    return frame.with_columns(casts) if casts else frame


_SCANNERS = {"jsonl": _scan_jsonl, "parquet": _scan_parquet, "hf_dataset": _scan_hf_dataset}


def distinct_rollouts(frame: pl.LazyFrame, files: Sequence[InputFile]) -> tuple[pl.LazyFrame, int]:
    """`frame` with each rollout once, and how many repeats were left out.

    A rollout is its `response_id`: the same id in two inputs (or twice in one) is the same rollout
    read twice, and counting it twice would skew every pass rate. Rows without an id all stay."""
    if "response_id" not in frame.collect_schema().names():
        return frame, 0
    repeat = pl.col("response_id").is_not_null() & ~pl.col("response_id").is_first_distinct()
    repeats = int(collect(frame.select(repeat.sum()), files).item())
    return (frame.filter(~repeat) if repeats else frame), repeats
