"""The digit task: a toy reward that a tiny random-weight model can learn in a few dozen steps.

The reward of a completion is the share of digits among its characters, scored by `DigitShare`
(task type `digit_share`). `DigitTurns` (task type `digit_turns`) is its multi-turn twin: an
environment of two model turns, the second asked for after the first, scored by the share of digits
among the characters of both. This module is a plugin module: name it in $GENESYS_PLUGINS and every
process that loads plugins (verification workers, Ray actors) finds them, with no path to set:

    GENESYS_PLUGINS=genesys.testing.digits genesys train --data.tasks tasks.jsonl ...

`digit_tasks` writes a task file for either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import genesys

TASK_TYPE = "digit_share"
TURNS_TASK_TYPE = "digit_turns"
PLUGIN = __name__  # the value of $GENESYS_PLUGINS that loads this module's verifier


class DigitShare(genesys.Verifier):
    """The share of digits among the completion's characters (0 for an empty completion): a toy reward
    a tiny model can learn quickly, for training tests and benchmarks."""

    task_type = TASK_TYPE

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        return genesys.Verdict(score=digit_share(rollout.completion))


class DigitTurns(genesys.Environment):
    """Two model turns, the environment asking for more digits after the first; the score is the
    share of digits among the characters of both turns."""

    task_type = TURNS_TASK_TYPE
    max_turns = 2

    def step(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Step:
        if sum(message["role"] == "assistant" for message in messages) >= self.max_turns:
            return genesys.Step(done=True)
        return genesys.Step([{"role": "user", "content": "More digits."}])

    def score(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Verdict:
        turns = [message.get("content") or "" for message in messages if message["role"] == "assistant"]
        return genesys.Verdict(score=digit_share("".join(turns)))


def digit_share(text: str) -> float:
    """The share of digits among the characters of `text` (0 for no text)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [DigitShare]


@genesys.hookimpl
def genesys_environments() -> list[type[genesys.Environment]]:
    return [DigitTurns]


def digit_tasks(path: Path, count: int = 16, task_type: str = TASK_TYPE) -> Path:
    """A JSONL task file of `count` digit tasks (prompts "Write digits <i>") of `task_type` (the
    single-turn `digit_share` or the two-turn `digit_turns`) at `path`; returns `path`."""
    rows = [
        {
            "problem_id": f"p{i}",
            "source": "toy",
            "task_type": task_type,
            "prompt": f"Write digits {i}",
            "verification_info": {},
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
