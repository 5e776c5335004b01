"""Rewards: a stage after verification that adds `reward` to verified rows, a weighted sum of terms.

    reward = sum(weight * term)

The terms, for a completion of L tokens, target T and coefficient c (INTELLECT-2's length-controlled
rewards, c = 0.0003 by default). Each length term is the change it makes to the score, so that
`score` plus one length term at weight 1 is that length penalty's reward:

- `score`:    the task score.
- `exact`:    -c * |L - T|                          (reward = score - c * |L - T|)
- `max`:      score * (clip(c * (T - L) + 0.5, 0, 1) - 1)   (reward = score * clip(c * (T - L) + 0.5, 0, 1))
- `clip`:     -score when L > T, else 0            (reward = 0 when L > T, else score)
- `overlong`: DAPO's soft overlong punishment. With maximum length M and buffer B,
              -penalty * clip((L - (M - B)) / B, 0, 1): nothing up to M - B tokens, then a linear
              ramp down to -penalty at M tokens and beyond.

`RewardConfig.length_penalty` picks the length term that joins `score` at weight 1 (`none`: the score
alone); `RewardConfig.weights` sets any term's weight (0 drops it), so `length_penalty="exact",
weights={"exact": 0.5, "overlong": 1.0}` gives score - 0.5 c |L - T| plus the overlong term.

L is `len(completion_ids)`, or the completion re-tokenized with `RewardConfig.tokenizer` when a row
has no ids. T is the row's `target_length` column when it has one, else `RewardConfig.target_length`.
The `score` column is never changed; a verdict that could not be reached (score None) has reward None.
Check rows with `reward_problem` before any work; `RewardStage` loads the tokenizer once, up front.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from genesys.config import RewardConfig
from genesys.errors import InputError
from genesys.schema import ErrorKind, VerifyError

TARGET_LENGTH_COLUMN = "target_length"


class Measures(NamedTuple):
    """What the terms of one row are computed from; length and target only when a term needs them."""

    score: float
    length: int = 0
    target: int = 0


def _score(m: Measures, config: RewardConfig) -> float:
    return m.score


def _exact(m: Measures, config: RewardConfig) -> float:
    return -config.coef * abs(m.length - m.target)


def _max(m: Measures, config: RewardConfig) -> float:
    return m.score * (min(max(config.coef * (m.target - m.length) + 0.5, 0.0), 1.0) - 1.0)


def _clip(m: Measures, config: RewardConfig) -> float:
    return -m.score if m.length > m.target else 0.0


def _overlong(m: Measures, config: RewardConfig) -> float:
    assert config.max_length is not None and config.overlong_buffer is not None
    start = config.max_length - config.overlong_buffer
    return -config.overlong_penalty * min(max((m.length - start) / config.overlong_buffer, 0.0), 1.0)


# Each term's function; which measures a term needs is part of its name in `genesys.config.REWARD_TERMS`.
TERMS: dict[str, Callable[[Measures, RewardConfig], float]] = {
    "score": _score,
    "exact": _exact,
    "max": _max,
    "clip": _clip,
    "overlong": _overlong,
}


def reward_problem(row: Mapping[str, Any], config: RewardConfig) -> str | None:
    """Why the reward of `config` cannot be computed for `row`, or None. Every path checks its rows
    (or, before generating, the rows it will make) with this before any work."""
    try:
        if config.needs_length:
            _length_source(row, config.tokenizer is not None)
        if config.needs_target:
            target_length(row, config)
    except InputError as exc:
        return str(exc)
    return None


class RewardStage:
    """Adds `reward` to verified rows. Build one per run, after checking the config: it loads the
    tokenizer (when the terms may need it) here, never in the middle of a run."""

    def __init__(self, config: RewardConfig) -> None:
        self.config = config
        self.terms = [(TERMS[name], weight) for name, weight in config.terms.items()]
        self.is_score = config.terms == {"score": 1.0}  # the default: reward = score, nothing to measure
        self.tokenizer = (
            _load_tokenizer(config.tokenizer) if config.tokenizer and config.needs_length else None
        )

    def reward(self, score: float | None, row: Mapping[str, Any]) -> float | None:
        """The reward of a row verified with `score`; None when the score is None.

        Raises InputError naming the row when a term needs a length or target the row lacks.
        """
        if score is None:
            return None
        config = self.config
        measures = Measures(
            score,
            self.completion_length(row) if config.needs_length else 0,
            target_length(row, config) if config.needs_target else 0,
        )
        total = 0.0
        for compute, weight in self.terms:
            total += weight * compute(measures, config)
        return total

    def apply(self, row: dict[str, Any]) -> dict[str, Any]:
        """Set `reward` on a verified row (in place; returned for convenience). A row the terms
        cannot measure keeps its score and gets reward None and a `reward_error` error."""
        error = row.pop("error", None)
        score = row.get("score")
        if self.is_score or score is None:
            row["reward"] = score
        else:
            try:
                row["reward"] = self.reward(score, row)
            except InputError as exc:
                row["reward"] = None
                error = error or str(VerifyError(ErrorKind.REWARD, str(exc)))
        row["error"] = error  # after reward, where the verdict columns have always had it
        return row

    def completion_length(self, row: Mapping[str, Any]) -> int:
        """Completion tokens of `row`: its `completion_ids`, else its completion text tokenized."""
        source = _length_source(row, self.tokenizer is not None)
        if isinstance(source, str):
            return len(self.tokenizer.encode(source, add_special_tokens=False))  # type: ignore[union-attr]
        return len(source)


def _length_source(row: Mapping[str, Any], can_tokenize: bool) -> Any:
    """The row's completion_ids, else its completion text when a tokenizer can count it."""
    ids = row.get("completion_ids")
    if ids is not None:
        if isinstance(ids, (list, tuple)) or getattr(ids, "ndim", None) == 1:  # arrays and tensors as well
            return ids
        raise InputError(
            f"{describe_row(row)}: completion_ids must be a list of token ids, got {type(ids).__name__} {_clipped(ids)}"
        )
    text = row.get("llm_response", row.get("completion"))
    if text is None:
        raise InputError(
            f"{describe_row(row)}: no completion_ids and no llm_response to measure the length of"
        )
    if not can_tokenize:
        raise InputError(
            f"{describe_row(row)}: no completion_ids; pass a tokenizer (--tokenizer) to count completion tokens"
        )
    return str(text)


def target_length(row: Mapping[str, Any], config: RewardConfig) -> int:
    """The target length for `row`: its `target_length` column, else the configured default."""
    value = row.get(TARGET_LENGTH_COLUMN)
    if value is None:
        value = config.target_length
    if value is None:
        raise InputError(
            f"{describe_row(row)}: no {TARGET_LENGTH_COLUMN!r} column and no default target length "
            "(--target-length; when generating, --target-lengths gives each task one)"
        )
    target = _as_length(value)
    if target is None:
        raise InputError(
            f"{describe_row(row)}: {TARGET_LENGTH_COLUMN!r} must be an integer >= 0, got {_clipped(value)}"
        )
    return target


def describe_row(row: Mapping[str, Any]) -> str:
    """A short name for a row in error messages: its response_id and problem_id."""
    names = [f"{key}={row[key]!r}" for key in ("response_id", "problem_id") if row.get(key) is not None]
    return f"row ({', '.join(names)})" if names else "row (no response_id or problem_id)"


def _as_length(value: Any) -> int | None:
    """`value` as a token count (an integer >= 0, also as a whole float or a digit string), or None."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        return None
    try:
        count = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return count if count >= 0 else None


def _clipped(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.lru_cache(maxsize=4)
def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load tokenizer {name!r}: {exc}") from None
