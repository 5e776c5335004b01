"""The `genesys` command and its subcommands.

Each subcommand is a pair: `_add_<name>(subparsers)` declares its flags, `_run_<name>(args)` runs it.
Handlers import their heavy modules themselves, so `genesys <cmd> --help` starts in milliseconds.
Exit codes: 0 when the run completed, 2 for usage or input errors (one clear line on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any


class UsageError(Exception):
    """Bad flags or input: reported as one line, exit code 2."""


def _parse_options(pairs: Sequence[str], flag: str = "-O/--option") -> dict[str, Any]:
    """Turn repeated `KEY=VALUE` flags into a dict (values parsed as JSON when they are JSON)."""
    from genesys.options import parse_key_values

    return parse_key_values(pairs, flag)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


# --- genesys verify -------------------------------------------------------------------------------


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="score rollout files with the installed verifiers",
        description="Score rollouts (jsonl, parquet, or directories of parquet shards) and write them with "
        "score, verification_result_info, reward and error. Rerunning the same command resumes.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="rollout files, directories or globs")
    p.add_argument("-o", "--output", required=True, help="output: .jsonl, .parquet, or a directory for parquet shards")
    p.add_argument("--workers", type=_positive_int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    p.add_argument("--timeout", type=_positive_float, help="per-rollout deadline in seconds, overriding each verifier's own")
    p.add_argument("--skip-unknown", action="store_true", help="record rows of unknown task_type as errors instead of refusing the run")
    p.add_argument("--rejects", help="where unreadable rows go (default: OUTPUT.rejects.jsonl)")
    p.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE", help="an option passed to every verifier")
    p.add_argument("--max-rows-per-worker", type=_positive_int, default=100_000, help="replace each worker after this many rows, bounding leaks in verifiers (default 100000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_reward_flags(p)
    _add_sandbox_flags(p)
    p.set_defaults(handler=_run_verify)


def _add_sandbox_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("code sandbox", "where and under which per-test limits code verifiers run programs")
    g.add_argument("--sandbox", choices=("auto", "docker", "bwrap", "subprocess"), help="backend (default auto: docker if a daemon answers, else bwrap)")
    g.add_argument("--sandbox-image", help="docker image (default genesys-sandbox:latest, made by `genesys sandbox build`)")
    g.add_argument("--time-limit", type=_positive_float, help="CPU seconds per test (default 2)")
    g.add_argument("--memory-limit", type=_positive_int, help="MB of memory per test (default 512)")
    g.add_argument("--process-limit", type=_positive_int, help="processes and threads per test (default 64)")
    g.add_argument("--output-limit", type=_positive_int, help="bytes of stdout per test (default 8 MiB)")
    g.add_argument("--disk-limit", type=_positive_int, help="MB per file a test writes (default 64)")


def _sandbox_options(args: argparse.Namespace) -> dict[str, Any]:
    """The sandbox flags that were given, as verifier options."""
    from genesys.sandbox.limits import OPTION_NAMES

    names = ("sandbox", "sandbox_image", *OPTION_NAMES)
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _add_reward_flags(p: argparse.ArgumentParser) -> None:
    from genesys.rewards import DEFAULT_LENGTH_COEF, LENGTH_PENALTIES

    g = p.add_argument_group("reward", "how `reward` is shaped from `score` by completion length (in tokens)")
    g.add_argument("--length-penalty", choices=LENGTH_PENALTIES, default="none", help="length term (default: none, reward = score)")
    g.add_argument("--length-coef", type=float, default=DEFAULT_LENGTH_COEF, help=f"coefficient of exact/max (default {DEFAULT_LENGTH_COEF})")
    g.add_argument("--target-length", type=int, help="target tokens for rows without a target_length column (exact, max, clip)")
    g.add_argument("--max-length", type=_positive_int, help="overlong: the maximum completion length in tokens")
    g.add_argument("--overlong-buffer", type=_positive_int, help="overlong: tokens before --max-length where the penalty ramps up")
    g.add_argument("--overlong-penalty", type=float, default=1.0, help="overlong: the penalty at --max-length and beyond (default 1.0)")
    g.add_argument("--tokenizer", help="tokenizer (name or path) counting tokens of rows without completion_ids")


def _reward_config(args: argparse.Namespace) -> Any:
    from genesys.rewards import RewardConfig

    if args.length_penalty == "overlong" and (args.max_length is None or args.overlong_buffer is None):
        raise UsageError("--length-penalty overlong needs --max-length and --overlong-buffer")
    try:
        return RewardConfig(
            length_penalty=args.length_penalty,
            coef=args.length_coef,
            target_length=args.target_length,
            max_length=args.max_length,
            overlong_buffer=args.overlong_buffer,
            overlong_penalty=args.overlong_penalty,
            tokenizer=args.tokenizer,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_verify(args: argparse.Namespace) -> int:
    from genesys.verify import VerifyConfig, verify_files

    config = VerifyConfig(
        workers=args.workers,
        timeout=args.timeout,
        skip_unknown=args.skip_unknown,
        options={**_parse_options(args.option), **_sandbox_options(args)},
        progress=not args.no_progress,
        reward=_reward_config(args),
        max_rows_per_worker=args.max_rows_per_worker,
    )
    verify_files(args.inputs, args.output, config=config, rejects=args.rejects)
    return 0


# --- genesys filter -------------------------------------------------------------------------------


def _add_filter(sub: argparse._SubParsersAction) -> None:
    from genesys.filtering import METRICS

    p = sub.add_parser(
        "filter",
        help="keep tasks whose pass rate over their rollouts lies in a range",
        description="Compute each task's pass rate over its verified rollouts and write one row per task whose rate "
        "is within [--min-pass-rate, --max-pass-rate] (inclusive): the task columns plus pass_rate, n_samples "
        "(scored rollouts) and n_errors (rollouts whose verification failed; they do not count in the rate). "
        "A task is its problem_id, or its prompt when problem_id is missing.",
    )
    p.add_argument("inputs", nargs="+", metavar="ROLLOUTS", help="rollout files, directories or globs")
    p.add_argument("-o", "--output", required=True, help="output tasks: .jsonl or .parquet")
    p.add_argument("--min-pass-rate", type=float, default=0.0, help="lowest pass rate kept (default 0.0)")
    p.add_argument("--max-pass-rate", type=float, default=1.0, help="highest pass rate kept (default 1.0)")
    p.add_argument("--metric", choices=METRICS, default="score", help="pass rate as mean score, or as the fraction with score == 1")
    p.add_argument("--pass-rate-column", metavar="COLUMN", help="the input is a task set with a solve rate in COLUMN: filter on it")
    p.set_defaults(handler=_run_filter)


def _run_filter(args: argparse.Namespace) -> int:
    from rich.console import Console

    from genesys.filtering import PassRateFilter, filter_tasks

    try:
        config = PassRateFilter(args.min_pass_rate, args.max_pass_rate, args.metric, args.pass_rate_column)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    console = Console(stderr=True)
    with console.status("computing pass rates"):
        summary = filter_tasks(args.inputs, args.output, config)
    read = f"{summary.tasks} tasks"
    if summary.rollouts is not None:
        read += f" from {summary.rollouts} rollouts ({summary.errors} with verification errors, not counted)"
    console.print(
        f"{read}; kept {summary.kept}, dropped {summary.too_hard} below {config.min_pass_rate}, "
        f"{summary.too_easy} above {config.max_pass_rate}, {summary.unscored} unscored -> {args.output}"
    )
    return 0


# --- genesys report -------------------------------------------------------------------------------


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="plots and a markdown summary of verified rollouts",
        description="Write PNG plots (pass rate per source, reward and completion-length distributions, length "
        "against correctness, score by task_type) and summary.md into a directory.",
    )
    p.add_argument("inputs", nargs="+", metavar="ROLLOUTS", help="rollout files, directories or globs")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="directory for the plots and summary.md")
    p.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from genesys.report import write_report

    console = Console(stderr=True)
    with console.status("reading rollouts and drawing plots"):
        report = write_report(args.inputs, args.output)
    console.print(f"report: {report.summary} ({len(report.plots)} plots)")
    return 0


# --- genesys generate -----------------------------------------------------------------------------


def _comma_list(kind: type) -> Any:
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None

    return parse


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="sample rollouts for tasks from a model (vLLM, transformers or an OpenAI-compatible server)",
        description="Sample -n completions per task and write rollouts with token ids and logprobs (and, with --verify, "
        "score and reward). Output is a .jsonl, a .parquet, or a directory of parquet shards; rerunning the same "
        "command after a crash generates only what is missing.",
    )
    p.add_argument("--tasks", nargs="+", required=True, metavar="SRC",
                   help="task sources: files/dirs (.jsonl, .parquet, saved datasets), hf:NAME[:split=S,...], or task sets (math-samples, code-samples, countdown:count=N)")
    p.add_argument("--model", required=True, help="model path or name (for openai: the served model name)")
    p.add_argument("-o", "--output", required=True, help="output: .jsonl, .parquet, or a directory for parquet shards")
    p.add_argument("--backend", default="auto",
                   help="a generation backend: vllm, transformers, openai or one a plugin adds; auto: vllm when installed with a GPU, else transformers")
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--samples", type=_positive_int, default=1, help="samples per task (default 1)")
    g.add_argument("--max-tokens", type=_positive_int, default=1024, help="completion tokens at most (default 1024)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 is greedy (default 1.0)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    g.add_argument("--seed", type=int, default=0, help="seed of sampling, task mixing and target lengths (default 0)")
    g = p.add_argument_group("tasks and prompts")
    g.add_argument("--mix", type=_comma_list(float), metavar="R1,R2,...", help="ratios of the task sources, one per --tasks source")
    g.add_argument("--max-tasks", type=_positive_int, help="use at most this many tasks")
    g.add_argument("--system-prompt", help="system message put before every task")
    g.add_argument("--continuation-prefix", default="", metavar="TEXT",
                   help=r"text the response starts with, after the chat template (e.g. '<think>\n'; \n and \t are escapes)")
    g.add_argument("--no-chat-template", action="store_true", help="send the raw task prompt instead of the chat template")
    g.add_argument("--target-lengths", type=_comma_list(int), metavar="N1,N2,...",
                   help="give each task one of these thinking lengths, asked for in the system message and stored as target_length")
    g.add_argument("--target-length-prompt", default=None, metavar="TEMPLATE",
                   help="the instruction, with {target_length} (default: 'Think for {target_length} tokens before giving a response.')")
    g = p.add_argument_group("backends")
    g.add_argument("--batch-size", type=_positive_int, help="transformers: sequences per batch (default 32); vllm: tasks per engine call (default 1024)")
    g.add_argument("--tensor-parallel-size", type=_positive_int, help="vllm: GPUs per model replica")
    g.add_argument("--device", help="transformers: torch device (default: cuda when available, else cpu)")
    g.add_argument("--dtype", help="transformers: torch dtype of the weights (default: the checkpoint's on GPU, float32 on CPU)")
    g.add_argument("--base-url", help="openai: server URL ending in /v1 (default: $OPENAI_BASE_URL or http://127.0.0.1:8000/v1)")
    g.add_argument("--api-key", help="openai: API key (default: $OPENAI_API_KEY)")
    g.add_argument("--concurrency", type=_positive_int, help="openai: requests in flight at most (default 64)")
    g.add_argument("--no-logprobs", dest="logprobs", action="store_const", const=False,
                   help="openai: do not ask for logprobs (for servers and models that refuse them)")
    g.add_argument("--split-samples", action="store_const", const=True,
                   help="openai: one request per sample, for servers that do not support n > 1")
    g.add_argument("--max-retries", type=int, help="openai: retries of a request on 429, 5xx or connection errors, with exponential backoff (default 8)")
    g.add_argument("-B", "--backend-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to the backend: vllm.LLM engine arguments, transformers from_pretrained arguments, or openai request fields")
    g = p.add_argument_group("verification")
    g.add_argument("--verify", action="store_true", help="verify rollouts while generating; rows gain score and reward")
    g.add_argument("--workers", type=_positive_int, default=os.cpu_count() or 1, help="verification worker processes (default: all cores)")
    g.add_argument("--timeout", type=_positive_float, help="per-rollout verification deadline in seconds, overriding each verifier's own")
    g.add_argument("--skip-unknown", action="store_true", help="record rows of task types no verifier serves as errors instead of refusing the run")
    g.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE", help="an option passed to every verifier")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_reward_flags(p)
    _add_sandbox_flags(p)
    p.set_defaults(handler=_run_generate)


# Backend settings: option name -> (its flag, the backends it applies to).
_BACKEND_FLAGS = {
    "tensor_parallel_size": ("--tensor-parallel-size", ("vllm",)),
    "device": ("--device", ("transformers",)),
    "dtype": ("--dtype", ("transformers",)),
    "base_url": ("--base-url", ("openai",)),
    "api_key": ("--api-key", ("openai",)),
    "concurrency": ("--concurrency", ("openai",)),
    "max_retries": ("--max-retries", ("openai",)),
    "logprobs": ("--no-logprobs", ("openai",)),
    "split_samples": ("--split-samples", ("openai",)),
    "batch_size": ("--batch-size", ("vllm", "transformers")),
}


def _backend_options(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """The backend's own settings from the flags; a flag another backend owns is a UsageError."""
    options = {name: getattr(args, name) for name in _BACKEND_FLAGS if getattr(args, name) is not None}
    for name in options:
        flag, backends = _BACKEND_FLAGS[name]
        if backend not in backends:
            raise UsageError(f"{flag} applies to the {' and '.join(backends)} backend, not to {backend}")
    extra = _parse_options(args.backend_arg, "-B/--backend-arg")
    if extra:
        extra_option = {"vllm": "engine_args", "transformers": "model_kwargs", "openai": "request_fields"}
        if backend not in extra_option:
            raise UsageError(f"-B/--backend-arg applies to the {', '.join(extra_option)} backends, not to {backend}")
        options[extra_option[backend]] = extra
    return options


def _run_generate(args: argparse.Namespace) -> int:
    from genesys.generate.backend import PromptStyle, SamplingConfig, resolve_backend_name
    from genesys.generate.runner import GenerateConfig, run_generation
    from genesys.http import APIError
    from genesys.verify import VerifyConfig

    backend = resolve_backend_name(args.backend)
    verify = None
    if args.verify:
        verify = VerifyConfig(
            workers=args.workers,
            timeout=args.timeout,
            skip_unknown=args.skip_unknown,
            options={**_parse_options(args.option), **_sandbox_options(args)},
            progress=False,
            reward=_reward_config(args),
        )
    config = GenerateConfig(
        tasks=args.tasks,
        model=args.model,
        output=args.output,
        backend=backend,
        sampling=SamplingConfig(n=args.samples, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed),
        style=PromptStyle(
            chat_template=not args.no_chat_template,
            continuation_prefix=args.continuation_prefix.replace("\\n", "\n").replace("\\t", "\t"),
        ),
        system_prompt=args.system_prompt,
        target_lengths=args.target_lengths,
        mix=args.mix,
        max_tasks=args.max_tasks,
        backend_options=_backend_options(args, backend),
        verify=verify,
        progress=not args.no_progress,
    )
    if args.target_length_prompt is not None:
        config.target_length_prompt = args.target_length_prompt
    try:
        run_generation(config)
    except APIError as exc:
        print(f"genesys generate: error: {exc}; rerun the same command to continue", file=sys.stderr)
        return 1
    return 0


# --- genesys tasks --------------------------------------------------------------------------------


def _add_tasks(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tasks", help="list the named task sets `genesys generate --tasks` accepts")
    p.set_defaults(handler=_run_tasks)


def _run_tasks(args: argparse.Namespace) -> int:
    from genesys.progress import print_table
    from genesys.tasks import task_sets

    rows = [(name, task_set.description or "-") for name, task_set in sorted(task_sets().items())]
    print_table("genesys task sets (--tasks NAME[:key=value,...])", ("name", "description"), rows)
    return 0


# --- genesys plugins ------------------------------------------------------------------------------


def _add_plugins(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list installed plugins and the task types they serve")
    p.set_defaults(handler=_run_plugins)


def _run_plugins(args: argparse.Namespace) -> int:
    from genesys.plugins import plugin_infos
    from genesys.progress import print_table

    rows = [(i.name, i.version or "-", i.origin, ", ".join(i.task_types) or "-") for i in plugin_infos()]
    print_table("genesys plugins", ("plugin", "version", "from", "task types"), rows)
    return 0


# --- entry point ----------------------------------------------------------------------------------

# --- genesys sandbox ------------------------------------------------------------------------------


def _add_sandbox(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="build the code sandbox image; check which sandboxes and languages work here")
    actions = p.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    build = actions.add_parser(
        "build",
        help="build the Docker sandbox image",
        description="Build the sandbox image: from the shipped Dockerfile when a registry is reachable, otherwise "
        "offline, FROM scratch, out of this machine's own python3, g++, rustc and node.",
    )
    mode = build.add_mutually_exclusive_group()
    mode.add_argument("--offline", action="store_true", help="build from the host's toolchains without trying a registry")
    mode.add_argument("--online", action="store_true", help="build from the shipped Dockerfile (needs a registry)")
    build.add_argument("--tag", help="image tag (default genesys-sandbox:latest)")
    build.add_argument("--languages", help="comma-separated languages for an offline build (default: all found)")
    build.add_argument("--python", help="the interpreter to put in an offline image (default /usr/bin/python3)")
    build.add_argument("--force", action="store_true", help="rebuild even when an identical image exists")
    build.set_defaults(handler=_run_sandbox)
    check = actions.add_parser("check", help="show which sandbox backends and languages work on this machine")
    check.add_argument("--sandbox-image", help="docker image to check (default genesys-sandbox:latest)")
    check.set_defaults(handler=_run_sandbox)


def _run_sandbox(args: argparse.Namespace) -> int:
    from genesys.sandbox import commands

    if args.sandbox_command == "build":
        languages = [part.strip() for part in args.languages.split(",")] if args.languages else None
        mode = "offline" if args.offline else "online" if args.online else "auto"
        return commands.build(mode=mode, tag=args.tag, languages=languages, python=args.python, force=args.force)
    return commands.check(image=args.sandbox_image)


_SUBCOMMANDS = (_add_generate, _add_tasks, _add_verify, _add_filter, _add_report, _add_plugins, _add_sandbox)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `genesys` command."""
    from genesys import __version__

    parser = argparse.ArgumentParser(prog="genesys", description="Verifiable-reward data: generate, verify, filter.")
    parser.add_argument("--version", action="version", version=f"genesys {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `genesys` command; returns the exit code."""
    from genesys.errors import InputError
    from genesys.plugins import PluginError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (UsageError, InputError, PluginError) as exc:
        print(f"genesys {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"genesys {args.command}: interrupted; rerun the same command to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
