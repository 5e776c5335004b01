"""Terminal output: the progress bar and closing summaries of every run on stderr, listings on stdout (rich)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

if TYPE_CHECKING:
    from genesys.engine import TypeStats
    from genesys.generate.runner import GenerateSummary
    from genesys.verify import RunSummary

console = Console(stderr=True)


class RunProgress:
    """A progress bar over a known total, with rates since the start; does nothing when disabled.

    The bar counts `unit`s. `rated` names what the rates are shown for (by default the unit itself),
    each counted through `advance`'s keyword arguments (`advance(1, samples=8, tokens=912)`).
    """

    def __init__(
        self, total: int, description: str, unit: str, *, rated: Sequence[str] = (), enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.unit = unit
        self.counts = dict.fromkeys(rated or (unit,), 0)
        self._started = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TextColumn("{task.fields[rates]}", style="progress.data.speed"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
        )
        self._task = self._progress.add_task(description, total=total, rates="")

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    @property
    def seconds(self) -> float:
        """Seconds since the bar was made."""
        return time.monotonic() - self._started

    def skip(self, n: int) -> None:
        """Count `n` units an earlier run already finished: on the bar, not in the rates."""
        if n:
            self._progress.advance(self._task, n)

    def describe(self, description: str) -> None:
        """Replace the text before the bar (e.g. with the latest reward)."""
        self._progress.update(self._task, description=description)

    def advance(self, n: int = 1, **amounts: int) -> None:
        """Count `n` units done now, and `amounts` of the rated quantities (the unit's own: `n`)."""
        for name in self.counts:
            self.counts[name] += amounts.get(name, n if name == self.unit else 0)
        seconds = max(self.seconds, 1e-9)
        rates = "  ".join(f"{count / seconds:,.1f} {name}/s" for name, count in self.counts.items())
        self._progress.update(self._task, advance=n, rates=rates)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print_type_stats(stats: dict[str, TypeStats], verified: int, seconds: float) -> None:
    """The table of a verification: per task_type count, mean score, errors, timeouts."""
    rate = verified / seconds if seconds else 0.0
    table = Table(title=f"verified {verified:,} rows in {seconds:.1f}s ({rate:,.0f} rows/s)")
    for column in ("task_type", "rows", "mean score", "errors", "timeouts"):
        table.add_column(column, justify="left" if column == "task_type" else "right")
    for task_type, s in sorted(stats.items()):
        table.add_row(task_type, f"{s.count:,}", _fmt(s.mean_score), f"{s.errors:,}", f"{s.timeouts:,}")
    console.print(table)


def print_summary(summary: RunSummary, rejects: Path | None) -> None:
    """The closing summary of a verify run: the per task_type table, resumed and unreadable rows, the output."""
    _print_type_stats(summary.stats, summary.verified, summary.seconds)
    if summary.resumed:
        console.print(f"resumed: {summary.resumed:,} rows were already in {summary.output}")
    if rejects is not None:
        console.print(f"[yellow]{summary.rejected:,} unreadable rows written to {rejects}")
    console.print(f"output: {summary.output}")


def print_generate_summary(summary: GenerateSummary) -> None:
    """The closing summary of a generation run, with the verification table when it verified."""
    seconds = max(summary.seconds, 1e-9)
    table = Table(title=f"generated {summary.generated:,} rollouts in {summary.seconds:.1f}s")
    for column in ("tasks", "rollouts", "resumed", "tokens", "samples/s", "tokens/s"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{summary.tasks:,}",
        f"{summary.generated:,}",
        f"{summary.resumed:,}",
        f"{summary.tokens:,}",
        f"{summary.generated / seconds:,.1f}",
        f"{summary.tokens / seconds:,.0f}",
    )
    console.print(table)
    if summary.duplicates:
        console.print(f"[yellow]{summary.duplicates:,} duplicate tasks were skipped")
    if summary.verify_stats:
        verified = sum(stats.count for stats in summary.verify_stats.values())
        _print_type_stats(summary.verify_stats, verified, summary.seconds)
    console.print(f"output: {summary.output}")


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A listing on stdout; cells fold rather than truncate, and pipes get a wide, stable layout."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
