"""GRPO training on genesys tasks, verifiers and rewards.

    from genesys.train import TrainConfig, train
    result = train(TrainConfig.load("run.toml", overrides={"optim": {"lr": 3e-6}}))

Modules: `config` (the typed config), `loss`, `logprobs` and `batch` (pure tensor functions),
`sources` (where rollouts come from, behind one `RolloutSource` protocol: online generation and
verification, recorded rollout files, or rollout workers on Ray), `groups` (the online group
filter), `order` (the seeded task order), `distributed` (the processes), `parallel` (FSDP2 sharding
and mixed precision), `loading` (the model built empty on every rank, its weights read by rank 0
alone), `lora` (peft adapters), `export` (full weights out of the shards, for engines and files),
`checkpoint` (sharded, resumable on any number of processes), `metrics`, and `trainer` (the loop). Importing this package loads no torch until `train` or `Trainer` is used.
"""

from __future__ import annotations

from typing import Any

from genesys.train.config import TrainConfig

__all__ = ["TrainConfig", "TrainResult", "Trainer", "train"]


def __getattr__(name: str) -> Any:
    if name in ("train", "Trainer", "TrainResult"):
        from genesys.train import trainer

        return getattr(trainer, name)
    raise AttributeError(name)
