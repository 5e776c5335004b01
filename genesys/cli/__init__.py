"""The `genesys` command: one module per subcommand, plugins add theirs through `genesys_commands`.

Subcommand modules are imported only when their command runs (or `genesys --help` lists them), so
`genesys verify --help` stays fast. Exit codes: 0 when the run completed, 2 for usage or input
errors (one clear line on stderr), 130 when interrupted. A config key or flag spelled the old way
works and prints one warning line naming the new spelling. However a command ends (Ctrl-C included),
it exits after the processes it started: verification workers are joined by their engine, and the
fork server and resource tracker of `multiprocessing` are stopped and waited for here.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import warnings
from collections.abc import Callable, Sequence

import click

# Built-in subcommands: name -> "module:attribute" of their click command.
BUILTIN_COMMANDS = {
    "generate": "genesys.cli.generate:command",
    "verify": "genesys.cli.verify:command",
    "validate": "genesys.cli.validate:command",
    "filter": "genesys.cli.filter:command",
    "train": "genesys.cli.train:command",
    "sft": "genesys.cli.sft:command",
    "report": "genesys.cli.report:command",
    "plan-inference": "genesys.cli.plan_inference:command",
    "pipeline-stage": "genesys.cli.pipeline_stage:command",
    "tasks": "genesys.cli.listings:tasks",
    "plugins": "genesys.cli.listings:plugins",
    "sandbox": "genesys.cli.sandbox:group",
    "version": "genesys.cli.version:command",
}
# Commands that fork verification workers at once: their fork server starts before they import and
# read their input (see genesys.verification.fork_server).
EARLY_FORK_SERVER = {"verify"}


class GenesysGroup(click.Group):
    """The top-level group: built-in commands load lazily; plugin commands come from the hook."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from genesys.errors import PluginError, PluginWarning

        try:
            added = _plugin_commands()
        except PluginError as exc:  # `genesys --help` still lists the built-in commands
            warnings.warn(f"no plugin commands: {exc}", PluginWarning, stacklevel=1)
            added = {}
        return sorted({*BUILTIN_COMMANDS, *added})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in BUILTIN_COMMANDS:
            module, attribute = BUILTIN_COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attribute)
        return _plugin_commands().get(name)


def _plugin_commands() -> dict[str, click.Command]:
    from genesys.plugins.registry import plugin_commands

    return plugin_commands(reserved=BUILTIN_COMMANDS)


def _configure_logging(verbose: int) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = RichHandler(console=Console(stderr=True), show_path=False, show_time=verbose > 1)
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler], force=True)


@click.group(
    cls=GenesysGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120}
)
@click.version_option(
    None, "-V", "--version", package_name="genesys-rl", prog_name="genesys", message="%(prog)s %(version)s"
)
@click.option("-v", "--verbose", count=True, help="log more (-v: progress details, -vv: debug)")
def cli(verbose: int) -> None:
    """Verifiable-reward data: generate, verify, validate, filter, sft, train, report."""
    _configure_logging(verbose)


def _one_line_warnings(command: str) -> Callable[..., None]:
    """`warnings.showwarning` that prints a renamed key's warning as one line, others as Python does."""
    from genesys.errors import ConfigDeprecationWarning

    show = warnings.showwarning

    def showwarning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
        if issubclass(category, ConfigDeprecationWarning):
            print(f"genesys {command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, *args, **kwargs)  # type: ignore[arg-type]

    return showwarning


def _show_plugin_warnings_as_one_line() -> None:
    """Print a `PluginWarning` (a plugin skipped or looking wrong) as one line on stderr."""
    from genesys.errors import PluginWarning

    show = warnings.showwarning
    if getattr(show, "genesys_one_line", False):
        return

    def show_one_line(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PluginWarning):
            print(f"genesys: warning: {message}", file=file or sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    show_one_line.genesys_one_line = True  # type: ignore[attr-defined]
    warnings.showwarning = show_one_line


def _stop_helper_processes() -> None:
    """Stop `multiprocessing`'s fork server and resource tracker, when this process started them, and
    wait for them: left to notice on their own that the command has gone, they outlive it by seconds."""
    for module, attribute in (
        ("multiprocessing.forkserver", "_forkserver"),
        ("multiprocessing.resource_tracker", "_resource_tracker"),
    ):
        helper = getattr(sys.modules.get(module), attribute, None)
        stop = getattr(helper, "_stop", None)  # what multiprocessing's own tests stop them with
        if stop is None:
            continue
        try:
            stop()
        except (OSError, ChildProcessError):
            pass  # already gone


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `genesys` command; returns the exit code.

    Without `argv` (the `genesys` script, `python -m genesys.cli`) this process is the command: its
    heap is frozen once the command is done (`gc.freeze`), so that the interpreter's exit does not
    walk every object the command imported (a tenth of a second). Called with `argv`, it leaves the
    heap alone."""
    try:
        return _run(argv)
    finally:
        _stop_helper_processes()
        if argv is None:
            gc.freeze()


def _run(argv: Sequence[str] | None) -> int:
    from genesys.errors import ConfigDeprecationWarning, GenesysError

    _show_plugin_warnings_as_one_line()
    args = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in args if not arg.startswith("-")), "genesys")
    if command in EARLY_FORK_SERVER and not {"-h", "--help"} & set(args):
        from genesys.verification.fork_server import start_early

        start_early()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default", ConfigDeprecationWarning)
            warnings.showwarning = _one_line_warnings(command)
            return int(cli.main(args, prog_name="genesys", standalone_mode=False) or 0)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        print(f"genesys {command}: interrupted; rerun the same command to continue", file=sys.stderr)
        return 130
    except GenesysError as exc:
        print(f"genesys {command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"genesys {command}: interrupted; rerun the same command to continue", file=sys.stderr)
        return 130
