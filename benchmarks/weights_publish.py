"""Publishing weights to rollout workers: the trainer's side and the worker's check, before and after.

Before: a full fp32 host copy of every parameter and one blake2b digest over all of them (what
`genesys.cluster.weights` did), checked again in full by each worker. After: each tensor gathered,
cast to the engine's dtype (bf16 here; fp32 engines get the CPU parameters without any copy) and
given an XXH3-128 digest as it goes; each worker checks the per-tensor digests. Ray's own copy into
its object store (`ray.put`) is the same in both and left out. Rounds alternate; medians are printed.

    python benchmarks/weights_publish.py                 # 64M parameters (256 MiB in fp32)
    python benchmarks/weights_publish.py --params 500e6  # a Qwen2.5-0.5B-sized state
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch

from genesys.cluster.weights import host_weights, verified_weights


def old_checksum(weights: dict[str, torch.Tensor]) -> str:
    """The former full-model digest: blake2b over every tensor's name, dtype, shape and bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def old_publish(named: list[tuple[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], str]:
    weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in named}
    return weights, old_checksum(weights)


def parameters(total: float, layer: int) -> list[tuple[str, torch.Tensor]]:
    """Random fp32 parameters of about `total` elements in tensors of `layer` elements."""
    count = max(1, int(total) // layer)
    return [(f"layers.{i}.weight", torch.nn.Parameter(torch.randn(layer))) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", type=float, default=64e6)
    parser.add_argument("--tensor", type=int, default=4 * 2**20, help="elements per tensor")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    named = parameters(args.params, args.tensor)
    gib = sum(t.numel() for _, t in named) * 4 / 2**30
    timings: dict[str, list[float]] = {
        key: [] for key in ("before", "after bf16", "after fp32", "check before", "check after")
    }
    for _ in range(args.rounds):
        started = time.perf_counter()
        weights, digest = old_publish(named)
        timings["before"].append(time.perf_counter() - started)
        started = time.perf_counter()
        assert old_checksum(weights) == digest
        timings["check before"].append(time.perf_counter() - started)
        del weights
        started = time.perf_counter()
        weights, digests = host_weights(named, torch.bfloat16)
        timings["after bf16"].append(time.perf_counter() - started)
        started = time.perf_counter()
        verified_weights(weights, digests, 1)
        timings["check after"].append(time.perf_counter() - started)
        del weights
        started = time.perf_counter()
        host_weights(named)
        timings["after fp32"].append(time.perf_counter() - started)
    medians = {key: statistics.median(values) for key, values in timings.items()}
    print(
        f"{gib:.2f} GiB of fp32 parameters in {len(named)} tensors; medians of {args.rounds} alternating rounds"
    )
    print(f"| {'step':<36} | {'seconds':>8} | {'GiB/s (fp32 GiB)':>16} | {'vs before':>9} |")
    print(f"|{'-' * 38}|{'-' * 10}|{'-' * 18}|{'-' * 11}|")
    rows = [
        ("before: fp32 copy + blake2b", "before", "before"),
        ("after: bf16 cast + XXH3 per tensor", "after bf16", "before"),
        ("after: fp32 engine, no copy + XXH3", "after fp32", "before"),
        ("worker check before: blake2b", "check before", "check before"),
        ("worker check after: XXH3 per tensor", "check after", "check before"),
    ]
    for label, key, baseline in rows:
        seconds = medians[key]
        print(
            f"| {label:<36} | {seconds:>8.3f} | {gib / seconds:>16.2f} | {medians[baseline] / seconds:>8.1f}x |"
        )


if __name__ == "__main__":
    main()
