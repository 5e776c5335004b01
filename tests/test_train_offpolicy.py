"""`genesys train` off the happy path: ratio 1 on the first on-policy step with top-p and with dropout
in the model's config, the importance correction and recomputed logprobs, mini-batches, steps with
no signal, resuming with another step count, evaluation during training, and a resumed wandb run."""

from __future__ import annotations

import json
import shutil
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import grpo_config, read_jsonl  # noqa: E402

from genesys.errors import InputError, TrainingError  # noqa: E402
from genesys.testing.digits import digit_tasks  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402
from genesys.train.tracking import open_trackers  # noqa: E402


def assert_on_policy(first: dict[str, Any]) -> None:
    assert first["logprob_mismatch"] <= 1e-4
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["ratio_max"] <= 1 + 1e-4
    assert first["clip_low_frac"] == first["clip_high_frac"] == 0.0


def test_the_first_on_policy_step_has_ratio_one_at_top_p_0_7(tiny_model, tmp_path, plugin_env):
    """The sampler's logprobs are of the renormalised nucleus; so are the trainer's."""
    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    result = train(
        grpo_config(tiny_model, tmp_path / "run", tasks, sampling={"top_p": 0.7, "temperature": 0.9})
    )
    assert_on_policy(result.metrics[0])


def test_the_first_on_policy_step_has_ratio_one_with_dropout_in_the_config(tiny_model, tmp_path, plugin_env):
    model = tmp_path / "dropout-model"
    shutil.copytree(tiny_model, model)
    settings = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**settings, "attention_dropout": 0.1}))
    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    result = train(grpo_config(str(model), tmp_path / "run", tasks))
    assert_on_policy(result.metrics[0])
    assert json.loads((tmp_path / "run" / "final" / "config.json").read_text())["attention_dropout"] == 0.1
    # with dropout left on, the trainer's policy is not the sampler's
    kept = train(grpo_config(str(model), tmp_path / "with-dropout", tasks, disable_dropout=False))
    assert kept.metrics[0]["ratio_max"] > 1 + 1e-3


def test_importance_correction_recomputes_the_old_logprobs_and_weighs_tokens(
    tiny_model, tmp_path, plugin_env
):
    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    result = train(
        grpo_config(
            tiny_model,
            tmp_path / "run",
            tasks,
            optim={"steps": 4, "mini_batches": 2},
            loss={"importance_correction": "mis", "importance_level": "sequence", "importance_cap": 2.0},
        )
    )
    first, second, third = result.metrics[:3]
    assert first["logprob_mismatch"] <= 1e-4 and first["logprob_mismatch_stale"] is None
    # the same engine and weights: every weight is 1, none over the cap
    assert first["is_weight_mean"] == pytest.approx(1.0, abs=1e-3) and first["is_capped_frac"] == 0.0
    assert first["ratio_max"] <= 1 + 1e-4
    # the second mini-batch of the same batch: the policy moved, the ratio is taken against the
    # recomputed logprobs of the weights the batch started from
    assert second["reward_mean"] == first["reward_mean"] and second["logprob_mismatch"] is None
    assert second["ratio_max"] > 1 + 1e-4
    assert 0 < first["tokens"] < first["tokens"] + second["tokens"]  # each step trains on one slice
    assert third["reward_mean"] != first["reward_mean"]  # a new batch after two mini-batches


def test_steps_without_signal_take_no_update_and_stop_the_run(tiny_model, tmp_path, plugin_env):
    """Every rollout scores 1 (the env_probe verifier): no group has signal, every group is dropped."""
    tasks = tmp_path / "same.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "problem_id": f"p{i}",
                    "task_type": "env_probe",
                    "prompt": f"say {i}",
                    "verification_info": {"name": "HOME"},
                }
            )
            + "\n"
            for i in range(8)
        )  # fmt: skip
    )
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"no group had a learning signal in 2 steps in a row"):
        train(
            grpo_config(
                tiny_model,
                out,
                tasks,
                optim={"steps": 5, "schedule": "cosine", "warmup_steps": 2},
                rollout={"max_refill_rounds": 1, "max_no_signal_steps": 2},
            )
        )
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["skip_reason"] for m in metrics] == ["no_signal", "no_signal"]
    assert all(m["step_skipped"] and m["groups_kept"] == 0 and m["groups_dropped"] == 4 for m in metrics)
    # the reward covers every generated group, the kept-only figure has none
    assert [(m["reward_mean"], m["reward_mean_kept"]) for m in metrics] == [(1.0, None), (1.0, None)]
    # no optimizer step, and the schedule did not move: still the first warmup step's rate
    assert [m["lr"] for m in metrics] == [pytest.approx(1.5e-3)] * 2
    assert not (out / "final").exists()
    assert (out / "checkpoints" / "step-000002").is_dir()  # what the run holds is kept, to resume from


def test_resuming_with_another_step_count_is_refused_with_a_cosine_schedule(tiny_model, tmp_path, plugin_env):
    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    out = tmp_path / "run"
    first = {"steps": 2, "schedule": "cosine"}
    train(grpo_config(tiny_model, out, tasks, optim=first, checkpoint={"every": 1}))
    with pytest.raises(InputError, match=r"optim.steps = 2 with a cosine schedule.*reshape the schedule"):
        train(grpo_config(tiny_model, out, tasks, optim={**first, "steps": 3}, checkpoint={"every": 1}))
    # a constant schedule does not depend on the step count: the run goes on to the new count
    constant = tmp_path / "constant"
    train(grpo_config(tiny_model, constant, tasks, optim={"steps": 2}, checkpoint={"every": 1}))
    longer = train(grpo_config(tiny_model, constant, tasks, optim={"steps": 3}, checkpoint={"every": 1}))
    assert [m["step"] for m in longer.metrics] == [1, 2, 3]
    assert {m["lr"] for m in longer.metrics} == {3e-3}


@pytest.mark.slow
def test_evaluation_during_training_writes_metrics_per_source_and_draws_them(
    tiny_model, tmp_path, plugin_env
):
    from genesys.analysis.report_training import write_training_report

    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    held_out = digit_tasks(tmp_path / "held_out.jsonl", count=3)
    result = train(
        grpo_config(
            tiny_model,
            tmp_path / "run",
            tasks,
            optim={"steps": 3},
            eval={"tasks": [str(held_out)], "every": 2, "samples": 3},
        )
    )
    evaluated = [m for m in result.metrics if "eval/held_out/accuracy" in m]
    assert [m["step"] for m in evaluated] == [2, 3]  # every 2 steps, and the last
    for metrics in evaluated:
        assert 0.0 <= metrics["eval/held_out/accuracy"] <= 1.0
        assert 0.0 <= metrics["eval/held_out/avg@3"] <= metrics["eval/held_out/pass@3"] <= 1.0
        assert metrics["eval/held_out/errors"] == 0
    assert "eval/held_out/accuracy" in read_jsonl(tmp_path / "run" / "metrics.jsonl")[1]
    report = write_training_report(tmp_path / "run" / "metrics.jsonl", tmp_path / "report")
    assert "evaluation" in {path.stem for path in report.plots}


def test_every_evaluation_draws_the_same_random_numbers_so_unchanged_weights_score_the_same(
    tiny_model, tmp_path, plugin_env
):
    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    held_out = digit_tasks(tmp_path / "held_out.jsonl", count=6)
    result = train(
        grpo_config(
            tiny_model,
            tmp_path / "run",
            tasks,
            sampling={"n": 8, "max_tokens": 16, "seed": 0, "temperature": 1.5},
            optim={"steps": 3, "lr": 0.0},
            eval={"tasks": [str(held_out)], "every": 1, "samples": 4},
        )
    )
    evaluated = [{k: v for k, v in m.items() if k.startswith("eval/")} for m in result.metrics]
    assert len(evaluated) == 3 and 0.0 < evaluated[0]["eval/held_out/avg@4"] < 1.0
    # a curve of evaluations moves with the weights only, never with the sampling noise
    assert evaluated[1] == evaluated[0] and evaluated[2] == evaluated[0]


def test_eval_is_refused_without_the_trainers_own_backend(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="eval.tasks evaluates with the trainer's own generation backend"):
        TrainConfig.load(
            None,
            {"model": "m", "output_dir": "o", "data": {"rollouts": ["r.jsonl"]}, "eval": {"tasks": ["t"]}},
        )


def test_a_resumed_run_logs_into_the_same_wandb_run(tmp_path, monkeypatch):
    inits: list[dict[str, Any]] = []
    module = ModuleType("wandb")

    def init(**kwargs: Any) -> SimpleNamespace:
        inits.append(kwargs)
        return SimpleNamespace(
            id=kwargs.get("id", f"run-{len(inits)}"), log=lambda *a, **k: None, finish=lambda: None
        )

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    open_trackers(["wandb"], tmp_path, {}, "run").close()
    open_trackers(["wandb"], tmp_path, {}, "run", resume=True).close()
    assert "id" not in inits[0]
    assert (inits[1]["id"], inits[1]["resume"]) == ("run-1", "allow")
    open_trackers(["wandb"], tmp_path, {}, "run", resume=False).close()  # a new run starts afresh
    assert "id" not in inits[2]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dr_grpo", "gspo", "cispo"])
def test_each_loss_type_learns_the_toy_task(tiny_model, tmp_path, plugin_env, loss_type):
    """The digit task as `test_a_tiny_model_learns_the_toy_task...` (grpo) learns it, in 60 steps."""
    result = train(
        grpo_config(
            tiny_model,
            tmp_path / "run",
            digit_tasks(tmp_path / "tasks.jsonl"),
            sampling={"max_tokens": 32},
            optim={"steps": 60},
            loss={"type": loss_type},
        )
    )
    rewards = [m["reward_mean"] for m in result.metrics]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert start < 0.2
    assert end >= 0.8, rewards


def test_mask_truncated_leaves_completions_cut_at_max_tokens_out_of_the_loss(
    tiny_model, tmp_path, plugin_env
):
    """At 4 tokens most completions of the random model are cut: they count in their group's
    advantages but not in the loss, and the metrics say how many."""
    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    plain = train(grpo_config(tiny_model, tmp_path / "plain", tasks, sampling={"max_tokens": 4}))
    masked = train(
        grpo_config(
            tiny_model, tmp_path / "masked", tasks, sampling={"max_tokens": 4}, loss={"mask_truncated": True}
        )
    )
    first, cut = plain.metrics[0], masked.metrics[0]
    assert cut["reward_mean"] == first["reward_mean"]  # the same rollouts
    assert cut["truncated_masked"] > 0
    assert cut["tokens"] == first["tokens"] - 4 * cut["truncated_masked"]
    assert "truncated_masked" not in first
