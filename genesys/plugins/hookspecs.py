"""The hooks a genesys plugin may implement, and the markers that declare them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import click

    from genesys.plugins.specs import BackendSpec, Environment, TaskSet, Verifier

PROJECT_NAME = "genesys"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class HookSpecs:
    """The hooks a genesys plugin may implement."""

    @hookspec
    def genesys_verifiers(self) -> list[type[Verifier]]:  # type: ignore[empty-body]
        """Return the Verifier subclasses this plugin provides."""

    @hookspec
    def genesys_environments(self) -> list[type[Environment]]:  # type: ignore[empty-body]
        """Return the Environment subclasses (multi-turn tasks) this plugin provides."""

    @hookspec
    def genesys_tasks(self) -> list[TaskSet]:  # type: ignore[empty-body]
        """Return the `genesys.tasks.TaskSet`s (named task sources, e.g. generators) this plugin provides."""

    @hookspec
    def genesys_commands(self) -> list[click.Command]:  # type: ignore[empty-body]
        """Return `click.Command`s to add to the `genesys` command line (e.g. `genesys mycommand`)."""

    @hookspec
    def genesys_backends(self) -> list[BackendSpec]:  # type: ignore[empty-body]
        """Return the `genesys.generate.backend.BackendSpec`s (generation backends) this plugin provides."""
