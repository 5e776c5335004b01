"""`genesys filter`: keep tasks whose pass rate over their rollouts lies in a range."""

from __future__ import annotations

from genesys.cli.flags import config_command
from genesys.config import FilterCommand


@config_command(
    "filter",
    FilterCommand,
    short_help="keep tasks whose pass rate over their rollouts lies in a range",
    help="Compute each task's pass rate over its verified rollouts and write one row per task whose rate is within "
    "[--min-pass-rate, --max-pass-rate] (inclusive): the task columns plus pass_rate, n_samples (scored rollouts) "
    "and n_errors (rollouts whose verification failed; they do not count in the rate). A task is its problem_id, "
    "or its prompt when problem_id is missing.",
)
def command(config: FilterCommand) -> int:
    from rich.console import Console

    from genesys.analysis.filtering import filter_tasks

    console = Console(stderr=True)
    bounds = config.filter
    with console.status("computing pass rates"):
        summary = filter_tasks(config.inputs, config.output, bounds)
    if summary.repeats:
        console.print(
            f"[yellow]warning: {summary.repeats} rollouts appear more than once in the inputs (the same "
            "response_id); each is counted once[/yellow]"
        )
    read = f"{summary.tasks} tasks"
    if summary.unproven is not None:
        read = f"{summary.unproven} rollouts without a valid TOPLOC proof dropped; " + read
    if summary.rollouts is not None:
        read += f" from {summary.rollouts} rollouts ({summary.errors} with verification errors, not counted)"
    console.print(
        f"{read}; kept {summary.kept}, dropped {summary.too_hard} below {bounds.min_pass_rate}, "
        f"{summary.too_easy} above {bounds.max_pass_rate}, {summary.unscored} unscored -> {config.output}"
    )
    return 0
