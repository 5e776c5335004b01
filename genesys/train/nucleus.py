"""The sampler's nucleus (top-p) in the trainer's logprobs: the distribution tokens were drawn from.

Below `sampling.top_p = 1` the sampler draws from the smallest set of most likely tokens whose
probability reaches top_p, renormalised, and records logprobs of that distribution
(`genesys.models.sampling_warpers`: transformers' temperature and top-p warpers; vLLM's processed
logprobs). The trainer's logprobs must be of the same distribution, or the ratio of a fresh rollout
is below 1 (by the nucleus's mass) and negative advantages are clipped away. The nucleus is found
with the same warper on the trainer's tempered logits (without gradient); the token that was drawn
always counts in it, so a policy that has moved since sampling keeps a finite logprob for it.
`genesys.train.logprobs` renormalises over it.
"""

from __future__ import annotations

import torch

from genesys.config import SamplingConfig


@torch.no_grad()
def outside_nucleus(scaled_logits: torch.Tensor, tokens: torch.Tensor, top_p: float) -> torch.Tensor:
    """Where (..., vocab) a token lies outside the top-p nucleus of the tempered `scaled_logits`,
    the drawn `tokens` (...) always inside."""
    from genesys.models import sampling_warpers

    flat = scaled_logits.detach().float().reshape(-1, scaled_logits.shape[-1])
    for warper in sampling_warpers(SamplingConfig(temperature=1.0, top_p=top_p)):
        flat = warper(None, flat)
    outside = torch.isneginf(flat).reshape(scaled_logits.shape)
    return outside.scatter(-1, tokens.unsqueeze(-1), False)
