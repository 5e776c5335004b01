"""Log-probabilities and entropies of completion tokens, from logits or from a model.

The logprob of a chosen token is its logit minus the log-sum-exp of its row (both at the sampling
temperature): only the chosen token is gathered, so no full-vocabulary log-softmax is kept.

`completion_logprobs` runs the model for the final hidden states only (its vocabulary projection
sees no position), takes the positions that predict completion tokens (`MicroBatch.targets`), and
projects them onto the vocabulary in chunks of at most `LOGITS_CHUNK_BYTES` of fp32 logits. When
there are several chunks, each is an activation checkpoint: its logits are freed once its logprobs
and entropies are taken, and computed again, one chunk at a time, in the backward pass. So no
`[tokens, vocab]` tensor of a micro-batch exists at once; the price is a second vocabulary
projection in the backward pass. A micro-batch of one chunk keeps its logits instead: the backward
pass starts with that chunk, so recomputing it would hold the same tensors at the same moment, and
cost the projection again for nothing.

Below `top_p = 1` a logprob is that of the sampler's nucleus, renormalised (`genesys.train.nucleus`);
entropies are always those of the whole distribution at the temperature.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.checkpoint import checkpoint

from genesys.models import takes_logits_to_keep
from genesys.train.batch import MicroBatch
from genesys.train.nucleus import outside_nucleus

# The fp32 logits of one chunk: 128 MiB is 220 tokens of a 151,936-token vocabulary.
LOGITS_CHUNK_BYTES = 128 * 2**20
# FSDP2 warns, on every forward of a sharded model asked for its hidden states, that it "returned a
# view tensor" (in-place changes to it would skip a backward hook). That view is hidden_states[0],
# the first decoder layer's input, made a view by FSDP2's own pre-forward hook on that layer and
# recorded by transformers as the first hidden state. `final_hidden_states` reads hidden_states[-1]
# alone (the final norm's output, not a view) and nothing changes any output in place, so the
# warning is about a tensor dropped unread: exactly it is silenced there.
_FSDP_VIEW_WARNING = r"FSDP2-wrapped module \(.*\) returned a view tensor"


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0
) -> torch.Tensor:
    """logprob of `tokens` (...) under `logits` (..., vocab) divided by `temperature`, in fp32;
    below `top_p = 1`, within the sampler's nucleus renormalised."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return chosen - _log_normaliser(logits, tokens, top_p)


def _log_normaliser(logits: torch.Tensor, tokens: torch.Tensor, top_p: float) -> torch.Tensor:
    """log-sum-exp of the (tempered) `logits` over the vocabulary, or over the nucleus below top_p 1."""
    if top_p < 1.0:
        logits = logits.masked_fill(outside_nucleus(logits, tokens, top_p), float("-inf"))
    return torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The entropy of each position's distribution (...), at `temperature`, in fp32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    probs = torch.exp(logits - log_z)
    return log_z.squeeze(-1) - (probs * logits).sum(dim=-1)


def chunk_tokens(vocab_size: int, chunk_bytes: int | None = None) -> int:
    """Positions per chunk so that one chunk's fp32 logits take at most `chunk_bytes` (by default
    `LOGITS_CHUNK_BYTES`)."""
    return max(1, (chunk_bytes or LOGITS_CHUNK_BYTES) // (4 * vocab_size))


def _project(
    head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropies) of `tokens` (n,) from hidden states (n, hidden) through `head`."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    probs = torch.exp(logits - log_z.unsqueeze(-1))
    entropy = log_z - (probs * logits).sum(dim=-1)
    if top_p < 1.0:
        log_z = _log_normaliser(logits, tokens, top_p)
    return chosen - log_z, entropy


def chunked_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk: int | None = None,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropies) of `tokens` (n,) predicted from `hidden` (n, hidden) by the vocabulary
    projection `head`, `chunk` positions at a time (by default `chunk_tokens` of its vocabulary); when
    gradients are recorded and there are several chunks, each is recomputed in the backward pass."""
    chunk = chunk or chunk_tokens(_vocab_size(head))
    recording = (
        len(tokens) > chunk and torch.is_grad_enabled() and (hidden.requires_grad or _has_trainable(head))
    )
    logprobs, entropies = [], []
    for start in range(0, max(len(tokens), 1), chunk):
        part = (head, hidden[start : start + chunk], tokens[start : start + chunk], temperature, top_p)
        if recording:
            logprob, entropy = checkpoint(_project, *part, use_reentrant=False)
        else:
            logprob, entropy = _project(*part)
        logprobs.append(logprob)
        entropies.append(entropy)
    return torch.cat(logprobs), torch.cat(entropies)


def _vocab_size(head: torch.nn.Module) -> int:
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(head.out_features)


def _has_trainable(module: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DistributedDataParallel wrapper (the model itself otherwise)."""
    return getattr(model, "module", model)


def final_hidden_states(model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
    """The model's last hidden states (after its final norm) at `batch.targets`, as (targets, hidden).

    The model is called as a whole (through any data-parallel wrapper, whose hooks must see the
    forward), asking for its hidden states and keeping no position for its vocabulary projection."""
    inner = unwrapped(model)
    kwargs = {}
    if takes_logits_to_keep(inner):
        kwargs["logits_to_keep"] = torch.zeros(0, dtype=torch.long, device=batch.input_ids.device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_FSDP_VIEW_WARNING, category=UserWarning)
        output = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
            output_hidden_states=True,
            **kwargs,
        )
    hidden = output.hidden_states[-1]
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.targets)


def completion_logprobs(
    model: torch.nn.Module, batch: MicroBatch, temperature: float, top_p: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The completion tokens' logprobs (within the top-p nucleus below 1) and their positions'
    entropies under `model`, both laid out as `batch.completion_ids` (sequences, completion_len), 0
    where `completion_mask` is false."""
    hidden = final_hidden_states(model, batch)
    tokens = batch.completion_ids[batch.completion_mask]
    head = unwrapped(model).get_output_embeddings()
    logprobs, entropies = chunked_logprobs(head, hidden, tokens, temperature, top_p=top_p)
    return _scatter(logprobs, batch.completion_mask), _scatter(entropies, batch.completion_mask)


def _scatter(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` (mask's true count,) placed at `mask`'s true entries of a zero tensor shaped as `mask`."""
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)
