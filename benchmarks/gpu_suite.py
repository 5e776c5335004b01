"""The training figures of `benchmarks/gpu_suite.sh`: per model shape, `genesys train` with a colocated
vLLM engine in bf16 (steps/s, tokens/s, the sampler/trainer logprob mismatch of the first update),
the same with `[parallel] strategy = "fsdp2"` in one process when this build has it, and each run's
peak memory against the `--dry-run` estimate. Random-weight models of real shapes are written here
from their configs (no downloads); the tasks are the toy digit task (`genesys.testing.digits`).

    python benchmarks/gpu_suite.py                     # on a GPU: Qwen2.5-0.5B and 1.5B shapes
    python benchmarks/gpu_suite.py --smoke             # CPU, tiny shapes, transformers backend: the plumbing only
    python benchmarks/gpu_suite.py --backend transformers   # on a GPU without vLLM: the trainer samples itself
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Real models' layer shapes (random weights); the vocabulary is Qwen2.5's.
SHAPES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "layers": 24, "heads": 14, "kv_heads": 2},
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "layers": 28,
        "heads": 12,
        "kv_heads": 2,
    },
    "qwen2.5-7b": {"hidden_size": 3584, "intermediate_size": 18944, "layers": 28, "heads": 28, "kv_heads": 4},
    "smoke": {"hidden_size": 64, "intermediate_size": 128, "layers": 2, "heads": 4, "kv_heads": 2},
}
VOCAB = 151936


def build_model(work: Path, shape: str, smoke: bool) -> Path:
    """A random-weight Qwen2 model of `shape` (its vocabulary padded to Qwen2.5's unless smoke)."""
    from genesys.generate.tiny_model import build_tiny_model

    path = work / f"model-{shape}"
    if not (path / "config.json").exists():
        build_tiny_model(path, model_vocab_size=None if smoke else VOCAB, **SHAPES[shape])
    return path


def has_parallel_strategy() -> bool:
    """Whether this build's `genesys train` has `[parallel] strategy`."""
    from genesys.train import TrainConfig

    return "parallel" in TrainConfig.__dataclass_fields__


def train_config(
    model: Path, out: Path, tasks: Path, args: argparse.Namespace, **extra: Any
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": str(model),
        "output_dir": str(out),
        "progress": False,
        "backend": args.backend,
        "precision": "fp32" if args.smoke else "bf16",
        "data": {"tasks": [str(tasks)]},
        "sampling": {"n": args.samples, "max_tokens": args.max_tokens, "temperature": 1.0},
        "rollout": {"prompts_per_step": args.prompts, "filter_groups": False},
        "optim": {"steps": args.steps, "lr": 1e-6, "micro_batch_tokens": args.budget},
        "checkpoint": {"every": 0},
    }
    if args.backend == "vllm":
        config["backend_options"] = {
            "args": {"gpu_memory_utilization": args.vllm_memory, "max_model_len": 2048}
        }
    config.update(extra)
    return config


def run_training(config: dict[str, Any], label: str) -> dict[str, Any]:
    """Train in a fresh process; its metrics, peak memory and the dry-run estimate."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(config)], capture_output=True, text=True, check=False
    )
    if done.returncode:
        return {"label": label, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["label"] = label
    return result


def child(config_json: str) -> None:
    import torch

    from genesys.train import TrainConfig, train
    from genesys.train.memory_plan import plan_memory

    config = TrainConfig.load(None, json.loads(config_json))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    estimate = plan_memory(config, 1, device)
    started = time.perf_counter()
    result = train(config)
    seconds = time.perf_counter() - started
    metrics = result.metrics[1:] or result.metrics  # the first step includes the engine's warm-up
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    print(
        json.dumps(
            {
                "steps_per_s": len(metrics) / sum(m["step_seconds"] for m in metrics),
                "tokens_per_s": sum(m["tokens"] for m in metrics) / sum(m["step_seconds"] for m in metrics),
                "mismatch": result.metrics[0].get("logprob_mismatch"),
                "peak": peak,
                "estimate": estimate.total,
                "estimate_training": estimate.total - estimate.parts["engine"],
                "seconds": seconds,
            }
        )
    )


def print_header() -> None:
    print(
        f"| {'run':<34} | {'steps/s':>7} | {'tokens/s':>9} | {'mismatch':>8} | {'peak GiB':>8} | {'estimate GiB':>12} | {'peak/est':>8} |"
    )
    print(f"|{'-' * 36}|{'-' * 9}|{'-' * 11}|{'-' * 10}|{'-' * 10}|{'-' * 14}|{'-' * 10}|", flush=True)


def print_row(row: dict[str, Any]) -> None:
    """One run's line of the table, printed as soon as the run ends."""
    if "error" in row:
        print(f"| {row['label']:<34} | failed: {' '.join(row['error'])}", flush=True)
        return
    # CUDA's counter sees the trainer's tensors, not vLLM's own allocations: compare without the engine.
    estimate = row["estimate_training"]
    peak = row["peak"]
    ratio = f"{peak / estimate:.2f}" if peak else "n/a"
    mismatch = row["mismatch"]
    print(
        f"| {row['label']:<34} | {row['steps_per_s']:>7.3f} | {row['tokens_per_s']:>9.0f} | "
        f"{mismatch if mismatch is None else f'{mismatch:.4f}':>8} | "
        f"{peak / 2**30 if peak else float('nan'):>8.2f} | {estimate / 2**30:>12.2f} | {ratio:>8} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, transformers backend")
    parser.add_argument(
        "--backend",
        choices=["vllm", "transformers"],
        default="vllm",
        help="the sampler: a colocated vLLM engine, or the trainer's own model (a GPU machine without vLLM)",
    )
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=None)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--budget", type=int, default=16384, help="optim.micro_batch_tokens")
    parser.add_argument("--vllm-memory", type=float, default=0.3)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.smoke:
        args.backend = "transformers"
        args.steps, args.prompts, args.samples = (
            min(args.steps, 2),
            min(args.prompts, 2),
            min(args.samples, 2),
        )
        args.max_tokens, args.budget = min(args.max_tokens, 8), min(args.budget, 256)
    shapes = args.shapes or (["smoke"] if args.smoke else ["qwen2.5-0.5b", "qwen2.5-1.5b"])
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-suite-"))
    work.mkdir(parents=True, exist_ok=True)
    from genesys.testing import digits

    os.environ["GENESYS_PLUGINS"] = digits.PLUGIN  # the children load the digit task's verifier
    tasks = digits.digit_tasks(work / "tasks.jsonl")
    print_header()
    for shape in shapes:
        model = build_model(work, shape, args.smoke)
        config = train_config(model, work / f"run-{shape}", tasks, args)
        print_row(run_training(config, f"{shape} {config['precision']} {config['backend']}"))
        if has_parallel_strategy():
            config = train_config(
                model, work / f"run-{shape}-fsdp2", tasks, args, parallel={"strategy": "fsdp2"}
            )
            print_row(run_training(config, f"{shape} fsdp2 (1 process)"))
        else:
            print_row(
                {"label": f"{shape} fsdp2 (1 process)", "error": ["[parallel] strategy not in this build"]}
            )


if __name__ == "__main__":
    main()
