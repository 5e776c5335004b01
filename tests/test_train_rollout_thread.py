"""The trainer generates in its own thread: on CPU, a second thread's torch pool beside the
trainer's slows both down."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import write_jsonl  # noqa: E402

from genesys.generate.hf import TransformersBackend  # noqa: E402
from genesys.generate.tiny_model import build_tiny_model  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402


def test_rollouts_and_weight_updates_run_in_the_trainers_thread(tmp_path, plugin_env, monkeypatch):
    model = str(build_tiny_model(tmp_path / "model"))
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            {
                "problem_id": f"p{i}",
                "task_type": "digit_share",
                "prompt": f"Write digits {i}",
                "verification_info": {},
            }
            for i in range(2)
        ],
    )
    threads: list[tuple[str, int]] = []
    for name in ("generate_batch", "_load_weights"):
        method = getattr(TransformersBackend, name)

        def recorded(self, *args, _method=method, _name=name):
            threads.append((_name, threading.get_ident()))
            return _method(self, *args)

        monkeypatch.setattr(TransformersBackend, name, recorded)
    config = TrainConfig.load(
        None,
        {
            "model": model,
            "output_dir": str(tmp_path / "run"),
            "progress": False,
            "backend": "transformers",
            "data": {"tasks": [str(tasks)]},
            "sampling": {"n": 2, "max_tokens": 4},
            "rollout": {"prompts_per_step": 2, "filter_groups": False},
            "optim": {"steps": 2},
            "checkpoint": {"every": 0},
            "verify": {"workers": 1},
        },
    )
    train(config)
    assert {name for name, _ in threads} == {"generate_batch", "_load_weights"}
    assert {thread for _, thread in threads} == {threading.get_ident()}
