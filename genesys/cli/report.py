"""`genesys report`: plots and a markdown summary of verified rollouts."""

from __future__ import annotations

import click


@click.command(
    "report",
    short_help="plots and a markdown summary of verified rollouts",
    help="Write PNG plots (pass rate per source, reward and completion-length distributions, length against "
    "correctness, score by task_type) and summary.md into a directory.",
)
@click.argument("inputs", nargs=-1, required=True, metavar="ROLLOUTS...")
@click.option("-o", "--output", required=True, metavar="DIR", help="directory for the plots and summary.md")
def command(inputs: tuple[str, ...], output: str) -> int:
    from rich.console import Console

    from genesys.report import write_report

    console = Console(stderr=True)
    with console.status("reading rollouts and drawing plots"):
        report = write_report(list(inputs), output)
    console.print(f"report: {report.summary} ({len(report.plots)} plots)")
    return 0
