"""Per task_type totals of a verification, and the table that shows them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from genesys.schema import ErrorKind, VerifyError


@dataclass
class TypeStats:
    """Running totals for one task_type."""

    count: int = 0
    score_sum: float = 0.0
    scored: int = 0
    errors: int = 0
    timeouts: int = 0

    def add(self, score: float | None, error: VerifyError | None) -> None:
        self.count += 1
        if score is not None:
            self.score_sum += score
            self.scored += 1
        if error is None:
            return
        if error.kind is ErrorKind.TIMEOUT:
            self.timeouts += 1
        else:
            self.errors += 1

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.scored if self.scored else None


def print_type_stats(stats: Mapping[str, TypeStats], verified: int, seconds: float) -> None:
    """The table of a verification: per task_type count, mean score, errors, timeouts."""
    from rich.table import Table

    from genesys.ui.progress import console

    rate = verified / seconds if seconds else 0.0
    table = Table(title=f"verified {verified:,} rows in {seconds:.1f}s ({rate:,.0f} rows/s)")
    for column in ("task_type", "rows", "mean score", "errors", "timeouts"):
        table.add_column(column, justify="left" if column == "task_type" else "right")
    for task_type, s in sorted(stats.items()):
        table.add_row(task_type, f"{s.count:,}", _fmt(s.mean_score), f"{s.errors:,}", f"{s.timeouts:,}")
    console.print(table)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
