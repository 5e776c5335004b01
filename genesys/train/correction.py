"""Importance-sampling correction of the gap between the sampler and the trainer's old policy.

The rollouts were sampled by an engine (vLLM, a bf16 sampler, or older weights in asynchronous
mode) whose logprobs are not exactly those of the trainer's policy. With `[loss]
importance_correction`, the trainer recomputes the old policy's logprobs itself (the ratio of the
loss is taken against them) and weighs each token's loss by w = pi_old / pi_sampler:

- `tis` (truncated importance sampling): min(w, cap);
- `mis` (masked importance sampling): w where w <= cap, else 0 (the token, or at sequence level the
  whole sequence, is left out).

At `importance_level = "sequence"` a sequence's weight is the product of its tokens' weights (the
sum of their log-ratios), one weight for all its tokens. The weights carry no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genesys.train.loss import clamped_log_ratio


@dataclass
class ImportanceWeights:
    """Per-token weights (batch, tokens), and where the cap changed them."""

    weights: torch.Tensor
    capped: torch.Tensor


def importance_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    level: str,
    cap: float,
) -> ImportanceWeights:
    """The weights of `mode` ("none", "tis", "mis") at `level` ("token", "sequence") for logprobs
    (batch, tokens) of the trainer's old policy and the sampler; `mask` marks real tokens."""
    mask = mask.bool()
    if mode == "none":
        return ImportanceWeights(torch.ones_like(old_logprobs), torch.zeros_like(mask))
    log_weight = clamped_log_ratio(old_logprobs.detach(), sampler_logprobs)
    if level == "sequence":
        log_weight = torch.where(mask, log_weight, 0.0).sum(dim=1, keepdim=True).expand_as(log_weight)
    elif level != "token":
        raise ValueError(f"importance level must be 'token' or 'sequence', got {level!r}")
    weight = torch.exp(log_weight)
    capped = (weight > cap) & mask
    if mode == "tis":
        weight = torch.clamp(weight, max=cap)
    elif mode == "mis":
        weight = torch.where(weight > cap, 0.0, weight)
    else:
        raise ValueError(f"importance correction must be 'none', 'tis' or 'mis', got {mode!r}")
    return ImportanceWeights(weight, capped)
