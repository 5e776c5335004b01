"""The vLLM backend: the offline `LLM` engine with prefix caching and tensor parallelism (GPU only).

vLLM is imported when the backend is built. Prompts are sent as token ids rendered with the
model's chat template, and `SamplingParams(n=..., logprobs=0)` returns the logprob of each sampled
token, so rollouts carry the same fields as with the other backends.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from genesys.errors import InputError
from genesys.generate.backend import Completion, GenerationRequest, GenerationResult, PromptStyle, SamplingConfig
from genesys.generate.prompts import render_ids


def sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float] | None:
    """The logprob of each sampled token from vLLM's per-position `{token_id: Logprob}` mappings."""
    if logprobs is None:
        return None
    return [float(position[token].logprob) for token, position in zip(token_ids, logprobs)]


def result_from_request_output(request: GenerationRequest, output: Any) -> GenerationResult:
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
    return GenerationResult(request, list(output.prompt_token_ids or []), completions)


class VLLMBackend:
    """Generation with vLLM's offline engine; `batch_size` tasks go to the engine per call.

    `engine_args` go to `vllm.LLM` unchanged (e.g. `gpu_memory_utilization`, `max_model_len`).
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        sampling: SamplingConfig,
        style: PromptStyle,
        *,
        tensor_parallel_size: int = 1,
        batch_size: int = 1024,
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise InputError(f"--backend vllm needs vLLM on a CUDA machine (pip install 'genesys[vllm]'): {exc}") from None

        self.sampling = sampling
        self.style = style
        self.batch_size = batch_size
        args = {"enable_prefix_caching": True, "seed": sampling.seed, **(engine_args or {})}
        self.llm = LLM(model=model, tensor_parallel_size=tensor_parallel_size, **args)
        self.tokenizer = self.llm.get_tokenizer()
        self.tensor_parallel_size = tensor_parallel_size

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

    def sampling_params(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            n=request.n,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_tokens=self.sampling.max_tokens,
            seed=request.seed,
            logprobs=0,
        )

    def generate(self, requests: Iterable[GenerationRequest]) -> Iterator[GenerationResult]:
        iterator = iter(requests)
        while chunk := list(itertools.islice(iterator, self.batch_size)):
            prompts = [{"prompt_token_ids": render_ids(self.tokenizer, r.messages, self.style)} for r in chunk]
            outputs = self.llm.generate(prompts, [self.sampling_params(r) for r in chunk], use_tqdm=False)
            for request, output in zip(chunk, outputs):
                yield result_from_request_output(request, output)
