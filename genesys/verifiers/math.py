"""The `verifiable_math` verifier: is the final answer of a completion equivalent to the gold answer?

The gold is `verification_info["ground_truth"]` (LaTeX or plain text, with or without `$...$` or
`\\boxed{}`). Which part of a completion is its answer is the extraction policy `answer_format`
(`boxed` or `lenient`, see `math_extract`): a task's `verification_info["answer_format"]`, else the
run's option `-O answer_format=...`, else `boxed`. Grading lives in `math_grade` and imports sympy,
so this module stays light: the plugin loads in milliseconds; the engine imports sympy once, before
it forks its workers (`preload`).

`math_verify_reward` exposes the same grading as a TRL-style reward function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic.dataclasses import dataclass

import genesys
from genesys.config.sections import SECTION, setting
from genesys.schema import Rollout, Verdict, parse_json_field
from genesys.verifiers.math_extract import ANSWER_FORMATS, DEFAULT_ANSWER_FORMAT

GOLD_KEYS = ("ground_truth", "solution", "answer", "gold")
TIMEOUT_S = 10.0
# 3x the costliest of the 697 labeled pairs (0.66 s) and a fifth of TIMEOUT_S, so a costly answer is
# decided (wrong) before the engine's deadline even when the worker gets only part of a core.
CPU_BUDGET_S = 2.0


@dataclass(frozen=True, config=SECTION)
class MathOptions:
    """The options of the `verifiable_math` verifier: the extraction policy and the CPU budget."""

    answer_format: Literal["boxed", "lenient"] = setting(
        DEFAULT_ANSWER_FORMAT,
        "which part of a completion is its answer, for rows whose verification_info names none: boxed "
        "(a box, a Minerva 'final answer is', or an explicit answer statement on the last line) or "
        "lenient (also a bare final line, the last number or math of the final statement)",
        choices=ANSWER_FORMATS,
    )
    cpu_budget: float = setting(
        CPU_BUDGET_S,
        "CPU seconds for parsing and comparing one answer; an answer not decided within it scores 0 "
        f"(reason too_complex) unless it is the gold as written. Keep it below --timeout ({TIMEOUT_S:g} s "
        "unless given)",
        gt=0,
    )


class MathVerifier(genesys.Verifier):
    """Scores `verifiable_math` rollouts: 1.0 when the final answer matches the gold, else 0.0."""

    task_type = "verifiable_math"
    options_model = MathOptions
    timeout = TIMEOUT_S
    preload = ("genesys.verifiers.math_grade",)  # sympy and math-verify, imported before workers fork

    def setup(self) -> None:
        """Import sympy and the LaTeX grammar and warm them up, outside any rollout's deadline."""
        from genesys.verifiers.math_grade import grade

        grade("x^2+1", "\\boxed{1 + x^2}")

    def verify(self, rollout: Rollout) -> Verdict:
        from genesys.verifiers.math_grade import grade

        settings: MathOptions = self.settings
        info = rollout.verification_info
        gold = info.get("ground_truth")
        if gold is None or isinstance(gold, (dict, list)):
            return Verdict.failed(
                "invalid_ground_truth: verification_info.ground_truth is missing or not a value"
            )
        answer_format = info.get("answer_format", settings.answer_format)
        if answer_format not in ANSWER_FORMATS:
            return Verdict.failed(
                f"invalid_verification_info: verification_info.answer_format is {answer_format!r}, "
                f"not one of {', '.join(ANSWER_FORMATS)}"
            )
        return grade(str(gold), rollout.completion, answer_format, settings.cpu_budget)


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [MathVerifier]


def math_verify_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer_format: str | Sequence[str | None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """A TRL-style reward function: one score per completion, None where the gold was unusable.

    Golds come from the first of the keyword columns `ground_truth`, `solution`, `answer`, `gold`
    or `verification_info` (a dict or JSON string holding `ground_truth`), one per completion.
    Completions may be strings or chat messages (`[{"role": "assistant", "content": ...}]`).
    `answer_format` is the extraction policy: one for all, or a column (as TRL passes a dataset's
    columns); a row's `verification_info["answer_format"]` wins; unset, `boxed`.
    Runs in the calling process with no deadline of its own; `genesys verify` adds hard deadlines.
    """
    from genesys.verifiers.math_grade import grade

    golds = _gold_column(kwargs, len(completions))
    formats = _format_column(answer_format, kwargs.get("verification_info"), len(completions))
    return [
        grade(gold, _completion_text(c), policy).score for gold, c, policy in zip(golds, completions, formats)
    ]


def _format_column(
    answer_format: str | Sequence[str | None] | None, infos: Sequence[Any] | None, count: int
) -> list[str]:
    """The extraction policy of each completion (see `math_verify_reward`)."""
    given = (
        [answer_format] * count if answer_format is None or isinstance(answer_format, str) else answer_format
    )
    if len(given) != count:
        raise ValueError(f"math_verify_reward got {count} completions but {len(given)} answer formats")
    formats = []
    for index, policy in enumerate(given):
        info = parse_json_field(infos[index], "verification_info") if infos is not None else {}
        chosen = info.get("answer_format") or policy or DEFAULT_ANSWER_FORMAT
        if chosen not in ANSWER_FORMATS:
            raise ValueError(
                f"math_verify_reward: answer_format of completion {index} is {chosen!r}, "
                f"not one of {', '.join(ANSWER_FORMATS)}"
            )
        formats.append(chosen)
    return formats


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
