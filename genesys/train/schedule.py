"""The learning-rate schedule: linear warmup, then constant or cosine decay."""

from __future__ import annotations

import math

from genesys.train.config import OptimConfig


def lr_factor(update: int, config: OptimConfig) -> float:
    """The learning rate of optimizer update `update` (0-based) as a fraction of `config.lr`."""
    if update < config.warmup_steps:
        return (update + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    decay_steps = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (update - config.warmup_steps) / decay_steps)
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
