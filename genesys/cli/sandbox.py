"""`genesys sandbox build|check`: the code sandbox image and what works on this machine."""

from __future__ import annotations

import click


@click.group("sandbox", help="build the code sandbox image; check which sandboxes and languages work here")
def group() -> None:
    """The sandbox subcommands."""


@group.command(
    "build",
    help="Build the sandbox image: from the shipped Dockerfile when a registry is reachable, otherwise offline, "
    "FROM scratch, out of this machine's own python3, g++, rustc and node.",
)
@click.option(
    "--offline",
    "mode",
    flag_value="offline",
    help="build from the host's toolchains without trying a registry",
)
@click.option(
    "--online", "mode", flag_value="online", help="build from the shipped Dockerfile (needs a registry)"
)
@click.option("--tag", help="image tag (default genesys-sandbox:latest, or $GENESYS_SANDBOX_IMAGE)")
@click.option("--languages", help="comma-separated languages for an offline build (default: all found)")
@click.option("--python", help="the interpreter to put in an offline image (default /usr/bin/python3)")
@click.option("--force", is_flag=True, help="rebuild even when an identical image exists")
def build(mode: str | None, tag: str | None, languages: str | None, python: str | None, force: bool) -> int:
    from genesys.sandbox import commands

    chosen = [part.strip() for part in languages.split(",")] if languages else None
    return commands.build(mode=mode or "auto", tag=tag, languages=chosen, python=python, force=force)


@group.command("check", help="show which sandbox backends and languages work on this machine")
@click.option(
    "--sandbox-image",
    help="docker image to check (default genesys-sandbox:latest, or $GENESYS_SANDBOX_IMAGE)",
)
def check(sandbox_image: str | None) -> int:
    from genesys.sandbox import commands

    return commands.check(image=sandbox_image)
