"""Task sources for `genesys generate`: named task sets from plugins, files, saved and hub datasets.

A plugin offers named task sets (built-in samples, generators such as Countdown) through the
`genesys_tasks` hook::

    @genesys.hookimpl
    def genesys_tasks():
        return [TaskSet("countdown", load=countdown_tasks, description="...")]

`load` receives the options written after the name on the command line
(`--tasks countdown:count=500,seed=3`) as keyword arguments and returns task rows in the GENESYS
task schema (`TaskSet` is defined in `genesys.plugins.specs`, `task_sets` in `genesys.plugins.registry`;
both are importable from here). `prepare` is the one task preparation of `genesys generate` and
`genesys train`: sources selected and mixed, rows checked, duplicates dropped, and tasks no verifier
or reward can serve refused before any work. This module is imported whenever plugins load, so it
stays free of heavy imports.
"""

from __future__ import annotations

from typing import Any

from genesys.plugins.hookspecs import hookimpl
from genesys.plugins.registry import task_sets
from genesys.plugins.specs import TaskSet

__all__ = ["TaskSet", "genesys_tasks", "task_sets"]


def _load_math_samples() -> list[dict[str, Any]]:
    from genesys.tasks.samples import load_sample_file

    return load_sample_file("math_tasks.jsonl")


def _load_arithmetic(**options: Any) -> list[dict[str, Any]]:
    from genesys.tasks.arithmetic import arithmetic_tasks

    return arithmetic_tasks(**options)


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
        TaskSet(
            "arithmetic",
            _load_arithmetic,
            "generated arithmetic with worked solutions (verifiable_math; options: digits, ops, count, seed, "
            "split=train|heldout)",
        ),
    ]
