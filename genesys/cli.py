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


def _parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """Turn repeated `-O key=value` flags into a dict (values parsed as JSON when they are JSON)."""
    import orjson

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"-O/--option expects KEY=VALUE, got {pair!r}")
        try:
            options[key] = orjson.loads(raw)
        except orjson.JSONDecodeError:
            options[key] = raw
    return options


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
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from genesys.verify import VerifyConfig, verify_files

    config = VerifyConfig(
        workers=args.workers,
        timeout=args.timeout,
        skip_unknown=args.skip_unknown,
        options=_parse_options(args.option),
        progress=not args.no_progress,
    )
    verify_files(args.inputs, args.output, config=config, rejects=args.rejects)
    return 0


# --- genesys plugins ------------------------------------------------------------------------------


def _add_plugins(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list installed plugins and the task types they serve")
    p.set_defaults(handler=_run_plugins)


def _run_plugins(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from genesys.plugins import plugin_infos

    table = Table(title="genesys plugins")
    for column in ("plugin", "version", "from", "task types"):
        table.add_column(column)
    for info in plugin_infos():
        table.add_row(info.name, info.version or "-", info.origin, ", ".join(info.task_types) or "-")
    Console().print(table)
    return 0


# --- entry point ----------------------------------------------------------------------------------

_SUBCOMMANDS = (_add_verify, _add_plugins)


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
