"""The wire types between the verification engine and its worker processes.

The engine sends `RowBatch` and `Stop`; a worker answers with `Results`, several per batch when the
batch runs long. Results hold parallel lists rather than one object per rollout: a batch carries up
to hundreds of rollouts, and this keeps the pipe's pickling as cheap as plain tuples.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from genesys.schema import VerifyError


@dataclass(frozen=True, slots=True)
class RowBatch:
    """Rows of one task_type for a worker to verify, each under `timeout` seconds."""

    batch_id: int
    task_type: str
    timeout: float
    seqs: list[int]
    rows: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Stop:
    """Tear the verifiers down and exit once the batches already sent are done."""


@dataclass(frozen=True, slots=True)
class Results:
    """Outcomes of some rollouts of one batch; `final` closes the batch, with its `elapsed` seconds.

    A rollout of the batch that no final Results answers for was not verified (its worker gave up on
    the batch) and is tried again.
    """

    batch_id: int
    seqs: list[int] = field(default_factory=list)
    scores: list[float | None] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)
    errors: list[VerifyError | None] = field(default_factory=list)
    final: bool = False
    elapsed: float | None = None

    def add(self, seq: int, score: float | None, details: dict[str, Any], error: VerifyError | None) -> None:
        """Record the outcome of rollout `seq`."""
        self.seqs.append(seq)
        self.scores.append(score)
        self.details.append(details)
        self.errors.append(error)

    def closing(self, elapsed: float) -> Results:
        """These results as the batch's final message."""
        return replace(self, final=True, elapsed=elapsed)

    def outcomes(self) -> Iterator[tuple[int, float | None, dict[str, Any], VerifyError | None]]:
        """(seq, score, details, error) of each rollout."""
        return zip(self.seqs, self.scores, self.details, self.errors)

    def __len__(self) -> int:
        return len(self.seqs)
