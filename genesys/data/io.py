"""Rollout files row by row: reading jsonl, parquet and saved HF datasets; writing jsonl or parquet shards.

Reading takes the files `genesys.data.inputs.resolve_inputs` found and yields `RowRecord`s with a
`file:line` (or `file#row`) location, so a bad row can be reported and skipped without stopping the
run. Writing goes through `RolloutWriter`, which appends in atomic units and reports the keys already
written, so a rerun after a crash resumes without duplicates; `BufferedWriter` gathers rows into
such units by count and age.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from genesys.data.inputs import JSONL_SUFFIXES, PARQUET_SUFFIX, InputFile
from genesys.errors import InputError
from genesys.schema import JSON_COLUMNS

_READ_BATCH_ROWS = 4096


@dataclass(frozen=True, slots=True)
class RowRecord:
    """One input row, or the reason it could not be read (then `row` is None)."""

    location: str
    row: dict[str, Any] | None
    error: str | None = None
    raw: str | None = None


def iter_rows(files: Sequence[InputFile]) -> Iterator[RowRecord]:
    """Every row of every input file (from `genesys.data.inputs.resolve_inputs`), in order, with its location."""
    readers = {"jsonl": _iter_jsonl, "parquet": _iter_parquet, "hf_dataset": _iter_hf_dataset}
    for file in files:
        yield from readers[file.format](file.path)


def _iter_jsonl(path: Path) -> Iterator[RowRecord]:
    with open(path, "rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            location = f"{path}:{line_no}"
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield RowRecord(
                    location, None, f"invalid JSON: {exc}", line.decode("utf-8", "replace").rstrip("\n")
                )
                continue
            if not isinstance(row, dict):
                yield RowRecord(
                    location,
                    None,
                    f"expected a JSON object, got {type(row).__name__}",
                    line.decode("utf-8", "replace").rstrip("\n"),
                )
                continue
            yield RowRecord(location, row)


def _iter_parquet(path: Path) -> Iterator[RowRecord]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise InputError(f"input {str(path)!r} is not a readable parquet file: {exc}") from None
    index = 0
    for batch in parquet.iter_batches(batch_size=_READ_BATCH_ROWS):
        for row in batch.to_pylist():
            yield RowRecord(f"{path}#{index}", row)
            index += 1


def _iter_hf_dataset(path: Path) -> Iterator[RowRecord]:
    from datasets import load_from_disk

    dataset = load_from_disk(str(path))
    for start in range(0, len(dataset), _READ_BATCH_ROWS):
        batch = dataset[start : start + _READ_BATCH_ROWS]
        columns = list(batch)
        for offset in range(len(batch[columns[0]]) if columns else 0):
            yield RowRecord(f"{path}#{start + offset}", {c: batch[c][offset] for c in columns})


# --- writing --------------------------------------------------------------------------------------


def rows_to_table(rows: Sequence[dict[str, Any]], seen_types: dict[str, Any] | None = None) -> Any:
    """A pyarrow Table of `rows`, with fixed types for known columns and dicts as JSON strings.

    `seen_types` (column -> arrow type) carries the types of earlier parts of the same output, so
    a column that is all null here keeps the type it had before and every part reads alike.
    """
    import pyarrow as pa

    seen_types = {} if seen_types is None else seen_types
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    arrays = {}
    for name in columns:
        array = _column_array(pa, name, [row.get(name) for row in rows])
        earlier = seen_types.get(name)
        if earlier is not None and array.type != earlier:
            try:
                array = array.cast(earlier)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
        if not pa.types.is_null(array.type):
            seen_types.setdefault(name, array.type)
        arrays[name] = array
    return pa.table(arrays)


def _known_types(pa: Any) -> dict[str, Any]:
    return {
        "score": pa.float64(),
        "reward": pa.float64(),
        "error": pa.string(),
        "response_id": pa.string(),
        "prompt_ids": pa.list_(pa.int64()),
        "completion_ids": pa.list_(pa.int64()),
        "completion_logprobs": pa.list_(pa.float64()),
        "toploc_proofs": pa.list_(pa.string()),
        "toploc_valid": pa.bool_(),
        "toploc_reason": pa.string(),
        "toploc_problems": pa.list_(pa.string()),
        **{name: pa.string() for name in JSON_COLUMNS},
    }


def _column_array(pa: Any, name: str, values: list[Any]) -> Any:
    if name in JSON_COLUMNS or any(isinstance(v, dict) for v in values):
        values = [v if v is None or isinstance(v, str) else orjson.dumps(v).decode() for v in values]
    known = _known_types(pa).get(name)
    try:
        return pa.array(values, type=known)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # mixed types: text, strings kept as they are
        return pa.array(
            [v if v is None or isinstance(v, str) else orjson.dumps(v).decode() for v in values],
            type=pa.string(),
        )


class RolloutWriter:
    """Appends rows to a rollout output in atomic units and knows which keys it already holds.

    The output kind follows the path: `.jsonl` appends lines (a torn last line is cut on reopen);
    `.parquet` writes parts into `PATH.parts/` and merges them into one file on `close()`; any other
    path is a directory of parquet shards, each written whole and renamed into place.
    """

    def __init__(self, path: str | Path, key_column: str = "response_id") -> None:
        self.path = Path(path)
        self.key_column = key_column
        if self.path.name.endswith(JSONL_SUFFIXES):
            self.kind = "jsonl"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _cut_torn_line(self.path)
        else:
            self.kind = "parquet_file" if self.path.name.endswith(PARQUET_SUFFIX) else "parquet_dir"
            self.shard_dir = (
                self.path.with_name(self.path.name + ".parts") if self.kind == "parquet_file" else self.path
            )
            if self.shard_dir.exists() and not self.shard_dir.is_dir():
                raise InputError(f"output {str(self.shard_dir)!r} exists and is not a directory")
            self.shard_dir.mkdir(parents=True, exist_ok=True)
            for stale in self.shard_dir.glob(".*.tmp"):
                stale.unlink()
            if self.kind == "parquet_file" and self.path.exists():
                # Parts beside a finished file were already merged into it (a crash hit the clean-up).
                for merged in self.shard_dir.glob("*.parquet"):
                    merged.unlink()
                # A finished earlier output becomes the first part, so new rows extend it.
                os.replace(self.path, self.shard_dir / "part-0-earlier.parquet")
        self._shard_seq = 0
        self._types: dict[str, Any] = {}
        if self.kind != "jsonl":
            import pyarrow.parquet as pq

            for part in sorted(self.shard_dir.glob("*.parquet")):
                for field in pq.read_schema(part):
                    if str(field.type) != "null":
                        self._types.setdefault(field.name, field.type)

    def existing_keys(self) -> set[str]:
        """The keys of every row already written."""
        if self.kind == "jsonl":
            return _jsonl_keys(self.path, self.key_column)
        return _parquet_keys(sorted(self.shard_dir.glob("*.parquet")), self.key_column)

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        """Write `rows` as one atomic unit: after a crash, all of them are there or none."""
        if not rows:
            return
        if self.kind == "jsonl":
            payload = b"".join(
                orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS) for row in rows
            )
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(payload)
                while view:  # one write() may take less than all of a large unit
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        import pyarrow.parquet as pq

        self._shard_seq += 1
        name = f"part-{time.time_ns()}-{self._shard_seq:05d}.parquet"
        tmp = self.shard_dir / f".{name}.tmp"
        pq.write_table(rows_to_table(rows, self._types), tmp)
        os.replace(tmp, self.shard_dir / name)

    def close(self) -> None:
        """Finish the output; for a single `.parquet` file, merge the parts into it."""
        if self.kind != "parquet_file":
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        parts = sorted(self.shard_dir.glob("*.parquet"))
        tables = [pq.read_table(p) for p in parts]
        merged = pa.concat_tables(tables, promote_options="permissive") if tables else rows_to_table([])
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        pq.write_table(merged, tmp)
        os.replace(tmp, self.path)
        shutil.rmtree(self.shard_dir)


class BufferedWriter:
    """Gathers rows for a `RolloutWriter` and writes them in units of `max_rows` rows, or of what has
    come in when `max_seconds` have passed since the last write. As a context manager it writes the
    rest on exit, after an interruption too (every row handed over is complete)."""

    def __init__(self, writer: RolloutWriter, max_rows: int, max_seconds: float = 2.0) -> None:
        self.writer = writer
        self.max_rows = max_rows
        self.max_seconds = max_seconds
        self._rows: list[dict[str, Any]] = []
        self._last_write = time.monotonic()

    def __enter__(self) -> BufferedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        """Take `rows`; write what is gathered when it is large or old enough."""
        self._rows.extend(rows)
        if len(self._rows) >= self.max_rows or (
            self._rows and time.monotonic() - self._last_write > self.max_seconds
        ):
            self.flush()

    def flush(self) -> None:
        """Write every gathered row now, as one unit."""
        self.writer.write(self._rows)
        self._rows = []
        self._last_write = time.monotonic()


def _cut_torn_line(path: Path) -> None:
    """Drop a partial last line left by a crash mid-write."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        size = handle.seek(0, os.SEEK_END)
        chunk = 1 << 16
        position = size
        while position > 0:
            start = max(0, position - chunk)
            handle.seek(start)
            cut = handle.read(position - start).rfind(b"\n")
            if cut >= 0:
                handle.truncate(start + cut + 1)
                return
            position = start
        handle.truncate(0)


def _jsonl_keys(path: Path, key_column: str) -> set[str]:
    keys: set[str] = set()
    if not path.exists():
        return keys
    with open(path, "rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    key = orjson.loads(line).get(key_column)
                except (orjson.JSONDecodeError, AttributeError):
                    raise InputError(
                        f"output {path}:{line_no} is not a JSON object; repair or remove that line to resume"
                    ) from None
                if key is not None:
                    keys.add(str(key))
    return keys


def _parquet_keys(paths: Sequence[Path], key_column: str) -> set[str]:
    import pyarrow.parquet as pq

    keys: set[str] = set()
    for path in paths:
        if key_column in pq.read_schema(path).names:
            keys.update(
                str(k)
                for k in pq.read_table(path, columns=[key_column]).column(0).to_pylist()
                if k is not None
            )
    return keys
