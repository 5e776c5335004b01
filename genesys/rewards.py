"""Composing a rollout's `reward` from its verdict: the task score, shaped by a length term.

Length is counted in completion tokens: `len(completion_ids)`, or the completion re-tokenized with
`RewardConfig.tokenizer` when a row has no ids. For a completion of L tokens, target T and
coefficient c (INTELLECT-2's length-controlled rewards, c = 0.0003 by default):

- `none`:     reward = score
- `exact`:    reward = score - c * |L - T|
- `max`:      reward = score * clip(c * (T - L) + 0.5, 0, 1)
- `clip`:     reward = 0 when L > T, else score
- `overlong`: DAPO's soft overlong punishment. With maximum length M and buffer B,
              reward = score - penalty * clip((L - (M - B)) / B, 0, 1): no change up to M - B tokens,
              then a linear ramp down to -penalty at M tokens and beyond.

T is the row's `target_length` column when it has one, else `RewardConfig.target_length`. The
`score` column is never changed; a verdict that could not be reached (score None) has reward None.
"""

from __future__ import annotations

import functools
from typing import Any

from genesys.config import DEFAULT_LENGTH_COEF, LENGTH_PENALTIES, RewardConfig
from genesys.errors import InputError

__all__ = ["DEFAULT_LENGTH_COEF", "LENGTH_PENALTIES", "RewardConfig", "compute_reward", "completion_length", "missing_reward_input", "target_length"]

TARGET_LENGTH_COLUMN = "target_length"


def compute_reward(score: float | None, row: dict[str, Any], config: RewardConfig) -> float | None:
    """The reward of a verified row; None when its score is None.

    Raises InputError naming the row when the length term needs a length or target it lacks.
    """
    if score is None:
        return None
    mode = config.length_penalty
    if mode == "none":
        return score
    length = completion_length(row, config.tokenizer)
    if mode == "overlong":
        assert config.max_length is not None and config.overlong_buffer is not None
        start = config.max_length - config.overlong_buffer
        overrun = min(max((length - start) / config.overlong_buffer, 0.0), 1.0)
        return score - config.overlong_penalty * overrun
    target = target_length(row, config)
    if mode == "exact":
        return score - config.coef * abs(length - target)
    if mode == "max":
        return score * min(max(config.coef * (target - length) + 0.5, 0.0), 1.0)
    return 0.0 if length > target else score  # clip


def missing_reward_input(row: dict[str, Any], config: RewardConfig) -> str | None:
    """What `row` lacks for the length term of `config` (checked before a run starts), or None."""
    if config.length_penalty == "none":
        return None
    try:
        _length_source(row, config.tokenizer)
        if config.length_penalty != "overlong":
            target_length(row, config)
    except InputError as exc:
        return str(exc)
    return None


def completion_length(row: dict[str, Any], tokenizer: str | None = None) -> int:
    """Completion tokens of `row`: its `completion_ids`, else its `llm_response` tokenized by `tokenizer`."""
    source = _length_source(row, tokenizer)
    if isinstance(source, str):
        return len(_load_tokenizer(tokenizer).encode(source, add_special_tokens=False))
    return len(source)


def _length_source(row: dict[str, Any], tokenizer: str | None) -> Any:
    """The row's completion_ids, else its completion text when a tokenizer can count it."""
    ids = row.get("completion_ids")
    if ids is not None:
        return ids
    text = row.get("llm_response", row.get("completion"))
    if text is None:
        raise InputError(f"{describe_row(row)}: no completion_ids and no llm_response to measure the length of")
    if tokenizer is None:
        raise InputError(f"{describe_row(row)}: no completion_ids; pass a tokenizer (--tokenizer) to count completion tokens")
    return str(text)


def target_length(row: dict[str, Any], config: RewardConfig) -> int:
    """The target length for `row`: its `target_length` column, else the configured default."""
    value = row.get(TARGET_LENGTH_COLUMN)
    if value is None:
        value = config.target_length
    if value is None:
        raise InputError(f"{describe_row(row)}: no {TARGET_LENGTH_COLUMN!r} column and no default target length (--target-length)")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InputError(f"{describe_row(row)}: {TARGET_LENGTH_COLUMN!r} must be an integer, got {value!r}") from None


def describe_row(row: dict[str, Any]) -> str:
    """A short name for a row in error messages: its response_id and problem_id."""
    names = [f"{key}={row[key]!r}" for key in ("response_id", "problem_id") if row.get(key) is not None]
    return f"row ({', '.join(names)})" if names else "row (no response_id or problem_id)"


@functools.lru_cache(maxsize=4)
def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load tokenizer {name!r}: {exc}") from None
