"""The vLLM backend: the offline `LLM` engine with prefix caching and tensor parallelism (GPU only).

vLLM is imported when the backend is built. Prompts are sent as token ids rendered with the
model's chat template, and `SamplingParams(n=..., logprobs=0)` returns the logprob of each sampled
token, so rollouts carry the same fields as with the other backends. The engine reports them after
temperature and top-p (`logprobs_mode="processed_logprobs"`), from the distribution actually sampled.
New weights reach every engine worker through `collective_rpc` and the model's own `load_weights`.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from genesys.errors import InputError
from genesys.generate.backend import Completion, GenerationRequest, GenerationResult, PromptStyle, Weights, next_weights_version
from genesys.generate.prompts import render_ids


class WeightLoader:
    """Methods added to each vLLM worker (`worker_extension_cls`), called through `collective_rpc`."""

    def load_genesys_weights(self, weights: list[tuple[str, Any]]) -> None:
        """Load (name, tensor) pairs, named as in the Hugging Face checkpoint, into this worker's model
        shard; the model's `load_weights` does the sharding and the fusing of projections."""
        self.model_runner.model.load_weights(weights=weights)


def sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float] | None:
    """The logprob of each sampled token from vLLM's per-position `{token_id: Logprob}` mappings."""
    if logprobs is None:
        return None
    return [float(position[token].logprob) for token, position in zip(token_ids, logprobs)]


def result_from_request_output(request: GenerationRequest, output: Any, weights_version: int = 0) -> GenerationResult:
    """Map a vLLM `RequestOutput` (its `CompletionOutput`s in `outputs`) to a GenerationResult."""
    completions = []
    for choice in sorted(output.outputs, key=lambda c: c.index):
        token_ids = list(choice.token_ids)
        completions.append(
            Completion(
                text=choice.text,
                completion_ids=token_ids,
                logprobs=sampled_logprobs(token_ids, choice.logprobs),
                finish_reason=choice.finish_reason,
            )
        )
    return GenerationResult(request, list(output.prompt_token_ids or []), completions, weights_version)


class VLLMBackend:
    """Generation with vLLM's offline engine; `batch_size` tasks go to the engine per call.

    `engine_args` go to `vllm.LLM` (e.g. `gpu_memory_utilization`, `max_model_len`) over the
    defaults here. `seed` seeds the engine; each request carries its own sampling seed.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        style: PromptStyle,
        *,
        tensor_parallel_size: int = 1,
        batch_size: int = 1024,
        seed: int = 0,
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise InputError(f"--backend vllm needs vLLM on a CUDA machine (pip install 'genesys[vllm]'): {exc}") from None

        self.style = style
        self.batch_size = batch_size
        args = {
            "enable_prefix_caching": True,
            "seed": seed,
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": f"{WeightLoader.__module__}.{WeightLoader.__qualname__}",
            **(engine_args or {}),
        }
        self.llm = LLM(model=model, tensor_parallel_size=tensor_parallel_size, **args)
        self.tokenizer = self.llm.get_tokenizer()
        self.tensor_parallel_size = tensor_parallel_size
        self.weights_version = 0
        self._engine_lock = threading.Lock()  # one engine call or one weight update at a time

    def info(self) -> dict[str, Any]:
        import torch
        import vllm

        return {
            "backend": self.name,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0),
            "tensor_parallel_size": self.tensor_parallel_size,
        }

    def close(self) -> None:
        self.llm = None

    async def update_weights(self, weights: Weights, version: int | None = None) -> None:
        """Load `weights` (Hugging Face names) into every engine worker, after the running engine call.

        The tensors travel with the RPC message: fine for a colocated trainer and small models; a
        broadcast over NCCL is the transport for large ones. The prefix cache, computed with the old
        weights, is dropped.
        """
        await asyncio.to_thread(self._load_weights, list(weights.items() if isinstance(weights, Mapping) else weights), version)

    def _load_weights(self, weights: list[tuple[str, Any]], version: int | None) -> None:
        with self._engine_lock:
            new_version = next_weights_version(self.weights_version, version)
            self.llm.collective_rpc("load_genesys_weights", args=(weights,))
            self.llm.reset_prefix_cache()
            self.weights_version = new_version

    def sampling_params(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams

        sampling = request.sampling
        return SamplingParams(
            n=request.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=request.seed,
            logprobs=0,
        )

    def _run_chunk(self, chunk: list[GenerationRequest]) -> tuple[list[Any], int]:
        """One engine call with the engine to itself: its outputs and the weights version that made them."""
        prompts = [{"prompt_token_ids": render_ids(self.tokenizer, r.messages, self.style)} for r in chunk]
        with self._engine_lock:
            return self.llm.generate(prompts, [self.sampling_params(r) for r in chunk], use_tqdm=False), self.weights_version

    async def generate(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]:
        iterator = iter(requests)
        while chunk := list(itertools.islice(iterator, self.batch_size)):
            outputs, version = await asyncio.to_thread(self._run_chunk, chunk)
            for request, output in zip(chunk, outputs):
                yield result_from_request_output(request, output, version)
