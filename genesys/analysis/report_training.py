"""`genesys report` of a training run: the curves of `metrics.jsonl` against step, and a summary.

An input is a training run when it is a directory holding `metrics.jsonl` or a file named
`metrics.jsonl`. Known metrics are grouped into figures (reward, completion length, clipping,
optimization, throughput, and evaluation: one panel per held-out source of `eval/SOURCE/...` keys);
any other numeric key is drawn in `other_metrics.png`, so every metric a run recorded is shown, and a
key no step recorded is left out. Null values are gaps in their curve.
With many steps each curve is drawn faint under a trailing moving average.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from genesys.analysis.report import Report
from genesys.errors import InputError
from genesys.train.metrics import is_metric_value

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
# From this many points a curve is smoothed, over a window of SMOOTH_FRACTION of its points (at least 3).
SMOOTH_FROM = 30
SMOOTH_FRACTION = 0.05

# name of the PNG, its title, and its panels: the metrics drawn together on one axes.
_FIGURES: tuple[tuple[str, str, tuple[tuple[str, ...], ...]], ...] = (
    (
        "reward",
        "Reward and score (means over each step's rollouts)",
        (("reward_mean", "reward_mean_kept", "score_mean"), ("reward_std",)),
    ),
    ("completion_length", "Completion length (tokens, mean per step)", (("completion_len_mean",),)),
    (
        "clipping",
        "Fraction of tokens clipped (low and high ratio bounds, delta bound)",
        (("clip_low_frac", "clip_high_frac", "delta_frac"),),
    ),
    (
        "optimization",
        "Optimization",
        (
            ("loss",),
            ("grad_norm",),
            ("lr",),
            ("entropy",),
            ("ratio_mean", "ratio_max"),
            ("kl",),
            ("logprob_mismatch", "logprob_mismatch_stale"),
            ("is_weight_mean", "is_capped_frac"),
        ),
    ),
    (
        "throughput",
        "Throughput and batches",
        (
            ("tokens_per_s",),
            ("step_seconds", "generate_seconds", "verify_seconds"),
            ("groups_kept", "groups_dropped"),
            ("rollout_errors", "refill_rounds"),
            ("tokens",),
        ),
    ),
)
OTHER_FIGURE = "other_metrics"
EVAL_FIGURE = "evaluation"
EVAL_PREFIX = "eval/"  # eval/SOURCE/METRIC, as genesys.train.evaluation writes them
# Metrics that follow a schedule, not noise: drawn as they are, never smoothed.
_SCHEDULED = frozenset({"lr"})


@dataclass(frozen=True)
class TrainingRun:
    """The metrics of one run: every recorded step, and each numeric metric's (steps, values)."""

    metrics_file: Path
    steps: list[int]
    series: dict[str, tuple[np.ndarray, np.ndarray]]


def find_training_run(inputs: Sequence[str]) -> Path | None:
    """The metrics file of the training run `inputs` name, or None when they name no training run.

    Inputs that mix a run with other files, or name several runs, are refused."""
    found = [(spec, _metrics_file(path)) for spec in inputs for path in _paths(spec)]
    runs = list(dict.fromkeys(metrics for _, metrics in found if metrics is not None))
    if not runs:
        return None
    other = next((spec for spec, metrics in found if metrics is None), None)
    if other is not None:
        raise InputError(
            f"{other!r} is not a training run (a directory holding {METRICS_FILE}, or that file) but {str(runs[0])!r} is: "
            "report a training run and rollouts in separate calls"
        )
    if len(runs) > 1:
        raise InputError(
            f"{len(runs)} training runs given ({', '.join(str(run) for run in runs)}): report one run per call"
        )
    return runs[0]


def _paths(spec: str) -> list[Path]:
    return (
        [Path(match) for match in sorted(glob.glob(spec, recursive=True))]
        if glob.has_magic(spec)
        else [Path(spec)]
    )


def _metrics_file(path: Path) -> Path | None:
    if path.is_dir() and (path / METRICS_FILE).is_file():
        return path / METRICS_FILE
    return path if path.name == METRICS_FILE and path.is_file() else None


def read_metrics_file(path: Path) -> list[dict[str, Any]]:
    """The step records of `path` in step order (the last record of a step repeated wins).

    A line that is not a JSON object with an integer `step` is refused by file:line; an unfinished
    last line (no newline: a run killed while writing it) that does not parse is left out."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    by_step: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise InputError(f"{path}:{number}: not valid JSON ({exc})") from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise InputError(f"{path}:{number}: a metrics line must be a JSON object with an integer 'step'")
        by_step[step] = record
    return [by_step[step] for step in sorted(by_step)]


def load_training_run(metrics_file: Path) -> TrainingRun:
    """The run behind `metrics_file`; an InputError when it records no step."""
    import numpy as np

    records = read_metrics_file(metrics_file)
    if not records:
        raise InputError(f"{metrics_file} records no step yet")
    series = {}
    for key in dict.fromkeys(key for record in records for key in record if key != "step"):
        points = [(record["step"], record[key]) for record in records if is_metric_value(record.get(key))]
        if points:
            steps, values = np.array(points, dtype=float).T
            series[key] = (steps, values)
    return TrainingRun(metrics_file, [record["step"] for record in records], series)


def write_training_report(metrics_file: Path, output_dir: str | Path) -> Report:
    """Draw the curves of the run behind `metrics_file` and write them and `summary.md` into `output_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = load_training_run(metrics_file)
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    plots = []
    for name, title, panels in _figure_specs(run):
        figure = _draw(run, title, panels)
        path = directory / f"{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
        plots.append(path)
    summary = directory / "summary.md"
    summary.write_text(_markdown(run, plots), encoding="utf-8")
    return Report(directory, plots, summary)


# --- plots ----------------------------------------------------------------------------------------


def _figure_specs(run: TrainingRun) -> list[tuple[str, str, list[tuple[str, ...]]]]:
    """The figures to draw: the known ones with the panels the run has data for, then the other metrics."""
    specs = []
    known: set[str] = set()
    for name, title, panels in _FIGURES:
        known.update(key for panel in panels for key in panel)
        present = [panel for panel in panels if any(key in run.series for key in panel)]
        if present:
            specs.append((name, title, present))
    sources: dict[str, list[str]] = {}
    for key in run.series:
        if key.startswith(EVAL_PREFIX) and key.count("/") == 2 and not key.endswith("/errors"):
            sources.setdefault(key.split("/")[1], []).append(key)
            known.add(key)
    if sources:
        panels = [tuple(sorted(keys)) for keys in sources.values()]
        specs.append((EVAL_FIGURE, "Evaluation on held-out tasks (per source)", panels))
    others = [(key,) for key in run.series if key not in known]
    if others:
        specs.append((OTHER_FIGURE, "Other metrics", others))
    return specs


def _draw(run: TrainingRun, title: str, panels: list[tuple[str, ...]]) -> Figure:
    import matplotlib.pyplot as plt

    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(5.0 * columns, 3.3 * rows), squeeze=False, layout="constrained"
    )
    for ax, panel in zip(axes.flat, panels):
        _draw_panel(ax, run, panel)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure.suptitle(f"{title}, {len(run.steps)} steps")
    return figure


def _draw_panel(ax: Axes, run: TrainingRun, keys: tuple[str, ...]) -> None:
    for key in keys:
        if key not in run.series:
            continue
        steps, values = run.series[key]
        window = 1 if key in _SCHEDULED else smoothing_window(values.size)
        if window > 1:
            (line,) = ax.plot(steps, values, linewidth=0.8, alpha=0.3)
            ax.plot(
                steps,
                moving_average(values, window),
                color=line.get_color(),
                linewidth=1.8,
                label=f"{key} ({window}-step mean)",
            )
        else:
            ax.plot(steps, values, marker="o" if values.size < SMOOTH_FROM else None, markersize=3, label=key)
    ax.set_xlabel("step")
    ax.set_title(" / ".join(key for key in keys if key in run.series), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def smoothing_window(points: int) -> int:
    """The moving-average window for a curve of `points` values: 1 (no smoothing) below SMOOTH_FROM."""
    return 1 if points < SMOOTH_FROM else max(3, round(points * SMOOTH_FRACTION))


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """The trailing mean of `values` over `window` points (fewer at the start)."""
    import numpy as np

    sums = np.concatenate(([0.0], np.cumsum(values)))
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


# --- summary --------------------------------------------------------------------------------------


def _markdown(run: TrainingRun, plots: list[Path]) -> str:
    run_dir = run.metrics_file.parent
    lines = [
        "# Training run report",
        "",
        f"Run: `{run_dir}`",
        "",
        f"Steps: {len(run.steps)} recorded (step {run.steps[0]} to {run.steps[-1]}). {_outputs(run_dir)}",
        "",
    ]
    lines += [_headline(run, key) for key in ("reward_mean", "score_mean") if key in run.series]
    lines += [
        "",
        "## Metrics",
        "",
        "| metric | steps | first | last | min | max | mean |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, (_, values) in run.series.items():
        row = (values[0], values[-1], values.min(), values.max(), values.mean())
        lines.append(f"| {key} | {values.size} | " + " | ".join(_number(value) for value in row) + " |")
    config = run_dir / "config.toml"
    if config.is_file():
        lines += ["", "## Config", "", "```toml", config.read_text(encoding="utf-8").rstrip(), "```"]
    lines += ["", "## Plots", ""]
    lines += [f"![{path.stem.replace('_', ' ')}]({path.name})" for path in plots]
    return "\n".join(lines) + "\n"


def _headline(run: TrainingRun, key: str) -> str:
    """First, last and best value of `key`, with the steps; the last moving average when smoothed."""
    steps, values = run.series[key]
    best = int(values.argmax())
    text = (
        f"- **{key}**: first {_number(values[0])} (step {steps[0]:.0f}), last {_number(values[-1])} (step {steps[-1]:.0f}), "
        f"best {_number(values[best])} (step {steps[best]:.0f})"
    )
    window = smoothing_window(values.size)
    if window > 1:
        text += f"; mean of the last {window} steps {_number(values[-window:].mean())}"
    return text


def _outputs(run_dir: Path) -> str:
    """What the run directory holds beside the metrics: checkpoints, the final model."""
    checkpoints = sorted(path.name for path in (run_dir / "checkpoints").glob("step-*") if path.is_dir())
    saved = f"{len(checkpoints)} (newest `{checkpoints[-1]}`)" if checkpoints else "none"
    final = "final model in `final/`" if (run_dir / "final").is_dir() else "no final model"
    return f"Checkpoints: {saved}; {final}."


def _number(value: float) -> str:
    return f"{value:.4g}"
