"""The trainer talks to its rollout source through the `RolloutSource` protocol alone: any object
with its methods serves, in the order the protocol promises, resumed from its own saved state."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from genesys.testing.digits import digit_tasks  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402
from genesys.train.sources.base import RolloutSource, StepRollouts  # noqa: E402


class ScriptedSource:
    """A rollout source that is none of genesys's: fixed groups, and a log of every call."""

    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls
        self.served = 0

    def start(self, named_parameters: Any, step: int) -> None:
        self.calls.append(("start", (step, len(list(named_parameters)) > 0)))

    def next_batch(self, size: int) -> StepRollouts:
        self.calls.append(("next_batch", size))
        groups = []
        for _ in range(size):
            self.served += 1
            groups.append(
                [
                    {
                        "problem_id": f"p{self.served}",
                        "prompt_ids": [1, 2, 3],
                        "completion_ids": [4, 5 + sample],
                        "completion_logprobs": [-1.0, -1.0],
                        "reward": float(sample),
                    }
                    for sample in range(2)
                ]
            )
        return StepRollouts(groups=groups, groups_seen=size, rounds=1)

    def publish(self, named_parameters: Any, version: int) -> None:
        self.calls.append(("publish", version))

    def state(self) -> dict[str, Any]:
        self.calls.append(("state", self.served))
        return {"served": self.served}

    def load_state(self, state: dict[str, Any]) -> None:
        self.calls.append(("load_state", state["served"]))
        self.served = state["served"]

    def close(self) -> None:
        self.calls.append(("close", None))


def run(model: str, out: Path, tasks: Path, steps: int, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[tuple[str, Any]] = []

    def open_source(config, world, task_rows, source_model, device) -> RolloutSource:
        calls.append(("open", (len(task_rows), Path(source_model).name)))
        return ScriptedSource(calls)

    monkeypatch.setattr("genesys.train.trainer.open_source", open_source)
    config = TrainConfig.load(
        None,
        {
            "model": model,
            "output_dir": str(out),
            "progress": False,
            "data": {"tasks": [str(tasks)]},
            "rollout": {"prompts_per_step": 2},
            "sampling": {"n": 2, "max_tokens": 8},
            "optim": {"steps": steps, "lr": 1e-3},
            "checkpoint": {"every": 2},
            "verify": {"workers": 1},
        },
    )
    result = train(config)
    assert [m["step"] for m in result.metrics][-1] == steps
    return calls


def test_the_trainer_drives_any_rollout_source_through_the_protocol(
    tiny_model, tmp_path, plugin_env, monkeypatch
):
    tasks = digit_tasks(tmp_path / "tasks.jsonl", count=6)
    calls = run(tiny_model, tmp_path / "run", tasks, 3, monkeypatch)
    assert calls == [
        ("open", (6, Path(tiny_model).name)),
        ("start", (0, True)),
        ("next_batch", 2),
        ("publish", 1),
        ("next_batch", 2),
        ("publish", 2),
        ("state", 4),  # the step-2 checkpoint
        ("next_batch", 2),
        ("publish", 3),
        ("close", None),
    ]
    # Resumed from the step-2 checkpoint (the final model removed, as after a crash): the source opens
    # the run's model (not the checkpoint's folder, which resuming never reads), gets its state back
    # before it starts, and starts with the checkpoint's weights, at step 2.
    shutil.rmtree(tmp_path / "run" / "final")
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]))
    resumed = run(tiny_model, tmp_path / "run", tasks, 3, monkeypatch)
    assert resumed == [
        ("open", (6, Path(tiny_model).name)),
        ("load_state", 4),
        ("start", (2, True)),
        ("next_batch", 2),
        ("publish", 3),
        ("close", None),
    ]
