"""A test plugin that adds a `genesys hello` command through the `genesys_commands` hook."""

import click

import genesys


@click.command("hello", help="say hello (a command from a plugin)")
@click.option("--name", default="world")
def hello(name: str) -> None:
    click.echo(f"hello {name}")


@genesys.hookimpl
def genesys_commands():
    return [hello]
