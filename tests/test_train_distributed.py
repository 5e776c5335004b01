"""Data parallel training: two CPU processes on gloo (launched with torchrun) end with the same
weights as one process with the same global batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import GENESYS, read_jsonl  # noqa: E402

from genesys.testing.digits import digit_tasks  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="torch has no gloo backend",
    ),
    pytest.mark.distributed,
    pytest.mark.slow,
]


def _arguments(model: str, tasks: Path, out: Path, extra: tuple[str, ...] = ()) -> list[str]:
    # One sequence per generate call: a completion then depends only on its own seed, not on what
    # it was batched with, so both layouts sample the very same tokens.
    return [
        "train",
        "--model",
        model,
        "-o",
        str(out),
        f"--data.tasks={tasks}",
        "--optim.steps",
        "3",
        "--optim.lr",
        "3e-3",
        "--optim.micro-batch-size",
        "4",
        "--backend",
        "transformers",
        "--sampling.n",
        "8",
        "--sampling.max-tokens",
        "16",
        "--backend-options.batch-size",
        "1",
        "--checkpoint.every",
        "2",
        "--verify.workers",
        "1",
        "--no-progress",
        *extra,
    ]


# With an importance correction the old policy's logprobs are recomputed before each batch's first
# update: every rank runs as many forward passes as the rank with the most.
@pytest.mark.parametrize("extra", [(), ("--loss.importance_correction", "tis")], ids=["plain", "tis"])
def test_two_gloo_processes_match_one_process(tiny_model, tmp_path, plugin_env, extra):
    from safetensors.torch import load_file

    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    env = {**plugin_env, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [GENESYS, *_arguments(tiny_model, tasks, tmp_path / "one", extra)],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "genesys.cli",
    ]
    two = subprocess.run(
        [*torchrun, *_arguments(tiny_model, tasks, tmp_path / "two", extra)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode == 0, two.stderr[-3000:]

    one_metrics, two_metrics = (
        read_jsonl(tmp_path / "one" / "metrics.jsonl"),
        read_jsonl(tmp_path / "two" / "metrics.jsonl"),
    )
    assert [m["groups_kept"] for m in two_metrics] == [4, 4, 4]  # both ranks' groups are counted
    for a, b in zip(one_metrics, two_metrics, strict=True):
        assert a["reward_mean"] == pytest.approx(
            b["reward_mean"], abs=1e-9
        )  # the same completions were sampled
        assert a["tokens"] == b["tokens"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    one, two_weights = (
        load_file(tmp_path / "one" / "final" / "model.safetensors"),
        load_file(tmp_path / "two" / "final" / "model.safetensors"),
    )
    start = load_file(Path(tiny_model) / "model.safetensors")
    for name in one:
        assert (one[name] - two_weights[name]).abs().max() <= 1e-5, name
    assert any(not torch.equal(one[name], start[name]) for name in one)  # the weights did move
    # rank 0 wrote the checkpoint, holding both ranks' data positions
    from genesys.train.checkpoint import load_state

    state = load_state(tmp_path / "two" / "checkpoints" / "step-000002")
    assert state["world_size"] == 2 and len(state["ranks"]) == 2
