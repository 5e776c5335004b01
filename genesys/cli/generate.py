"""`genesys generate`: sample rollouts for tasks from a model, optionally verified as they come."""

from __future__ import annotations

import sys

from genesys.cli.flags import config_command
from genesys.config import GenerateCommand


@config_command(
    "generate",
    GenerateCommand,
    short_help="sample rollouts for tasks from a model (vLLM, transformers or an OpenAI-compatible server)",
    help="Sample -n completions per task and write rollouts with token ids and logprobs (and, with --verify, score "
    "and reward). Output is a .jsonl, a .parquet, or a directory of parquet shards; rerunning the same command after "
    "a crash generates only what is missing.",
)
def command(config: GenerateCommand) -> int:
    from genesys.generate.backend import resolve_backend_name
    from genesys.generate.runner import run_generation
    from genesys.openai_client import APIError

    try:
        run_generation(config.build(resolve_backend_name(config.backend)))
    except APIError as exc:
        print(f"genesys generate: error: {exc}; rerun the same command to continue", file=sys.stderr)
        return 1
    return 0
