"""The learning demo's plumbing: every stage runs its real command and the summary holds what the
issue of a newcomer needs (the learning claim itself is `benchmarks/learning_loop.py`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from genesys.demo import TINY, Demo, _write_toml  # noqa: E402


def test_the_generated_config_files_read_back_as_written(tmp_path):
    import tomllib

    config = {
        "model": "m",
        "progress": False,
        "data": {"tasks": ["arithmetic:count=2"]},
        "optim": {"lr": 0.0},
    }
    assert tomllib.loads(_write_toml(tmp_path / "run.toml", config).read_text()) == config


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
    )
    summary = Demo(tmp_path / "demo", settings).run()
    assert json.loads((tmp_path / "demo" / "summary.json").read_text()) == summary
    assert summary["heldout_tasks"] == 4
    for key in ("accuracy_before_sft", "accuracy_after_sft", "accuracy_after_rl"):
        assert 0.0 <= summary[key] <= 1.0
    assert [stage["name"] for stage in summary["stages"]][:3] == [
        "build the tiny model",
        "evaluate (base)",
        "genesys sft",
    ]
    assert all(stage["seconds"] > 0 for stage in summary["stages"])
    report = tmp_path / "demo" / "report"
    assert (report / "heldout_accuracy.png").is_file() and (report / "optimization.png").is_file()
    held_out = [json.loads(line) for line in (tmp_path / "demo" / "eval-base.jsonl").open()]
    assert {row["metadata"]["split"] for row in held_out} == {"heldout"}
