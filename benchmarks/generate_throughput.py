"""Tokens/s of a genesys generation backend against the plain library call, same prompts, same run.

`--backend transformers` (default): the transformers backend against a plain `model.generate`
loop. Both sample the same prompts (rendered with the chat template) with the same batch size and
settings; the plain loop takes the prompts in their given order and keeps nothing but the tokens.
The backend also sorts by length, records per-token logprobs and builds completions.

`--backend vllm`: `genesys generate --backend vllm` end to end through its Python entry
(`run_generation`: tasks read from a file, rollout rows with token ids and logprobs written to a
jsonl file) against a plain vLLM script, `LLM(...).generate(prompts, [SamplingParams(n, temperature,
top_p, max_tokens, seed)])`, on prompts rendered with the same chat template, each task sampled with
the seed genesys gives it (so both sides make the same tokens). Each side has its own engine, built
with the same `--engine-arg`s (genesys adds its own defaults: prefix caching, the engine seed and
`logprobs_mode="processed_logprobs"`). The plain script runs twice per round: as written above
(tokens only), and asking for the sampled token's logprob (`logprobs=0`), which genesys records.
Engine start is outside the timing; the prefix cache is reset before each round.

Prints each side's rate (best and range over `--repeats` alternating rounds) and the ratio of the
best rates (goal: transformers >= 1.0x, vLLM >= 0.97x: the pipeline adds nothing, or under 3%).

    python benchmarks/generate_throughput.py                      # stand-in tiny model, CPU
    python benchmarks/generate_throughput.py --shape qwen2.5-1.5b \\
        --device cuda --dtype bfloat16 --batch-size 64 --prompts 256 --max-tokens 256   # Qwen2.5-1.5B-sized, random weights
    python benchmarks/generate_throughput.py --backend vllm --hidden 128 --heads 2   # vLLM's CPU build, tiny model
    python benchmarks/generate_throughput.py --backend vllm --shape qwen2.5-1.5b --dtype bfloat16 \\
        --prompts 512 --samples 8 --max-tokens 512 --engine-arg gpu_memory_utilization=0.4   # a GPU: two engines side by side
    python benchmarks/generate_throughput.py --model PATH        # an existing model
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# The plain sides of the vLLM comparison, and genesys's.
PLAIN_VLLM = "plain vLLM script"
PLAIN_VLLM_LOGPROBS = "plain vLLM + logprobs=0"
GENESYS_VLLM = "genesys generate --backend vllm"


def plain_generate_loop(
    model, tokenizer, prompt_ids: list[list[int]], *, batch_size: int, max_tokens: int, device: str
) -> int:
    """The baseline: batches in the given order, left padding, one `model.generate` call each; returns tokens made."""
    tokens = 0
    stop = tokenizer.eos_token_id
    for start in range(0, len(prompt_ids), batch_size):
        batch = tokenizer.pad(
            {"input_ids": prompt_ids[start : start + batch_size]}, padding=True, return_tensors="pt"
        ).to(device)
        with torch.inference_mode():
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=stop,
            )
        for row in out[:, batch["input_ids"].shape[1] :].tolist():
            tokens += next((k + 1 for k, t in enumerate(row) if t == stop), len(row))
    return tokens


def timed_rounds(
    sides: dict[str, Callable[[], int]],
    repeats: int,
    *,
    before: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every side once untimed (warm-up), then `repeats` rounds of each in turn; returns each
    side's tokens/s per round by wall clock and by this process's CPU time. `before` runs ahead of
    each timed run, untimed (e.g. a cache reset); `after` ends it, timed (e.g. a GPU synchronize)."""
    for run in sides.values():
        run()
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, run in sides.items():
            before()
            started, started_cpu = time.perf_counter(), time.process_time()
            tokens = run()
            after()
            wall[name].append(tokens / (time.perf_counter() - started))
            cpu[name].append(tokens / (time.process_time() - started_cpu))
    return wall, cpu


def describe(rates: list[float]) -> str:
    """The best rate and the range over rounds."""
    return f"{max(rates):10,.1f} tokens/s (rounds {min(rates):,.1f}-{max(rates):,.1f})"


def bundled_tasks(count: int) -> list[dict[str, Any]]:
    """A realistic mix of prompt lengths: the bundled tasks, shuffled, repeated up to `count` (each copy a task of its own)."""
    from genesys.tasks.samples import load_sample_file

    tasks = load_sample_file("math_tasks.jsonl") + load_sample_file("code_tasks.jsonl")
    random.Random(0).shuffle(tasks)
    return [{**tasks[i % len(tasks)], "problem_id": f"bench-{i}"} for i in range(count)]


def compare_transformers(args: argparse.Namespace, model_path: str) -> None:
    """The transformers backend against a plain `model.generate` loop (CPU time beside wall time)."""
    from genesys.generate.backend import GenerationRequest, PromptStyle, SamplingConfig, iterate
    from genesys.generate.hf import TransformersBackend
    from genesys.tasks.prompts import build_messages, render_ids

    sampling = SamplingConfig(n=1, max_tokens=args.max_tokens, temperature=1.0, top_p=1.0, seed=0)
    style = PromptStyle()
    # In this thread, as the plain loop: two threads running torch in one process slow each other down.
    backend = TransformersBackend(
        model_path,
        style,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        worker_thread=False,
    )
    messages = [build_messages(task["prompt"]) for task in bundled_tasks(args.prompts)]
    requests = [GenerationRequest(f"t{i}", m, [0], seed=i, sampling=sampling) for i, m in enumerate(messages)]
    prompt_ids = [render_ids(backend.tokenizer, m, style) for m in messages]

    def run_backend() -> int:
        return sum(len(c.completion_ids) for r in iterate(backend.generate(requests)) for c in r.completions)

    def run_plain() -> int:
        return plain_generate_loop(
            backend.model,
            backend.tokenizer,
            prompt_ids,
            batch_size=args.batch_size,
            max_tokens=args.max_tokens,
            device=args.device,
        )

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    plain, genesys = "plain model.generate loop", "genesys transformers backend"
    # By wall clock and by this process's CPU time (steadier on a machine shared with other work;
    # on an idle machine the two agree).
    wall, cpu = timed_rounds({plain: run_plain, genesys: run_backend}, args.repeats, before=sync, after=sync)
    config = backend.model.config
    print(
        f"model: hidden={config.hidden_size} layers={config.num_hidden_layers} vocab={config.vocab_size} on {args.device} ({args.dtype})"
    )
    print(
        f"prompts={args.prompts} batch_size={args.batch_size} max_tokens={args.max_tokens} torch threads={torch.get_num_threads()}"
    )
    for name in (genesys, plain):
        print(f"{name:32s} {describe(wall[name])} wall   {max(cpu[name]):10,.1f} tokens/CPU-s")
    print(
        f"ratio backend / plain: {max(wall[genesys]) / max(wall[plain]):.2f}x wall, {max(cpu[genesys]) / max(cpu[plain]):.2f}x CPU time (goal >= 1.0x)"
    )


def vllm_engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """The engine arguments both sides get: dtype, context length, `--engine-arg`s, and on CPU a
    1 GiB KV cache (vLLM's CPU default claims most of the machine's memory) and genesys's CPU
    defaults (no chunked prefill, without which seeded sampling fails there)."""
    from genesys.generate.vllm import platform_defaults

    engine_args: dict[str, Any] = {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        **platform_defaults(),
    }
    engine_args.update(
        (key, json.loads(value)) for key, _, value in (item.partition("=") for item in args.engine_arg)
    )
    if not torch.cuda.is_available():
        engine_args.setdefault("kv_cache_memory_bytes", 1 << 30)
    return engine_args


def compare_vllm(args: argparse.Namespace, model_path: str, workdir: Path) -> None:
    """`genesys generate --backend vllm` (its Python entry, end to end) against a plain vLLM script."""
    from vllm import LLM, SamplingParams

    from genesys.config import GenerateConfig, PromptStyle, SamplingConfig
    from genesys.data.identity import request_seed
    from genesys.generate.runner import plan_tasks, run_generation, select_tasks
    from genesys.generate.vllm import VLLMBackend
    from genesys.tasks.prompts import build_messages, render_text

    tasks_file = workdir / "tasks.jsonl"
    tasks = bundled_tasks(args.prompts)
    tasks_file.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    engine_args = vllm_engine_args(args)
    sampling = SamplingConfig(n=args.samples, max_tokens=args.max_tokens, temperature=1.0, top_p=1.0, seed=0)
    runs = itertools.count()

    def config() -> GenerateConfig:
        output = workdir / f"rollouts-{next(runs)}.jsonl"
        return GenerateConfig(
            tasks=[str(tasks_file)],
            model=model_path,
            output=output,
            backend="vllm",
            sampling=sampling,
            progress=False,
        )

    backend = VLLMBackend(model_path, PromptStyle(), engine_args=engine_args)
    plain_llm = LLM(model=model_path, seed=0, **engine_args)
    # The plain script samples each task with the seed genesys gives it, so both make the same tokens.
    plans, _, _ = plan_tasks(select_tasks(config()), config(), set())
    prompts = [
        render_text(backend.tokenizer, build_messages(plan.row["prompt"]), PromptStyle()) for plan in plans
    ]
    seeds = [request_seed(sampling.seed, plan.key) for plan in plans]
    tokens: dict[str, int] = {}

    def counted(name: str, run: Callable[[], int]) -> Callable[[], int]:
        def run_and_count() -> int:
            tokens[name] = run()
            return tokens[name]

        return run_and_count

    def run_genesys() -> int:
        return run_generation(config(), backend=backend).tokens

    def plain(logprobs: int | None) -> Callable[[], int]:
        params = [
            SamplingParams(
                n=args.samples,
                temperature=1.0,
                top_p=1.0,
                max_tokens=args.max_tokens,
                seed=seed,
                logprobs=logprobs,
            )
            for seed in seeds
        ]
        return lambda: sum(
            len(c.token_ids)
            for out in plain_llm.generate(prompts, params, use_tqdm=False)
            for c in out.outputs
        )

    def reset_caches() -> None:
        backend.llm.reset_prefix_cache()
        plain_llm.reset_prefix_cache()

    sides = {PLAIN_VLLM: plain(None), GENESYS_VLLM: run_genesys, PLAIN_VLLM_LOGPROBS: plain(0)}
    wall, _ = timed_rounds(
        {name: counted(name, run) for name, run in sides.items()}, args.repeats, before=reset_caches
    )
    info = backend.info()
    backend.close()
    print_vllm_report(args, info, engine_args, wall, tokens)


def print_vllm_report(
    args: argparse.Namespace,
    info: dict[str, Any],
    engine_args: dict[str, Any],
    wall: dict[str, list[float]],
    tokens: dict[str, int],
) -> None:
    """Each side's rate and genesys's ratio to both plain runs, best round against best round and
    round by round (the engine runs in its own process, so wall time only)."""
    device = info.get("gpu") or f"CPU ({info.get('cpu')})"
    print(f"vLLM {info['vllm']}, torch {info['torch']}, {device}; engine args {engine_args}")
    print(
        f"prompts={args.prompts} samples={args.samples} max_tokens={args.max_tokens}, {args.repeats} timed rounds"
    )
    for name, rates in wall.items():
        print(f"{name:32s} {describe(rates)}, {tokens[name]:,} tokens a run")
    for plain in (PLAIN_VLLM, PLAIN_VLLM_LOGPROBS):
        per_round = [g / p for g, p in zip(wall[GENESYS_VLLM], wall[plain])]
        print(
            f"genesys / {plain}: {max(wall[GENESYS_VLLM]) / max(wall[plain]):.3f}x best rounds, "
            f"{min(per_round):.3f}-{max(per_round):.3f}x round by round (goal >= 0.97x)"
        )


def main() -> None:
    from genesys.generate.tiny_model import SHAPES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--model", help="model path (default: build a random-weight model of the given size)")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        help="a real model's layer shapes (random weights), over --hidden/--layers/--heads/--vocab",
    )
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--vocab", type=int, help="pad the model's vocabulary to this size (e.g. 151936, as Qwen2.5)"
    )
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument(
        "--samples", type=int, default=1, help="vllm: completions per prompt (SamplingParams n)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="transformers: sequences per batch (vllm: all prompts in one engine call)",
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="transformers: torch device (vLLM runs where its build runs)",
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=2048, help="vllm: the engines' context length")
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="vllm: an engine argument for both sides",
    )
    parser.add_argument("--repeats", type=int, default=2, help="alternating timed rounds per side")
    args = parser.parse_args()
    if args.backend == "transformers" and args.samples != 1:
        parser.error(
            "--samples is for --backend vllm (the plain model.generate loop samples once per prompt)"
        )

    from genesys.generate.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="generate-throughput-") as tmp:
        shape = (
            SHAPES[args.shape]
            if args.shape
            else {
                "hidden_size": args.hidden,
                "layers": args.layers,
                "heads": args.heads,
                "model_vocab_size": args.vocab,
            }
        )
        model_path = args.model or str(build_tiny_model(Path(tmp) / "model", **shape))
        if args.backend == "vllm":
            compare_vllm(args, model_path, Path(tmp))
        else:
            compare_transformers(args, model_path)


if __name__ == "__main__":
    main()
