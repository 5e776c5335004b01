"""Guess the number: a multi-turn environment. The model guesses, the environment says higher or lower.

Task rows look like::

    {"task_type": "guess_number", "prompt": "...",
     "verification_info": {"secret": 37, "low": 1, "high": 100}}

Each model turn ends with a guess inside `<guess>...</guess>`; the environment answers "higher",
"lower" or "correct". The episode ends at the right guess or after `max_turns` turns; the score is 1
when the model found the number, with a small cost per extra guess (0.9 for two guesses, ...), else 0.
"""

from __future__ import annotations

import random
import re
from typing import Any

import genesys
from genesys.tasks import TaskSet

__all__ = ["GuessNumber", "genesys_environments", "genesys_tasks", "guess_number_tasks"]

GUESS_RE = re.compile(r"<guess>\s*(-?\d+)\s*</guess>")
PROMPT = (
    "I am thinking of a whole number from {low} to {high}. Guess it: end each message with your guess "
    "inside <guess></guess>, for example <guess>{example}</guess>. I will answer higher, lower or correct."
)


def last_guess(text: str) -> int | None:
    """The last `<guess>N</guess>` of a message, None when it has none."""
    found = GUESS_RE.findall(text or "")
    return int(found[-1]) if found else None


class GuessNumber(genesys.Environment):
    """Find the secret number by guessing; each wrong guess is answered with higher or lower."""

    task_type = "guess_number"
    max_turns = 8
    step_timeout = 5.0

    def step(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Step:
        secret = int(task.verification_info["secret"])
        guess = last_guess(messages[-1].get("content", ""))
        if guess is None:
            return genesys.Step([{"role": "user", "content": "Give your guess inside <guess></guess>."}])
        if guess == secret:
            return genesys.Step([{"role": "user", "content": "correct"}], done=True)
        return genesys.Step([{"role": "user", "content": "higher" if guess < secret else "lower"}])

    def score(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Verdict:
        secret = int(task.verification_info["secret"])
        guesses = [last_guess(m.get("content", "")) for m in messages if m.get("role") == "assistant"]
        guesses = [g for g in guesses if g is not None]
        if secret not in guesses:
            return genesys.Verdict(score=0.0, details={"guesses": len(guesses), "found": False})
        tries = guesses.index(secret) + 1
        return genesys.Verdict(
            score=max(0.1, 1.0 - 0.1 * (tries - 1)), details={"guesses": tries, "found": True}
        )


def guess_number_tasks(
    count: int = 100, low: int = 1, high: int = 100, seed: int = 0
) -> list[dict[str, Any]]:
    """`count` guess-the-number tasks in the GENESYS task schema, the same ones for the same arguments."""
    if count < 1 or high <= low:
        raise ValueError(f"guess-number needs count >= 1 and high > low, got {count}, {low}, {high}")
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        secret = rng.randint(low, high)
        rows.append(
            {
                "problem_id": f"guess-number-{seed}-{low}-{high}-{index}",
                "source": "genesys-guess-number",
                "task_type": "guess_number",
                "in_source_id": str(index),
                "prompt": PROMPT.format(low=low, high=high, example=(low + high) // 2),
                "gold_standard_solution": f"<guess>{secret}</guess>",
                "verification_info": {"secret": secret, "low": low, "high": high},
                "metadata": {"generator": "genesys-guess-number", "seed": seed},
            }
        )
    return rows


@genesys.hookimpl
def genesys_environments() -> list[type[genesys.Environment]]:
    return [GuessNumber]


@genesys.hookimpl
def genesys_tasks() -> list[TaskSet]:
    return [
        TaskSet(
            "guess-number",
            guess_number_tasks,
            "generated guess-the-number games, played over several turns (options: count, low, high, seed)",
        )
    ]
