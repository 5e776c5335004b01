"""Does the loop learn? The learning demo (`genesys.demo`), then the same RL run with `lr = 0`.

    python benchmarks/learning_loop.py demo-out/learning

Runs the whole demo (a tiny model built and trained from nothing: `genesys sft`, held-out
evaluation, `genesys filter`, `genesys train` with GRPO, evaluation again), then the control: the
same GRPO run from the same SFT model on the same tasks with `optim.lr = 0`, evaluated on the same
held-out tasks. The stages both runs share (model, SFT, evaluations, task pool) run once: each
genesys command resumes what is already done. Prints the accuracies and each stage's time, and
exits 1 unless RL gains at least `--min-gain` points over SFT on at least 200 held-out tasks and the
control gains at most `--max-control-gain` points.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from genesys.demo import TINY, Demo, print_summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out", type=Path, help="output directory (shared with the demo: finished stages are reused)"
    )
    parser.add_argument(
        "--min-gain", type=float, default=10.0, help="points RL must gain over SFT (default 10)"
    )
    parser.add_argument(
        "--max-control-gain", type=float, default=2.0, help="points the lr = 0 run may gain (default 2)"
    )
    args = parser.parse_args()
    learned = Demo(args.out, TINY).run()
    print_summary(learned)
    control = Demo(args.out, TINY).run(rl_lr=0.0)
    gain = 100 * (learned["accuracy_after_rl"] - learned["accuracy_after_sft"])
    control_gain = 100 * (control["accuracy_after_rl"] - control["accuracy_after_sft"])
    report = {
        "heldout_tasks": learned["heldout_tasks"],
        "accuracy_before_sft": learned["accuracy_before_sft"],
        "accuracy_after_sft": learned["accuracy_after_sft"],
        "accuracy_after_rl": learned["accuracy_after_rl"],
        "accuracy_after_rl_lr0": control["accuracy_after_rl"],
        "rl_gain_points": gain,
        "control_gain_points": control_gain,
    }
    print(json.dumps(report, indent=2))
    (args.out / "learning_loop.json").write_text(json.dumps(report, indent=2) + "\n")
    failures = []
    if learned["heldout_tasks"] < 200:
        failures.append(f"only {learned['heldout_tasks']} held-out tasks (at least 200)")
    if gain < args.min_gain:
        failures.append(f"RL gained {gain:.1f} points over SFT (at least {args.min_gain:g} expected)")
    if control_gain > args.max_control_gain:
        failures.append(
            f"the lr = 0 control gained {control_gain:.1f} points (at most {args.max_control_gain:g})"
        )
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
