"""Checkpoints hold the trainer state as JSON and safetensors and the training state as safetensors
shards: nothing is unpickled on resume (a planted pickle is refused or ignored, never run), the state
round-trips exactly, a resumed run ends with the weights of an uninterrupted one, reading its shards
and not the model folder, checkpoints of an older genesys or with a missing or cut shard file are
refused by path, and a model larger than one file is written as indexed files that load as they are."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402
from conftest import checkpoint_shards, read_jsonl, write_jsonl  # noqa: E402
from conftest import recorded_rows as rows  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from genesys.errors import InputError  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402
from genesys.train import checkpoint as ckpt  # noqa: E402


class Planted:
    """An object whose unpickling creates `marker` (as a malicious pickle would run any code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def plant(path: Path, marker: Path) -> None:
    torch.save({"step": 1, "world_size": 1, "payload": Planted(marker)}, path)


def config(model: str, out: Path, rollouts: Path, steps: int) -> TrainConfig:
    return TrainConfig.load(
        None,
        {
            "model": model,
            "output_dir": str(out),
            "sampling": {"seed": 0},
            "progress": False,
            "data": {"rollouts": [str(rollouts)]},
            "rollout": {"prompts_per_step": 2},
            "optim": {"steps": steps, "lr": 1e-2, "max_grad_norm": 1.0, "micro_batch_size": 64},
            "checkpoint": {"every": 1, "keep": 5},
        },
    )


@pytest.fixture
def rollouts(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "rollouts.jsonl", rows())


@pytest.fixture
def straight(tiny_model: str, tmp_path: Path, rollouts: Path) -> dict[str, Any]:
    """The final weights of an uninterrupted 3-step run."""
    return load_file(
        train(config(tiny_model, tmp_path / "straight", rollouts, 3)).final_dir / "model.safetensors"
    )


def assert_same_weights(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_the_state_round_trips_exactly_through_json_and_safetensors(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    random.seed(5)
    np.random.seed(5)
    state = {
        "step": 7,
        "optimizer": optimizer.state_dict(),  # integer keys, tuples (betas), 0-d tensors
        "rng": ckpt.rng_states(),  # a tuple of 625 ints, a numpy uint32 array, a uint8 tensor
        "floats": [0.1, math.nan, math.inf, -math.inf, 1e-320],
        "rows": [{"__genesys__": "a row's own key", "text": "x", 3: b"\x00bytes"}],
        "nothing": None,
    }
    ckpt.write_state(tmp_path, state)
    back = ckpt.load_state(tmp_path)

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, np.ndarray):
            return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
        if isinstance(a, float) and math.isnan(a):
            return isinstance(b, float) and math.isnan(b)
        if isinstance(a, dict):
            return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list | tuple):
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return type(a) is type(b) and a == b

    assert same(state, back)
    assert not list(tmp_path.glob("*.pt"))
    text = (tmp_path / ckpt.STATE_FILE).read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    with pytest.raises(TypeError, match="cannot store a object"):
        ckpt.write_state(tmp_path, {"x": object()})


def test_a_planted_pickle_in_place_of_the_state_is_refused_and_never_run(tiny_model, tmp_path, rollouts):
    out = tmp_path / "run"
    step = out / "checkpoints" / "step-000002"
    step.mkdir(parents=True)
    marker = tmp_path / "pwned"
    plant(step / "trainer_state.pt", marker)
    with pytest.raises(InputError) as error:
        train(config(tiny_model, out, rollouts, 3))
    message = str(error.value)
    assert str(step) in message and "trainer_state.pt" in message and "pickle" in message
    assert f"--model {step}" in message
    assert not marker.exists()
    assert not (out / "metrics.jsonl").exists()


def test_a_pickle_beside_the_state_is_ignored_and_resume_matches_an_uninterrupted_run(
    tiny_model, tmp_path, rollouts, straight, caplog
):
    out = tmp_path / "run"
    train(config(tiny_model, out, rollouts, 2))  # checkpoint step-000001, then the final model
    first = out / "checkpoints" / "step-000001"
    assert (first / "trainer_state.json").is_file() and (first / "trainer_state.safetensors").is_file()
    marker = tmp_path / "pwned"
    plant(first / "trainer_state.pt", marker)
    plant(first / "optimizer.pt", marker)
    with caplog.at_level(logging.WARNING, logger="genesys.train.checkpoint"):
        result = train(config(tiny_model, out, rollouts, 3))  # resumes from step 1
    assert not marker.exists()
    assert "trainer_state.pt: ignored (a pickle" in caplog.text
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    assert_same_weights(straight, load_file(result.final_dir / "model.safetensors"))


def test_a_resumed_run_reads_its_weights_from_the_shards_and_never_the_model_folder(
    tiny_model, tmp_path, rollouts, straight
):
    out = tmp_path / "run"
    train(config(tiny_model, out, rollouts, 2))
    first = out / "checkpoints" / "step-000001"
    names = sorted(path.name for path in (first / ckpt.SHARDS_DIR).iterdir())
    assert names == ["shard-00001-model-00001-of-00001.safetensors"]  # one process: one file of shards
    shards = checkpoint_shards(first)
    assert {name.split(".")[0] for name in shards} == {"model", "optimizer"}
    assert "model.lm_head.weight" not in shards  # tied to the embeddings: kept once
    (first / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    plant(first / "pytorch_model.bin", marker)
    result = train(config(tiny_model, out, rollouts, 3))
    assert not marker.exists()
    assert_same_weights(straight, load_file(result.final_dir / "model.safetensors"))


def test_a_checkpoint_of_the_gathered_format_is_refused_by_path(tiny_model, tmp_path, rollouts):
    out = tmp_path / "run"
    train(config(tiny_model, out, rollouts, 2))
    first = out / "checkpoints" / "step-000001"
    document = json.loads((first / ckpt.STATE_FILE).read_text())
    document["version"] = 1  # as an older genesys wrote it: the whole state gathered on rank 0
    (first / ckpt.STATE_FILE).write_text(json.dumps(document))
    with pytest.raises(InputError) as error:
        train(config(tiny_model, out, rollouts, 3))
    message = str(error.value)
    assert str(first) in message and "version 1" in message and f"--model {first}" in message
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]  # nothing was lost


def test_a_checkpoint_missing_a_shard_file_or_with_one_cut_short_is_refused_by_path(
    tiny_model, tmp_path, rollouts
):
    out = tmp_path / "run"
    train(config(tiny_model, out, rollouts, 2))
    shards = out / "checkpoints" / "step-000001" / ckpt.SHARDS_DIR
    file = shards / "shard-00001-model-00001-of-00001.safetensors"
    content = file.read_bytes()
    file.rename(shards / "moved-away")
    with pytest.raises(
        InputError, match=rf"{shards}: no model\.model\.embed_tokens\.weight in its shards \(a file"
    ):
        train(config(tiny_model, out, rollouts, 3))
    file.write_bytes(content[: len(content) // 2])
    with pytest.raises(InputError, match=rf"{shards}: the shards cannot be read"):
        train(config(tiny_model, out, rollouts, 3))


def test_a_model_larger_than_one_file_is_written_a_file_at_a_time_and_loads_as_it_is(
    tiny_model, tmp_path, rollouts, monkeypatch
):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from genesys.train import export

    whole = train(config(tiny_model, tmp_path / "whole", rollouts, 1)).final_dir
    monkeypatch.setattr(export, "MAX_SHARD_BYTES", 100_000)  # the tiny model's 428 KB in several files
    split = train(config(tiny_model, tmp_path / "split", rollouts, 1)).final_dir
    files = sorted(split.glob("model-*-of-*.safetensors"))
    assert len(files) > 2 and not (split / "model.safetensors").exists()
    index = json.loads((split / "model.safetensors.index.json").read_text())
    for file in files:
        with safe_open(file, "pt") as handle:
            assert all(index["weight_map"][name] == file.name for name in handle.keys())
    a, b = (AutoModelForCausalLM.from_pretrained(path) for path in (whole, split))
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_a_checkpoint_written_before_any_update_leaves_the_first_update_as_it_was(
    tiny_model, tmp_path, rollouts, straight
):
    """torch gives an optimizer without state its state by a step at learning rate 0: AdamW's step
    count became 1, and the run's first real update was AdamW's second (another bias correction), so a
    run that wrote a checkpoint before its first update (e.g. after a skipped step) trained otherwise."""
    from genesys.train.distributed import close_world, init_world
    from genesys.train.trainer import Trainer

    out = tmp_path / "early"
    world = init_world()
    try:
        with Trainer(config(tiny_model, out, rollouts, 3), world) as trainer:
            trainer.save_checkpoint()  # step 0: nothing trained yet
            assert all(float(state["step"]) == 0 for state in trainer.optimizer.state.values())
            trainer.run()
    finally:
        close_world(world)
    assert_same_weights(load_file(out / "final" / "model.safetensors"), straight)
