"""Asynchronous training (max_staleness = 1) against the synchronous loop (max_staleness = 0), on Ray.

Both runs train the same budget of steps on the toy digit task (`genesys.testing.digits`, the
`digit_share` verifier) with a tiny random-weight model, on the same local Ray instance with the same rollout
and verifier actors; only `async.max_staleness` differs. Every group is trained (no group
filtering) and the learning rate is 0 unless `--lr` says otherwise: the pipeline (generation,
verification, the optimizer step, publishing and loading weights) runs in full, but both runs
sample from the same policy, so every step does the same work (a learning policy changes its
completion lengths, and the two runs' policies drift apart). Each run's first step (actors
starting, models loading) is left out. Printed per run:

- steps/s: steps over the wall time of the steps (the trainer's `step_seconds`, waiting included);
- trainer wait: the fraction of that time the trainer waited for rollouts (`trainer_wait_s`);
- generation idle: the fraction of the rollout workers' time not spent generating
  (1 - `generation_busy_s` / (workers x wall)).

Generation and training should take similar time for the comparison the target is about (k = 1 at
least 1.5x the steps/s of k = 0); `--max-tokens` and `--samples` move generation, `--hidden` and
`--layers` both. Every process runs one thread (OMP_NUM_THREADS=1), so one rollout worker and the
trainer use one core each.

    python benchmarks/async_vs_sync.py                   # 2-core CPU machine
    python benchmarks/async_vs_sync.py --steps 40 --workers 2
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

from genesys.testing import digits


def run(
    args: argparse.Namespace, model: Path, tasks: Path, out: Path, staleness: int
) -> list[dict[str, Any]]:
    from genesys.train import TrainConfig, train

    config = TrainConfig.load(
        None,
        {
            "model": str(model),
            "output_dir": str(out),
            "backend": "transformers",
            "progress": False,
            "data": {"tasks": [str(tasks)]},
            "sampling": {"n": args.samples, "max_tokens": args.max_tokens, "seed": 0},
            "rollout": {"prompts_per_step": args.prompts, "filter_groups": False},
            "optim": {
                "steps": args.steps,
                "lr": args.lr,
                "max_grad_norm": 1.0,
                "micro_batch_size": args.prompts * args.samples,
            },
            "checkpoint": {"every": 0},
            "verify": {"workers": 1},
            "async": {"max_staleness": staleness},
            "cluster": {
                "backend": "ray",
                "rollout_workers": args.workers,
                "verifier_workers": 1,
                "verifier_cpus": 0,
            },
        },
    )
    return train(config).metrics


def summary(metrics: list[dict[str, Any]], workers: int) -> dict[str, float]:
    steady = metrics[1:]
    wall = sum(m["step_seconds"] for m in steady)
    return {
        "steps_per_s": len(steady) / wall,
        "trainer_wait": sum(m["trainer_wait_s"] for m in steady) / wall,
        "generation_idle": 1 - sum(m["generation_busy_s"] for m in steady) / (workers * wall),
        "staleness_mean": mean([m["staleness_mean"] for m in steady if m["staleness_mean"] is not None]),
        "weights_load_s": max(
            (m["weights_load_s"] for m in steady if m["weights_load_s"] is not None), default=float("nan")
        ),
        "reward_last": metrics[-1]["reward_mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--workers", type=int, default=1, help="rollout workers")
    parser.add_argument("--prompts", type=int, default=4, help="groups per step")
    parser.add_argument("--samples", type=int, default=8, help="samples per group")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--lr",
        type=float,
        default=0.0,
        help="0: both runs sample from the same policy, so they do the same work per step",
    )
    args = parser.parse_args()

    os.environ.update(OMP_NUM_THREADS="1", GENESYS_PLUGINS=digits.PLUGIN)
    import ray
    import torch

    from genesys.cluster import NAMESPACE, forwarded_environment
    from genesys.generate.tiny_model import build_tiny_model

    torch.set_num_threads(1)
    ray.init(
        num_cpus=args.workers + 2,
        include_dashboard=False,
        log_to_driver=False,
        namespace=NAMESPACE,
        runtime_env={"env_vars": forwarded_environment() | {"OMP_NUM_THREADS": "1"}},
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "model", hidden_size=args.hidden, layers=args.layers)
        tasks = digits.digit_tasks(root / "tasks.jsonl", 64)
        results = {k: summary(run(args, model, tasks, root / f"k{k}", k), args.workers) for k in (0, 1)}
    ray.shutdown()
    print(
        f"{args.steps} steps (first left out), {args.workers} rollout worker(s), {args.prompts}x{args.samples} rollouts of <= {args.max_tokens} tokens, "
        f"model hidden {args.hidden} x {args.layers} layers"
    )
    print(
        f"{'max_staleness':>13} {'steps/s':>8} {'trainer wait':>13} {'generation idle':>16} {'staleness':>10} {'publish->loaded s':>18} {'last reward':>12}"
    )
    for k, r in results.items():
        print(
            f"{k:>13} {r['steps_per_s']:>8.3f} {r['trainer_wait']:>13.1%} {r['generation_idle']:>16.1%} {r['staleness_mean']:>10.2f} {r['weights_load_s']:>18.3f} {r['reward_last']:>12.3f}"
        )
    print(f"speed-up of max_staleness = 1: {results[1]['steps_per_s'] / results[0]['steps_per_s']:.2f}x")


if __name__ == "__main__":
    main()
