"""Task types no installed verifier serves: found before any work, and refused in one wording.

Every path that verifies (`genesys verify`, `genesys generate --verify`, the trainer) counts the task
types of its input with a `TaskTypeCensus` and calls `refuse_unknown` before it starts; with
`--skip-unknown` it goes on and the engine records each such row as an error with
`unknown_type_error`, in the same words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from genesys.errors import InputError


@dataclass
class TaskTypeCensus:
    """How many rows of each task type an input holds, and where each type first appears."""

    counts: Counter[str] = field(default_factory=Counter)
    first_seen: dict[str, str] = field(default_factory=dict)

    def add(self, task_type: str, location: str) -> None:
        """Count one row of `task_type`, found at `location` (`file:line`, `task 3 of 'spec'`)."""
        self.counts[task_type] += 1
        self.first_seen.setdefault(task_type, location)


def refuse_unknown(census: TaskTypeCensus, known: Collection[str]) -> None:
    """Raise InputError naming every task type of `census` outside `known`, with its count and first location."""
    unknown = sorted(set(census.counts) - set(known))
    if unknown:
        described = "; ".join(
            f"{t!r} ({census.counts[t]} rows, first at {census.first_seen[t]})" for t in unknown
        )
        raise InputError(
            f"{_unknown_text(described, known)}. "
            "Install the plugin that serves it, or pass --skip-unknown to record these rows as errors."
        )


def unknown_type_error(task_type: object, known: Collection[str]) -> str:
    """The error of one row whose task type no verifier serves (recorded with --skip-unknown)."""
    return _unknown_text(repr(task_type), known)


def _unknown_text(described: str, known: Collection[str]) -> str:
    return f"unknown task_type {described}; known task types: {', '.join(sorted(known)) or 'none'}"
