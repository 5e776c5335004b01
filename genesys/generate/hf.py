"""The transformers backend: batched `model.generate` on CPU or GPU, with per-token logprobs.

Prompts are sorted by length and padded on the left, so a batch wastes little compute on padding.
The logprob kept for each completion token is that of the sampled token under the model's own
distribution (log-softmax of the raw logits, before temperature and top-p), as vLLM reports it.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList
from transformers.utils import logging as transformers_logging

from genesys.errors import InputError
from genesys.generate.backend import Completion, GenerationRequest, GenerationResult, PromptStyle, SamplingConfig
from genesys.generate.prompts import render_ids


class SampledTokenLogprobs(LogitsProcessor):
    """A logits processor that records, step by step, the logprob of the token sampled at each step.

    At step t it keeps the raw logits; at step t+1 the token sampled at t is the last of
    `input_ids`, so its logprob (its logit minus the log-sum-exp) is read off then. Memory stays at
    one (batch, vocab) matrix instead of the logits of every step.
    """

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []
        self._logits: torch.Tensor | None = None

    def _record(self, tokens: torch.Tensor) -> None:
        logits = self._logits
        self.steps.append(logits.gather(1, tokens) - logits.logsumexp(dim=1, keepdim=True))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._logits is not None:
            self._record(input_ids[:, -1:])
        self._logits = scores if scores.dtype == torch.float32 else scores.float()
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """The (batch, steps) logprobs of `new_tokens`, the generated part of the sequences."""
        steps = len(self.steps)
        if self._logits is not None and steps < new_tokens.shape[1]:
            self._record(new_tokens[:, steps : steps + 1])
        self._logits = None
        return torch.cat(self.steps, dim=1) if self.steps else new_tokens.new_zeros((new_tokens.shape[0], 0), dtype=torch.float32)


class TransformersBackend:
    """Generation with a transformers causal LM; `batch_size` counts sequences (prompt x sample).

    `dtype` defaults to the checkpoint's own on GPU and float32 on CPU.
    """

    name = "transformers"

    def __init__(
        self,
        model: str,
        sampling: SamplingConfig,
        style: PromptStyle,
        *,
        batch_size: int = 32,
        device: str | None = None,
        dtype: str | None = None,
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.sampling = sampling
        self.style = style
        self.batch_size = batch_size
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        transformers_logging.disable_progress_bar()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
        except OSError as exc:
            raise InputError(f"--model {model!r} cannot be loaded: {exc}") from None
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # On CPU, bfloat16 weights would run far slower than float32 on most processors.
        dtype = dtype or ("float32" if self.device == "cpu" else "auto")
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, **(model_kwargs or {})).to(self.device).eval()
        self.stop_ids = _stop_token_ids(self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id)

    def info(self) -> dict[str, Any]:
        info = {"backend": self.name, "transformers": transformers.__version__, "torch": torch.__version__, "device": self.device}
        if self.device.startswith("cuda"):
            info["gpu"] = torch.cuda.get_device_name(self.device)
        else:
            info["cpu"] = platform.processor() or platform.machine()
        return info

    def close(self) -> None:
        self.model = None

    def generate(self, requests: Iterable[GenerationRequest]) -> Iterator[GenerationResult]:
        requests = list(requests)
        prompts = [render_ids(self.tokenizer, r.messages, self.style) for r in requests]
        # One item per (request, sample), longest prompts first: batches of similar lengths.
        items = sorted(((i, j) for i, r in enumerate(requests) for j in range(r.n)), key=lambda ij: -len(prompts[ij[0]]))
        partial: dict[int, dict[int, Completion]] = {}
        for start in range(0, len(items), self.batch_size):
            batch = items[start : start + self.batch_size]
            completions = self.generate_batch([prompts[i] for i, _ in batch], seed=requests[batch[0][0]].seed + batch[0][1])
            for (i, j), completion in zip(batch, completions):
                partial.setdefault(i, {})[j] = completion
                if len(partial[i]) == requests[i].n:
                    done = partial.pop(i)
                    yield GenerationResult(requests[i], prompts[i], [done[k] for k in range(requests[i].n)])

    def generate_batch(self, prompts: list[list[int]], seed: int) -> list[Completion]:
        """Sample one completion for each prompt (token ids) in one `model.generate` call."""
        encoded = self.tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt").to(self.device)
        recorder = SampledTokenLogprobs()
        sample = self.sampling.temperature > 0
        torch.manual_seed(seed)
        with torch.inference_mode():
            sequences = self.model.generate(
                **encoded,
                do_sample=sample,
                temperature=self.sampling.temperature if sample else None,
                top_p=self.sampling.top_p if sample else None,
                top_k=0 if sample else None,  # 0: no top-k cut, whatever the model's generation_config says
                repetition_penalty=1.0,
                max_new_tokens=self.sampling.max_tokens,
                eos_token_id=sorted(self.stop_ids),
                pad_token_id=self.tokenizer.pad_token_id,
                logits_processor=LogitsProcessorList([recorder]),
            )
        new_tokens = sequences[:, encoded["input_ids"].shape[1] :]
        logprobs = recorder.finish(new_tokens).cpu().tolist()
        return [self._completion(tokens, lps) for tokens, lps in zip(new_tokens.cpu().tolist(), logprobs)]

    def _completion(self, tokens: list[int], logprobs: list[float]) -> Completion:
        end = next((k + 1 for k, t in enumerate(tokens) if t in self.stop_ids), None)
        finish = "length" if end is None else "stop"
        tokens = tokens if end is None else tokens[:end]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(text=text, completion_ids=tokens, logprobs=logprobs[: len(tokens)], finish_reason=finish)


def _stop_token_ids(*candidates: int | list[int] | None) -> set[int]:
    ids: set[int] = set()
    for candidate in candidates:
        if isinstance(candidate, int):
            ids.add(candidate)
        elif candidate:
            ids.update(candidate)
    return ids
