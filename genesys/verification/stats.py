"""Per task_type totals of a verification, and the table that shows them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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

    def merge(self, other: TypeStats) -> None:
        """Add the totals of `other` (another run over the same task_type) to these."""
        for name in ("count", "score_sum", "scored", "errors", "timeouts"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.scored if self.scored else None


@dataclass
class RewardMeans:
    """Running mean of `reward` per task_type, for runs whose reward is shaped (not just the score)."""

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, row: Mapping[str, Any]) -> None:
        reward = row.get("reward")
        if reward is None:
            return
        task_type = str(row.get("task_type"))
        self.sums[task_type] = self.sums.get(task_type, 0.0) + reward
        self.counts[task_type] = self.counts.get(task_type, 0) + 1

    def mean(self, task_type: str) -> float | None:
        count = self.counts.get(task_type)
        return self.sums[task_type] / count if count else None


def print_type_stats(
    stats: Mapping[str, TypeStats], verified: int, seconds: float, rewards: RewardMeans | None = None
) -> None:
    """The table of a verification: per task_type count, mean score (and, when the reward is shaped,
    mean reward), errors, timeouts."""
    from rich.table import Table

    from genesys.ui.progress import console

    rate = verified / seconds if seconds else 0.0
    table = Table(title=f"verified {verified:,} rows in {seconds:.1f}s ({rate:,.0f} rows/s)")
    columns = ["task_type", "rows", "mean score", *(["mean reward"] if rewards else []), "errors", "timeouts"]
    for column in columns:
        table.add_column(column, justify="left" if column == "task_type" else "right")
    for task_type, s in sorted(stats.items()):
        reward = [_fmt(rewards.mean(task_type))] if rewards else []
        table.add_row(
            task_type, f"{s.count:,}", _fmt(s.mean_score), *reward, f"{s.errors:,}", f"{s.timeouts:,}"
        )
    console.print(table)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
