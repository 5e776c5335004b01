"""The built-in generation backends, registered through the `genesys_backends` hook like any plugin's.

Nothing heavy is imported here: each backend's module loads when the backend is built.
"""

from __future__ import annotations

import importlib.util

from genesys.plugins.hookspecs import hookimpl
from genesys.plugins.specs import BackendSpec


def transformers_usable() -> bool:
    """torch and transformers are installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def vllm_usable() -> bool:
    """vLLM is installed and a CUDA GPU is visible."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


@hookimpl
def genesys_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            "vllm",
            "genesys.generate.vllm:VLLMBackend",
            usable=vllm_usable,
            priority=20,
            description="vLLM's offline engine (GPU)",
        ),
        BackendSpec(
            "transformers",
            "genesys.generate.hf:TransformersBackend",
            usable=transformers_usable,
            priority=10,
            description="transformers model.generate (CPU or GPU)",
        ),
        BackendSpec(
            "pipeline",
            "genesys.inference.backend:PipelineBackend",
            description="transformers layers split across processes or machines in a ring",
        ),
        BackendSpec(
            "openai", "genesys.generate.openai:OpenAIBackend", description="an OpenAI-compatible server"
        ),
    ]
