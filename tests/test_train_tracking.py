"""Experiment trackers: TensorBoard for real, wandb and trackio through their documented calls, missing libraries refused."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from genesys.errors import InputError
from genesys.testing.digits import digit_tasks
from genesys.train.tracking import open_trackers

CONFIG = {"model": "tiny", "optim": {"lr": 1e-6, "steps": 3}}


def steps() -> list[dict[str, Any]]:
    """Three steps as the trainer logs them: `step` among the metrics, a null, a key only on step 1."""
    return [
        {
            "step": step,
            "reward_mean": 0.1 * step,
            "groups_dropped": step % 2,
            "kl": None,
            **({"logprob_mismatch": 0.01} if step == 1 else {}),
        }
        for step in (1, 2, 3)
    ]


def test_tensorboard_writes_scalars_that_read_back(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = open_trackers(["tensorboard"], tmp_path, CONFIG, "run")
    for metrics in steps():
        tracker.log(metrics, metrics["step"])
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward_mean", "groups_dropped", "logprob_mismatch"}
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("reward_mean")] == [
        (1, 0.1),
        (2, 0.2),
        (3, 0.3),
    ]
    assert [(e.step, e.value) for e in events.Scalars("groups_dropped")] == [(1, 1.0), (2, 0.0), (3, 1.0)]
    assert [e.step for e in events.Scalars("logprob_mismatch")] == [1]


def recorder(name: str, calls: list[tuple[str, Any]]) -> ModuleType:
    """A stand-in for the wandb or trackio module that records the calls made to it."""
    module = ModuleType(name)
    run = SimpleNamespace(
        log=lambda values, step: calls.append(("log", (values, step))),
        finish=lambda: calls.append(("finish", None)),
    )

    def init(**kwargs: Any) -> SimpleNamespace:
        calls.append(("init", kwargs))
        return run

    module.init, module.log, module.finish = init, run.log, run.finish
    return module


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_wandb_and_trackio_get_the_project_run_config_and_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
):
    calls: list[tuple[str, Any]] = []
    monkeypatch.setitem(sys.modules, name, recorder(name, calls))
    monkeypatch.setenv("GENESYS_PROJECT", "math-grpo")
    tracker = open_trackers([name], tmp_path, CONFIG, "run-7")
    for metrics in steps():
        tracker.log(metrics, metrics["step"])
    tracker.close()
    init = {"project": "math-grpo", "name": "run-7", "config": CONFIG} | (
        {"dir": str(tmp_path)} if name == "wandb" else {}
    )
    assert calls[0] == ("init", init)
    assert calls[1] == ("log", ({"reward_mean": 0.1, "groups_dropped": 1, "logprob_mismatch": 0.01}, 1))
    assert calls[2] == ("log", ({"reward_mean": 0.2, "groups_dropped": 0}, 2))
    assert calls[4:] == [("finish", None)]


def test_the_project_defaults_to_genesys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls: list[tuple[str, Any]] = []
    monkeypatch.setitem(sys.modules, "trackio", recorder("trackio", calls))
    monkeypatch.delenv("GENESYS_PROJECT", raising=False)
    open_trackers(["trackio"], tmp_path, CONFIG, "run").close()
    assert calls[0][1]["project"] == "genesys"


@pytest.mark.parametrize("missing", ["tensorboard", "wandb", "trackio"])
def test_a_missing_library_is_refused_before_any_tracker_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
):
    calls: list[tuple[str, Any]] = []
    monkeypatch.setitem(sys.modules, "trackio", recorder("trackio", calls))
    monkeypatch.setitem(sys.modules, missing, None)  # None in sys.modules makes `import missing` fail
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    report_to = [name for name in ("tensorboard", "trackio") if name != missing] + [missing]
    with pytest.raises(
        InputError, match=rf"report_to '{missing}' needs the {missing} package.*: pip install {missing}$"
    ):
        open_trackers(report_to, tmp_path, CONFIG, "run")
    assert not (tmp_path / "tensorboard").exists()
    assert calls == []


def test_an_unknown_tracker_is_refused(tmp_path: Path):
    with pytest.raises(InputError, match="unknown tracker 'mlflow'"):
        open_trackers(["mlflow"], tmp_path, CONFIG, "run")


def test_no_tracker_is_a_tracker_that_does_nothing(tmp_path: Path):
    tracker = open_trackers([], tmp_path, CONFIG, "run")
    tracker.log({"step": 1, "reward_mean": 0.5}, 1)
    tracker.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_training_run_reports_to_tensorboard_and_its_directory_draws(
    tiny_model, tmp_path: Path, plugin_env
):
    pytest.importorskip("transformers")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from genesys.analysis.report_training import write_training_report
    from genesys.train import TrainConfig, train

    out = tmp_path / "run"
    config = TrainConfig.load(
        None,
        {
            "model": tiny_model,
            "output_dir": str(out),
            "progress": False,
            "report_to": ["tensorboard"],
            "data": {"tasks": [str(digit_tasks(tmp_path / "tasks.jsonl"))]},
            "backend": "transformers",
            "sampling": {"n": 4, "max_tokens": 16},
            "rollout": {"prompts_per_step": 2},
            "optim": {"steps": 3, "lr": 1e-3},
            "checkpoint": {"every": 0},
            "verify": {"workers": 1},
        },
    )
    result = train(config)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("reward_mean")] == [
        (m["step"], m["reward_mean"]) for m in result.metrics
    ]
    report = write_training_report(out / "metrics.jsonl", tmp_path / "report")
    assert {"reward", "completion_length", "clipping", "optimization", "throughput"} <= {
        path.stem for path in report.plots
    }
    assert (
        "Steps: 3 recorded (step 1 to 3). Checkpoints: none; final model in `final/`."
        in report.summary.read_text()
    )
