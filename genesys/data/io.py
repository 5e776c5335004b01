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
        yield from readers[file.format](file.path, file.label)


def _iter_jsonl(path: Path, label: str) -> Iterator[RowRecord]:
    with open(path, "rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            location = f"{label}:{line_no}"
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


def _iter_parquet(path: Path, label: str) -> Iterator[RowRecord]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise InputError(f"input {str(path)!r} is not a readable parquet file: {exc}") from None
    index = 0
    for batch in parquet.iter_batches(batch_size=_READ_BATCH_ROWS):
        for row in batch.to_pylist():
            yield RowRecord(f"{label}#{index}", row)
            index += 1


def _iter_hf_dataset(path: Path, label: str) -> Iterator[RowRecord]:
    from datasets import load_from_disk

    dataset = load_from_disk(str(path))
    for start in range(0, len(dataset), _READ_BATCH_ROWS):
        batch = dataset[start : start + _READ_BATCH_ROWS]
        columns = list(batch)
        for offset in range(len(batch[columns[0]]) if columns else 0):
            yield RowRecord(f"{label}#{start + offset}", {c: batch[c][offset] for c in columns})


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
        return pa.array(_as_text(values), type=pa.string())


def _as_text(values: Sequence[Any]) -> list[str | None]:
    """Values as text: strings as they are, anything else as its JSON (17 -> "17", True -> "true")."""
    return [v if v is None or isinstance(v, str) else orjson.dumps(v).decode() for v in values]


OUTPUT_KINDS = "a .jsonl (or .json, .ndjson) file, a .parquet file, or a directory for parquet shards"


def check_output_path(path: str | Path) -> None:
    """Refuse (InputError) an output path no writer takes: `-` (stdout cannot be resumed or locked) or
    an extension other than the accepted ones. A path without an extension, or an existing
    directory, is a directory of parquet shards."""
    path = Path(path)
    if str(path) == "-":
        raise InputError(
            "output '-' (stdout): this command writes a resumable output, which a rerun continues and "
            f"which stdout cannot be; write to {OUTPUT_KINDS}"
        )
    if path.name.endswith(JSONL_SUFFIXES + (PARQUET_SUFFIX,)) or path.is_dir() or not path.suffix:
        return
    raise InputError(f"output {str(path)!r}: unknown extension {path.suffix!r}; write to {OUTPUT_KINDS}")


def remove_output(path: str | Path) -> None:
    """Remove an output and what a run keeps beside it (`.parts`), for a run that starts over.

    A directory is removed only when it holds nothing but parquet shards (it may be a directory the
    user keeps other things in); otherwise an InputError names what it holds."""
    path = Path(path)
    if path.is_dir():
        others = [
            p for p in path.iterdir() if not (p.name.endswith(PARQUET_SUFFIX) or p.name.endswith(".tmp"))
        ]
        if others:
            raise InputError(
                f"--overwrite: output directory {str(path)!r} holds more than parquet shards "
                f"({others[0].name}, ...); remove it yourself or write to another output"
            )
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    parts = path.with_name(path.name + ".parts")
    if path.name.endswith(PARQUET_SUFFIX) and parts.is_dir():
        shutil.rmtree(parts)


class RolloutWriter:
    """Appends rows to a rollout output in atomic units and knows which keys it already holds.

    The output kind follows the path: `.jsonl` appends lines (a torn last line is cut on reopen);
    `.parquet` writes parts into `PATH.parts/` and merges them, with the finished file of an earlier
    run, into one file on `close()`; any other path is a directory of parquet shards, each written
    whole and renamed into place. One run at a time: `genesys.data.runs.FileRun` holds the lock.
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
        self._shard_seq = 0
        self._types: dict[str, Any] = {}
        if self.kind != "jsonl":
            import pyarrow.parquet as pq

            for part in self.written_files():
                for field in pq.read_schema(part):
                    if str(field.type) != "null":
                        self._types.setdefault(field.name, field.type)

    def written_files(self) -> list[Path]:
        """The files holding the rows written so far (a finished `.parquet` of an earlier run first)."""
        if self.kind == "jsonl":
            return [self.path] if self.path.exists() else []
        finished = [self.path] if self.kind == "parquet_file" and self.path.is_file() else []
        return finished + sorted(self.shard_dir.glob("*.parquet"))

    def existing_keys(self) -> set[str]:
        """The keys of every row already written."""
        if self.kind == "jsonl":
            return _jsonl_keys(self.path, self.key_column)
        return _parquet_keys(self.written_files(), self.key_column)

    def take_out(self, column: str) -> dict[str, dict[str, Any]]:
        """Remove from the output every row where `column` is set (not null); returns them by key.

        Each file is rewritten without them and renamed into place, so after a crash a file holds
        either all its rows or those that stay. Rows without a key stay where they are."""
        taken: dict[str, dict[str, Any]] = {}
        if self.kind == "jsonl":
            if self.path.exists():
                self._take_out_jsonl(column, taken)
            return taken
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for file in self.written_files():
            table = pq.read_table(file)
            if column not in table.column_names or self.key_column not in table.column_names:
                continue
            mask = pc.and_(pc.is_valid(table.column(column)), pc.is_valid(table.column(self.key_column)))
            if not pc.any(mask).as_py():
                continue
            for row in table.filter(mask).to_pylist():
                taken[str(row[self.key_column])] = row
            kept = table.filter(pc.invert(mask))
            if kept.num_rows == 0 and file != self.path:
                file.unlink()
                continue
            tmp = file.with_name(f".{file.name}.tmp")
            pq.write_table(kept, tmp)
            os.replace(tmp, file)
        return taken

    def _take_out_jsonl(self, column: str, taken: dict[str, dict[str, Any]]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(self.path, "rb") as source, open(tmp, "wb") as kept:
            for line in source:
                try:
                    row = orjson.loads(line) if line.strip() else None
                except orjson.JSONDecodeError:
                    row = None  # kept: reading the keys names the line
                key = row.get(self.key_column) if isinstance(row, dict) else None
                if key is not None and row.get(column) is not None:
                    taken[str(key)] = row
                else:
                    kept.write(line)
            kept.flush()
            os.fsync(kept.fileno())
        if taken:
            os.replace(tmp, self.path)
        else:
            tmp.unlink()

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
        """Finish the output; for a single `.parquet` file, merge the earlier file and the parts into it.

        The merge reads every part under one schema (`merge_tables`). Rows of a part whose key the
        earlier file already holds were merged before (a crash came between the merge and the
        clean-up) and are not repeated. When the parts cannot be merged, an InputError names the
        column and its types, and the earlier file and every part stay as they were.
        """
        if self.kind != "parquet_file":
            return
        import pyarrow.parquet as pq

        parts = sorted(self.shard_dir.glob("*.parquet"))
        if self.path.is_file() and not parts:
            shutil.rmtree(self.shard_dir)
            return
        tables = []
        if self.path.is_file():
            finished = pq.read_table(self.path)
            tables.append(finished)
            if self.key_column in finished.column_names:
                keys = {str(k) for k in finished.column(self.key_column).to_pylist() if k is not None}
                parts_tables = [_without_keys(pq.read_table(p), self.key_column, keys) for p in parts]
            else:
                parts_tables = [pq.read_table(p) for p in parts]
            tables += parts_tables
        else:
            tables += [pq.read_table(p) for p in parts]
        merged = merge_tables(tables, f"output {str(self.path)!r}", kept=f"{self.shard_dir}")
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        pq.write_table(merged, tmp)
        os.replace(tmp, self.path)
        shutil.rmtree(self.shard_dir)


def _without_keys(table: Any, key_column: str, keys: set[str]) -> Any:
    """`table` without the rows whose `key_column` is one of `keys`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not keys or key_column not in table.column_names:
        return table
    column = table.column(key_column).cast(pa.string())
    return table.filter(pc.invert(pc.fill_null(pc.is_in(column, value_set=pa.array(sorted(keys))), False)))


def merge_tables(tables: Sequence[Any], what: str, kept: str = "") -> Any:
    """One pyarrow Table of `tables` under one schema: a column missing from a table is null there;
    a column whose type differs between tables takes the type both promote to without loss (int32
    and int64 -> int64, int and float -> float when every value fits, null -> any), and numbers or
    booleans beside text become text (as in one unit: 17 -> "17"). Other differences are an
    InputError naming `what`, the column and both types (and, with `kept`, where the parts stay)."""
    import pyarrow as pa

    if not tables:
        return rows_to_table([])
    names: dict[str, None] = {}
    for table in tables:
        names.update(dict.fromkeys(table.column_names))
    target = {
        name: _unified_type(
            name, [t.schema.field(name).type for t in tables if name in t.column_names], what, kept
        )
        for name in names
    }
    schema = pa.schema([pa.field(name, target[name]) for name in names])
    aligned = []
    for table in tables:
        columns = []
        for name in names:
            if name not in table.column_names:
                columns.append(pa.nulls(len(table), target[name]))
                continue
            column = table.column(name)
            if column.type == target[name]:
                columns.append(column)
            elif pa.types.is_string(target[name]) and not pa.types.is_string(column.type):
                columns.append(pa.array(_as_text(column.to_pylist()), pa.string()))
            else:
                try:
                    columns.append(column.cast(target[name], safe=True))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                    raise InputError(
                        f"{what}: column {name!r} holds {column.type} values that do not fit {target[name]} ({exc}); "
                        f"{_kept(kept)}"
                    ) from None
        aligned.append(pa.Table.from_arrays(columns, schema=schema))
    return pa.concat_tables(aligned)


def _unified_type(name: str, types: Sequence[Any], what: str, kept: str) -> Any:
    import pyarrow as pa

    distinct = list(dict.fromkeys(t for t in types if not pa.types.is_null(t)))
    if not distinct:
        return pa.null()
    if len(distinct) == 1:
        return distinct[0]
    try:
        promoted = (
            pa.unify_schemas([pa.schema([pa.field(name, t)]) for t in distinct], promote_options="permissive")
            .field(name)
            .type
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        promoted = None
    if promoted is not None:
        return promoted
    scalar = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string)
    if all(any(test(t) for test in scalar) for t in distinct) and any(
        pa.types.is_string(t) for t in distinct
    ):
        return pa.string()
    raise InputError(
        f"{what}: column {name!r} was written as {distinct[0]} and now as {distinct[1]}, which do not merge; "
        f"{_kept(kept)}"
    )


def _kept(kept: str) -> str:
    where = f" in {kept}" if kept else ""
    return f"every part is kept{where}: give the column one type, or write to another output"


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
