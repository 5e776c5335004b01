"""Non-finite numbers never reach the weights: recorded rollouts with a NaN or infinite logprob or
reward are refused naming the row, a step whose loss or gradient is not finite is skipped and
counted, too many in a row stop the run, and no model with a non-finite weight is written."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import read_jsonl, write_jsonl  # noqa: E402

from genesys.errors import InputError, TrainingError  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402


def recorded_rows(tasks: int = 4, samples: int = 4) -> list[dict[str, Any]]:
    """Recorded rollouts of `tasks` tasks, `samples` each, half of them rewarded."""
    return [
        {
            "problem_id": f"t{task}",
            "prompt": f"task {task}",
            "prompt_ids": [10 + task, 20, 30],
            "completion_ids": [40 + sample, 50 + task, 60],
            "completion_logprobs": [-6.0, -6.0, -6.0],
            "reward": float(sample % 2),
        }
        for task in range(tasks)
        for sample in range(samples)
    ]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def offline_config(model: str, out: Path, rollouts: Path, **sections: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "model": model,
        "output_dir": str(out),
        "sampling": {"seed": 0},
        "progress": False,
        "data": {"rollouts": [str(rollouts)]},
        "rollout": {"prompts_per_step": 2},
        "optim": {"steps": 4, "lr": 1e-2, "max_grad_norm": 1.0, "micro_batch_size": 64},
        "checkpoint": {"every": 0},
    }
    for section, values in sections.items():
        data[section] = {**data[section], **values} if isinstance(data.get(section), dict) else values
    return TrainConfig.load(None, data)


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("completion_logprobs", [-1.0, math.nan, -1.0], r"completion_logprobs\[1\] is nan"),
        ("completion_logprobs", [-1.0, -1.0, math.inf], r"completion_logprobs\[2\] is inf"),
        ("completion_logprobs", [-math.inf, -1.0, -1.0], r"completion_logprobs\[0\] is -inf"),
        ("reward", math.nan, "reward must be a finite number or null, got nan"),
        ("reward", -math.inf, "reward must be a finite number or null, got -inf"),
    ],
)
def test_recorded_rollouts_with_non_finite_logprobs_or_rewards_are_refused_naming_the_row(
    tiny_model, tmp_path, column, value, message
):
    rows = recorded_rows()
    rows[5][column] = value
    path = write_parquet(tmp_path / "rollouts.parquet", rows)
    with pytest.raises(InputError, match=rf"rollouts\.parquet#5: {message}"):
        train(offline_config(tiny_model, tmp_path / "run", path))
    assert not (tmp_path / "run" / "final").exists()


def test_a_reward_too_large_for_a_finite_advantage_is_refused_naming_the_row(tiny_model, tmp_path):
    rows = recorded_rows(tasks=2)
    rows[1]["reward"] = 1e39  # finite here, infinite in the trainer's float32
    path = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    with pytest.raises(
        InputError, match=r"\(task 't0'\) has reward 1e\+39: its group's advantages are not finite"
    ):
        train(offline_config(tiny_model, tmp_path / "run", path))


def _poison(monkeypatch: pytest.MonkeyPatch, calls: set[int], where: str) -> None:
    """Make the loss (or only its gradient) NaN in the given calls of the token loss (1-based); with
    one micro-batch per step, call n is step n."""
    from genesys.train import trainer

    original = trainer.policy_token_loss
    count = 0

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        result = original(*args, **kwargs)
        if count in calls:
            if where == "loss":
                result.loss = result.loss * math.nan
            else:  # a finite loss whose gradient is NaN
                result.loss.register_hook(lambda grad: grad * math.nan)
        return result

    monkeypatch.setattr(trainer, "policy_token_loss", poisoned)


def _weights(checkpoint: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(checkpoint / "model.safetensors")


@pytest.mark.parametrize("where", ["loss", "gradient"])
def test_a_step_with_a_non_finite_loss_or_gradient_is_skipped_counted_and_leaves_the_weights(
    tiny_model, tmp_path, monkeypatch, where
):
    _poison(monkeypatch, {2}, where)
    path = write_jsonl(tmp_path / "rollouts.jsonl", recorded_rows())
    out = tmp_path / "run"
    result = train(offline_config(tiny_model, out, path, checkpoint={"every": 1, "keep": 10}))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # the run went on
    assert [m["step_skipped"] for m in metrics] == [False, True, False, False]
    assert [m["skipped_steps"] for m in metrics] == [0, 1, 1, 1]
    if where == "loss":
        assert metrics[1]["loss"] is None  # NaN is written as null
    else:
        assert metrics[1]["grad_norm"] is None and math.isfinite(metrics[1]["loss"])
    one, two, three = (_weights(out / "checkpoints" / f"step-00000{step}") for step in (1, 2, 3))
    assert all(torch.equal(one[name], two[name]) for name in one)  # no update at step 2
    assert any(not torch.equal(two[name], three[name]) for name in two)  # an update at step 3
    final = _weights(result.final_dir)
    assert all(torch.isfinite(tensor).all() for tensor in final.values())


def test_too_many_non_finite_steps_in_a_row_stop_the_run_with_a_clear_error(
    tiny_model, tmp_path, monkeypatch
):
    _poison(monkeypatch, set(range(2, 100)), "loss")
    path = write_jsonl(tmp_path / "rollouts.jsonl", recorded_rows())
    out = tmp_path / "run"
    config = offline_config(
        tiny_model,
        out,
        path,
        optim={"steps": 8, "max_nonfinite_steps": 3},
        checkpoint={"every": 1, "keep": 10},
    )
    with pytest.raises(
        TrainingError, match=r"step 4: the loss or gradient was not finite in 3 steps in a row"
    ) as error:
        train(config)
    assert "the model is that of step 1" in str(error.value) and "optim.max_nonfinite_steps" in str(
        error.value
    )
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step_skipped"] for m in metrics] == [False, True, True, True]
    assert not (out / "final").exists()
    for checkpoint in sorted((out / "checkpoints").iterdir()):
        assert all(torch.isfinite(tensor).all() for tensor in _weights(checkpoint).values()), checkpoint


def test_max_nonfinite_steps_is_a_config_key_with_a_default_and_may_change_on_resume():
    from genesys.train.trainer import RESUMABLE_CONFIG_KEYS

    assert (
        TrainConfig.load(
            None, {"model": "m", "output_dir": "o", "data": {"tasks": ["t"]}, "sampling": {"n": 2}}
        ).optim.max_nonfinite_steps
        == 3
    )
    with pytest.raises(ValueError, match="max_nonfinite_steps"):
        TrainConfig.load(
            None,
            {
                "model": "m",
                "output_dir": "o",
                "data": {"tasks": ["t"]},
                "sampling": {"n": 2},
                "optim": {"max_nonfinite_steps": 0},
            },
        )
    assert "optim.max_nonfinite_steps" in RESUMABLE_CONFIG_KEYS


def test_no_checkpoint_or_final_model_is_written_with_a_non_finite_weight(tiny_model, tmp_path):
    from genesys.train import checkpoint as ckpt
    from genesys.train.distributed import close_world, init_world
    from genesys.train.parallel import local_tensor
    from genesys.train.trainer import Trainer

    path = write_jsonl(tmp_path / "rollouts.jsonl", recorded_rows())
    out = tmp_path / "run"
    world = init_world()
    try:
        with Trainer(offline_config(tiny_model, out, path), world) as trainer:
            assert ckpt.nonfinite_parameters(trainer.model) == []
            with torch.no_grad():
                local_tensor(trainer.model.model.norm.weight)[3] = math.inf  # in the sharded master weights
            with pytest.raises(
                TrainingError, match=r"not writing checkpoint .*step-000000: weight model\.norm\.weight"
            ):
                trainer.save_checkpoint()
            assert not (out / "checkpoints").exists()
            trainer.step = trainer.config.optim.steps  # nothing left to train: straight to the final model
            with pytest.raises(TrainingError, match="the final model .* holds NaN or infinite values"):
                trainer.run()
            assert not (out / "final").exists()
    finally:
        close_world(world)
