"""Weights from the trainer to generation engines: gathered one tensor at a time, in the engine's dtype.

`engine_weights` yields the trainer's parameters one by one, each gathered whole from its shards
(a DTensor of fully_shard, a collective every rank joins in the same order) and cast to the
engine's dtype on the trainer's device, so at most one gathered tensor exists beside the shards.
A colocated engine loads them as they come (`genesys.generate.vllm`); nothing goes through host memory.

For rollout workers on Ray, `publish` copies each tensor to the host in the engine's dtype (a CPU
tensor already in that dtype is not copied: the object store's copy is the only one), takes its
digest as it goes, and puts the whole version into Ray's object store once; every worker fetches
the same object (from the node's shared memory, or pulled across machines by Ray) and loads it
only when every tensor's digest matches (`verified_weights`), so a worker never loads a partial or
damaged version. The digest is xxHash's XXH3-128 of each tensor's name, dtype, shape and bytes:
several GB/s, a small fraction of the copy it checks (benchmarks/weights_publish.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash

Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class PublishedWeights:
    """One published version: the object holding the tensors, each tensor's digest, when it was published."""

    version: int
    digests: dict[str, str]
    ref: Any  # a Ray ObjectRef of a `Weights` dict
    published_at: float = field(default_factory=time.time)


def tensor_digest(name: str, tensor: torch.Tensor) -> str:
    """XXH3-128 of a CPU tensor's name, dtype, shape and bytes."""
    digest = xxhash.xxh3_128(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
    if tensor.numel():
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def digests(weights: Weights) -> dict[str, str]:
    """Every tensor's digest, by name."""
    return {name: tensor_digest(name, tensor.cpu()) for name, tensor in weights.items()}


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded parameter (a DTensor's `full_tensor`), else the tensor itself."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if full_tensor is not None else tensor


def engine_weights(
    named_parameters: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of each parameter, detached, gathered whole and in `dtype` (its own by default),
    on the parameter's device, one at a time."""
    for name, parameter in named_parameters:
        with torch.no_grad():
            tensor = gathered(parameter.detach())
            yield name, tensor if dtype is None else tensor.to(dtype)


def host_weights(
    named_parameters: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
) -> tuple[Weights, dict[str, str]]:
    """The parameters on the host in `dtype`, with their digests, one tensor at a time."""
    weights: Weights = {}
    found: dict[str, str] = {}
    for name, tensor in engine_weights(named_parameters, dtype):
        host = tensor.to("cpu")  # no copy for a CPU tensor already in dtype
        weights[name] = host
        found[name] = tensor_digest(name, host)
    return weights, found


def publish(
    ray: Any,
    named_parameters: Iterable[tuple[str, torch.Tensor]],
    version: int,
    dtype: torch.dtype | None = None,
) -> PublishedWeights:
    """Put the weights, in the engines' `dtype`, into the object store once; workers fetch them by reference."""
    weights, found = host_weights(named_parameters, dtype)
    return PublishedWeights(version, found, ray.put(weights))


def verified_weights(weights: Weights, expected: dict[str, str], version: int) -> Weights:
    """`weights` when every tensor's digest is as `expected`; a ValueError (nothing to load) otherwise."""
    if set(weights) != set(expected):
        missing = sorted(set(expected) - set(weights)) or sorted(set(weights) - set(expected))
        raise ValueError(
            f"weights version {version} arrived without the tensors published (first: {missing[0]}); not loaded"
        )
    for name, tensor in weights.items():
        found = tensor_digest(name, tensor)
        if found != expected[name]:
            raise ValueError(
                f"weights version {version}: tensor {name!r} arrived with digest {found}, published as "
                f"{expected[name]}; not loaded"
            )
    return weights
