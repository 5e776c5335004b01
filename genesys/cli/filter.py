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
    "or its prompt when problem_id is missing. With --require-proofs, only rollouts genesys validate --tasks marked "
    "valid and attested under the trust key (--trust-key) count. With --emit rollouts, write the rollouts of the "
    "kept tasks instead (genesys train learns from them offline). The output is written whole: an existing one is "
    "replaced only with --overwrite; -o - writes JSON lines to stdout.",
)
def command(config: FilterCommand) -> int:
    from rich.console import Console

    from genesys.analysis.filtering import filter_tasks
    from genesys.proofs.requirement import ProofRequirement

    console = Console(stderr=True)
    bounds = config.filter
    requirement = (
        ProofRequirement.load(config.proofs.trust_key, config.data.tasks) if bounds.require_proofs else None
    )
    with console.status("computing pass rates"):
        summary = filter_tasks(config.inputs, config.output, bounds, requirement, overwrite=config.overwrite)
    if summary.repeats:
        console.print(
            f"[yellow]warning: {summary.repeats} rollouts appear more than once in the inputs (the same "
            "response_id); each is counted once[/yellow]"
        )
    where = "stdout" if config.output == "-" else config.output
    read = f"{summary.tasks} tasks"
    if summary.unproven is not None:
        read = f"{summary.unproven} rollouts not proven dropped; " + read
        if summary.first_unproven:
            console.print(
                f"--require-proofs: the first rollout dropped: {summary.first_unproven}", markup=False
            )
    if summary.rollouts is not None:
        read += f" from {summary.rollouts} rollouts ({summary.errors} with verification errors, not counted)"
    console.print(
        f"{read}; kept {summary.kept}, dropped {summary.too_hard} below {bounds.min_pass_rate}, "
        f"{summary.too_easy} above {bounds.max_pass_rate}, {summary.unscored} unscored -> {where}"
        + (f" ({summary.emitted} rollouts of the kept tasks)" if bounds.emit == "rollouts" else "")
    )
    if summary.kept == 0:
        console.print(
            f"[bold yellow]warning: no task has a pass rate in [{bounds.min_pass_rate}, {bounds.max_pass_rate}]: "
            f"{where} holds no task.[/bold yellow] Pass rates of the {summary.tasks - summary.unscored} "
            "scored tasks:"
        )
        console.print(histogram_text(summary.histogram), markup=False, highlight=False)
    return 0


def histogram_text(counts: tuple[int, ...], width: int = 40) -> str:
    """`counts` per pass-rate range as text bars, one line per range."""
    most = max(counts, default=0) or 1
    lines = []
    for index, count in enumerate(counts):
        low, high = index / len(counts), (index + 1) / len(counts)
        closing = "]" if index == len(counts) - 1 else ")"
        lines.append(
            f"  [{low:.1f}, {high:.1f}{closing} {'#' * round(width * count / most):<{width}} {count}"
        )
    return "\n".join(lines)
