"""The transformers backend: batched decoding on CPU or GPU, with per-token logprobs.

Prompts are sorted by length and padded on the left, so a batch wastes little compute on padding;
requests with other sampling settings go in other batches. The logprob kept for each completion
token is that of the sampled token under the distribution it was sampled from: the model's logits
after temperature and top-p (the behaviour policy an importance ratio needs). Greedy decoding
(temperature 0) keeps the logprob under the untempered logits.

Each batch is decoded by `genesys.generate.decoding.decode`: what `model.generate` samples, bit for
bit, with the [sampling] settings alone, at a fraction of its per-token CPU cost.

With `proofs`, a forward hook records the final hidden state that produced each new token, and
every completion gets its TOPLOC proofs (`genesys.proofs`) and the settings a validator needs.
"""

from __future__ import annotations

import asyncio
import platform
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from typing import Any, TypeVar

import torch
import transformers

from genesys.config import ProofConfig
from genesys.generate.backend import (
    Completion,
    GenerationRequest,
    GenerationResult,
    PromptStyle,
    SamplingConfig,
    Weights,
    next_weights_version,
)
from genesys.generate.decoding import (
    SeededSampler,
    Step,
    TokenPicker,
    TokenSampler,
    decode,
    forward_step,
    left_padded,
    step_function,
)
from genesys.models import load_causal_lm, sampling_warpers, stop_token_ids
from genesys.threads import ThreadTuner, forward_probe

T = TypeVar("T")
TUNE_EVERY = 4  # batches between two measurements of the worker's CPU thread count


class TransformersBackend:
    """Generation with a transformers causal LM; `batch_size` counts sequences (prompt x sample).

    `dtype` defaults to the checkpoint's own on GPU and float32 on CPU. The model runs one batch at a
    time, in one long-lived worker thread (the event loop stays free for other work meanwhile) or,
    with `worker_thread=False`, in the caller's thread: a caller with nothing to overlap (the trainer)
    should ask for that, as torch's CPU thread pool is per calling thread and two pools on the same
    cores (the trainer's and the worker's) slow each other down. The worker is always the same
    thread, which also loads the model: a new thread per batch builds a new pool each time, and ran a
    small model three times slower on 2 cores. On the CPU the worker measures its thread count every
    few batches (`genesys.threads.ThreadTuner`: on a busy 2-core machine one thread generated 7x
    faster than two); without a worker the caller's count stands. `update_weights` copies new
    weights into the model between two batches. `proofs` turns on TOPLOC proofs of every completion.
    """

    name = "transformers"

    def __init__(
        self,
        model: str,
        style: PromptStyle,
        *,
        batch_size: int = 32,
        device: str | None = None,
        dtype: str | None = None,
        model_kwargs: dict[str, Any] | None = None,
        worker_thread: bool = True,
        proofs: ProofConfig | None = None,
    ) -> None:
        self.model_name = model
        self.style = style
        self.worker_thread = worker_thread
        self._worker = (
            ThreadPoolExecutor(1, thread_name_prefix="genesys-transformers") if worker_thread else None
        )
        self.batch_size = batch_size
        # Loaded by the thread that will run it, so torch builds no thread pool in this one.
        load = partial(load_causal_lm, model, device, dtype, model_kwargs)
        self.device, self.tokenizer, self.model = (
            load() if self._worker is None else self._worker.submit(load).result()
        )
        self.stop_ids = stop_token_ids(self.model.generation_config, self.tokenizer)
        self._threads = (
            ThreadTuner.for_device(
                torch.device(self.device),
                forward_probe(self.model, len(self.tokenizer), self.device),
                TUNE_EVERY,
            )
            if worker_thread
            else None
        )
        self._batches_run = 0
        self._step: Step | None = None  # chosen at the first batch (`step_function`), in the model's thread
        self.weights_version = 0
        self._model_lock = threading.Lock()  # one batch or one weight update at a time
        self.proofs = proofs
        self._proof_settings: dict[str, Any] | None = None
        if proofs is not None:
            from genesys.proofs.toploc import proof_settings_for, require_toploc

            require_toploc()
            self.proofs = proof_settings_for(proofs, self.model.config.get_text_config().hidden_size)
            self._proof_settings = self._describe_proofs()

    def _describe_proofs(self) -> dict[str, Any]:
        """What a validator needs besides the proofs: their shape, dtype, and the model and its weights' hash."""
        from genesys.proofs.toploc import PROOF_DTYPE
        from genesys.proofs.weights import weights_sha256

        return {
            "topk": self.proofs.topk,
            "decode_batching_size": self.proofs.decode_batching_size,
            "dtype": PROOF_DTYPE,
            "model": self.model_name,
            "weights_sha256": weights_sha256(self.model),
        }

    def info(self) -> dict[str, Any]:
        info = {
            "backend": self.name,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": self.device,
        }
        if self.device.startswith("cuda"):
            info["gpu"] = torch.cuda.get_device_name(self.device)
        else:
            info["cpu"] = platform.processor() or platform.machine()
        return info

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        self.model = None

    async def update_weights(self, weights: Weights, version: int | None = None) -> None:
        """Copy `weights` (by parameter or buffer name) into the live model, after the running batch."""
        await self._call(
            self._load_weights, list(weights.items() if isinstance(weights, Mapping) else weights), version
        )

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` in the worker thread, or right here without one."""
        if self._worker is None:
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(self._worker, function, *args)

    def _load_weights(self, weights: list[tuple[str, Any]], version: int | None) -> None:
        with self._model_lock:
            new_version = next_weights_version(self.weights_version, version)
            targets = {
                **dict(self.model.named_parameters(remove_duplicate=False)),
                **dict(self.model.named_buffers(remove_duplicate=False)),
            }
            unknown = [name for name, _ in weights if name not in targets]
            if unknown:
                raise ValueError(
                    f"the model has no parameter {unknown[0]!r} ({len(unknown)} unknown names); nothing was loaded"
                )
            mismatched = [
                (name, tuple(t.shape), tuple(targets[name].shape))
                for name, t in weights
                if tuple(t.shape) != tuple(targets[name].shape)
            ]
            if mismatched:
                name, given, expected = mismatched[0]
                raise ValueError(
                    f"weight {name!r} has shape {given}, the model's has {expected}; nothing was loaded"
                )
            with torch.no_grad():
                for name, tensor in weights:
                    targets[name].copy_(tensor)
            self.weights_version = new_version
            if self.proofs is not None:
                self._proof_settings = self._describe_proofs()

    async def generate(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]:
        requests = list(requests)
        prompts = [r.prompt_token_ids(self.tokenizer, self.style) for r in requests]
        partial: dict[int, dict[int, Completion]] = {}
        versions: dict[int, int] = {}
        for batch in batches(requests, prompts, self.batch_size):
            first, sample = batch[0]
            completions, version = await self._call(
                self._run_batch,
                [prompts[i] for i, _ in batch],
                requests[first].seed + sample,
                requests[first].sampling,
                [(requests[i].seed, requests[i].sample_indices[j]) for i, j in batch],
            )
            for (i, j), completion in zip(batch, completions):
                partial.setdefault(i, {})[j] = completion
                versions[i] = min(versions.get(i, version), version)
                if len(partial[i]) == requests[i].n:
                    done = partial.pop(i)
                    yield GenerationResult(
                        requests[i], prompts[i], [done[k] for k in range(requests[i].n)], versions.pop(i)
                    )

    def _run_batch(
        self, prompts: list[list[int]], seed: int, sampling: SamplingConfig, keys: list[tuple[int, int]]
    ) -> tuple[list[Completion], int]:
        """One batch with the model to itself: its completions and the weights version that made them."""
        with self._model_lock:
            if self._threads is not None:
                self._threads.maybe_tune(self._batches_run)
            self._batches_run += 1
            return self.generate_batch(prompts, seed, sampling, keys), self.weights_version

    def generate_batch(
        self,
        prompts: list[list[int]],
        seed: int,
        sampling: SamplingConfig,
        keys: list[tuple[int, int]] | None = None,
    ) -> list[Completion]:
        """Sample one completion for each prompt (token ids) in one batch (`decode`); with
        sampling proofs, prompt i's tokens are drawn by the seeded sampler from `keys[i]` (its request
        seed and sample index) instead of from `seed`."""
        input_ids, attention_mask = left_padded(prompts, self.tokenizer.pad_token_id, self.device)
        sampler = self._sampler(seed, sampling, keys)
        pick = TokenPicker(
            sampler,
            sampling_warpers(sampling),
            self.stop_ids,
            self.tokenizer.pad_token_id,
            len(prompts),
            input_ids.device,
        )
        capture = self._capture()
        with torch.inference_mode(), capture:
            new_tokens = decode(
                self.model, input_ids, attention_mask, sampling.max_tokens, pick, self._decode_step()
            )
        logprobs = sampler.logprobs().cpu().tolist()
        completions = [
            make_completion(self.tokenizer, self.stop_ids, tokens, lps)
            for tokens, lps in zip(new_tokens.cpu().tolist(), logprobs)
        ]
        if self.proofs is not None:
            self._attach_proofs(completions, capture.per_step())
        if isinstance(sampler, SeededSampler):
            from genesys.proofs.sampling import SAMPLER

            for completion in completions:
                completion.sampler = SAMPLER
        return completions

    def _decode_step(self) -> Step:
        """How each new token's forward pass runs: through the model's forward when proofs record
        its base model's outputs (a hook on that forward), else the fastest exact step."""
        if self.proofs is not None:
            return forward_step(self.model)
        if self._step is None:
            self._step = step_function(self.model)
        return self._step

    def _sampler(
        self, seed: int, sampling: SamplingConfig, keys: list[tuple[int, int]] | None
    ) -> TokenSampler:
        """The seeded sampler when this backend writes sampling proofs, else one drawing from `seed`."""
        if self.proofs is not None and self.proofs.sampling:
            if keys is None:
                raise ValueError("sampling proofs need each prompt's request seed and sample index")
            return SeededSampler(keys, sampling.temperature)
        return TokenSampler(
            torch.Generator(self.device).manual_seed(seed) if sampling.temperature > 0 else None
        )

    def _capture(self) -> Any:
        """The hook recording the hidden states proofs are built from (nothing without proofs)."""
        if self.proofs is None:
            return nullcontext()
        from genesys.proofs.hf_capture import FinalHiddenStates

        return FinalHiddenStates(self.model, last_only=True)

    def _attach_proofs(self, completions: list[Completion], hidden: torch.Tensor) -> None:
        """Give each completion the proofs of its tokens' hidden states (batch, steps, hidden)."""
        from genesys.proofs.toploc import as_proof_dtype, build_proofs

        for completion, states in zip(completions, as_proof_dtype(hidden)):
            completion.proofs = build_proofs(states[: len(completion.completion_ids)], self.proofs)
            completion.proof_settings = self._proof_settings


def batches(
    requests: list[GenerationRequest], prompts: list[list[int]], batch_size: int
) -> Iterator[list[tuple[int, int]]]:
    """(request, sample) items in batches of one sampling setting each, longest prompts first."""
    groups: dict[tuple[int, float, float], list[tuple[int, int]]] = {}
    for i, request in enumerate(requests):
        s = request.sampling
        groups.setdefault((s.max_tokens, s.temperature, s.top_p), []).extend((i, j) for j in range(request.n))
    for items in groups.values():
        items.sort(key=lambda ij: -len(prompts[ij[0]]))
        for start in range(0, len(items), batch_size):
            yield items[start : start + batch_size]


def make_completion(
    tokenizer: Any, stop_ids: set[int], tokens: list[int], logprobs: list[float]
) -> Completion:
    """A completion of sampled `tokens`, cut after its first stop token ("stop"), else "length"."""
    end = next((k + 1 for k, t in enumerate(tokens) if t in stop_ids), None)
    finish = "length" if end is None else "stop"
    tokens = tokens if end is None else tokens[:end]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return Completion(
        text=text, completion_ids=tokens, logprobs=logprobs[: len(tokens)], finish_reason=finish
    )
