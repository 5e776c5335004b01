"""The digit task: a toy reward that a tiny random-weight model can learn in a few dozen steps.

The reward of a completion is the share of digits among its characters, scored by `DigitShare`
(task type `digit_share`). This module is a plugin module: name it in $GENESYS_PLUGINS and every
process that loads plugins (verification workers, Ray actors) finds the verifier, with no path to set:

    GENESYS_PLUGINS=genesys.testing.digits genesys train --data.tasks tasks.jsonl ...

`digit_tasks` writes a task file for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import genesys

TASK_TYPE = "digit_share"
PLUGIN = __name__  # the value of $GENESYS_PLUGINS that loads this module's verifier


class DigitShare(genesys.Verifier):
    """The share of digits among the completion's characters (0 for an empty completion): a toy reward
    a tiny model can learn quickly, for training tests and benchmarks."""

    task_type = TASK_TYPE

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        text = rollout.completion
        return genesys.Verdict(score=sum(c.isdigit() for c in text) / len(text) if text else 0.0)


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [DigitShare]


def digit_tasks(path: Path, count: int = 16) -> Path:
    """A JSONL task file of `count` digit tasks (prompts "Write digits <i>") at `path`; returns `path`."""
    rows = [
        {
            "problem_id": f"p{i}",
            "source": "toy",
            "task_type": TASK_TYPE,
            "prompt": f"Write digits {i}",
            "verification_info": {},
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
