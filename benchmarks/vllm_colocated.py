"""A colocated vLLM engine as `genesys train` uses it: start time, in-place weight update time and
sampling throughput, on a random-weight model of a realistic shape (no hub needed).

    python benchmarks/vllm_colocated.py                      # Qwen2.5-0.5B's attention and vocabulary, CPU
    python benchmarks/vllm_colocated.py --dtype bfloat16 --engine-arg gpu_memory_utilization=0.3   # a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="default: a 1 GiB KV cache (CPU)",
    )
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from genesys.config import PromptStyle, SamplingConfig
    from genesys.generate.backend import GenerationRequest, iterate
    from genesys.generate.tiny_model import build_tiny_model
    from genesys.generate.vllm import VLLMBackend
    from genesys.tasks.prompts import build_messages

    engine_args = {"dtype": args.dtype, "max_model_len": 1024}
    engine_args.update(
        (key, json.loads(value)) for key, _, value in (item.partition("=") for item in args.engine_arg)
    )
    if not torch.cuda.is_available():
        engine_args.setdefault(
            "kv_cache_memory_bytes", 1 << 30
        )  # vLLM's CPU default claims most of the memory
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(
            Path(tmp) / "model",
            hidden_size=args.hidden,
            layers=args.layers,
            heads=args.heads,
            model_vocab_size=args.vocab,
        )
        started = time.perf_counter()
        backend = VLLMBackend(str(path), PromptStyle(), colocate=True, engine_args=engine_args)
        print(f"engine start: {time.perf_counter() - started:.1f} s")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
        for _ in range(args.updates):
            started = time.perf_counter()
            asyncio.run(backend.update_weights(list(model.named_parameters())))
            print(f"weight update: {time.perf_counter() - started:.2f} s")
        sampling = SamplingConfig(n=args.samples, max_tokens=args.max_tokens, temperature=1.0)
        requests = [
            GenerationRequest(
                str(i),
                build_messages(f"Write digits {i}"),
                list(range(args.samples)),
                seed=i,
                sampling=sampling,
            )
            for i in range(args.tasks)
        ]
        started = time.perf_counter()
        tokens = sum(
            len(c.completion_ids or ())
            for result in iterate(backend.generate(requests))
            for c in result.completions
        )
        seconds = time.perf_counter() - started
        print(f"sampling: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.0f} tokens/s")
        backend.close()


if __name__ == "__main__":
    main()
