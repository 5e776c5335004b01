"""The progress bar of a generation run: tasks done, samples/s and tokens/s."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rich.table import Table

from genesys.progress import console, print_summary

if TYPE_CHECKING:
    from genesys.generate.runner import GenerateSummary


class GenerationProgress:
    """Counts finished tasks, samples and completion tokens; a rich bar when enabled."""

    def __init__(self, total_tasks: int, enabled: bool = True) -> None:
        self.samples = 0
        self.tokens = 0
        self._started = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]generating"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tasks"),
            TextColumn("{task.fields[rates]}", style="progress.data.speed"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self._task = self._progress.add_task("generating", total=total_tasks, rates="")

    def __enter__(self) -> GenerationProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self._started

    def rates(self) -> tuple[float, float]:
        """(samples/s, tokens/s) since the start."""
        seconds = max(self.seconds, 1e-9)
        return self.samples / seconds, self.tokens / seconds

    def advance_done(self, tasks: int) -> None:
        """Count tasks an earlier run already finished."""
        self._progress.update(self._task, advance=tasks)

    def task_done(self, samples: int, tokens: int) -> None:
        self.samples += samples
        self.tokens += tokens
        samples_per_s, tokens_per_s = self.rates()
        self._progress.update(self._task, advance=1, rates=f"{samples_per_s:,.1f} samples/s  {tokens_per_s:,.0f} tokens/s")


def print_generate_summary(summary: GenerateSummary) -> None:
    """The closing table of a generation run, then the verification summary when there was one."""
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
        from genesys.verify import RunSummary

        verified = sum(stats.count for stats in summary.verify_stats.values())
        print_summary(RunSummary(output=summary.output, stats=summary.verify_stats, verified=verified, seconds=summary.seconds), None)
    else:
        console.print(f"output: {summary.output}")
