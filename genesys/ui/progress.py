"""The progress bar of every run, on stderr (rich); `console` is where closing summaries print too."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

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
