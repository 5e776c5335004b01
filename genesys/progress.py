"""Terminal output: progress bars and closing summaries on stderr, listings on stdout (rich)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from genesys.verify import RunSummary

console = Console(stderr=True)


class RateColumn(ProgressColumn):
    """Items per second, e.g. '5,120 rows/s'."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Any) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-" if speed is None else f"{speed:,.0f} {self.unit}/s", style="progress.data.speed")


class RowProgress:
    """A progress bar over a known number of rows; does nothing when disabled."""

    def __init__(self, total: int, enabled: bool = True, description: str = "verifying", unit: str = "rows") -> None:
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            RateColumn(unit),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
        )
        self._task = self._progress.add_task(description, total=total)

    def __enter__(self) -> RowProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(self, n: int) -> None:
        if n:
            self._progress.advance(self._task, n)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_summary(summary: RunSummary, rejects: Path | None) -> None:
    """The closing table of a verify run: per task_type count, mean score, errors, timeouts."""
    table = Table(title=f"verified {summary.verified:,} rows in {summary.seconds:.1f}s ({summary.rows_per_second:,.0f} rows/s)")
    for column in ("task_type", "rows", "mean score", "errors", "timeouts"):
        table.add_column(column, justify="left" if column == "task_type" else "right")
    for task_type, stats in sorted(summary.stats.items()):
        table.add_row(task_type, f"{stats.count:,}", _fmt(stats.mean_score), f"{stats.errors:,}", f"{stats.timeouts:,}")
    console.print(table)
    if summary.resumed:
        console.print(f"resumed: {summary.resumed:,} rows were already in {summary.output}")
    if rejects is not None:
        console.print(f"[yellow]{summary.rejected:,} unreadable rows written to {rejects}")
    console.print(f"output: {summary.output}")


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A listing on stdout; cells fold rather than truncate, and pipes get a wide, stable layout."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
