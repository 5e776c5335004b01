"""The learning demo's plumbing: every stage runs its real command and the summary holds what the
issue of a newcomer needs (the learning claim itself is `benchmarks/learning_loop.py`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from genesys.demo import TINY, Demo, _write_toml, mean_and_stderr, paired_gain  # noqa: E402
from genesys.tasks.sources import load_source  # noqa: E402


def test_the_generated_config_files_read_back_as_written(tmp_path):
    import tomllib

    config = {
        "model": "m",
        "progress": False,
        "data": {"tasks": ["arithmetic:count=2"]},
        "optim": {"lr": 0.0},
    }
    assert tomllib.loads(_write_toml(tmp_path / "run.toml", config).read_text()) == config


def test_the_demo_evaluates_on_at_least_200_tasks_no_training_stage_ever_sees(tmp_path):
    tasks = Demo(tmp_path, TINY).tasks
    problems = {use: {row["problem_id"] for row in load_source(spec).rows} for use, spec in tasks.items()}
    assert len(problems["heldout"]) == TINY.heldout_tasks >= 200
    assert problems["heldout_during_rl"] <= problems["heldout"]
    trained = problems["tokenizer"] | problems["sft"] | problems["pool"]
    assert len(problems["pool"] - problems["sft"]) > len(problems["pool"]) // 2  # mostly new problems for RL
    assert not trained & problems["heldout"]


def test_accuracy_and_gain_carry_standard_errors_over_tasks():
    mean, stderr = mean_and_stderr({"a": 0.0, "b": 1.0, "c": 0.5, "d": 0.5})
    assert mean == 0.5 and stderr == pytest.approx((1 / 6) ** 0.5 / 2)
    # paired: a gain every task shares has no spread, whatever the spread of the tasks themselves
    assert paired_gain({"a": 0.0, "b": 0.5, "c": 0.9}, {"a": 0.1, "b": 0.6, "c": 1.0, "d": 1.0}) == (
        pytest.approx(0.1),
        pytest.approx(0.0),
    )


@pytest.mark.slow
def test_a_small_demo_runs_every_stage_and_writes_its_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    settings = replace(
        TINY,
        heldout_tasks=4,
        samples=2,
        max_tokens=8,
        sft_tasks=32,
        sft_steps=2,
        sft_examples_per_step=8,
        pool_tasks=4,
        pool_samples=2,
        min_pass_rate=0.0,
        max_pass_rate=1.0,
        rl_steps=1,
        rl_prompts_per_step=2,
        rl_group_size=2,
        rl_warmup_steps=0,
        eval_every=1,
        eval_tasks=2,
        eval_samples=1,
    )
    summary = Demo(tmp_path / "demo", settings).run()
    assert json.loads((tmp_path / "demo" / "summary.json").read_text()) == summary
    assert summary["heldout_tasks"] == 4
    for key in ("accuracy_before_sft", "accuracy_after_sft", "accuracy_after_rl"):
        assert 0.0 <= summary[key] <= 1.0 and 0.0 <= summary[f"{key}_stderr"] <= 0.5
    assert summary["rl_gain_points"] == pytest.approx(
        100 * (summary["accuracy_after_rl"] - summary["accuracy_after_sft"])
    )
    assert [stage["name"] for stage in summary["stages"]][:3] == [
        "build the tiny model",
        "evaluate (base)",
        "genesys sft",
    ]
    assert all(stage["seconds"] > 0 for stage in summary["stages"])
    report = tmp_path / "demo" / "report"
    assert (report / "heldout_accuracy.png").is_file() and (report / "optimization.png").is_file()
    assert (report / "evaluation.png").is_file()  # held-out accuracy during RL
    held_out = [json.loads(line) for line in (tmp_path / "demo" / "eval-base.jsonl").open()]
    assert {row["metadata"]["split"] for row in held_out} == {"heldout"}
