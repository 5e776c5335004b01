"""The hash of a model's weights that rows with proofs carry, the same whatever dtype loaded them.

Every parameter is hashed as float32 in name order: bfloat16 and float16 values are exact in float32,
so a bf16 checkpoint hashes alike when run in bf16 on a GPU and in float32 on a CPU validator, and a
single changed weight changes the hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import torch


def _sha256(named_values: Iterable[tuple[str, torch.Tensor]]) -> str:
    hasher = hashlib.sha256()
    for name, tensor in named_values:
        values = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous()
        hasher.update(f"{name}:{tuple(values.shape)}\x00".encode())
        hasher.update(values.numpy())
    return hasher.hexdigest()


def weights_sha256(model: Any) -> str:
    """sha256 over the names, shapes and float32 values of `model`'s parameters (tied ones once)."""
    with torch.no_grad():
        return _sha256(sorted(model.named_parameters(), key=lambda item: item[0]))


def checkpoint_weights_sha256(model: str, dtype: str | torch.dtype = "auto") -> str:
    """`weights_sha256` of the checkpoint `model` (a hub name or a path) loaded in `dtype`, streamed
    tensor by tensor from its safetensors files, so the whole model is never in memory: for an engine
    whose own copy of the weights is laid out otherwise (vLLM fuses them), and for a pipeline's first
    stage, which holds only its share of the layers."""
    from transformers import AutoConfig

    from genesys.checkpoints import Checkpoint, meta_model, tied_names, weights_dtype

    config = AutoConfig.from_pretrained(model)
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else weights_dtype(model, config, dtype)
    skeleton = meta_model(config, torch_dtype)
    names = tied_names(skeleton)
    with Checkpoint(model) as checkpoint:
        return _sha256(
            (name, checkpoint.read(next((a for a in names[id(p)] if a in checkpoint), name)).to(torch_dtype))
            for name, p in sorted(skeleton.named_parameters(), key=lambda item: item[0])
        )
