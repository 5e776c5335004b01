"""Rollout files as one polars LazyFrame, for whole-dataset work (filtering, reports).

Row-by-row reading with locations lives in `genesys.io`; this module is the columnar view of the
same inputs (jsonl, parquet, directories of shards, saved HF datasets). Dict-valued columns become
JSON strings whatever the file held (objects in jsonl, strings or structs in parquet), so inputs of
either format combine into one frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from genesys.errors import InputError
from genesys.io import JSONL_SUFFIXES, PARQUET_SUFFIX, expand_inputs
from genesys.schema import JSON_COLUMNS

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
_HF_MARKERS = ("dataset_info.json", "state.json")


def scan_rollouts(inputs: Sequence[str]) -> pl.LazyFrame:
    """All rows of `inputs` (files, directories, globs) as one lazy frame.

    Columns missing from some files are null there. Dict-valued columns are JSON strings.
    """
    frames = [_scan_path(path) for path in expand_inputs(inputs)]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


def _scan_path(path: Path) -> pl.LazyFrame:
    if path.is_dir():
        if any((path / marker).exists() for marker in _HF_MARKERS):
            return _normalise(_scan_hf_dataset(path))
        shards = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(JSONL_SUFFIXES + (PARQUET_SUFFIX,)))
        if not shards:
            raise InputError(f"input directory {str(path)!r} holds no .parquet or .jsonl files")
        frames = [_scan_path(shard) for shard in shards]
        return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
    if path.name.endswith(JSONL_SUFFIXES):
        return _scan_jsonl(path)
    if path.name.endswith(PARQUET_SUFFIX):
        return _normalise(pl.scan_parquet(path))
    raise InputError(f"input {str(path)!r}: unsupported file type (expected .jsonl, .parquet or a directory)")


def _scan_jsonl(path: Path) -> pl.LazyFrame:
    """A jsonl file with every object-valued column read as its JSON text.

    Types are inferred from the first rows; a column that is null there is read as text, so values
    appearing later (objects included) still fit.
    """
    try:
        inferred = pl.scan_ndjson(path).collect_schema()
    except pl.exceptions.PolarsError as exc:
        raise InputError(f"input {str(path)!r} is not readable as jsonl: {exc}") from None
    overrides = {
        name: _FIXED_TYPES.get(name, pl.String())
        for name, dtype in inferred.items()
        if name in _FIXED_TYPES or isinstance(dtype, (pl.Struct, pl.Null))
    }
    return pl.scan_ndjson(path, schema_overrides=overrides)


def _scan_hf_dataset(path: Path) -> pl.LazyFrame:
    from datasets import DatasetDict, load_from_disk

    dataset = load_from_disk(str(path))
    if isinstance(dataset, DatasetDict):
        raise InputError(f"input {str(path)!r} is a DatasetDict; name one split's directory: {', '.join(str(path / s) for s in dataset)}")
    return pl.from_arrow(dataset.data.table).lazy()


def _normalise(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Struct columns as JSON strings and the fixed-type columns cast, so files combine."""
    casts = []
    for name, dtype in frame.collect_schema().items():
        if isinstance(dtype, pl.Struct):
            casts.append(pl.col(name).struct.json_encode())
        elif name in _FIXED_TYPES and dtype != _FIXED_TYPES[name]:
            casts.append(pl.col(name).cast(_FIXED_TYPES[name]))
    return frame.with_columns(casts) if casts else frame
