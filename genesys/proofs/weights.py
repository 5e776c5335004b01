"""The hash of a model's weights that rows with proofs carry, the same whatever dtype loaded them.

Every parameter is hashed as float32 in name order: bfloat16 and float16 values are exact in float32,
so a bf16 checkpoint hashes alike when run in bf16 on a GPU and in float32 on a CPU validator, and a
single changed weight changes the hash.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def weights_sha256(model: Any) -> str:
    """sha256 over the names, shapes and float32 values of `model`'s parameters (tied ones once)."""
    hasher = hashlib.sha256()
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters(), key=lambda item: item[0]):
            values = parameter.detach().to(device="cpu", dtype=torch.float32).contiguous()
            hasher.update(f"{name}:{tuple(values.shape)}\x00".encode())
            hasher.update(values.numpy())
    return hasher.hexdigest()


def checkpoint_weights_sha256(model: str) -> str:
    """`weights_sha256` of the checkpoint `model` (a hub name or a path), loaded on the CPU for the
    hash alone: for an engine whose own copy of the weights is laid out otherwise (vLLM fuses them)."""
    from transformers import AutoModelForCausalLM

    return weights_sha256(AutoModelForCausalLM.from_pretrained(model, dtype="auto"))
