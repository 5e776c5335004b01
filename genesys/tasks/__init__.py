"""Task sources for `genesys generate`: named task sets from plugins, files, saved and hub datasets.

A plugin offers named task sets (built-in samples, generators such as Countdown) through the
`genesys_tasks` hook::

    @genesys.hookimpl
    def genesys_tasks():
        return [TaskSet("countdown", load=countdown_tasks, description="...")]

`load` receives the options written after the name on the command line
(`--tasks countdown:count=500,seed=3`) as keyword arguments and returns task rows in the GENESYS
task schema. This module is imported whenever plugins load, so it stays free of heavy imports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pluggy

from genesys.plugins import PluginError, default_plugin_manager, hookimpl

__all__ = ["TaskSet", "genesys_tasks", "task_sets"]


@dataclass(frozen=True)
class TaskSet:
    """A named source of task rows; `load(**options)` returns rows in the GENESYS task schema."""

    name: str
    load: Callable[..., Iterable[dict[str, Any]]]
    description: str = ""


def task_sets(pm: pluggy.PluginManager | None = None) -> dict[str, TaskSet]:
    """Every task set the installed plugins offer, by name; two plugins using one name is a PluginError."""
    pm = pm or default_plugin_manager()
    found: dict[str, tuple[TaskSet, str]] = {}
    for impl in pm.hook.genesys_tasks.get_hookimpls():
        for task_set in impl.function() or ():
            if not isinstance(task_set, TaskSet):
                raise PluginError(
                    f"plugin {impl.plugin_name!r} returned {task_set!r} from genesys_tasks, not a TaskSet"
                )
            previous = found.get(task_set.name)
            if previous is not None and previous[0] is not task_set:
                raise PluginError(
                    f"task set {task_set.name!r} is offered by two plugins: {previous[1]} and {impl.plugin_name}; uninstall one of them"
                )
            found[task_set.name] = (task_set, impl.plugin_name)
    return {name: task_set for name, (task_set, _) in found.items()}


def _load_math_samples() -> list[dict[str, Any]]:
    from genesys.tasks.samples import load_sample_file

    return load_sample_file("math_tasks.jsonl")


def _load_code_samples() -> list[dict[str, Any]]:
    from genesys.tasks.samples import load_sample_file

    return load_sample_file("code_tasks.jsonl")


@hookimpl
def genesys_tasks() -> list[TaskSet]:
    return [
        TaskSet(
            "math-samples", _load_math_samples, "bundled competition-style math problems (verifiable_math)"
        ),
        TaskSet(
            "code-samples",
            _load_code_samples,
            "bundled Python programming problems with tests (verifiable_code)",
        ),
    ]
