"""The policy-gradient objectives as small pure functions on tensors: advantages, the per-token
losses of each `[loss] type`, their reduction, and the KL estimate.

Per completion token t with advantage A and ratio rho = exp(logp_new - logp_old):

- `grpo` (`clipped_token_loss`), INTELLECT-2's two-sided clipped objective

      loss_t = -min(min(rho, delta) * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)

  Its branches: A > 0 and rho > 1 + eps_high is clipped (no gradient); A < 0 and rho < 1 - eps_low
  is clipped; A < 0 and rho > delta is bounded at delta * A (no gradient); everything else is rho * A.
- `dr_grpo`: the same token loss, summed and divided by a constant (the most model tokens the batch's
  sequences could hold: sampling.max_tokens for a completion, max_turns x sampling.max_tokens for a
  trajectory, `loss_denominator`) instead of the batch's token count, with advantages never scaled
  by the std.
- `gspo` (`gspo_token_loss`): one ratio per sequence, s = exp(mean_t(logp_new - logp_old)), clipped
  to [1 - eps_low, 1 + eps_high] as PPO clips; each token carries s and the gradient of s.
- `cispo` (`cispo_token_loss`): loss_t = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * logp_new:
  the importance weight is clipped and detached, so every token keeps a gradient.

The log-ratio is clamped to +-MAX_LOG_RATIO before `exp`: a ratio that overflows to infinity would
give its token a NaN gradient (0 * inf through the clip) although the clip leaves it none. Within
the clamp every branch is as above as long as delta and 1 + eps_high stay below exp(MAX_LOG_RATIO).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# exp(20) ~ 4.9e8: far beyond any clip bound, far below float32's (and bfloat16's) largest number.
MAX_LOG_RATIO = 20.0


def group_advantages(
    rewards: torch.Tensor, group_sizes: Sequence[int], scale_by_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """`A = r - mean(group)` for consecutive groups of the given sizes, optionally divided by the
    group's standard deviation (population std, plus `eps`)."""
    if rewards.ndim != 1 or rewards.numel() != sum(group_sizes):
        raise ValueError(
            f"rewards must be a flat tensor of {sum(group_sizes)} rewards (the groups' sizes), got shape {tuple(rewards.shape)}"
        )
    parts = []
    for group in torch.split(rewards, list(group_sizes)):
        advantage = group - group.mean()
        if scale_by_std:
            advantage = advantage / (group.std(unbiased=False) + eps)
        parts.append(advantage)
    return torch.cat(parts) if parts else rewards.new_zeros(0)


@dataclass
class ClippedLoss:
    """Per-token losses and where each clipping branch was active, all of shape (batch, tokens)."""

    loss: torch.Tensor
    ratio: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    bounded_by_delta: torch.Tensor


def clipped_token_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    delta: float,
) -> ClippedLoss:
    """The per-token loss for logprobs (batch, tokens) under the trained and the behaviour policy,
    with one advantage per sequence (batch,). Masking is left to `reduce_loss`."""
    ratio = torch.exp(clamped_log_ratio(logprobs, behaviour_logprobs))
    adv = advantages.unsqueeze(1)
    bounded = torch.clamp(ratio, max=delta) * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    detached = ratio.detach()
    return ClippedLoss(
        loss=-torch.minimum(bounded, clipped),
        ratio=detached,
        clipped_low=(adv < 0) & (detached < 1.0 - eps_low),
        clipped_high=(adv > 0) & (detached > 1.0 + eps_high),
        bounded_by_delta=(adv < 0) & (detached > delta),
    )


def gspo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> ClippedLoss:
    """GSPO's per-token loss: every token of sequence i carries the clipped sequence ratio
    s_i = exp(mean over its tokens of the log-ratio), its value s_i and its gradient that of s_i
    (`sg(s_i) * exp(logp - sg(logp))`); averaging a sequence's tokens gives GSPO's sequence loss."""
    mask = mask.bool()
    log_ratio = torch.where(mask, clamped_log_ratio(logprobs, old_logprobs), 0.0)
    sequence_log_ratio = log_ratio.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    ratio = torch.exp(sequence_log_ratio.detach().unsqueeze(1) + logprobs - logprobs.detach())
    adv = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    detached = ratio.detach()
    return ClippedLoss(
        loss=-torch.minimum(ratio * adv, clipped),
        ratio=detached,
        clipped_low=(adv < 0) & (detached < 1.0 - eps_low),
        clipped_high=(adv > 0) & (detached > 1.0 + eps_high),
        bounded_by_delta=torch.zeros_like(mask),
    )


def cispo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> ClippedLoss:
    """CISPO's per-token loss `-sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * logp`: the clip bounds
    the weight, never the gradient. `clipped_low`/`clipped_high` mark weights the clip changed."""
    ratio = torch.exp(clamped_log_ratio(logprobs, old_logprobs)).detach()
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return ClippedLoss(
        loss=-weight * advantages.unsqueeze(1) * logprobs,
        ratio=ratio,
        clipped_low=ratio < 1.0 - eps_low,
        clipped_high=ratio > 1.0 + eps_high,
        bounded_by_delta=torch.zeros_like(ratio, dtype=torch.bool),
    )


def policy_token_loss(
    loss_type: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    delta: float,
) -> ClippedLoss:
    """The per-token loss of `[loss] type` (grpo, dr_grpo, gspo, cispo); see the module's docstring."""
    if loss_type in ("grpo", "dr_grpo"):
        return clipped_token_loss(
            logprobs, old_logprobs, advantages, eps_low=eps_low, eps_high=eps_high, delta=delta
        )
    if loss_type == "gspo":
        return gspo_token_loss(logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high)
    if loss_type == "cispo":
        return cispo_token_loss(logprobs, old_logprobs, advantages, eps_low=eps_low, eps_high=eps_high)
    raise ValueError(f"loss type must be grpo, dr_grpo, gspo or cispo, got {loss_type!r}")


def loss_denominator(loss_type: str, normalize: str, tokens: float, sequences: float, budget: float) -> float:
    """What the summed losses of a batch are divided by: its model `tokens` (normalize "token"), its
    `sequences` ("sequence", each already a mean over its tokens), or for dr_grpo the constant
    `budget`, the most model tokens its sequences could hold (`sequences * max_tokens` for single
    completions), the same for every batch of those sequences whatever their lengths."""
    if loss_type == "dr_grpo":
        value = budget
    else:
        value = tokens if normalize == "token" else sequences
    return max(value, 1.0)


def clamped_log_ratio(logprobs: torch.Tensor, other_logprobs: torch.Tensor) -> torch.Tensor:
    """`logprobs - other_logprobs`, clamped to +-MAX_LOG_RATIO so its `exp` stays finite (NaN stays NaN)."""
    return torch.clamp(logprobs - other_logprobs, -MAX_LOG_RATIO, MAX_LOG_RATIO)


def reduce_loss(
    token_loss: torch.Tensor, mask: torch.Tensor, normalize: str, denominator: float
) -> torch.Tensor:
    """This micro-batch's share of the batch loss.

    `token`: the sum of masked token losses divided by `denominator`, the number of completion tokens
    in the whole batch (all micro-batches and ranks). `sequence`: each sequence's mean over its own
    tokens, summed and divided by `denominator`, the number of sequences in the whole batch. Summing
    the shares of every micro-batch gives the batch's mean, whatever the micro-batch split.
    """
    mask = mask.bool()
    masked = torch.where(mask, token_loss, 0.0)  # not a product: padding's NaN or inf times 0 is NaN
    if normalize == "token":
        return masked.sum() / denominator
    if normalize == "sequence":
        per_sequence = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_sequence.sum() / denominator
    raise ValueError(f"normalize must be 'token' or 'sequence', got {normalize!r}")


def kl_estimate(logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' logprobs (the
    non-negative "k3" estimator: exp(ref - logp) - (ref - logp) - 1), the log-ratio clamped as above."""
    log_ratio = clamped_log_ratio(reference_logprobs, logprobs)
    return torch.exp(log_ratio) - log_ratio - 1.0
