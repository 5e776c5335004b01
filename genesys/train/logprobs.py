"""Log-probabilities and entropies of completion tokens, from logits or from a model.

The logprob of a chosen token is its logit minus the log-sum-exp of its row (both at the sampling
temperature): only the chosen token is gathered, so no full-vocabulary log-softmax is kept, and
the model projects onto the vocabulary only the positions that predict completion tokens.
"""

from __future__ import annotations

import inspect
from functools import cache

import torch

from genesys.train.batch import MicroBatch


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0
) -> torch.Tensor:
    """logprob of `tokens` (batch, T) under `logits` (batch, T, vocab) divided by `temperature`, in
    fp32; below `top_p = 1`, within the sampler's nucleus renormalised (`genesys.train.nucleus`)."""
    if top_p < 1.0:
        from genesys.train.nucleus import nucleus_token_logprobs

        return nucleus_token_logprobs(logits, tokens, temperature, top_p)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The entropy of each position's distribution (batch, T), at `temperature`, in fp32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    probs = torch.exp(logits - log_z)
    return log_z.squeeze(-1) - (probs * logits).sum(dim=-1)


@cache
def _takes_logits_to_keep(model_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def completion_logits(model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
    """The logits (batch, completion_len, vocab) that predict each completion token."""
    keep = batch.completion_len + 1
    inner = getattr(model, "module", model)  # the model inside a DistributedDataParallel wrapper
    kwargs = {"logits_to_keep": keep} if _takes_logits_to_keep(type(inner)) else {}
    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        **kwargs,
    )
    return output.logits[:, -keep:-1, :]


def completion_logprobs(
    model: torch.nn.Module, batch: MicroBatch, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The completion tokens' logprobs under `model` (batch, completion_len), and their positions'
    entropies when asked (with gradient only if the caller is recording one)."""
    logits = completion_logits(model, batch)
    logprobs = token_logprobs(logits, batch.completion_ids, temperature)
    entropy = token_entropy(logits, temperature) if with_entropy else None
    return logprobs, entropy
