"""Peak memory of one training step against batch size and micro-batch size.

Each configuration trains one offline step (from synthetic recorded rollouts: random prompt and
completion ids, random rewards) in a fresh process and reports the process's peak resident
memory (CPU) or peak CUDA memory (GPU). Memory should follow the micro-batch, not the batch: a
batch 8x larger at the same micro-batch size costs about the same.

    python benchmarks/train_memory.py                                  # CPU, 32k-token vocabulary
    python benchmarks/train_memory.py --device cuda --hidden 896 --layers 24 --vocab 151936 \
        --completion-tokens 1024                                       # Qwen2.5-0.5B-sized, random weights
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def write_rollouts(
    path: Path, groups: int, group_size: int, prompt_tokens: int, completion_tokens: int, vocab: int
) -> None:
    rng = random.Random(0)
    with open(path, "w") as handle:
        for group in range(groups):
            prompt = [rng.randrange(3, vocab) for _ in range(prompt_tokens)]
            for sample in range(group_size):
                row = {
                    "problem_id": f"g{group}",
                    "prompt": f"task {group}",
                    "task_type": "synthetic",
                    "prompt_ids": prompt,
                    "completion_ids": [rng.randrange(3, vocab) for _ in range(completion_tokens)],
                    "completion_logprobs": [-10.0] * completion_tokens,
                    "reward": float(sample % 2),
                }
                handle.write(json.dumps(row) + "\n")


def one_step(args: argparse.Namespace) -> None:
    """In the child process: train one step and print the peak memory in MiB."""
    import torch

    from genesys.train import TrainConfig, train

    config = TrainConfig.load(
        None,
        {
            "model": args.model,
            "output_dir": args.output,
            "progress": False,
            "data": {"rollouts": [args.rollouts]},
            "sampling": {"n": args.group_size},
            "rollout": {"prompts_per_step": args.groups},
            "optim": {"steps": 1, "micro_batch_size": args.micro_batch},
            "checkpoint": {"every": 0},
            "backend_options": {"device": args.device} if args.device else {},
        },
    )
    train(config)
    if args.device and args.device.startswith("cuda"):
        print(torch.cuda.max_memory_allocated() / 2**20)
    else:
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--vocab", type=int, default=32_000, help="the model's vocabulary (output layer) size"
    )
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--device", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--rollouts", help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--micro-batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        one_step(args)
        return

    from genesys.generate.tiny_model import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="train-memory-"))
    model = build_tiny_model(
        work / "model",
        hidden_size=args.hidden,
        layers=args.layers,
        heads=max(1, args.hidden // 64),
        model_vocab_size=args.vocab,
    )
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}; sequences of {args.prompt_tokens} + {args.completion_tokens} tokens"
    )
    print(f"{'sequences':>9} {'micro-batch':>11} {'peak MiB':>9}")
    for groups, micro in ((2, 2), (2, 16), (16, 2), (16, 16)):
        rollouts = work / f"rollouts-{groups}.jsonl"
        if not rollouts.exists():
            write_rollouts(
                rollouts, groups, args.group_size, args.prompt_tokens, args.completion_tokens, args.vocab
            )
        child = [
            sys.executable,
            __file__,
            "--child",
            "--model",
            str(model),
            "--output",
            str(work / f"run-{groups}-{micro}"),
            "--rollouts",
            str(rollouts),
            "--groups",
            str(groups),
            "--micro-batch",
            str(micro),
        ]
        if args.device:
            child += ["--device", args.device]
        peak = float(
            subprocess.run(child, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        )
        print(f"{groups * args.group_size:>9} {micro:>11} {peak:>9.0f}")


if __name__ == "__main__":
    main()
