"""Resolving `--tasks` specs into task rows.

A spec is one of:
- a local path or glob: a .jsonl or .parquet file, a directory of shards, or a `datasets` dir saved to
  disk (resolved by `genesys.data.inputs`, as every command's inputs);
- `hf:NAME[:key=value,...]`: a dataset on the Hugging Face hub (or any path `datasets.load_dataset`
  accepts), loaded with the options as keyword arguments (`split` defaults to `train`);
- `NAME[:key=value,...]`: a task set offered by a plugin (`math-samples`, `countdown:count=200`).
Option values are parsed as JSON when they are JSON (`count=200` is an int).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from genesys.config.options import parse_key_values
from genesys.data.inputs import names_local_input, resolve_inputs
from genesys.errors import InputError

HUB_PREFIX = "hf:"
# Takes an unreadable row: its location, the reason, and the raw line when there is one.
Reject = Callable[[str, str, str | None], None]


@dataclass
class TaskSource:
    """The rows of one `--tasks` spec; `rows` is a list or an indexable `datasets.Dataset`."""

    spec: str
    rows: Sequence[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.rows)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split `NAME:key=value,...` into the name and its options."""
    name, sep, tail = spec.partition(":")
    if not sep or not tail:
        return name, {}
    return name, parse_key_values(
        tail.split(","), f"--tasks {spec!r} (options after ':' are comma-separated)"
    )


def load_source(spec: str, reject: Reject | None = None) -> TaskSource:
    """Load one `--tasks` spec; raises InputError naming the spec when it cannot be used.

    A row of a local file that cannot be read is handed to `reject` (location, error, raw line)
    and left out; without `reject` it is an InputError naming its location.
    """
    if spec.startswith(HUB_PREFIX):
        name, options = parse_spec(spec[len(HUB_PREFIX) :])
        return TaskSource(spec, _load_hub(spec, name, options))
    if names_local_input(spec):
        return TaskSource(spec, _load_local(spec, reject))
    from genesys.plugins.registry import task_sets

    name, options = parse_spec(spec)
    known = task_sets()
    if name not in known:
        raise InputError(
            f"--tasks {spec!r} is not an existing file or directory, not a task set "
            f"(installed: {', '.join(sorted(known)) or 'none'}), and not a hub dataset (write hf:NAME)"
        )
    try:
        rows = list(known[name].load(**options))
    except (TypeError, ValueError) as exc:
        raise InputError(f"--tasks {spec!r}: bad options for task set {name!r}: {exc}") from None
    return TaskSource(spec, rows)


def _load_local(spec: str, reject: Reject | None) -> list[dict[str, Any]]:
    from genesys.data.io import iter_rows

    rows = []
    for record in iter_rows(resolve_inputs([spec])):
        if record.row is None:
            if reject is None:
                raise InputError(f"--tasks {spec!r}: row at {record.location} is unreadable: {record.error}")
            reject(record.location, str(record.error), record.raw)
            continue
        rows.append(record.row)
    return rows


def _load_hub(spec: str, name: str, options: dict[str, Any]) -> Sequence[dict[str, Any]]:
    import datasets

    options.setdefault("split", "train")
    try:
        dataset = datasets.load_dataset(name, **options)
    except (OSError, ValueError) as exc:  # missing dataset or split, hub unreachable
        raise InputError(f"--tasks {spec!r}: cannot load dataset {name!r}: {exc}") from None
    if not isinstance(dataset, datasets.Dataset):
        raise InputError(
            f"--tasks {spec!r}: expected one split, got {type(dataset).__name__}; name it with :split=NAME"
        )
    return dataset
