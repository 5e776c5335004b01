"""What every generation backend takes and returns, and how a backend is chosen."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from genesys.config import PromptStyle, SamplingConfig
from genesys.errors import InputError

__all__ = ["Backend", "Completion", "GenerationRequest", "GenerationResult", "PromptStyle", "SamplingConfig", "create_backend", "resolve_backend_name"]

BACKENDS = ("auto", "vllm", "transformers", "openai")


@dataclass
class GenerationRequest:
    """The missing samples of one task: `sample_indices` says which samples they are."""

    key: str
    messages: list[dict[str, str]]
    sample_indices: list[int]
    seed: int

    @property
    def n(self) -> int:
        return len(self.sample_indices)


@dataclass
class Completion:
    """One sampled completion. `logprobs[i]` is the logprob of `completion_ids[i]`."""

    text: str
    completion_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None


@dataclass
class GenerationResult:
    """The completions of one request, in the order of its `sample_indices`."""

    request: GenerationRequest
    prompt_ids: list[int] | None
    completions: list[Completion] = field(default_factory=list)


class Backend(Protocol):
    """A generation backend. `generate` yields results as they finish, in any order."""

    name: str

    def generate(self, requests: Iterable[GenerationRequest]) -> Iterator[GenerationResult]: ...

    def info(self) -> dict[str, Any]:
        """Versions and devices, for the rollouts' `machine_info`."""
        ...

    def close(self) -> None: ...


def vllm_usable() -> bool:
    """vLLM is installed and a CUDA GPU is visible."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def resolve_backend_name(name: str) -> str:
    """`auto` becomes `vllm` when it can run here, else `transformers`."""
    if name not in BACKENDS:
        raise InputError(f"--backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "auto":
        return "vllm" if vllm_usable() else "transformers"
    return name


def create_backend(name: str, model: str, sampling: SamplingConfig, style: PromptStyle, options: dict[str, Any]) -> Backend:
    """Build the backend `name` (already resolved) for `model`; `options` are its own settings."""
    if name == "vllm":
        from genesys.generate.vllm import VLLMBackend

        return VLLMBackend(model, sampling, style, **options)
    if name == "transformers":
        from genesys.generate.hf import TransformersBackend

        return TransformersBackend(model, sampling, style, **options)
    from genesys.generate.openai import OpenAIBackend

    return OpenAIBackend(model, sampling, style, **options)
