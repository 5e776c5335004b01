"""Shared test fixtures: test verifier plugins and small rollout files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

# The tests' plugin modules: on sys.path through `pythonpath` in pyproject.toml, and in PYTHONPATH for subprocesses.
SUPPORT = Path(__file__).parent / "support"
REPO = Path(__file__).resolve().parent.parent
GENESYS = str(Path(sys.executable).with_name("genesys"))


def rollout(task_type: str, completion: str, response_id: str | None = None, **info: Any) -> dict[str, Any]:
    """A GENESYS-shaped rollout row (verification_info as a JSON string, as in the published datasets)."""
    row = {
        "problem_id": f"{task_type}-{info.get('expected', '')}",
        "source": "tests",
        "task_type": task_type,
        "in_source_id": None,
        "prompt": "say the word",
        "gold_standard_solution": None,
        "verification_info": json.dumps(info),
        "metadata": json.dumps({"difficulty": 1}),
        "llm_response": completion,
    }
    if response_id is not None:
        row["response_id"] = response_id
    return row


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session", autouse=True)
def trust_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trust key of the session's tests (`genesys validate` makes it on first use), never the
    user's own: `$GENESYS_TRUST_KEY`, seen by the `genesys` subprocesses too."""
    path = tmp_path_factory.mktemp("trust") / "trust.key"
    previous = os.environ.get("GENESYS_TRUST_KEY")
    os.environ["GENESYS_TRUST_KEY"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("GENESYS_TRUST_KEY", None)
    else:
        os.environ["GENESYS_TRUST_KEY"] = previous


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for `genesys` subprocesses (and this process) that loads the test verifiers."""
    monkeypatch.setenv("GENESYS_PLUGINS", "genesys_testplugins")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]))
    from genesys.plugins import default_plugin_manager

    default_plugin_manager.cache_clear()
    yield dict(os.environ)
    default_plugin_manager.cache_clear()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random-weight Qwen2 model with a locally trained tokenizer (built once per test session)."""
    from genesys.generate.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def checkpoint_shards(checkpoint: Path) -> dict[str, Any]:
    """The tensors of a checkpoint's sharded training state (`state/`) by name, each slice as its file
    holds it (a checkpoint of one process holds every tensor whole)."""
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for file in sorted((checkpoint / "state").glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            tensors.setdefault(name, tensor)
    return tensors


def recorded_rows() -> list[dict[str, Any]]:
    """Recorded rollouts for offline training tests: 6 tasks x 4 samples, rewards 0 and 1 alternating."""
    return [
        {
            "problem_id": f"t{task}",
            "prompt": f"task {task}",
            "prompt_ids": [10 + task, 20, 30],
            "completion_ids": [40 + sample, 50 + task, 60, 70 + sample],
            "completion_logprobs": [-6.0, -6.0, -6.0, -6.0],
            "reward": float(sample % 2),
        }
        for task in range(6)
        for sample in range(4)
    ]


def grpo_config(
    model: str, out: Path, tasks: Path | None = None, *, max_tokens: int = 16, **sections: Any
) -> Any:
    """The TrainConfig of a one-step GRPO run on `tasks` with the transformers backend (4 prompts, 8
    samples of at most `max_tokens` tokens each, seed 0), without checkpoints. Each of `sections`
    updates that section (`optim={"steps": 3}` keeps the other optim settings) or sets a plain key."""
    from genesys.train import TrainConfig

    data: dict[str, Any] = {
        "model": model,
        "output_dir": str(out),
        "backend": "transformers",
        "progress": False,
        "data": {"tasks": [str(tasks)]} if tasks else {},
        "sampling": {"n": 8, "max_tokens": max_tokens, "seed": 0},
        "rollout": {"prompts_per_step": 4},
        "optim": {"steps": 1, "lr": 3e-3, "max_grad_norm": 1.0, "micro_batch_size": 32},
        "checkpoint": {"every": 0},
        "verify": {"workers": 1},
    }
    for section, values in sections.items():
        data[section] = {**data[section], **values} if isinstance(data.get(section), dict) else values
    return TrainConfig.load(None, data)


def train_arguments(
    model: str, out: Path, tasks: Path, steps: int, micro_batch_size: int, *extra: str
) -> list[str]:
    """`genesys train` arguments (the command name first) for a short run on `tasks` with the
    transformers backend: 8 samples of at most 16 tokens a prompt, lr 3e-3, a checkpoint every 2 steps."""
    return [
        "train",
        "--model",
        model,
        "-o",
        str(out),
        f"--data.tasks={tasks}",
        "--optim.steps",
        str(steps),
        "--optim.lr",
        "3e-3",
        "--optim.micro-batch-size",
        str(micro_batch_size),
        "--backend",
        "transformers",
        "--sampling.n",
        "8",
        "--sampling.max-tokens",
        "16",
        "--checkpoint.every",
        "2",
        "--verify.workers",
        "1",
        "--no-progress",
        *extra,
    ]
