"""`genesys report`: PNG plots and a markdown summary of verified rollouts.

Plots: task pass rate per source, score and reward distributions, completion length, length against
correctness, outcomes by task_type. Lengths are completion tokens (`completion_ids`), or characters of
`llm_response` when a file has no token ids. A rollout is correct when its score is 1; rollouts whose
verification failed (score null) are shown as errors, never as wrong answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genesys.errors import InputError

if TYPE_CHECKING:
    import polars as pl
    from matplotlib.figure import Figure

MAX_SOURCE_PANELS = 9
_OUTCOME_COLOURS = {"correct": "#2a9d8f", "partial": "#e9c46a", "wrong": "#e76f51", "error": "#8d99ae"}


@dataclass(frozen=True)
class Report:
    """The files a report run wrote."""

    directory: Path
    plots: list[Path]
    summary: Path
    repeats: int = 0  # rollouts read more than once (the same response_id), counted once


@dataclass(frozen=True)
class _Data:
    rollouts: pl.DataFrame  # source, task_type, score, reward, error, length, correct
    tasks: pl.DataFrame  # source, pass_rate, n_samples
    length_unit: str | None  # "tokens", "characters", or None when lengths are unknown
    repeats: int = 0


def write_report(inputs: Sequence[str], output_dir: str | Path) -> Report:
    """Read verified rollouts and write the plots and `summary.md` into `output_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    data = _load(inputs)
    plots = []
    for name, draw in _PLOTS:
        figure = draw(data)
        if figure is None:
            continue
        path = directory / f"{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        _close(figure)
        plots.append(path)
    summary = directory / "summary.md"
    summary.write_text(_markdown(data, inputs, plots), encoding="utf-8")
    return Report(directory, plots, summary, data.repeats)


# --- data -----------------------------------------------------------------------------------------


def _load(inputs: Sequence[str]) -> _Data:
    import polars as pl

    from genesys.analysis.filtering import (
        refuse_out_of_range,
        score_out_of_range,
        score_problem,
        task_pass_rates,
    )
    from genesys.data.frames import collect, distinct_rollouts, scan_rollouts
    from genesys.data.inputs import resolve_inputs

    files = resolve_inputs(inputs)
    frame, repeats = distinct_rollouts(scan_rollouts(files), files)
    names = frame.collect_schema().names()
    if "score" not in names:
        raise InputError("the rollouts have no 'score' column: verify them first (genesys verify)")
    length_unit: str | None = None
    length = pl.lit(None, dtype=pl.Int64)
    if "completion_ids" in names:
        length, length_unit = pl.col("completion_ids").list.len().cast(pl.Int64), "tokens"
    elif "llm_response" in names:
        length, length_unit = pl.col("llm_response").str.len_chars().cast(pl.Int64), "characters"
    frame = frame.with_columns(
        *[_text_or_unknown(name, names) for name in ("source", "task_type")],
        *[pl.lit(None, dtype=pl.Float64).alias(n) for n in ("reward",) if n not in names],
        *[pl.lit(None, dtype=pl.String).alias(n) for n in ("error",) if n not in names],
    )
    rollouts = collect(
        frame.select(
            "source",
            "task_type",
            "score",
            "reward",
            "error",
            length.alias("length"),
            (pl.col("score") == 1.0).alias("correct"),
        ),
        files,
        score_problem,
    )
    refuse_out_of_range(rollouts.select(score_out_of_range(pl.col("score")).sum()).item(), files)
    tasks = collect(task_pass_rates(frame).select("source", "pass_rate", "n_samples"), files, score_problem)
    if rollouts.height == 0:
        raise InputError("the input holds no rollouts")
    if rollouts["length"].null_count() == rollouts.height:
        length_unit = None
    return _Data(rollouts, tasks, length_unit, repeats)


def _text_or_unknown(name: str, names: list[str]) -> pl.Expr:
    import polars as pl

    column = pl.col(name).cast(pl.String) if name in names else pl.lit(None, dtype=pl.String)
    return column.fill_null("(unknown)").alias(name)


def _outcome_counts(rollouts: pl.DataFrame, by: str) -> pl.DataFrame:
    """Per `by` value: rollouts, mean score, and counts of correct / partial / wrong / error."""
    import polars as pl

    score = pl.col("score")
    return (
        rollouts.group_by(by)
        .agg(
            pl.len().alias("rollouts"),
            score.mean().alias("mean_score"),
            (score == 1.0).sum().alias("correct"),
            ((score > 0.0) & (score < 1.0)).sum().alias("partial"),
            (score == 0.0).sum().alias("wrong"),
            score.null_count().alias("error"),
            pl.col("length").median().alias("median_length"),
        )
        .sort("rollouts", descending=True)
    )


# --- plots ----------------------------------------------------------------------------------------


def _figure(*args: Any, **kwargs: Any) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    return plt.subplots(*args, layout="constrained", **kwargs)


def _close(figure: Figure) -> None:
    import matplotlib.pyplot as plt

    plt.close(figure)


def _plot_pass_rate_by_source(data: _Data) -> Figure | None:
    import numpy as np

    tasks = data.tasks.drop_nulls("pass_rate")
    if tasks.height == 0:
        return None
    counts = tasks["source"].value_counts(sort=True)
    sources = counts["source"].to_list()[:MAX_SOURCE_PANELS]
    columns = min(3, len(sources))
    rows = -(-len(sources) // columns)
    figure, axes = _figure(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False, sharex=True)
    # Binary scores over k samples give rates on a 1/k grid: then one bar per possible value.
    k = int(tasks["n_samples"].max() or 1)
    all_rates = tasks["pass_rate"].to_numpy()
    on_grid = k <= 20 and np.allclose(all_rates * k, np.round(all_rates * k))
    bins = (np.arange(k + 2) - 0.5) / k if on_grid else np.linspace(0.0, 1.0, 21)
    for ax, source in zip(axes.flat, sources):
        rates = tasks.filter(tasks["source"] == source)["pass_rate"].to_numpy()
        ax.hist(rates, bins=bins, color="#457b9d", edgecolor="white")
        ax.set_title(f"{source}  ({rates.size} tasks, mean {rates.mean():.2f})", fontsize=10)
        ax.set_xlabel("task pass rate")
        ax.set_ylabel("tasks")
    for ax in list(axes.flat)[len(sources) :]:
        ax.set_visible(False)
    figure.suptitle("Task pass rate by source (mean score over each task's rollouts)")
    return figure


def _plot_reward_distribution(data: _Data) -> Figure | None:
    import numpy as np

    scores = data.rollouts["score"].drop_nulls().to_numpy()
    rewards = data.rollouts["reward"].drop_nulls().to_numpy()
    if scores.size == 0:
        return None
    panels = [("score", scores, "#2a9d8f")] + ([("reward", rewards, "#e76f51")] if rewards.size else [])
    figure, axes = _figure(1, len(panels), figsize=(5.5 * len(panels), 3.6), squeeze=False)
    for ax, (name, values, colour) in zip(axes.flat, panels):
        low, high = min(0.0, float(values.min())), max(1.0, float(values.max()))
        ax.hist(values, bins=np.linspace(low, high, 21), color=colour, edgecolor="white")
        ax.axvline(values.mean(), color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{name}: mean {values.mean():.3f} over {values.size} rollouts", fontsize=10)
        ax.set_xlabel(name)
        ax.set_ylabel("rollouts")
    errors = data.rollouts["score"].null_count()
    figure.suptitle(f"Score and reward distributions ({errors} rollouts with verification errors not shown)")
    return figure


def _plot_completion_length(data: _Data) -> Figure | None:
    import numpy as np

    if data.length_unit is None:
        return None
    lengths = data.rollouts["length"].drop_nulls().to_numpy()
    figure, ax = _figure(figsize=(7, 3.8))
    ax.hist(lengths, bins=40, color="#457b9d", edgecolor="white")
    median, p95 = np.median(lengths), np.percentile(lengths, 95)
    ax.axvline(median, color="black", linestyle="--", linewidth=1, label=f"median {median:,.0f}")
    ax.axvline(p95, color="#e76f51", linestyle=":", linewidth=1.5, label=f"95th percentile {p95:,.0f}")
    ax.set_xlabel(f"completion length ({data.length_unit})")
    ax.set_ylabel("rollouts")
    ax.set_title(f"Completion length over {lengths.size} rollouts")
    ax.legend()
    return figure


def _plot_length_vs_correctness(data: _Data) -> Figure | None:
    import numpy as np
    import polars as pl

    if data.length_unit is None:
        return None
    scored = data.rollouts.filter(pl.col("score").is_not_null() & pl.col("length").is_not_null())
    if scored.height == 0:
        return None
    figure, (left, right) = _figure(1, 2, figsize=(11, 3.8))
    lengths = scored["length"].to_numpy()
    correct = scored["correct"].to_numpy()
    bins = np.linspace(lengths.min(), lengths.max() + 1, 31)
    for mask, label, colour in ((correct, "correct", "#2a9d8f"), (~correct, "not correct", "#e76f51")):
        if mask.any():
            left.hist(
                lengths[mask],
                bins=bins,
                histtype="step",
                linewidth=2,
                color=colour,
                label=f"{label} ({mask.sum()})",
            )
    left.set_xlabel(f"completion length ({data.length_unit})")
    left.set_ylabel("rollouts")
    left.set_title("Length of correct and incorrect completions", fontsize=10)
    left.legend()
    edges = np.unique(np.quantile(lengths, np.linspace(0, 1, 11)))
    which = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, max(len(edges) - 2, 0))
    centres, rates = [], []
    for i in range(max(len(edges) - 1, 1)):
        in_bin = which == i
        if in_bin.any():
            centres.append(lengths[in_bin].mean())
            rates.append(correct[in_bin].mean())
    right.plot(centres, rates, marker="o", color="#264653")
    right.set_ylim(-0.02, 1.02)
    right.set_xlabel(f"completion length ({data.length_unit}), decile bins")
    right.set_ylabel("fraction correct")
    right.set_title("Correctness against length", fontsize=10)
    right.grid(alpha=0.3)
    return figure


def _plot_score_by_task_type(data: _Data) -> Figure | None:
    import numpy as np

    table = _outcome_counts(data.rollouts, "task_type").sort("rollouts")
    figure, ax = _figure(figsize=(8, 1.2 + 0.55 * table.height))
    labels = [
        f"{t}  (n={n}, mean {m:.2f})" if m is not None else f"{t}  (n={n})"
        for t, n, m in table.select("task_type", "rollouts", "mean_score").iter_rows()
    ]
    left = np.zeros(table.height)
    for outcome, colour in _OUTCOME_COLOURS.items():
        share = table[outcome].to_numpy() / table["rollouts"].to_numpy()
        ax.barh(labels, share, left=left, color=colour, label=outcome)
        left += share
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of rollouts")
    ax.set_title("Outcomes by task_type (correct: score 1, partial: 0 < score < 1, error: not verified)")
    ax.legend(ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False)
    return figure


_PLOTS = (
    ("pass_rate_by_source", _plot_pass_rate_by_source),
    ("reward_distribution", _plot_reward_distribution),
    ("completion_length", _plot_completion_length),
    ("length_vs_correctness", _plot_length_vs_correctness),
    ("score_by_task_type", _plot_score_by_task_type),
)


# --- summary --------------------------------------------------------------------------------------


def _markdown(data: _Data, inputs: Sequence[str], plots: list[Path]) -> str:
    import polars as pl

    rollouts, tasks = data.rollouts, data.tasks
    errors = rollouts["score"].null_count()
    scored = rollouts.height - errors
    mean_score = rollouts["score"].mean()
    lines = [
        "# Rollout report",
        "",
        f"Inputs: {', '.join(f'`{i}`' for i in inputs)}",
        "",
        "| rollouts | tasks | mean score | correct (score = 1) | verification errors |",
        "|---:|---:|---:|---:|---:|",
        f"| {rollouts.height} | {tasks.height} | {_number(mean_score)} | {_share(int(rollouts['correct'].sum() or 0), scored)} "
        f"| {_share(errors, rollouts.height)} |",
        "",
        "Mean score and correctness are over verified rollouts; rollouts with a verification error are counted apart."
        + (
            f" {data.repeats} rollouts appeared more than once in the inputs (the same response_id) and count once."
            if data.repeats
            else ""
        ),
        "",
        "## By task_type",
        "",
        f"| task_type | rollouts | mean score | correct | partial | wrong | errors | median length ({data.length_unit or 'n/a'}) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in _outcome_counts(rollouts, "task_type").iter_rows(named=True):
        lines.append(
            f"| {row['task_type']} | {row['rollouts']} | {_number(row['mean_score'])} | {row['correct']} | {row['partial']} "
            f"| {row['wrong']} | {row['error']} | {_number(row['median_length'], 0)} |"
        )
    by_source = (
        tasks.group_by("source")
        .agg(
            pl.len().alias("tasks"),
            pl.col("pass_rate").mean().alias("mean"),
            (pl.col("pass_rate") == 0.0).sum().alias("never"),
            (pl.col("pass_rate") == 1.0).sum().alias("always"),
        )
        .sort("tasks", descending=True)
    )
    lines += [
        "",
        "## Task pass rates by source",
        "",
        "| source | tasks | mean pass rate | never solved | always solved |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in by_source.iter_rows(named=True):
        lines.append(
            f"| {row['source']} | {row['tasks']} | {_number(row['mean'])} | {row['never']} | {row['always']} |"
        )
    if errors:
        kinds = (
            rollouts.filter(pl.col("score").is_null())
            .select(
                pl.col("error")
                .fill_null("(no message)")
                .str.split(":")
                .list.first()
                .str.strip_chars()
                .alias("kind")
            )
            .group_by("kind")
            .len()
            .sort("len", descending=True)
        )
        lines += ["", "## Verification errors", "", "| kind | rollouts |", "|---|---:|"]
        lines += [f"| {kind} | {count} |" for kind, count in kinds.iter_rows()]
    lines += ["", "## Plots", ""]
    lines += [f"![{path.stem.replace('_', ' ')}]({path.name})" for path in plots]
    return "\n".join(lines) + "\n"


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _share(count: int, total: int) -> str:
    return f"{count} ({count / total:.1%})" if total else str(count)
