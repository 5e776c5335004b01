"""Weight distribution to rollout workers through Ray's object store.

After each optimizer step the trainer publishes its weights once (`publish`: one `ray.put` of the
CPU tensors, with the version and a checksum of their bytes); every worker fetches the same object
(from the node's shared memory, or pulled across machines by Ray, which serves it from every node
that already holds a copy) and loads it only when the checksum of what arrived matches
(`verified_weights`), so a worker never loads a partial or damaged version.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class PublishedWeights:
    """One published version: the object holding the tensors, their checksum, when it was published."""

    version: int
    checksum: str
    ref: Any  # a Ray ObjectRef of a `Weights` dict
    published_at: float = field(default_factory=time.time)


def checksum(weights: Weights) -> str:
    """A digest of every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def cpu_weights(named_parameters: Iterable[tuple[str, torch.Tensor]]) -> Weights:
    """A detached CPU copy of the parameters, as the object store keeps them."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in named_parameters}


def publish(ray: Any, named_parameters: Iterable[tuple[str, torch.Tensor]], version: int) -> PublishedWeights:
    """Put the weights into the object store once; workers fetch them by reference."""
    weights = cpu_weights(named_parameters)
    return PublishedWeights(version, checksum(weights), ray.put(weights))


def verified_weights(weights: Weights, expected: str, version: int) -> Weights:
    """`weights` when their checksum is `expected`; a ValueError (nothing to load) otherwise."""
    found = checksum(weights)
    if found != expected:
        raise ValueError(
            f"weights version {version} arrived with checksum {found}, published as {expected}; not loaded"
        )
    return weights
