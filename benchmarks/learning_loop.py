"""Does the loop learn? The learning demo (`genesys.demo`), then the same RL run with `lr = 0`.

    python benchmarks/learning_loop.py demo-out/learning

Runs the whole demo (a tiny model built and trained from nothing: `genesys sft`, held-out
evaluation, `genesys filter`, `genesys train` with GRPO, evaluation again), then the control: the
same GRPO run from the same SFT model on the same tasks with `optim.lr = 0`, evaluated on the same
held-out tasks (OUT/summary-lr0.json, OUT/report-lr0/). The stages both runs share (model, SFT,
evaluations, task pool) run once: each genesys command resumes what is already done. Prints the accuracies (with their standard errors
over tasks) and each stage's time, writes OUT/learning_loop.json, and exits 1 unless, on at least
200 held-out tasks, RL gains at least `--min-gain` points over SFT and the control gains at most
`--max-control-gain` points.
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
    print_summary(control)
    gain, control_gain = learned["rl_gain_points"], control["rl_gain_points"]
    report = {
        "heldout_tasks": learned["heldout_tasks"],
        "samples_per_task": learned["samples_per_task"],
        **{
            key: learned[key]
            for stage in ("before_sft", "after_sft", "after_rl")
            for key in (f"accuracy_{stage}", f"accuracy_{stage}_stderr")
        },
        "accuracy_after_rl_lr0": control["accuracy_after_rl"],
        "accuracy_after_rl_lr0_stderr": control["accuracy_after_rl_stderr"],
        "rl_gain_points": gain,
        "rl_gain_stderr_points": learned["rl_gain_stderr_points"],
        "control_gain_points": control_gain,
        "control_gain_stderr_points": control["rl_gain_stderr_points"],
        "stages": learned["stages"]
        + [s for s in control["stages"] if "lr 0" in s["name"] or "lr0" in s["name"]],
        "load_average": learned["load_average"] + control["load_average"],
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
