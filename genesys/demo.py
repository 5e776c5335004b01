"""The learning demo: a model learns arithmetic through genesys' own commands, and the figures show it.

    python -m genesys.demo demo-out/learning              # a tiny model built and trained from nothing, on CPU
    python -m genesys.demo demo-out/learning --model M    # the same loop from a real model (GPU recommended)

Each stage runs a real `genesys` command (or the tiny-model builder) in a subprocess:

1. build: a tiny decoder with random weights and a tokenizer trained on the arithmetic task text;
2. evaluate it on the held-out tasks (`genesys generate --verify`): accuracy before SFT;
3. `genesys sft` on worked solutions of training tasks;
4. evaluate: accuracy after SFT;
5. `genesys generate --verify` on a pool of other training tasks, then `genesys filter` keeps those
   of useful difficulty (pass rate strictly between 0 and 1);
6. `genesys train` (GRPO, online) on them, evaluating the first held-out tasks every few steps;
7. evaluate: accuracy after RL; `genesys report` draws the training curves (reward, held-out
   accuracy, completion length, optimizer), and this module the held-out accuracy of each stage.

The held-out tasks come from `arithmetic:split=heldout`, which shares no problem with any
`split=train` set (`genesys.tasks.arithmetic`). Accuracy is the mean score of `samples` completions
per held-out task, sampled at the training temperature, with its standard error over tasks.
`summary.json` holds the accuracies (`accuracy_before_sft`, `accuracy_after_sft`,
`accuracy_after_rl`, each with `_stderr`), `rl_gain_points` (paired over the tasks, with its
standard error), `heldout_tasks`, and each stage's wall-clock and CPU seconds beside the load
average. `--rl-lr 0` is the control: the same RL run that cannot change the weights, which must
gain nothing (`benchmarks/learning_loop.py` runs both).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ARITHMETIC = "arithmetic:digits=2,ops=+-"
TRAIN = f"{ARITHMETIC},split=train"
HELDOUT = f"{ARITHMETIC},split=heldout,seed=0"
TOKENIZER_TASKS = 2000  # training tasks whose text the tiny model's tokenizer is trained on


@dataclass(frozen=True)
class Settings:
    """The demo's sizes and learning rates; `TINY` trains a model from nothing on 2 CPU cores."""

    heldout_tasks: int = 300
    samples: int = 4  # completions per held-out task
    max_tokens: int = 64
    temperature: float = 1.0
    sft_tasks: int = 4000
    sft_steps: int = 600
    sft_examples_per_step: int = 32
    sft_lr: float = 5e-3
    pool_tasks: int = 400  # training tasks whose pass rate decides which ones RL trains on
    pool_samples: int = 4
    min_pass_rate: float = 0.01  # RL trains on the pool's tasks solved sometimes but not always
    max_pass_rate: float = 0.99
    rl_steps: int = 80
    rl_prompts_per_step: int = 16
    rl_group_size: int = 8
    rl_lr: float = 3e-4
    rl_warmup_steps: int = 3
    eval_every: int = 10  # steps between evaluations during RL (the accuracy curve of the report)
    eval_tasks: int = 100  # the first held-out tasks, evaluated during RL
    eval_samples: int = 2
    micro_batch_size: int = 32
    batch_size: int = 256  # sequences per generation batch (transformers)
    backend: str = "transformers"


TINY = Settings()
# A pretrained model: a short SFT and gentle RL at the usual learning rates, vLLM when it is there.
PRETRAINED = Settings(
    max_tokens=256, sft_steps=50, sft_lr=1e-5, rl_lr=1e-6, rl_steps=40, backend="auto", micro_batch_size=8
)


@dataclass
class Stage:
    name: str
    seconds: float
    cpu_seconds: float


@dataclass
class Demo:
    """One run of the loop into `out`; stages already done (their outputs exist) are not redone."""

    out: Path
    settings: Settings
    model: str | None = None  # None: build the tiny model
    stages: list[Stage] = field(default_factory=list)

    def run_stage(self, name: str, *commands: list[str]) -> None:
        """Run `commands` one after the other, timing them as the stage `name`."""
        started, cpu = time.perf_counter(), _children_cpu()
        print(f"\n== {name}", flush=True)
        for command in commands:
            print("$ " + " ".join(command), flush=True)
            subprocess.run(command, check=True)
        self.stages.append(Stage(name, time.perf_counter() - started, _children_cpu() - cpu))

    @property
    def tasks(self) -> dict[str, str]:
        """The task sources of each use: the training split for the tokenizer, SFT and the RL pool
        (other seeds, so other problems), the held-out split for every evaluation."""
        s = self.settings
        return {
            "tokenizer": f"{TRAIN},count={TOKENIZER_TASKS},seed=0",
            "sft": f"{TRAIN},count={s.sft_tasks},seed=0",
            "pool": f"{TRAIN},count={s.pool_tasks},seed=1",
            "heldout": f"{HELDOUT},count={s.heldout_tasks}",
            "heldout_during_rl": f"{HELDOUT},count={min(s.eval_tasks, s.heldout_tasks)}",
        }

    def genesys(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "genesys.cli", *args]

    # --- stages ------------------------------------------------------------------------------------

    def base_model(self) -> str:
        """The model the loop starts from: `model`, or the tiny one, built here."""
        if self.model is not None:
            return self.model
        path = self.out / "base-model"
        if not (path / "config.json").is_file():
            self.run_stage(
                "build the tiny model",
                [
                    sys.executable,
                    "-m",
                    "genesys.generate.tiny_model",
                    str(path),
                    "--tasks",
                    self.tasks["tokenizer"],
                    "--split-digits",
                    "--vocab-size",
                    "384",
                    "--hidden-size",
                    "128",
                    "--layers",
                    "4",
                ],
            )
        return str(path)

    def evaluate(self, name: str, model: str) -> Path:
        """Generate and verify the held-out tasks' samples into `eval-NAME.jsonl` (returned)."""
        s = self.settings
        output = self.out / f"eval-{name}.jsonl"
        self.run_stage(
            f"evaluate ({name})",
            self.genesys(
                "generate",
                "--tasks",
                self.tasks["heldout"],
                "--model",
                model,
                "-o",
                str(output),
                *self._sampling(s.samples),
                "--verify",
                "--workers",
                "2",
                "--no-progress",
            ),
        )
        return output

    def sft(self, model: str) -> str:
        s = self.settings
        run = self.out / "sft"
        config = {
            "model": model,
            "output_dir": str(run),
            "progress": False,
            "data": {"tasks": [self.tasks["sft"]]},
            "sft": {"examples_per_step": s.sft_examples_per_step},
            "optim": {
                "steps": s.sft_steps,
                "lr": s.sft_lr,
                "warmup_steps": max(1, s.sft_steps // 20),
                "schedule": "cosine",
                "min_lr_ratio": 0.3,
                "max_grad_norm": 1.0,
                "micro_batch_size": s.micro_batch_size,
            },
            "checkpoint": {"every": 100},
        }
        self.run_stage("genesys sft", self.genesys("sft", str(_write_toml(self.out / "sft.toml", config))))
        return str(run / "final")

    def rl_tasks(self, model: str) -> Path:
        """Training tasks the SFT model solves sometimes but not always."""
        s = self.settings
        pool, tasks = self.out / "pool.jsonl", self.out / "rl-tasks.jsonl"
        self.run_stage(
            "genesys generate + filter (tasks of useful difficulty)",
            self.genesys(
                "generate",
                "--tasks",
                self.tasks["pool"],
                "--model",
                model,
                "-o",
                str(pool),
                *self._sampling(s.pool_samples),
                "--verify",
                "--workers",
                "2",
                "--no-progress",
            ),
            self.genesys(
                "filter",
                str(pool),
                "-o",
                str(tasks),
                "--min-pass-rate",
                str(s.min_pass_rate),
                "--max-pass-rate",
                str(s.max_pass_rate),
                "--overwrite",  # the same tasks again when the loop is rerun
            ),
        )
        return tasks

    def grpo(self, model: str, tasks: Path, lr: float) -> str:
        s = self.settings
        run = self.out / f"grpo{self._variant(lr)}"
        config = {
            "model": model,
            "output_dir": str(run),
            "backend": s.backend,
            "progress": False,
            "data": {"tasks": [str(tasks)]},
            "sampling": {"n": s.rl_group_size, "max_tokens": s.max_tokens, "temperature": s.temperature},
            "rollout": {"prompts_per_step": s.rl_prompts_per_step},
            "optim": {
                "steps": s.rl_steps,
                "lr": lr,
                "warmup_steps": s.rl_warmup_steps,
                "max_grad_norm": 1.0,
                "micro_batch_size": s.micro_batch_size,
            },
            "backend_options": {"batch_size": s.batch_size} if s.backend == "transformers" else {},
            "checkpoint": {"every": 20},
            "verify": {"workers": 2},
            "eval": {
                "tasks": [self.tasks["heldout_during_rl"]],
                "every": s.eval_every,
                "samples": s.eval_samples,
            },
        }
        toml = _write_toml(self.out / f"{run.name}.toml", config)
        self.run_stage(f"genesys train (GRPO, lr {lr:g})", self.genesys("train", str(toml)))
        return str(run / "final")

    def _variant(self, lr: float) -> str:
        """What names the outputs of an RL run at another learning rate than the settings' (the
        control): `-lr0` for lr 0, nothing for the settings' own."""
        return "" if lr == self.settings.rl_lr else f"-lr{lr:g}"

    def _sampling(self, n: int) -> list[str]:
        s = self.settings
        options = ["-n", str(n), "--max-tokens", str(s.max_tokens), "--temperature", str(s.temperature)]
        if s.backend == "transformers":
            options += ["--backend", "transformers", "--batch-size", str(s.batch_size)]
        return options

    # --- the loop ----------------------------------------------------------------------------------

    def run(self, rl_lr: float | None = None) -> dict[str, Any]:
        """The whole loop; returns (and writes) the summary."""
        self.out.mkdir(parents=True, exist_ok=True)
        started, load_before = time.perf_counter(), os.getloadavg()[0]
        lr = self.settings.rl_lr if rl_lr is None else rl_lr
        base = self.base_model()
        before_sft = self.evaluate("base", base)
        sft_model = self.sft(base)
        after_sft = self.evaluate("sft", sft_model)
        tasks = self.rl_tasks(sft_model)
        rl_model = self.grpo(sft_model, tasks, lr)
        after_rl = self.evaluate(f"rl{self._variant(lr)}", rl_model)
        report = self.out / f"report{self._variant(lr)}"
        self.run_stage(
            "genesys report", self.genesys("report", str(Path(rl_model).parent), "-o", str(report))
        )
        scores = {
            name: task_scores(path)
            for name, path in (("before_sft", before_sft), ("after_sft", after_sft), ("after_rl", after_rl))
        }
        gain, gain_stderr = paired_gain(scores["after_sft"], scores["after_rl"])
        errors = sum(verification_errors(path) for path in (before_sft, after_sft, after_rl))
        summary: dict[str, Any] = {
            "model": self.model or "tiny model trained from nothing",
            "heldout_tasks": len(scores["after_rl"]),
            "samples_per_task": self.settings.samples,
            "temperature": self.settings.temperature,
        }
        for name, per_task in scores.items():
            summary[f"accuracy_{name}"], summary[f"accuracy_{name}_stderr"] = mean_and_stderr(per_task)
        summary |= {
            "rl_gain_points": 100 * gain,
            "rl_gain_stderr_points": 100 * gain_stderr,
            "verification_errors": errors,
            "rl_lr": lr,
            "rl_tasks": sum(1 for _ in tasks.open()),
            "stages": [asdict(stage) for stage in self.stages],
            "total_seconds": time.perf_counter() - started,
            "load_average": [load_before, os.getloadavg()[0]],  # 1-minute load at the start and the end
            "cpus": os.cpu_count(),
            "settings": asdict(self.settings),
        }
        (self.out / f"summary{self._variant(lr)}.json").write_text(json.dumps(summary, indent=2) + "\n")
        plot_accuracy(summary, report / "heldout_accuracy.png")
        return summary


def task_scores(path: Path) -> dict[str, float]:
    """Each task's mean score over its verified rollouts in `path`. A rollout whose verification
    failed (no score: an infrastructure error, never a wrong answer) is left out, as `verification_errors`
    counts it; a task with none verified is left out."""
    scores: dict[str, list[float]] = {}
    for row in _rows(path):
        if row.get("score") is not None:
            scores.setdefault(row["problem_id"], []).append(float(row["score"]))
    return {task: sum(values) / len(values) for task, values in scores.items() if values}


def verification_errors(path: Path) -> int:
    """The rollouts in `path` whose verification failed."""
    return sum(row.get("score") is None for row in _rows(path))


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open() if line.strip()]


def mean_and_stderr(per_task: dict[str, float]) -> tuple[float, float]:
    """The mean over tasks and its standard error (tasks are the sampled unit: the spread of their
    means over the square root of their number)."""
    values = list(per_task.values())
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    variance = sum((value - mean) ** 2 for value in values) / max(len(values) - 1, 1)
    return mean, math.sqrt(variance / len(values))


def paired_gain(before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
    """The mean per-task gain from `before` to `after` over the tasks both scored, and its standard
    error (paired: each task is compared with itself)."""
    return mean_and_stderr({task: after[task] - before[task] for task in after.keys() & before.keys()})


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _write_toml(path: Path, config: dict[str, Any]) -> Path:
    """`config` (tables one level deep) as TOML."""
    lines = [f"{key} = {json.dumps(value)}" for key, value in config.items() if not isinstance(value, dict)]
    for table, values in config.items():
        if isinstance(values, dict):
            lines.append(f"\n[{table}]")
            lines += [f"{key} = {json.dumps(item)}" for key, item in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_accuracy(summary: dict[str, Any], path: Path) -> None:
    """Held-out accuracy before SFT, after SFT and after RL, as bars with their standard errors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("before_sft", "after_sft", "after_rl")
    labels = ["before SFT", "after SFT", "after RL" if summary["rl_lr"] else "after RL (lr 0)"]
    values = [summary[f"accuracy_{key}"] * 100 for key in keys]
    errors = [summary[f"accuracy_{key}_stderr"] * 100 for key in keys]
    figure, axes = plt.subplots(figsize=(5, 3.5))
    bars = axes.bar(labels, values, yerr=errors, capsize=4, color=["#999999", "#4c72b0", "#55a868"])
    axes.bar_label(bars, fmt="%.1f%%", padding=3)
    axes.set_ylabel("held-out accuracy (%)")
    axes.set_ylim(0, 100)
    axes.set_title(f"{summary['heldout_tasks']} held-out tasks, {summary['samples_per_task']} samples each")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"held-out accuracy ({summary['heldout_tasks']} tasks never trained on)")
    table.add_column("stage")
    table.add_column("accuracy", justify="right")
    table.add_column("std. error", justify="right")
    for key in ("accuracy_before_sft", "accuracy_after_sft", "accuracy_after_rl"):
        table.add_row(key, f"{summary[key] * 100:.1f}%", f"{summary[key + '_stderr'] * 100:.1f}")
    table.add_row(
        f"RL gain (lr {summary['rl_lr']:g})",
        f"{summary['rl_gain_points']:+.1f} points",
        f"{summary['rl_gain_stderr_points']:.1f}",
    )
    times = Table(title="time per stage")
    times.add_column("stage")
    times.add_column("wall s", justify="right")
    times.add_column("CPU s", justify="right")
    for stage in summary["stages"]:
        times.add_row(stage["name"], f"{stage['seconds']:.0f}", f"{stage['cpu_seconds']:.0f}")
    load = " -> ".join(f"{value:.1f}" for value in summary["load_average"])
    times.add_row(
        f"total ({summary['cpus']} CPUs, load average {load})", f"{summary['total_seconds']:.0f}", ""
    )
    console = Console()
    console.print(table)
    console.print(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The learning demo (see python -m genesys.demo --help).")
    parser.add_argument(
        "out",
        type=Path,
        help="output directory (summary.json, report/, runs; summary-lr0.json, report-lr0/ for --rl-lr 0)",
    )
    parser.add_argument("--model", help="start from this model (hub name or path) instead of a tiny one")
    parser.add_argument("--rl-lr", type=float, help="GRPO learning rate (0: the control run)")
    parser.add_argument("--summary", type=Path, help="where summary.json goes (default: OUT/summary.json)")
    args = parser.parse_args(argv)
    demo = Demo(args.out, PRETRAINED if args.model else TINY, args.model)
    summary = demo.run(args.rl_lr)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary)


if __name__ == "__main__":
    main()
