"""`genesys generate --dry-run`: what a run would generate, without loading a model or writing a file.

For each task type: how many tasks and samples the run would generate (samples the output already
holds are counted as resumed), and how a row of it is made: one completion scored by its verifier,
or a conversation played in its environment (its turns, tools, deadlines, isolation, and whether
`genesys validate` can replay it). Then the opening messages of the first task of each type, as the
model is first asked: the task's prompt with the system prompt and target-length instruction, or
the environment's `reset` (run as a rollout runs it, under its deadline).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genesys.config import GenerateConfig
from genesys.generate.rows import PlannedTask

PREVIEW_CHARS = 400  # of each opening message shown


@dataclass
class TypePlan:
    """The share of a run of one task type."""

    task_type: str
    tasks: int = 0
    samples: int = 0  # to generate
    resumed: int = 0
    environment: Any = None  # the environment class playing it, None for single completions
    first: PlannedTask | None = None
    opening: list[dict[str, Any]] | str = field(default_factory=list)  # messages, or why there are none


def plan_run(config: GenerateConfig) -> list[TypePlan]:
    """The run's plan per task type (see the module's docstring)."""
    from genesys.data.io import RolloutWriter
    from genesys.generate.runner import plan_tasks, select_tasks
    from genesys.plugins.registry import environments

    done: set[str] = set()
    if Path(config.output).exists():
        done = RolloutWriter(Path(config.output), "response_id").existing_keys()
    plans, _, _ = plan_tasks(select_tasks(config), config, done)
    played = environments()
    by_type: dict[str, TypePlan] = {}
    for plan in plans:
        task_type = plan.row["task_type"]
        entry = by_type.setdefault(task_type, TypePlan(task_type, environment=played.get(task_type)))
        entry.tasks += 1
        entry.samples += len(plan.missing)
        entry.resumed += config.sampling.n - len(plan.missing)
        if entry.first is None:
            entry.first = plan
            entry.opening = _opening(entry.environment, plan, config)
    return list(by_type.values())


def _opening(environment: Any, plan: PlannedTask, config: GenerateConfig) -> list[dict[str, Any]] | str:
    from genesys.generate.rows import request_messages

    if environment is None:
        return request_messages(plan, config)
    from genesys.environments.rollout import opening_messages
    from genesys.schema import Task

    try:
        return asyncio.run(opening_messages(environment, Task.from_row(plan.row)))
    except ValueError as exc:
        return f"reset failed: {exc}"


def describe(plans: Sequence[TypePlan], config: GenerateConfig) -> str:
    """The plan as text."""
    lines = [
        f"genesys generate --dry-run: {config.model} -> {config.output}, "
        f"{config.sampling.n} samples per task, max_tokens {config.sampling.max_tokens}"
        + (", with proofs" if config.proofs is not None else "")
    ]
    for plan in plans:
        lines.append("")
        lines.append(
            f"{plan.task_type}: {plan.tasks} tasks, {plan.samples} samples to generate"
            + (f" ({plan.resumed} already in the output)" if plan.resumed else "")
        )
        lines.append("  " + _how(plan.environment, config))
        if plan.first is not None:
            label = plan.first.row.get("problem_id") or plan.first.key
            lines.append(f"  first task ({label}) opens with:")
            if isinstance(plan.opening, str):
                lines.append(f"    {plan.opening}")
            for message in plan.opening if isinstance(plan.opening, list) else ():
                content = str(message.get("content") or "")
                cut = content[:PREVIEW_CHARS] + ("..." if len(content) > PREVIEW_CHARS else "")
                lines.append(f"    [{message.get('role')}] {cut!r}")
    if not plans:
        lines.append("nothing to generate: no tasks selected")
    return "\n".join(lines)


def _how(environment: Any, config: GenerateConfig) -> str:
    """How a row of the type is made, in a line."""
    if environment is None:
        return "one completion per sample, scored by the task type's verifier"
    from genesys.environments.tools import tools_of

    tools = ", ".join(tools_of(environment.tools)) or "none"
    line = (
        f"played in environment {environment.__name__}: up to {environment.max_turns} model turns of "
        f"at most {config.sampling.max_tokens} tokens each; tools: {tools}; deadlines: step "
        f"{environment.step_timeout:g} s, tool {environment.tool_timeout:g} s, score {environment.timeout:g} s; "
        f"isolation {environment.isolation!r}"
    )
    if config.proofs is not None:
        line += (
            "; validate replays its environment side"
            if environment.deterministic
            else "; NOT deterministic: validate refuses its rows"
        )
    return line
