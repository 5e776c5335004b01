"""Asynchronous training and verification on a local Ray instance: bounded staleness, weight
broadcast, a rollout worker killed mid-run, and `genesys verify` spread over Ray actors."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install 'genesys[ray]'")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import REPO, SUPPORT, digit_tasks, read_jsonl, rollout, write_jsonl  # noqa: E402
from genesys.cluster import NAMESPACE  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (4 logical CPUs: 2 rollout, 1 verifier actor, spare),
    whose actors load the test plugins."""
    env = {"GENESYS_PLUGINS": "genesys_testplugins", "PYTHONPATH": os.pathsep.join([str(SUPPORT), str(REPO)]), "OMP_NUM_THREADS": "1"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE, runtime_env={"env_vars": env})
    yield ray
    ray.shutdown()


def ray_config(model: str, out: Path, tasks: Path, staleness: int = 1, steps: int = 12, **sections: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "model": model, "output_dir": str(out), "seed": 0, "progress": False,
        "data": {"tasks": [str(tasks)]},
        "rollout": {"prompts_per_step": 4, "samples_per_prompt": 8, "max_tokens": 32},
        "optim": {"steps": steps, "lr": 3e-3, "max_grad_norm": 1.0, "micro_batch_size": 32},
        "checkpoint": {"every": 0},
        "verify": {"workers": 1},
        "async": {"max_staleness": staleness},
        "cluster": {"backend": "ray", "rollout_workers": 2, "verifier_workers": 1},
    }
    for section, values in sections.items():
        data[section] = {**data[section], **values} if isinstance(values, dict) and isinstance(data.get(section), dict) else values
    return TrainConfig.load(None, data)


def test_two_workers_with_staleness_one_stay_in_bound_and_learn(tiny_model, tmp_path, plugin_env, local_ray):
    result = train(ray_config(tiny_model, tmp_path / "run", digit_tasks(tmp_path / "tasks.jsonl"), staleness=1, steps=30))
    metrics = result.metrics
    assert [m["step"] for m in metrics] == list(range(1, 31))
    for m in metrics:
        assert m["staleness_max"] <= 1 and 0 <= m["staleness_mean"] <= 1
        assert sum(m["staleness_hist"].values()) == m["groups_kept"] == 4
        assert set(m["staleness_hist"]) <= {"0", "1"}
        assert m["trainer_wait_s"] >= 0
    assert any(m["staleness_max"] == 1 for m in metrics)  # generation did run ahead of the trainer
    draws = [d for m in metrics for d in m["draws"]]
    assert len(draws) == len(set(draws)) == 30 * 4  # no group trained twice
    assert all(m["weights_load_s"] is not None for m in metrics[2:])
    rewards = [m["reward_mean"] for m in metrics]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.2, rewards


def test_staleness_zero_on_ray_trains_on_policy(tiny_model, tmp_path, plugin_env, local_ray):
    result = train(ray_config(tiny_model, tmp_path / "run", digit_tasks(tmp_path / "tasks.jsonl"), staleness=0, steps=4))
    assert all(m["staleness_max"] == 0 for m in result.metrics)
    assert result.metrics[0]["logprob_mismatch"] <= 1e-4  # the first batch comes from the trainer's own weights
