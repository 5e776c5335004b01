"""`genesys generate`: sample rollouts for tasks from a model, optionally verified as they come."""

from __future__ import annotations

import sys

import click

from genesys.cli.flags import config_command
from genesys.config import GenerateCommand

DRY_RUN = click.Option(
    ["--dry-run", "dry_run"],
    is_flag=True,
    help="print what the run would generate (tasks and samples per task type, how each type is played: one "
    "completion, or an environment's turns, tools and deadlines) and the opening messages of each type's first "
    "task, then stop: no model is loaded and nothing is written",
)


@config_command(
    "generate",
    GenerateCommand,
    short_help="sample rollouts for tasks from a model (vLLM, transformers or an OpenAI-compatible server)",
    help="Sample -n completions per task and write rollouts with token ids and logprobs (and, with --verify, score "
    "and reward). Output is a .jsonl, a .parquet, or a directory of parquet shards; rerunning the same command after "
    "a crash generates only what is missing.",
    options=[DRY_RUN],
)
def command(config: GenerateCommand, dry_run: bool = False) -> int:
    from genesys.generate.backend import resolve_backend_name
    from genesys.generate.runner import run_generation
    from genesys.openai_client import APIError

    if dry_run:
        from genesys.generate.dry_run import describe, plan_run

        built = config.build(resolve_backend_name(config.backend))
        print(describe(plan_run(built), built))
        return 0
    try:
        run_generation(config.build(resolve_backend_name(config.backend)))
    except APIError as exc:
        print(f"genesys generate: error: {exc}; rerun the same command to continue", file=sys.stderr)
        return 1
    return 0
