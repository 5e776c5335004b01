"""Dropout off for training: with dropout the trainer's policy is not the sampler's (which generates
in eval mode), and the first on-policy ratio is no longer 1."""

from __future__ import annotations

import torch

DROPOUT = "dropout"


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout rate of `model` to 0: each `nn.Dropout`'s `p`, and each module's float
    attribute whose name ends in "dropout" (attention layers keep their rate so, e.g. Qwen2's
    `attention_dropout`). `model.config` is left as it is, so a saved model keeps its settings.
    Returns how many rates were above 0."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            changed += module.p > 0
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if name.endswith(DROPOUT) and isinstance(value, float):
                changed += value > 0
                setattr(module, name, 0.0)
    return changed
