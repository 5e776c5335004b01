"""`genesys report` of a training run: real PNGs, right summary figures, bad lines named, inputs told apart."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import GENESYS, write_jsonl
from test_report import assert_png, rollouts

from genesys.analysis.report_training import find_training_run, moving_average, write_training_report
from genesys.errors import InputError

FIGURES = {"reward", "completion_length", "clipping", "optimization", "throughput", "other_metrics"}


def step_metrics(step: int) -> dict:
    """One step as the trainer writes it, plus a key it does not know and a text value."""
    return {
        "step": step,
        "reward_mean": 0.2 + 0.01 * step + (0.1 if step % 7 == 0 else 0.0),
        "reward_std": 0.3,
        "score_mean": 0.1 + 0.01 * step,
        "loss": 0.5 / step,
        "grad_norm": 1.0 + (step % 3),
        "lr": 1e-6 * min(1.0, step / 10),
        "clip_low_frac": 0.01,
        "clip_high_frac": 0.02 * (step % 2),
        "delta_frac": 0.0,
        "ratio_mean": 1.0,
        "ratio_max": 1.3,
        "entropy": 0.8 - 0.005 * step,
        "completion_len_mean": 300 + 2 * step,
        "groups_kept": 4,
        "groups_dropped": step % 3,
        "logprob_mismatch": 0.01 if step == 1 else None,
        "tokens_per_s": 900.0,
        "step_seconds": 12.5,
        "kl": 0.001 * step,
        "custom_metric": step**0.5,
        "note": "text is not plotted",
    }


def training_run(directory: Path, steps: int = 40) -> Path:
    """A run directory as the trainer leaves it: metrics, config, two checkpoints, the final model."""
    directory.mkdir(parents=True)
    write_jsonl(directory / "metrics.jsonl", [step_metrics(step) for step in range(1, steps + 1)])
    (directory / "config.toml").write_text('model = "tiny-model"\n[optim]\nlr = 1e-6\n')
    for name in (
        "checkpoints/step-000020",
        "checkpoints/step-000040",
        "checkpoints/.tmp-step-000060-1",
        "final",
    ):
        (directory / name).mkdir(parents=True)
    return directory


def test_every_figure_is_a_png_and_the_summary_links_them(tmp_path: Path):
    run = training_run(tmp_path / "run")
    report = write_training_report(run / "metrics.jsonl", tmp_path / "report")
    assert {path.stem for path in report.plots} == FIGURES
    for path in report.plots:
        assert_png(path)
        assert f"]({path.name})" in report.summary.read_text()


def test_summary_figures(tmp_path: Path):
    run = training_run(tmp_path / "run")
    summary = write_training_report(run / "metrics.jsonl", tmp_path / "report").summary.read_text()
    rewards = [step_metrics(step)["reward_mean"] for step in range(1, 41)]
    assert "Steps: 40 recorded (step 1 to 40)." in summary
    assert (
        f"**reward_mean**: first {rewards[0]:.4g} (step 1), last {rewards[-1]:.4g} (step 40), best 0.65 (step 35); "
        f"mean of the last 3 steps {np.mean(rewards[-3:]):.4g}"
    ) in summary
    assert "Checkpoints: 2 (newest `step-000040`); final model in `final/`." in summary
    assert "| groups_dropped | 40 | 1 | 1 | 0 | 2 | 1 |" in summary
    assert "| logprob_mismatch | 1 | 0.01 | 0.01 | 0.01 | 0.01 | 0.01 |" in summary
    assert "| note |" not in summary
    assert 'model = "tiny-model"' in summary


def test_only_recorded_metrics_are_drawn(tmp_path: Path):
    records = [{"step": step, "reward_mean": 0.5, "loss": None, "kl": None} for step in range(1, 4)]
    metrics = write_jsonl(tmp_path / "metrics.jsonl", records)
    report = write_training_report(metrics, tmp_path / "report")
    assert [path.stem for path in report.plots] == ["reward"]
    assert_png(report.plots[0])
    summary = report.summary.read_text()
    assert "| loss |" not in summary and "| kl |" not in summary
    assert "Checkpoints: none; no final model." in summary


def test_a_single_step_is_drawn(tmp_path: Path):
    metrics = write_jsonl(tmp_path / "metrics.jsonl", [step_metrics(1)])
    report = write_training_report(metrics, tmp_path / "report")
    assert {path.stem for path in report.plots} == FIGURES
    assert "first 0.21 (step 1), last 0.21 (step 1), best 0.21 (step 1)" in report.summary.read_text()


def test_moving_average_is_trailing():
    assert moving_average(np.array([1.0, 2.0, 3.0, 4.0, 10.0]), 2).tolist() == [1.0, 1.5, 2.5, 3.5, 7.0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"reward_mean": 0.5}', "integer 'step'"),
        ('{"step": "3"}', "integer 'step'"),
        ("[1, 2]", "integer 'step'"),
    ],
)
def test_a_bad_line_is_refused_by_file_and_line(tmp_path: Path, line: str, message: str):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(step_metrics(1)) + "\n\n" + line + "\n" + json.dumps(step_metrics(2)) + "\n")
    with pytest.raises(InputError, match=rf"metrics\.jsonl:3: .*{message}"):
        write_training_report(path, tmp_path / "report")


def test_an_unfinished_last_line_is_left_out(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(step_metrics(step)) + "\n" for step in (1, 2)) + '{"step": 3, "rew')
    summary = write_training_report(path, tmp_path / "report").summary.read_text()
    assert "Steps: 2 recorded (step 1 to 2)." in summary


def test_a_file_without_steps_is_refused(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    with pytest.raises(InputError, match="records no step"):
        write_training_report(path, tmp_path / "report")


def test_inputs_are_told_apart(tmp_path: Path):
    run = training_run(tmp_path / "run")
    other = training_run(tmp_path / "other", steps=3)
    verified = write_jsonl(tmp_path / "rollouts.jsonl", rollouts())
    assert find_training_run([str(run)]) == run / "metrics.jsonl"
    assert find_training_run([str(tmp_path / "ru?")]) == run / "metrics.jsonl"
    assert find_training_run([str(run), str(run / "metrics.jsonl")]) == run / "metrics.jsonl"
    assert find_training_run([str(verified)]) is None
    assert find_training_run([str(tmp_path / "r*.jsonl")]) is None
    with pytest.raises(InputError, match="rollouts.jsonl' is not a training run"):
        find_training_run([str(run), str(verified)])
    with pytest.raises(InputError, match="2 training runs given"):
        find_training_run([str(run), str(other)])


def test_cli_reports_a_run_directory(tmp_path: Path):
    run = training_run(tmp_path / "run")
    done = subprocess.run(
        [GENESYS, "report", str(run), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert {path.stem for path in (tmp_path / "out").glob("*.png")} == FIGURES
    assert (tmp_path / "out" / "summary.md").read_text().startswith("# Training run report")


def test_cli_refuses_a_run_mixed_with_rollouts(tmp_path: Path):
    run = training_run(tmp_path / "run")
    verified = write_jsonl(tmp_path / "rollouts.jsonl", rollouts())
    done = subprocess.run(
        [GENESYS, "report", str(run), str(verified), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "is not a training run" in done.stderr and "separate calls" in done.stderr
    assert not (tmp_path / "out").exists()
