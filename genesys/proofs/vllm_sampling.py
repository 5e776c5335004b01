"""The seeded sampler of `genesys.proofs.sampling` inside a vLLM engine, as a V1 logits processor
(`SAMPLING_PROCESSOR`; the marks and names it reads are in `genesys.proofs.vllm_capture`).

vLLM's V1 engine runs custom logits processors (`LLM(logits_processors=[...])`) in its worker on the
float32 logits of every step, before its own temperature, top-p and sampling. `SeededSampling` acts
on the requests whose sampling params carry `SAMPLING_KEY` in `extra_args`: it applies their
temperature and top-p as `genesys.models.sampling_warpers` does, picks the token the seeded sampler
picks at the request's position (its output token count), records that token and its logprob under
the tempered, top-p distribution, and leaves the row -inf everywhere but at that token, so whatever
vLLM then does (greedy, or its own seeded draw) takes it. It says it is not argmax-invariant, so vLLM
runs it before greedy decoding too.

vLLM reports the logprob of the distribution it sampled from, one-hot here, so the recorded logprobs
replace it: the worker keeps them by sample (`sample_name(key, index)`, by position, so a request
computed again after a preemption overwrites them, in `genesys.proofs.vllm_capture.SAMPLED`) until
the worker extension's `genesys_take_sampled` hands them over, with the recorded tokens, which the
backend checks against the completion's.

vLLM samples the n completions of a request as child requests seeded `seed + index`: the index
names the sample, whose noise comes from the request's sample index at that place.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from genesys.proofs.vllm_capture import SAMPLED, SAMPLING_KEY, sample_name


class _Row:
    """A marked request in the batch: its name, noise key, sampling settings and growing output."""

    def __init__(self, params: Any, output: list[int]) -> None:
        mark = params.extra_args[SAMPLING_KEY]
        index = params.seed - mark["seed"]  # vLLM seeds child request `index` with seed + index
        self.name = sample_name(mark["key"], index)
        self.seed = mark["seed"]
        self.sample = mark["samples"][index]
        self.settings = (params.temperature, params.top_p)
        self.output = output  # vLLM's live list of the request's output tokens


def _new_row(params: Any, prompt: list[int] | None, output: list[int]) -> _Row | None:
    if params is None or not params.extra_args or SAMPLING_KEY not in params.extra_args:
        return None
    return _Row(params, output)


class SeededSampling(LogitsProcessor):
    """Draws the tokens of marked requests with the seeded Gumbel-max sampler and records them."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}  # by index in the batch

    def is_argmax_invariant(self) -> bool:
        return False  # it picks the token: it must run before greedy decoding as well

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, _new_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        groups: dict[tuple[float, float], list[int]] = {}
        for index, row in self.rows.items():
            groups.setdefault(row.settings, []).append(index)
        for (temperature, top_p), indices in groups.items():
            self._draw(logits, indices, temperature, top_p)
        return logits

    def _draw(self, logits: torch.Tensor, indices: list[int], temperature: float, top_p: float) -> None:
        from genesys.config import SamplingConfig
        from genesys.models import sampling_warpers
        from genesys.proofs.sampling import choose, step_keys

        rows = [self.rows[i] for i in indices]
        where = torch.tensor(indices, device=logits.device)
        scores = logits.index_select(0, where)
        for warper in sampling_warpers(SamplingConfig(temperature=temperature, top_p=top_p)):
            scores = warper(None, scores)
        positions = [len(row.output) for row in rows]
        keys = step_keys([r.seed for r in rows], [r.sample for r in rows], positions, logits.device)
        tokens = choose(scores, keys, temperature)
        logprobs = scores.log_softmax(dim=-1).gather(1, tokens)
        forced = torch.full_like(scores, float("-inf")).scatter_(1, tokens, 0.0)
        logits.index_copy_(0, where, forced)
        for row, position, token, logprob in zip(
            rows, positions, tokens.squeeze(1).tolist(), logprobs.squeeze(1).tolist()
        ):
            SAMPLED.setdefault(row.name, {})[position] = (token, logprob)
