"""The trainer's typed config, composed with every other command's in `genesys.config.commands`.

`TrainConfig` reads the shared sections under the same tables and defaults as `genesys generate` and
`genesys verify` (`[data]`, `[sampling]`, `[style]`, `[backend_options]`, `[verify]`, `[sandbox]`,
`[reward]`, `[cluster]`) and its own: `[rollout]` (groups per step and their filtering), `[optim]`,
`[loss]`, `[checkpoint]`, `[parallel]` (sharding), `[lora]` (adapters) and `[async]` (bounded staleness). Any key is overridable as a dotted flag.
"""

from __future__ import annotations

from genesys.config.commands import TrainConfig
from genesys.config.sections import (
    SIGNALS,
    TRACKERS,
    AsyncConfig,
    CheckpointConfig,
    LoraConfig,
    LossConfig,
    OptimConfig,
    ParallelConfig,
    RolloutConfig,
    TrainData,
)

__all__ = [
    "SIGNALS",
    "TRACKERS",
    "AsyncConfig",
    "CheckpointConfig",
    "LoraConfig",
    "LossConfig",
    "OptimConfig",
    "ParallelConfig",
    "RolloutConfig",
    "TrainConfig",
    "TrainData",
]
