"""Peak memory of training steps: bounded by `optim.micro_batch_tokens`, and against the dry-run estimate.

Every configuration trains two offline steps (synthetic recorded rollouts: random ids, random
rewards) in a fresh process. Peak memory on CPU is the process's peak resident set size
(`ru_maxrss`) less its resident size just before training starts (torch and transformers imported,
no model loaded), with glibc's mmap threshold fixed at 64 KiB (`MALLOC_MMAP_THRESHOLD_`) so that a
freed tensor goes back to the system and the resident size follows live tensors; on a GPU it is
`torch.cuda.max_memory_allocated`. Two steps, so the second backward pass runs beside AdamW's state.

Table 1 (budget): one model with a Qwen2.5 vocabulary (151,936), several batches. Packed
micro-batches of `--budget` tokens keep the peak flat whatever the batch size or the sequence
length; padded micro-batches of 8 sequences grow with the longest sequence; and without chunked
vocabulary logprobs (`--no-chunk` rows: one chunk for the whole micro-batch) the `[tokens, vocab]`
logits come back.

Table 2 (estimate): three model shapes, the measured peak against `genesys train --dry-run`'s
estimate (`genesys.train.memory_plan`).

Table 3 (loading): the peak host memory of each of two processes (torchrun, gloo) while they load a
bf16 model and shard it with fsdp2 (peak resident size since just before loading, `VmHWM` after
resetting it, less the resident size then): as `genesys train` does it (`genesys.train.loading`: built
empty on every rank, read by rank 0 alone and sent out a tensor at a time) against the baseline of
every rank reading the whole model in fp32 and sharding it; alternate rounds, medians.

    python benchmarks/train_memory.py                  # tables 1 and 2, CPU (about 10 minutes on 2 cores)
    python benchmarks/train_memory.py --table estimate --shapes small
    python benchmarks/train_memory.py --table loading  # table 3 (small and Qwen2.5-0.5B shapes)
    python benchmarks/train_memory.py --table loading --loading-shapes layered --rounds 1
    python benchmarks/train_memory.py --device cuda    # GPU: peak CUDA memory
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 2**20
# Model shapes of the estimate table: hidden, layers, heads, intermediate, vocabulary.
SHAPES = {
    "small": {
        "hidden_size": 256,
        "layers": 4,
        "heads": 4,
        "intermediate_size": 1024,
        "model_vocab_size": 32000,
    },
    "wide": {
        "hidden_size": 768,
        "layers": 6,
        "heads": 12,
        "intermediate_size": 2048,
        "model_vocab_size": 32000,
    },
    "deep": {
        "hidden_size": 512,
        "layers": 12,
        "heads": 8,
        "intermediate_size": 1536,
        "model_vocab_size": 50000,
    },
}
LOADING_PATHS = ("every rank reads", "rank 0 reads")
# Mostly layers (a 512-token vocabulary): no single tensor is a large part of the model.
LAYERED_SHAPE = {
    "hidden_size": 512,
    "layers": 8,
    "heads": 8,
    "intermediate_size": 2048,
    "model_vocab_size": 512,
}
BUDGET_SHAPE = {
    "hidden_size": 256,
    "layers": 4,
    "heads": 4,
    "intermediate_size": 1024,
    "model_vocab_size": 151936,
}


def write_rollouts(
    path: Path, sequences: int, prompt_tokens: int, completion_tokens: int, vocab: int
) -> None:
    """`sequences` recorded rollouts in groups of 4, half rewarded."""
    rng = random.Random(0)
    with open(path, "w") as handle:
        for index in range(sequences):
            group = index // 4
            row = {
                "problem_id": f"g{group}",
                "prompt": f"task {group}",
                "prompt_ids": [rng.randrange(3, vocab) for _ in range(prompt_tokens)],
                "completion_ids": [rng.randrange(3, vocab) for _ in range(completion_tokens)],
                "completion_logprobs": [-10.0] * completion_tokens,
                "reward": float(index % 2),
            }
            handle.write(json.dumps(row) + "\n")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Start this process's peak resident size afresh (Linux: `clear_refs` 5), so that it leaves out
    what imports held before."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def peak_resident_bytes() -> int:
    """This process's peak resident size since it started or since `reset_peak` (VmHWM)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(args: argparse.Namespace) -> None:
    """In a fresh process: the estimate, then two training steps; prints both as JSON."""
    import torch

    from genesys.train import TrainConfig, train
    from genesys.train.memory_plan import plan_memory

    if args.no_chunk:
        import genesys.train.logprobs as logprobs

        logprobs.LOGITS_CHUNK_BYTES = 2**62  # the whole micro-batch in one chunk
    config = TrainConfig.load(None, json.loads(args.config))
    estimate = plan_memory(config, 1, torch.device(args.device or "cpu"))
    baseline = resident_bytes()
    train(config)
    if args.device and args.device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    print(json.dumps({"peak": peak, "estimate": estimate.total, "params": estimate.facts.params}))


def load_child(args: argparse.Namespace) -> None:
    """One rank of two: load `--model` by `--load` and shard it; prints the peak growth of its resident size."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from genesys.train.distributed import close_world, init_world
    from genesys.train.loading import sharded_pretrained
    from genesys.train.parallel import device_mesh, shard_model

    world = init_world()
    cpu = torch.device("cpu")
    mesh = device_mesh(world, "fsdp2", cpu)
    with torch.device("meta"):  # imports the model's code before the baseline, which then counts only weights
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model))
    baseline = resident_bytes()
    reset_peak()
    if args.load == LOADING_PATHS[0]:
        loaded = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model = shard_model(loaded, mesh, "fp32")
    else:
        model = sharded_pretrained(args.model, world, mesh, "fp32", cpu)
    peak = peak_resident_bytes() - baseline
    full = sum(parameter.numel() * 4 for parameter in model.parameters())  # whole, in fp32
    print("LOADED", json.dumps({"rank": world.rank, "peak": peak, "full": full}), flush=True)
    close_world(world)


def run_load_child(model: Path, path: str) -> dict[int, dict]:
    """Both ranks' results of loading `model` by `path`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [__file__, "--load-child", "--model", str(model), "--load", path]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    results = [
        json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("LOADED")
    ]
    by_rank = {result["rank"]: result for result in results}
    if set(by_rank) != {0, 1}:  # a rank's line missing or garbled: show what came instead
        raise RuntimeError(
            f"loading by {path!r}: results of ranks {sorted(by_rank)}, not 0 and 1\n"
            f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
        )
    return by_rank


def run_child(
    work: Path, name: str, model: Path, rollouts: Path, optim: dict, args: argparse.Namespace, no_chunk=False
):
    config = {
        "model": str(model),
        "output_dir": str(work / f"run-{name}"),
        "progress": False,
        "sampling": {"n": 4},
        "data": {"rollouts": [str(rollouts)]},
        "rollout": {"prompts_per_step": 10**6},  # set per run below
        "optim": {"steps": 2, "lr": 1e-5, **optim},
        "checkpoint": {"every": 0},
        "backend_options": {"device": args.device} if args.device else {},
    }
    rows = sum(1 for _ in open(rollouts))
    config["rollout"]["prompts_per_step"] = rows // 8  # two steps over the file's groups of 4
    command = [sys.executable, __file__, "--child", "--config", json.dumps(config)]
    if args.device:
        command += ["--device", args.device]
    if no_chunk:
        command.append("--no-chunk")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"train_memory.py: the {name} run failed:\n{done.stderr.strip()[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(work: Path, name: str, shape: dict) -> Path:
    from genesys.generate.tiny_model import build_tiny_model

    path = work / f"model-{name}"
    if not path.exists():
        build_tiny_model(path, **{"kv_heads": max(1, shape["heads"] // 2), **shape})
    return path


def budget_table(work: Path, args: argparse.Namespace) -> None:
    model = build(work, "budget", BUDGET_SHAPE)
    vocab = BUDGET_SHAPE["model_vocab_size"]
    print(
        f"\nTable 1: peak memory against the batch (model: hidden {BUDGET_SHAPE['hidden_size']}, "
        f"{BUDGET_SHAPE['layers']} layers, vocabulary {vocab}; micro_batch_tokens {args.budget})"
    )
    print(
        f"| {'sequences':>9} | {'tokens each':>11} | {'micro-batches':<26} | {'peak MiB':>8} | {'estimate MiB':>12} |"
    )
    print(f"|{'-' * 11}|{'-' * 13}|{'-' * 28}|{'-' * 10}|{'-' * 14}|")
    cases = [(16, 64, 192), (64, 64, 192), (16, 64, 960)]
    for index, (sequences, prompt, completion) in enumerate(cases):
        rollouts = work / f"rollouts-{sequences}-{prompt}-{completion}.jsonl"
        write_rollouts(rollouts, sequences * 2, prompt, completion, vocab)
        runs = [
            ("packed", {"micro_batch_tokens": args.budget}, False),
            ("padded, 8 sequences", {"micro_batch_size": 8}, False),
        ]
        if index == 0:
            runs.append(("packed, logits not chunked", {"micro_batch_tokens": args.budget}, True))
        for label, optim, no_chunk in runs:
            result = run_child(
                work, f"b{sequences}-{completion}-{len(label)}", model, rollouts, optim, args, no_chunk
            )
            print(
                f"| {sequences:>9} | {prompt + completion:>11} | {label:<26} | {result['peak'] / MIB:>8.0f} | "
                f"{result['estimate'] / MIB:>12.0f} |",
                flush=True,
            )


def estimate_table(work: Path, args: argparse.Namespace) -> None:
    print(
        f"\nTable 2: measured peak against the dry-run estimate (micro_batch_tokens {args.budget}, 2 steps)"
    )
    print(
        f"| {'shape':<6} | {'parameters':>10} | {'measured MiB':>12} | {'estimate MiB':>12} | {'estimate/measured':>17} |"
    )
    print(f"|{'-' * 8}|{'-' * 12}|{'-' * 14}|{'-' * 14}|{'-' * 19}|")
    for name in args.shapes:
        shape = SHAPES[name]
        model = build(work, name, shape)
        rollouts = work / f"rollouts-{name}.jsonl"
        write_rollouts(rollouts, args.sequences, 64, 192, shape["model_vocab_size"])
        result = run_child(work, f"e-{name}", model, rollouts, {"micro_batch_tokens": args.budget}, args)
        params = result["params"]
        ratio = result["estimate"] / result["peak"]
        print(
            f"| {name:<6} | {params / 1e6:>9.1f}M | {result['peak'] / MIB:>12.0f} | {result['estimate'] / MIB:>12.0f} | {ratio:>17.2f} |",
            flush=True,
        )


def loading_table(work: Path, args: argparse.Namespace) -> None:
    from genesys.generate.tiny_model import SHAPES as REAL_SHAPES

    shapes = {"small": SHAPES["small"], "layered": LAYERED_SHAPE, "qwen2.5-0.5b": REAL_SHAPES["qwen2.5-0.5b"]}
    print(
        f"\nTable 3: peak host memory per rank loading a bf16 model into 2 fsdp2 processes ({args.rounds} rounds, medians)"
    )
    print(
        f"| {'shape':<12} | {'fp32 MiB':>8} | {'rank':>4} | {'every rank reads':>16} | {'rank 0 reads':>12} | {'ratio':>5} |"
    )
    print(f"|{'-' * 14}|{'-' * 10}|{'-' * 6}|{'-' * 18}|{'-' * 14}|{'-' * 7}|")
    for name in args.loading_shapes:
        model = bf16_model(work, name, shapes[name])
        peaks: dict[tuple[str, int], list[int]] = {}
        for _ in range(args.rounds):  # alternate the two ways, so that drift hits both alike
            for path in LOADING_PATHS:
                for rank, result in run_load_child(model, path).items():
                    peaks.setdefault((path, rank), []).append(result["peak"])
                    full = result["full"]
        for rank in (0, 1):
            every, rank0 = (statistics.median(peaks[path, rank]) for path in LOADING_PATHS)
            print(
                f"| {name:<12} | {full / MIB:>8.0f} | {rank:>4} | {every / MIB:>16.0f} | {rank0 / MIB:>12.0f} | "
                f"{rank0 / every:>5.2f} |",
                flush=True,
            )


def bf16_model(work: Path, name: str, shape: dict) -> Path:
    """A random-weight model of `shape` saved in bfloat16 (as real checkpoints are)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = work / f"model-{name}-bf16"
    if not path.exists():
        source = build(work, name, shape)
        AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(path)
        AutoTokenizer.from_pretrained(source).save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--table", choices=("budget", "estimate", "both", "loading"), default="both")
    parser.add_argument("--budget", type=int, default=2048, help="optim.micro_batch_tokens")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument(
        "--sequences",
        type=int,
        default=32,
        help="recorded rollouts of each shape in the estimate table (two steps over them; the peak "
        "follows the micro-batch, not their number: fewer run sooner)",
    )
    parser.add_argument(
        "--loading-shapes",
        nargs="+",
        choices=("small", "layered", "qwen2.5-0.5b"),
        default=["small", "qwen2.5-0.5b"],
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the loading table")
    parser.add_argument("--device", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--load", choices=LOADING_PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--no-chunk", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.load_child:
        load_child(args)
        return
    work = Path(tempfile.mkdtemp(prefix="train-memory-"))
    if args.table == "loading":
        print("peak memory: peak RSS less the RSS before loading, per rank")
        loading_table(work, args)
        return
    print(
        f"peak memory: {'CUDA max_memory_allocated' if args.device else 'peak RSS less the RSS before training'}"
    )
    if args.table in ("budget", "both"):
        budget_table(work, args)
    if args.table in ("estimate", "both"):
        estimate_table(work, args)


if __name__ == "__main__":
    main()
