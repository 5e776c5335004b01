"""The trainer's logprobs under the sampler's nucleus (top-p): the distribution tokens were drawn from.

Below `sampling.top_p = 1` the sampler draws from the smallest set of most likely tokens whose
probability reaches top_p, renormalised, and records logprobs of that distribution
(`genesys.models.sampling_warpers`: transformers' temperature and top-p warpers; vLLM's processed
logprobs). The trainer's logprobs must be of the same distribution, or the ratio of a fresh rollout
is below 1 (by the nucleus's mass) and negative advantages are clipped away. The nucleus is found
with the same warper on the trainer's logits (without gradient); the token that was drawn always
counts in it, so a policy that has moved since sampling keeps a finite logprob for it.
"""

from __future__ import annotations

import torch

from genesys.config import SamplingConfig


def nucleus_token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    """logprob of `tokens` (batch, T) under `logits` (batch, T, vocab) at `temperature`, within the
    top-p nucleus renormalised, in fp32."""
    from genesys.models import sampling_warpers

    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    with torch.no_grad():
        flat = scaled.detach().reshape(-1, scaled.shape[-1])
        warped = flat
        for warper in sampling_warpers(SamplingConfig(temperature=1.0, top_p=top_p)):
            warped = warper(None, warped)
        outside = torch.isneginf(warped).reshape(scaled.shape)
        outside.scatter_(-1, tokens.unsqueeze(-1), False)
    chosen = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(scaled.masked_fill(outside, float("-inf")), dim=-1)
