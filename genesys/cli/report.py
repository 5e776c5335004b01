"""`genesys report`: plots and a markdown summary of verified rollouts or of a training run."""

from __future__ import annotations

import click


@click.command(
    "report",
    short_help="plots and a markdown summary of verified rollouts or a training run",
    help="Write PNG plots and summary.md into a directory. For rollouts: pass rate per source, reward and "
    "completion-length distributions, length against correctness, score by task_type. For a training run (its "
    "output_dir, or its metrics.jsonl): reward, completion length, clipping, optimization and throughput against step.",
)
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("-o", "--output", required=True, metavar="DIR", help="directory for the plots and summary.md")
def command(inputs: tuple[str, ...], output: str) -> int:
    from rich.console import Console

    from genesys.analysis.report import write_report
    from genesys.analysis.report_training import find_training_run, write_training_report

    console = Console(stderr=True)
    metrics_file = find_training_run(inputs)
    if metrics_file is not None:
        with console.status("reading training metrics and drawing plots"):
            report = write_training_report(metrics_file, output)
    else:
        with console.status("reading rollouts and drawing plots"):
            report = write_report(list(inputs), output)
        if report.repeats:
            console.print(
                f"[yellow]warning: {report.repeats} rollouts appear more than once in the inputs (the same "
                "response_id); each is counted once[/yellow]"
            )
    console.print(f"report: {report.summary} ({len(report.plots)} plots)")
    return 0
