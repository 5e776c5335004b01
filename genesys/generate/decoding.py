"""Decoding a batch with a KV cache: the token sampler, how the next token is picked, and the loop.

`decode` is the loop `model.generate` runs for sampling, without what it adds around it: one forward
pass over the left-padded prompts, then one step per new token over transformers' own
`DynamicCache`, with the masks and positions `generate` passes, each new token picked by
`TokenPicker` from the [sampling] settings alone (nothing from the model's generation config). Its
tokens and logprobs are those of `generate` with the same processors, bit for bit, and so are the
final hidden states a proof hook records when every step runs the model's forward (tested).

A decode step of a Llama-family decoder (Llama, Qwen2/3, Mistral without sliding windows, ...) can
call the model's own modules directly: embedding, rotary table, each decoder layer over the cache,
final norm, output layer, in the order the model's forward runs them, without the per-call wrapping
around them (output capture, config defaults, the mask builder: over a quarter of a small model's
decode step on CPU). `step_function` takes that step only for models whose layers all attend fully
and for which it gives the forward's logits bit for bit on a check batch; every other model steps
through its forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from transformers import LogitsProcessor

from genesys.models import takes_logits_to_keep

# A decode step: (input ids, 2-D attention mask or None, position ids, cache) -> last position's logits.
Step = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, Any], torch.Tensor]


class TokenSampler:
    """Draws each token from the processed scores and records the token's logprob.

    It sees the scores after temperature and top-p, so the logprob it keeps is that of the
    distribution the token was drawn from. It draws by inverse transform: one uniform number per
    sequence, located in the cumulative probabilities (float32, as torch's own sampler sums them).
    On CPU that costs about a tenth of `torch.multinomial` at a 400-token vocabulary and a fortieth at
    150k tokens, where `multinomial` spends tens of milliseconds per step drawing one random number
    per vocabulary entry. Without a generator it picks the most likely token (greedy decoding).
    """

    def __init__(self, generator: torch.Generator | None) -> None:
        self.generator = generator
        self.steps: list[torch.Tensor] = []

    def draw(self, scores: torch.Tensor) -> torch.Tensor:
        """The (batch,) tokens drawn from `scores` (batch, vocab), their logprobs recorded."""
        logprobs = scores.float().log_softmax(dim=-1)
        tokens = self.choose(scores, logprobs)
        self.steps.append(logprobs.gather(1, tokens))
        return tokens.squeeze(1)

    def choose(self, scores: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
        """The (batch, 1) tokens of this step."""
        return (
            logprobs.argmax(dim=-1, keepdim=True)
            if self.generator is None
            else self._inverse_transform(logprobs.exp())
        )

    def _inverse_transform(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row, token i with probability probs[i]; one of probability 0 never."""
        cumulative = probs.cumsum(dim=-1)
        total = cumulative[:, -1:]
        uniform = torch.rand(total.shape, generator=self.generator, device=probs.device, dtype=probs.dtype)
        # The first entry whose cumulative sum exceeds u: u below the total keeps it inside the
        # vocabulary and off the zero-probability entries that end it.
        u = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
        return torch.searchsorted(cumulative, u, right=True)

    def logprobs(self) -> torch.Tensor:
        """The (batch, steps) logprobs of the tokens drawn so far."""
        return torch.cat(self.steps, dim=1)


class SeededSampler(TokenSampler):
    """A `TokenSampler` drawing with the seeded Gumbel-max sampler a validator can check
    (`genesys.proofs.sampling`): row i's noise comes from `keys[i]`, its (request seed, sample index),
    and the step's position, whatever else is in the batch."""

    def __init__(self, keys: list[tuple[int, int]], temperature: float) -> None:
        super().__init__(None)
        self.seeds = [seed for seed, _ in keys]
        self.samples = [sample for _, sample in keys]
        self.temperature = temperature

    def choose(self, scores: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
        from genesys.proofs.sampling import choose, step_keys

        position = [len(self.steps)] * len(self.seeds)
        return choose(scores, step_keys(self.seeds, self.samples, position, scores.device), self.temperature)


class TokenPicker:
    """Picks each next token of a batch of sequences as `generate` does: the warpers (temperature,
    top-p), then the sampler's draw; a finished sequence gets `pad_id` from then on. A sequence is
    finished once it picked one of `stop_ids`. (`genesys.inference.stage` picks with it too.)"""

    def __init__(
        self,
        sampler: TokenSampler,
        warpers: list[LogitsProcessor],
        stop_ids: Iterable[int],
        pad_id: int,
        batch: int,
        device: Any,
    ) -> None:
        self.sampler = sampler
        self.warpers = warpers
        self.stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
        self.pad_id = pad_id
        self.unfinished = torch.ones(batch, dtype=torch.bool, device=device)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The (batch,) next tokens from the last position's (batch, vocab) logits."""
        scores = logits.float()
        for warper in self.warpers:
            scores = warper(None, scores)
        tokens = self.sampler.draw(scores)
        tokens = torch.where(self.unfinished, tokens, self.pad_id)
        self.unfinished &= ~torch.isin(tokens, self.stops)
        return tokens

    @property
    def done(self) -> bool:
        """Whether every sequence is finished."""
        return not bool(self.unfinished.any())


def decode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_tokens: int,
    pick: TokenPicker,
    step: Step | None = None,
) -> torch.Tensor:
    """Up to `max_tokens` new tokens for each left-padded row of `input_ids`, as `generate` samples
    them: the prompts in one forward pass of `model`, then one `step` per token over the KV cache
    (default: the model's forward), until every row is finished. Returns the (batch, new tokens)
    ids; a row's tokens after its stop token are pads."""
    from transformers import DynamicCache

    step = step or forward_step(model)
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    # Without padding `generate` passes no mask (attention takes its causal path): so do we.
    mask = None if bool(attention_mask.all()) else attention_mask
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    tokens = [pick(forward_step(model)(input_ids, mask, positions, cache))]
    while not pick.done and len(tokens) < max_tokens:
        positions = positions[:, -1:] + 1
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        tokens.append(pick(step(tokens[-1][:, None], mask, positions, cache)))
    return torch.stack(tokens, dim=1)


def forward_step(model: Any) -> Step:
    """A step through the model's own forward, asking for the last position's logits only."""
    keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}

    def step(
        input_ids: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        output = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **keep,
        )
        return output.logits[:, -1]

    return step


def layers_step(model: Any) -> Step | None:
    """A decode step calling a Llama-family decoder's modules directly (see the module's docstring),
    or None when the model is not built so (or has layers that attend within a window)."""
    base = getattr(model, "base_model", None)
    head = model.get_output_embeddings()
    parts = ("embed_tokens", "rotary_emb", "layers", "norm")
    if base is None or head is None or not all(hasattr(base, name) for name in parts):
        return None
    config = base.config
    windowed = getattr(config, "sliding_window", None) is not None or any(
        kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()
    )
    if windowed:  # a window's mask is not the padding mask alone
        return None

    def step(
        input_ids: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        hidden = base.embed_tokens(input_ids)
        rotary = base.rotary_emb(hidden, positions)
        # One new position per row: the mask the model builds is the padding mask, per key.
        attention = None if mask is None else mask[:, None, None, :].bool()
        for layer in base.layers:
            hidden = layer(
                hidden,
                attention_mask=attention,
                position_embeddings=rotary,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
        return head(base.norm(hidden)[:, -1:, :])[:, -1]

    return step


def step_function(model: Any) -> Step:
    """The fastest decode step that gives the model's own logits: `layers_step` when it exists and
    matches the forward bit for bit on a check batch (padded and not, a few steps), else the forward."""
    direct = layers_step(model)
    if direct is None:
        return forward_step(model)
    try:
        same = _same_logits(model, direct)
    except Exception:  # a model whose modules take other arguments: its forward knows how to call them
        same = False
    return direct if same else forward_step(model)


@torch.inference_mode()
def _same_logits(model: Any, direct: Step) -> bool:
    """Whether `direct` gives the forward's logits bit for bit over a few decode steps of a small
    batch, with left padding and without."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    config = model.config.get_text_config(decoder=True)
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [0, 0, 9, 10]], device=device)
    for mask in (torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]], device=device), None):
        rows = ids if mask is not None else ids[:2]
        positions = (
            (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
            if mask is not None
            else torch.arange(rows.shape[1], device=device).expand(rows.shape[0], -1)
        )
        caches = DynamicCache(config=config), DynamicCache(config=config)
        for cache in caches:
            forward_step(model)(rows, mask, positions, cache)
        tokens = rows[:, -1:]
        for _ in range(3):
            positions = positions[:, -1:] + 1
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            expected = forward_step(model)(tokens, mask, positions, caches[0])
            if not torch.equal(direct(tokens, mask, positions, caches[1]), expected):
                return False
            tokens = expected.argmax(dim=-1, keepdim=True)
    return True


def left_padded(prompts: list[list[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of `prompts` padded on the left to the longest."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)
