"""The `verifiable_math` verifier: is the final answer of a completion equivalent to the gold answer?

The gold is `verification_info["ground_truth"]` (LaTeX or plain text, with or without `$...$` or
`\\boxed{}`). Grading lives in `math_grade` and imports sympy, so this module stays light: the plugin
loads in milliseconds; the engine imports sympy once, before it forks its workers (`preload`).

`math_verify_reward` exposes the same grading as a TRL-style reward function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import genesys
from genesys.schema import Rollout, Verdict, parse_json_field

GOLD_KEYS = ("ground_truth", "solution", "answer", "gold")


class MathVerifier(genesys.Verifier):
    """Scores `verifiable_math` rollouts: 1.0 when the final answer matches the gold, else 0.0."""

    task_type = "verifiable_math"
    accepted_options = frozenset()
    timeout = 10.0
    preload = ("genesys.verifiers.math_grade",)  # sympy and math-verify, imported before workers fork

    def setup(self) -> None:
        """Import sympy and the LaTeX grammar and warm them up, outside any rollout's deadline."""
        from genesys.verifiers.math_grade import grade

        grade("x^2+1", "\\boxed{1 + x^2}")

    def verify(self, rollout: Rollout) -> Verdict:
        from genesys.verifiers.math_grade import grade

        gold = rollout.verification_info.get("ground_truth")
        if gold is None or isinstance(gold, (dict, list)):
            return Verdict.failed(
                "invalid_ground_truth: verification_info.ground_truth is missing or not a value"
            )
        return grade(str(gold), rollout.completion)


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [MathVerifier]


def math_verify_reward(
    prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    """A TRL-style reward function: one score per completion, None where the gold was unusable.

    Golds come from the first of the keyword columns `ground_truth`, `solution`, `answer`, `gold`
    or `verification_info` (a dict or JSON string holding `ground_truth`), one per completion.
    Completions may be strings or chat messages (`[{"role": "assistant", "content": ...}]`).
    Runs in the calling process with no deadline of its own; `genesys verify` adds hard deadlines.
    """
    from genesys.verifiers.math_grade import grade

    golds = _gold_column(kwargs, len(completions))
    return [grade(gold, _completion_text(c)).score for gold, c in zip(golds, completions)]


def _gold_column(kwargs: dict[str, Any], count: int) -> list[str]:
    for key in GOLD_KEYS:
        if key in kwargs and kwargs[key] is not None:
            column = list(kwargs[key])
            break
    else:
        if "verification_info" not in kwargs:
            raise TypeError(
                f"math_verify_reward needs a gold column: one of {', '.join(GOLD_KEYS)} or verification_info"
            )
        column = [
            parse_json_field(info, "verification_info").get("ground_truth", "")
            for info in kwargs["verification_info"]
        ]
    if len(column) != count:
        raise ValueError(f"math_verify_reward got {count} completions but {len(column)} golds")
    return ["" if gold is None else str(gold) for gold in column]


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(
        f"math_verify_reward: a completion must be a string or a list of messages, got {type(completion).__name__}"
    )
