"""Resolving input arguments into the files to read, for every reader of rollout and task files.

An input is a file (`.jsonl`/`.json`/`.ndjson` or `.parquet`), a folder written by
`datasets.save_to_disk`, a directory holding such files and folders (read recursively, in name
order), a glob of any of these, or `-`: JSON lines on stdin (read once into a temporary file, so a
command may read its inputs twice; rows are located as `<stdin>:LINE`).
`resolve_inputs` expands them into `InputFile`s with their format, so the row reader (`genesys.data.io`),
the frame scanner (`genesys.data.frames`) and task sources read the same files and refuse the same inputs
with the same words, before any work.
"""

from __future__ import annotations

import glob
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from genesys.errors import InputError

STDIN = "-"
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIX = ".parquet"
# Files `datasets.save_to_disk` writes beside the data of one split.
_HF_DATASET_MARKERS = ("dataset_info.json", "state.json")
_HF_DATASET_DICT_MARKER = "dataset_dict.json"

Format = Literal["jsonl", "parquet", "hf_dataset"]


@dataclass(frozen=True, slots=True)
class InputFile:
    """One readable input: a jsonl or parquet file, or a saved `datasets.Dataset` folder."""

    path: Path
    format: Format
    name: str | None = None  # how rows are located, when not by the path (`<stdin>`)

    @property
    def label(self) -> str:
        return self.name or str(self.path)


def names_local_input(spec: str) -> bool:
    """Whether `spec` names a local input (an existing path, a glob, or `-` for stdin) rather than something else."""
    return spec == STDIN or glob.has_magic(spec) or Path(spec).exists()


@cache
def _stdin_copy() -> Path:
    """Standard input, copied once into a temporary file removed when the process ends."""
    folder = tempfile.TemporaryDirectory(prefix="genesys-stdin-")
    _stdin_folders.append(folder)  # kept alive until exit, then cleaned up
    path = Path(folder.name) / "stdin.jsonl"
    with open(path, "wb") as copy:
        shutil.copyfileobj(sys.stdin.buffer, copy)
    return path


_stdin_folders: list[tempfile.TemporaryDirectory] = []


def resolve_inputs(patterns: Sequence[str]) -> list[InputFile]:
    """The files behind `patterns`, in order; an InputError names the first pattern that cannot be read."""
    files: list[InputFile] = []
    for pattern in patterns:
        if pattern == STDIN:
            files.append(InputFile(_stdin_copy(), "jsonl", "<stdin>"))
            continue
        for path in _expand(pattern):
            files.extend(_resolve_path(path))
    return files


def _expand(pattern: str) -> list[Path]:
    if glob.has_magic(pattern):
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise InputError(f"input pattern {pattern!r} matches no file")
        return [Path(match) for match in matches]
    path = Path(pattern)
    if not path.exists():
        raise InputError(f"input {pattern!r} does not exist")
    return [path]


def _resolve_path(path: Path) -> list[InputFile]:
    if not path.is_dir():
        return [InputFile(path, _file_format(path))]
    files = _resolve_dir(path)
    if not files:
        raise InputError(f"input directory {str(path)!r} holds no .parquet or .jsonl files")
    return files


def _resolve_dir(path: Path) -> list[InputFile]:
    """A saved dataset, or the data files under `path` in name order (saved datasets found on the way included)."""
    if (path / _HF_DATASET_DICT_MARKER).exists():
        raise InputError(
            f"input {str(path)!r} is a DatasetDict; name one split's directory: {', '.join(_splits(path))}"
        )
    if any((path / marker).exists() for marker in _HF_DATASET_MARKERS):
        return [InputFile(path, "hf_dataset")]
    files: list[InputFile] = []
    for child in sorted(path.iterdir()):
        if child.is_dir():
            files.extend(_resolve_dir(child))
        elif child.name.endswith(JSONL_SUFFIXES + (PARQUET_SUFFIX,)):
            files.append(InputFile(child, _file_format(child)))
    return files


def _file_format(path: Path) -> Format:
    if path.name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if path.name.endswith(PARQUET_SUFFIX):
        return "parquet"
    raise InputError(f"input {str(path)!r}: unsupported file type (expected .jsonl, .parquet or a directory)")


def _splits(path: Path) -> list[str]:
    """The split directories a saved DatasetDict lists (its subdirectories if the list is unreadable)."""
    try:
        names = json.loads((path / _HF_DATASET_DICT_MARKER).read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        names = sorted(p.name for p in path.iterdir() if p.is_dir())
    return [str(path / name) for name in names]
