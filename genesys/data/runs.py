"""The one resumable file run: inputs in, an output written in atomic units, resumable, locked.

`genesys verify`, `genesys generate` and `genesys validate` each run through a `FileRun`, so they
share one behaviour:

- **Overlap refused.** Before any work, an output that is an input, lies inside an input
  directory (or a glob that would read it), or holds an input (an input inside the output
  directory) is refused, naming both paths. So is a rejects file that is an input.
- **One run per output.** The run holds an exclusive lock (`flock`) on `OUTPUT.lock` from start to
  end; the lock covers the output, its `.parts` and its rejects file. A second run on the same
  output is refused, naming the holder (pid, host, start time and command, recorded in the lock
  file). The lock file is removed when the run ends; a crashed run's lock is released by the kernel.
- **Unreadable rows go to the rejects file.** A row that cannot be read (bad JSON, not an object)
  or that the command cannot use at all is written to `OUTPUT.rejects.jsonl` (or `--rejects`) as
  `{"location", "error", "raw"}`, counted in the summary, and the run goes on. The file is
  rewritten by every run (inputs are read in full each time) and removed when a run rejects nothing.
- **Resume.** Rows already in the output (by `response_id`) are skipped and counted as resumed;
  nothing is written twice. An existing output is always resumed, never silently replaced: with
  `overwrite` the run removes it first (after taking the lock) and starts over.
- **Retrying errors.** With `retry_column` (`error` for verify and generate, `toploc_reason` for
  validate), rows of the output where that column is set are taken out of it when the output is
  opened (`retried`); the run does them again and writes the new rows. A taken-out row is written
  back unchanged when the run ends without having written a row of its key (an interruption, or an
  input that no longer holds it), so no row is lost and none is written twice.
- **Order.** Rows are written in the order they are handed over; `InOrder` puts rows that finish out
  of order (parallel verification) back into input order, holding only those that finished early.
  A resumed or retrying run appends its rows after those the output already holds.
- **Output paths.** `.jsonl` (or `.json`, `.ndjson`), `.parquet`, or a directory of parquet shards
  (a path without an extension, or an existing directory); any other extension is refused before
  any work, naming the accepted ones, and so is `-` (stdout cannot be resumed).
- **One flush policy.** Rows are written in atomic units of `FLUSH_ROWS` rows, or of what has come
  in once `FLUSH_SECONDS` have passed since the last write. Rows handed over before a failure are
  written before the run ends.

A run is a context manager:

    summary = RunSummary(output=Path(output))
    with FileRun(output, summary, inputs=specs) as run:      # refuses overlaps, takes the lock
        rows = list(run.rows(check))                          # readable rows; the others rejected
        run.open_output()                                     # the writer, and the keys it holds
        with run.progress(len(rows), "verifying", "rows"):
            for row in run.pending(rows):                     # rows the output does not hold yet
                run.write([work(row)])
    # the output is finished (a `.parquet` merged), the lock released
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

import orjson

from genesys.data.inputs import PARQUET_SUFFIX, STDIN, InputFile, resolve_inputs
from genesys.data.io import BufferedWriter, RolloutWriter, check_output_path, iter_rows, remove_output
from genesys.errors import InputError
from genesys.ui.progress import RunProgress, console

FLUSH_ROWS = 4096
FLUSH_SECONDS = 2.0

# Why a readable row cannot be used by the command at all (it then goes to the rejects file), or None.
RowCheck = Callable[[dict[str, Any]], str | None]


@dataclass
class FileRunSummary:
    """What every file run reports; each command's summary extends it with its own figures."""

    output: Path
    resumed: int = 0  # rows (or samples) the output already held
    retried: int = 0  # rows of the output taken out to be done again (retry_column set)
    rejected: int = 0  # input rows written to the rejects file
    rejects: Path | None = None  # the rejects file, when rows were rejected
    first_rejected: str = ""  # `location: reason` of the first rejected row
    seconds: float = 0.0

    def print_files(self) -> None:
        """The closing lines of every run: the rows rejected and where they went, the output."""
        if self.rejected:
            console.print(
                f"[yellow]{self.rejected:,} unreadable rows written to {self.rejects} "
                f"(the first: {self.first_rejected})"
            )
        console.print(f"output: {self.output}")


S = TypeVar("S", bound=FileRunSummary)


def default_rejects_path(output: str | Path) -> Path:
    """Where a run's unreadable rows go unless told otherwise: `OUTPUT.rejects.jsonl`."""
    output = Path(output)
    return output.with_name(output.name + ".rejects.jsonl")


def lock_path(output: str | Path) -> Path:
    """The lock file of an output: `OUTPUT.lock`, beside it."""
    output = Path(output)
    return output.with_name(output.name + ".lock")


class FileRun(Generic[S]):
    """One run from input files to an output: overlap check, lock, rejects, resume, writing, progress.

    `inputs` are the local input arguments (files, directories, globs) the run reads or must not
    overlap; `summary` is filled with the counts every run shares. See the module docstring for the
    behaviour; `FLUSH_ROWS`/`FLUSH_SECONDS` are the flush policy.
    """

    def __init__(
        self,
        output: str | Path,
        summary: S,
        *,
        inputs: Sequence[str] = (),
        rejects: str | Path | None = None,
        key_column: str = "response_id",
        command: str | None = None,
        retry_column: str | None = None,
        overwrite: bool = False,
    ) -> None:
        self.output = Path(output)
        self.retry_column = retry_column
        self.overwrite = overwrite
        self.retried: dict[str, dict[str, Any]] = {}  # rows taken out of the output to be done again
        self.summary = summary
        self.inputs = list(inputs)
        self.rejects_path = Path(rejects) if rejects else default_rejects_path(self.output)
        self.key_column = key_column
        self.command = command if command is not None else shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self.files: list[InputFile] = []
        self.done: set[str] = set()
        self.writer: RolloutWriter | None = None
        self._out: BufferedWriter | None = None
        self._lock: OutputLock | None = None
        self._rejects: IO[bytes] | None = None
        self._rejected_at: set[str] = set()
        self._bar: RunProgress | None = None

    # --- start and end ----------------------------------------------------------------------------

    def __enter__(self) -> FileRun[S]:
        """Check the output path, resolve the inputs, refuse an overlap with the output, and take the
        output's lock; with `overwrite`, remove what the output holds."""
        check_output_path(self.output)
        self.files = resolve_inputs(self.inputs)
        refuse_overlap(self.output, self.rejects_path, self.inputs, self.files)
        self._lock = OutputLock(self.output, self.command)
        self._lock.acquire()
        if self.overwrite:
            try:
                remove_output(self.output)
            except BaseException:
                self._lock.release()
                raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Write what was handed over (after a failure too); on success finish the output; unlock."""
        try:
            if self._out is not None:
                self._out.flush()
            if self.retried and self.writer is not None:  # not done again: kept as they were
                self.writer.write(list(self.retried.values()))
                self.retried = {}
            if self._rejects is not None:
                self._rejects.close()
            if exc_type is None:
                if self.writer is not None:
                    self.writer.close()
                if not self._rejected_at and self.rejects_path.exists():
                    self.rejects_path.unlink()  # an earlier run's rejects: this one read every row
        finally:
            if self._lock is not None:
                self._lock.release()

    # --- reading ----------------------------------------------------------------------------------

    def rows(self, check: RowCheck | None = None) -> Iterator[dict[str, Any]]:
        """Every usable row of the inputs, in order. A row that cannot be read, or that `check`
        refuses, goes to the rejects file (once, however often the inputs are read) and is skipped."""
        return (row for _, row in self.located_rows(check))

    def located_rows(self, check: RowCheck | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """`rows`, each with its location (`file:line` or `file#row`)."""
        for record in iter_rows(self.files):
            reason = record.error
            if reason is None and check is not None:
                reason = check(record.row)  # type: ignore[arg-type]
            if reason:
                raw = record.raw if record.raw is not None else orjson.dumps(record.row).decode()
                self.reject(record.location, reason, raw)
                continue
            yield record.location, record.row  # type: ignore[misc]

    def reject(self, location: str, error: str, raw: str | None) -> None:
        """Write one unusable input row to the rejects file and count it (once per location)."""
        if location in self._rejected_at:
            return
        if self._rejects is None:
            self.rejects_path.parent.mkdir(parents=True, exist_ok=True)
            self._rejects = open(self.rejects_path, "wb")  # noqa: SIM115 - closed in __exit__
        self._rejects.write(
            orjson.dumps({"location": location, "error": error, "raw": raw}, option=orjson.OPT_APPEND_NEWLINE)
        )
        self._rejects.flush()
        self._rejected_at.add(location)
        self.summary.rejected += 1
        self.summary.rejects = self.rejects_path
        self.summary.first_rejected = self.summary.first_rejected or f"{location}: {error}"

    # --- writing ----------------------------------------------------------------------------------

    def open_output(self) -> set[str]:
        """Open the output for appending; returns (and keeps in `done`) the keys it already holds.

        With `retry_column`, the rows where it is set are first taken out (into `retried`)."""
        self.writer = RolloutWriter(self.output, self.key_column)
        if self.retry_column is not None:
            self.retried = self.writer.take_out(self.retry_column)
            self.summary.retried = len(self.retried)
        self.done = self.writer.existing_keys()
        self._out = BufferedWriter(self.writer, FLUSH_ROWS, FLUSH_SECONDS)
        return self.done

    def pending(self, rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The rows whose key the output does not hold yet; the others are counted as resumed."""
        for row in rows:
            if row[self.key_column] in self.done:
                self.summary.resumed += 1
                if self._bar is not None:
                    self._bar.skip(1)
                continue
            yield row

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        """Hand rows over to be written (in units of the flush policy)."""
        if self._out is None:
            raise RuntimeError("FileRun.write before open_output()")
        if self.retried:
            for row in rows:
                self.retried.pop(str(row.get(self.key_column)), None)
        self._out.add(rows)

    @contextmanager
    def progress(
        self, total: int, description: str, unit: str, *, rated: Sequence[str] = (), enabled: bool = True
    ) -> Iterator[RunProgress]:
        """The run's progress bar over `total` units; `pending` counts resumed rows on it."""
        with RunProgress(total, description, unit, rated=rated, enabled=enabled) as bar:
            self._bar = bar
            try:
                yield bar
            finally:
                self._bar = None


class InOrder:
    """Rows numbered 0, 1, 2, ... come in any order and leave in number order.

    Only rows that came before one with a lower number are held; the caller bounds how many (by not
    handing out more work while `len(self)` is large)."""

    def __init__(self) -> None:
        self._next = 0
        self._waiting: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, number: int, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Take row `number`; returns the rows now ready, in order (often none, or several)."""
        self._waiting[number] = row
        ready = []
        while self._next in self._waiting:
            ready.append(self._waiting.pop(self._next))
            self._next += 1
        return ready

    def rest(self) -> list[dict[str, Any]]:
        """The rows still held (waiting for a lower number that will not come: the run stopped), in order."""
        held = [self._waiting[number] for number in sorted(self._waiting)]
        self._waiting.clear()
        return held


# --- overlap -----------------------------------------------------------------------------------------


def refuse_overlap(
    output: Path, rejects: Path, inputs: Sequence[str], files: Sequence[InputFile] = ()
) -> None:
    """Refuse (InputError naming both paths) an output or rejects file that is, contains or lies
    inside an input: the same file, an output inside an input directory or matched by an input glob,
    or an input inside the output directory. `files` are the inputs as resolved (symlinks followed)."""
    targets = [("output", output)]
    if output.name.endswith(PARQUET_SUFFIX):
        targets.append(("output", output.with_name(output.name + ".parts")))
    targets.append(("rejects file", rejects))
    sources: list[tuple[str, Path]] = []
    for spec in inputs:
        if spec == STDIN:
            continue  # read from a copy of its own
        if glob.has_magic(spec):
            for what, target in targets:
                if _glob_reads(spec, target):
                    raise InputError(
                        f"{what} {str(target)!r} would be read by input {spec!r} on the next run: "
                        "write to a path no input names"
                    )
            sources += [(spec, Path(match)) for match in glob.glob(spec, recursive=True)]
        else:
            sources.append((spec, Path(spec)))
    sources += [(str(file.path), file.path) for file in files]
    for what, target in targets:
        real_target = Path(os.path.realpath(target))
        for spec, source in sources:
            real_source = Path(os.path.realpath(source))
            if real_target == real_source:
                raise InputError(f"{what} {str(target)!r} is also input {spec!r}: write to another path")
            if real_source in real_target.parents:
                raise InputError(
                    f"{what} {str(target)!r} is inside input directory {spec!r}, so a rerun would read it "
                    "as input: write outside the input"
                )
            if real_target in real_source.parents:
                raise InputError(
                    f"input {spec!r} is inside the {what} {str(target)!r}: "
                    "write to a path that holds no input"
                )


def _glob_reads(pattern: str, path: Path) -> bool:
    """Whether the glob `pattern` (recursive, as inputs are expanded) matches `path` or a directory
    holding it, so that reading the inputs would read `path`."""
    pattern_parts = Path(os.path.abspath(pattern)).parts
    path_parts = Path(os.path.abspath(path)).parts
    return any(_match(pattern_parts, path_parts[:end]) for end in range(1, len(path_parts) + 1))


def _match(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    if not pattern:
        return not parts
    head = pattern[0]
    if head == "**":
        return _match(pattern[1:], parts) or (
            bool(parts) and not parts[0].startswith(".") and _match(pattern, parts[1:])
        )
    if not parts:
        return False
    name = parts[0]
    if glob.has_magic(head) and name.startswith(".") and not head.startswith("."):
        return False  # glob leaves hidden names out of wildcards
    return fnmatchcase(name, head) and _match(pattern[1:], parts[1:])


# --- the lock ----------------------------------------------------------------------------------------


class OutputLock:
    """An exclusive `flock` on `OUTPUT.lock`, recording who holds it; removed on release."""

    def __init__(self, output: Path, command: str) -> None:
        self.output = output
        self.path = lock_path(output)
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise InputError naming the run that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe_holder(fd)
                os.close(fd)
                raise InputError(
                    f"output {str(self.output)!r} is being written by another run ({holder}); "
                    f"wait for it to end or write to another output (lock: {self.path})"
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the holder removed the file as we opened it: lock the new one
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": self.command,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode() + b"\n", 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink()  # while still held, so no other run locks a file about to vanish
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _describe_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 1 << 16, 0) or b"null")
        return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}: {holder['command']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "its pid is not recorded yet"
