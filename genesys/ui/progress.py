"""The progress bar of every run, on stderr (rich); `console` is where closing summaries print too.

The bar is laid out to fit an 80-column terminal with every figure whole: the bar itself takes the
width the text leaves, rates are written short (`12.3k tokens/s`) and times as `m:ss` (`h:mm:ss`
past an hour).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Column
from rich.text import Text

console = Console(stderr=True)


# How a rated quantity is named on the bar, where a long name would push the figures off the line.
_SHORT_NAMES = {"tokens": "tok"}
# Counts of the bar are exact below this; above it they are written short (`333k/1.0M`).
_EXACT_BELOW = 100_000


def short_number(value: float) -> str:
    """`value` in at most 5 characters: 7.3, 912, 12.3k, 333k, 4.1M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            scaled = value / limit
            return f"{scaled:.0f}{suffix}" if abs(scaled) >= 100 else f"{scaled:.1f}{suffix}"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


def short_duration(seconds: float | None) -> str:
    """`m:ss`, or `h:mm:ss` from an hour on; `-:--` when unknown."""
    if seconds is None:
        return "-:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class _CountColumn(ProgressColumn):
    """Units done of the total: exact (`3333/10000`), or short for large totals (`333k/1.0M`)."""

    def render(self, task: Task) -> Text:
        total = int(task.total or 0)
        done = int(task.completed)
        text = f"{done}/{total}" if total < _EXACT_BELOW else f"{short_number(done)}/{short_number(total)}"
        return Text(text, style="progress.download")


class _TimesColumn(ProgressColumn):
    """Elapsed time and the estimate of what remains: `0:42 ETA 1:05`."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        remaining = 0.0 if task.finished else task.time_remaining
        return Text(f"{short_duration(elapsed)} ETA {short_duration(remaining)}", style="progress.remaining")


class RunProgress:
    """A progress bar over a known total, with rates since the start; does nothing when disabled.

    The bar counts `unit`s. `rated` names what the rates are shown for (by default the unit itself),
    each counted through `advance`'s keyword arguments (`advance(1, samples=8, tokens=912)`); the
    unit's own rate is shown only when nothing else is rated (the ETA tells it).
    """

    def __init__(
        self, total: int, description: str, unit: str, *, rated: Sequence[str] = (), enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.unit = unit
        self.counts = dict.fromkeys(rated or (unit,), 0)
        self._started = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True)),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=4)),
            _CountColumn(table_column=Column(no_wrap=True)),
            TextColumn(unit, table_column=Column(no_wrap=True)),
            TextColumn(
                "{task.fields[rates]}", style="progress.data.speed", table_column=Column(no_wrap=True)
            ),
            _TimesColumn(table_column=Column(no_wrap=True)),
            console=console,
            disable=not enabled,
            expand=True,
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
        shown = {name: count for name, count in self.counts.items() if name != self.unit} or self.counts
        rates = " ".join(
            f"{short_number(count / seconds)} {_SHORT_NAMES.get(name, name)}/s"
            for name, count in shown.items()
        )
        self._progress.update(self._task, advance=n, rates=rates)
