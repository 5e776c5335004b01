"""A Countdown task generator, offered to `genesys generate` as the task set `countdown`.

`--tasks countdown:count=500,numbers=4,max_number=50,seed=1` makes 500 puzzles, each with
`numbers` integers from 1 to `max_number` and a target reachable with + - * / using each number
exactly once (the generator builds one such expression and keeps it as the gold solution).
"""

from __future__ import annotations

import random
from typing import Any

from genesys import hookimpl
from genesys.tasks import TaskSet

PROMPT = (
    "Using the numbers {numbers}, write an arithmetic expression that equals {target}. "
    "Use each number exactly once, with any of + - * / and parentheses. "
    "Reason first, then give only the expression inside <answer></answer>, for example <answer>(1 + 2) * 3</answer>."
)


def _combine(rng: random.Random, a: tuple[int, str], b: tuple[int, str]) -> tuple[int, str]:
    """Join two (value, expression) pairs with an operator that keeps the value a positive integer."""
    (x, ex), (y, ey) = (a, b) if a[0] >= b[0] else (b, a)
    choices = [(x + y, f"({ex} + {ey})"), (x * y, f"({ex} * {ey})")]
    if x > y:
        choices.append((x - y, f"({ex} - {ey})"))
    if y > 1 and x % y == 0:
        choices.append((x // y, f"({ex} / {ey})"))
    return rng.choice(choices)


def make_puzzle(rng: random.Random, numbers: int, max_number: int) -> tuple[list[int], int, str]:
    """Numbers, a target they can reach, and an expression reaching it."""
    values = [rng.randint(1, max_number) for _ in range(numbers)]
    pool = [(v, str(v)) for v in values]
    while len(pool) > 1:
        rng.shuffle(pool)
        pool.append(_combine(rng, pool.pop(), pool.pop()))
    target, expression = pool[0]
    if expression.startswith("(") and expression.endswith(")"):
        expression = expression[1:-1]
    return values, target, expression


def countdown_tasks(
    count: int = 100, numbers: int = 4, max_number: int = 50, seed: int = 0
) -> list[dict[str, Any]]:
    """`count` Countdown tasks in the GENESYS task schema, the same ones for the same arguments."""
    if count < 1 or numbers < 2 or max_number < 1:
        raise ValueError(
            f"countdown needs count >= 1, numbers >= 2 and max_number >= 1, got {count}, {numbers}, {max_number}"
        )
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        values, target, expression = make_puzzle(rng, numbers, max_number)
        rows.append(
            {
                "problem_id": f"countdown-{seed}-{numbers}-{max_number}-{index}",
                "source": "genesys-countdown",
                "task_type": "countdown",
                "in_source_id": str(index),
                "prompt": PROMPT.format(numbers=", ".join(map(str, values)), target=target),
                "gold_standard_solution": f"<answer>{expression}</answer>",
                "verification_info": {"numbers": values, "target": target},
                "metadata": {"generator": "genesys-countdown", "seed": seed},
            }
        )
    return rows


@hookimpl
def genesys_tasks() -> list[TaskSet]:
    return [
        TaskSet(
            "countdown",
            countdown_tasks,
            "generated Countdown arithmetic puzzles (options: count, numbers, max_number, seed)",
        )
    ]
