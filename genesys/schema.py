"""Task, Rollout and Verdict: the records genesys reads, verifies and writes; `Row`, one row of a file.

Column names follow the GENESYS / SYNTHETIC-1 task schema, so their files read without conversion.
`verification_info`, `metadata` and the other dict-valued columns may arrive as dicts or as JSON
strings; the dataclasses always hold dicts.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

Row = dict[str, Any]  # one row of a task or rollout file, by column name

TASK_COLUMNS = (
    "problem_id",
    "source",
    "task_type",
    "in_source_id",
    "prompt",
    "gold_standard_solution",
    "verification_info",
    "metadata",
)
RESPONSE_COLUMNS = (
    "llm_response",
    "response_id",
    "model_name",
    "generation_config",
    "machine_info",
    "prompt_ids",
    "completion_ids",
    "completion_logprobs",
    "finish_reason",
)
VERDICT_COLUMNS = ("score", "verification_result_info", "reward", "error")
# Columns holding dicts (or, for `messages`, a list of them); written as JSON strings where a file format
# needs one fixed type.
JSON_COLUMNS = (
    "verification_info",
    "metadata",
    "generation_config",
    "machine_info",
    "verification_result_info",
    "toploc_config",
    "toploc_errors",
    "messages",
)
# The columns a trajectory (a rollout played in an environment) adds: the whole conversation, the number
# of model turns, and the error that ended it early, naming its turn.
TRAJECTORY_COLUMNS = ("messages", "turns", "trajectory_error")


class SchemaError(ValueError):
    """A row that does not fit the task or rollout schema; the message names the field."""


def parse_json_field(value: Any, name: str) -> dict[str, Any]:
    """Return a dict-valued column as a dict, decoding it when it arrived as a JSON string."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, (str, bytes)):
        try:
            decoded = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise SchemaError(f"field {name!r} is not valid JSON: {exc}") from None
        if decoded is None:
            return {}
        if not isinstance(decoded, dict):
            raise SchemaError(f"field {name!r} must hold a JSON object, got {type(decoded).__name__}")
        return decoded
    raise SchemaError(f"field {name!r} must be a dict or a JSON string, got {type(value).__name__}")


COMPLETION_COLUMN = "llm_response"


def completion_problem(row: dict[str, Any], field: str = COMPLETION_COLUMN) -> str | None:
    """Why `row` has no completion to verify, or None. The completion is `llm_response` (or, in rows
    without one, `completion`); `field` is what the caller calls that column, named in the message.

    A missing column, a null and a value that is not text are problems: never an empty answer.
    """
    name = COMPLETION_COLUMN if COMPLETION_COLUMN in row or "completion" not in row else "completion"
    if name not in row:
        hint = "; name the completion column with --completion-field" if field == COMPLETION_COLUMN else ""
        return f"field {field!r} (the completion) is missing; the row has {', '.join(map(str, row)) or 'no columns'}{hint}"
    value = row[name]
    if value is None:
        return f"field {field!r} (the completion) is null: there is no answer to verify"
    if not isinstance(value, str):
        return f"field {field!r} (the completion) must be text, got {type(value).__name__}"
    return None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(kw_only=True)
class Task:
    """One task in the GENESYS / SYNTHETIC-1 schema."""

    prompt: str = ""
    task_type: str = ""
    verification_info: dict[str, Any] = field(default_factory=dict)
    problem_id: str | None = None
    source: str | None = None
    in_source_id: str | None = None
    gold_standard_solution: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        """Build a Task from a file row; raises SchemaError naming the offending field."""
        return cls(**_task_kwargs(row))

    def to_row(self) -> dict[str, Any]:
        """The task as a row with GENESYS column names."""
        return {name: getattr(self, name) for name in TASK_COLUMNS}


def _task_kwargs(row: dict[str, Any]) -> dict[str, Any]:
    task_type = row.get("task_type")
    if not isinstance(task_type, str) or not task_type:
        raise SchemaError("field 'task_type' is missing or not a non-empty string")
    prompt = row.get("prompt")
    return {
        "prompt": "" if prompt is None else str(prompt),
        "task_type": task_type,
        "verification_info": parse_json_field(row.get("verification_info"), "verification_info"),
        "problem_id": _opt_str(row.get("problem_id")),
        "source": _opt_str(row.get("source")),
        "in_source_id": _opt_str(row.get("in_source_id")),
        "gold_standard_solution": _opt_str(row.get("gold_standard_solution")),
        "metadata": parse_json_field(row.get("metadata"), "metadata"),
    }


@dataclass(kw_only=True)
class Rollout(Task):
    """A task plus one model completion; what a verifier scores.

    `completion` is the GENESYS `llm_response` column. Columns the schema does not name stay
    available in `extra`.
    """

    completion: str = ""
    response_id: str | None = None
    model_name: str | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    finish_reason: str | None = None
    generation_config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Rollout:
        """Build a Rollout from a GENESYS rollout row (`llm_response` holds the completion).

        Raises SchemaError naming the field when the completion is missing, null or not text.
        """
        kwargs = _task_kwargs(row)
        problem = completion_problem(row)
        if problem:
            raise SchemaError(problem)
        kwargs.update(
            completion=row.get(COMPLETION_COLUMN, row.get("completion")),
            response_id=_opt_str(row.get("response_id")),
            model_name=_opt_str(row.get("model_name")),
            prompt_ids=row.get("prompt_ids"),
            completion_ids=row.get("completion_ids"),
            completion_logprobs=row.get("completion_logprobs"),
            finish_reason=_opt_str(row.get("finish_reason")),
            generation_config=parse_json_field(row.get("generation_config"), "generation_config"),
            extra={k: v for k, v in row.items() if k not in _ROLLOUT_KNOWN},
        )
        return cls(**kwargs)


_ROLLOUT_KNOWN = frozenset(TASK_COLUMNS + RESPONSE_COLUMNS + VERDICT_COLUMNS + ("completion",))


class InvalidVerdict(ValueError):
    """A verifier made a verdict that is not one: a score that is not a number in [0, 1] or None."""


@dataclass
class Verdict:
    """The outcome of verifying one rollout.

    `score` is in [0, 1], or None when the check could not run; then `error` says why.
    """

    score: float | None
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        if self.error is not None and not isinstance(self.error, str):
            self.error = (
                f"{type(self.error).__name__}: {self.error}"
                if isinstance(self.error, BaseException)
                else str(self.error)
            )
        if self.score is not None:
            if isinstance(self.score, bool) or not isinstance(self.score, numbers.Real):
                raise InvalidVerdict(
                    f"Verdict.score must be a number in [0, 1] or None, got {self.score!r} "
                    f"({type(self.score).__name__})"
                )
            score = float(self.score)
            if math.isnan(score) or not 0.0 <= score <= 1.0:
                raise InvalidVerdict(f"Verdict.score must be in [0, 1] or None, got {self.score!r}")
            self.score = score

    @classmethod
    def failed(cls, error: str, **details: Any) -> Verdict:
        """A verdict that could not be reached: score None, with the reason in `error`."""
        return cls(score=None, details=details, error=error)


class ErrorKind(StrEnum):
    """What kind of failure an `error` records; the value opens the `error` column's text (VERDICT's aside)."""

    TIMEOUT = "timeout"  # the engine's hard deadline (or an async verifier's soft one) passed
    CRASH = "worker_crash"  # the worker process died
    EXCEPTION = "exception"  # the verifier raised
    INVALID_VERDICT = (
        "invalid_verdict"  # the verifier returned no Verdict, or one with a score that is not one
    )
    SCHEMA = "invalid_row"  # the row does not fit the rollout schema
    UNKNOWN_TYPE = "unknown_task_type"  # no verifier serves the row's task_type
    REWARD = "reward_error"  # verified, but the reward terms cannot measure the row
    VERDICT = "verdict"  # the verifier's own `Verdict.error`, written as it gave it


@dataclass(frozen=True, slots=True)
class VerifyError:
    """Why a row has no verdict (or no reward); `str()` is the text of its `error` column."""

    kind: ErrorKind
    message: str

    def __str__(self) -> str:
        return self.message if self.kind is ErrorKind.VERDICT else f"{self.kind.value}: {self.message}"
