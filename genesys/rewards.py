"""Composing a rollout's `reward` from its verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RewardConfig:
    """How `reward` is derived from `score`."""

    length_penalty: str = "none"


def compute_reward(score: float | None, row: dict[str, Any], config: RewardConfig) -> float | None:
    """The reward of a verified row: its score (None when the verdict could not be reached)."""
    return score
