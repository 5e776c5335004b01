"""LoRA training ([lora], built with peft): only the adapters learn, the engines and `final/` get the
merged weights (the adapter survives every merge), `final/` is the merged model or the adapter
alone, and a resumed LoRA run ends with the weights of an uninterrupted one."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import checkpoint_shards, grpo_config, recorded_rows, write_jsonl  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from genesys.errors import InputError  # noqa: E402
from genesys.testing.digits import digit_tasks  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402

LORA = {"rank": 8, "alpha": 16.0, "target_modules": ["all-linear"]}


def config(model: str, out: Path, **sections: Any) -> TrainConfig:
    """`grpo_config` with `LORA`, for 3 steps at lr 2e-2 of 8 samples of at most 32 tokens (keys
    given in `optim` or `lora` replace those)."""
    sections["optim"] = {"steps": 3, "lr": 2e-2, **sections.get("optim", {})}
    sections["lora"] = {**LORA, **sections.get("lora", {})}
    return grpo_config(model, out, max_tokens=32, **sections)


def offline(model: str, out: Path, rollouts: Path, steps: int, **lora: Any) -> TrainConfig:
    return config(
        model,
        out,
        data={"rollouts": [str(rollouts)]},
        rollout={"prompts_per_step": 2},
        optim={"steps": steps, "lr": 1e-2, "micro_batch_size": 64},
        checkpoint={"every": 1, "keep": 5},
        lora={**LORA, **lora},
    )


# Every projection and the output layer. The stand-in model's output layer is its (tied, frozen under
# LoRA) embedding, whose tiny random rows bound the logits too tightly to put most of the probability
# on digits; an output layer of its own with an adapter can.
LEARNING_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


@pytest.fixture(scope="module")
def untied_model(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The stand-in model with an output layer of its own (a copy of the embedding)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    target = tmp_path_factory.mktemp("untied") / "model"
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(target)
    return str(target)


@pytest.mark.slow
def test_lora_learns_the_toy_task_and_its_merged_final_model_loads_in_transformers(
    untied_model, tmp_path, plugin_env
):
    from transformers import AutoModelForCausalLM

    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    result = train(
        config(
            untied_model,
            tmp_path / "run",
            data={"tasks": [str(tasks)]},
            optim={"steps": 60, "lr": 5e-3},
            lora={**LORA, "target_modules": LEARNING_TARGETS},
            # late in the run every sample is perfect: steps without signal, which must not stop it
            rollout={"max_no_signal_steps": 60},
        )
    )
    rewards = [m["reward_mean"] for m in result.metrics if m["reward_mean"] is not None]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert start < 0.2 and end >= 0.8, rewards
    final = AutoModelForCausalLM.from_pretrained(result.final_dir)
    base = AutoModelForCausalLM.from_pretrained(untied_model)
    assert not any("lora" in name for name, _ in final.named_parameters())  # a plain model
    assert final.config.architectures == base.config.architectures
    assert not torch.equal(final.lm_head.weight, base.lm_head.weight)
    assert torch.equal(final.model.embed_tokens.weight, base.model.embed_tokens.weight)  # not adapted


@pytest.fixture
def rollouts(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "rollouts.jsonl", recorded_rows())


def test_the_merged_final_model_equals_peft_merging_the_saved_adapter(tiny_model, tmp_path, rollouts):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = train(offline(tiny_model, tmp_path / "merged", rollouts, 2)).final_dir
    adapter = train(offline(tiny_model, tmp_path / "adapter", rollouts, 2, save="adapter")).final_dir
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").exists()
    by_peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), adapter)
    expected = by_peft.merge_and_unload().state_dict()
    ours = load_file(merged / "model.safetensors")
    base = load_file(Path(tiny_model) / "model.safetensors")
    assert ours.keys() == base.keys()
    moved = [name for name in ours if not torch.equal(ours[name], base[name])]
    assert moved and all("proj" in name for name in moved)  # only adapted layers changed
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-6, rtol=0), name
    # the run's own rerun sees an adapter-only final/ as a finished run
    assert train(offline(tiny_model, tmp_path / "adapter", rollouts, 2, save="adapter")).already_complete


def test_generation_receives_merged_weights_and_the_adapter_survives(tiny_model, tmp_path, rollouts):
    from genesys.train import export
    from genesys.train.distributed import close_world, init_world
    from genesys.train.parallel import full_tensor
    from genesys.train.trainer import Trainer

    world = init_world()
    try:
        with Trainer(offline(tiny_model, tmp_path / "run", rollouts, 2), world) as trainer:
            trainer.train_step()
            adapters = {
                n: full_tensor(p).clone() for n, p in trainer.model.named_parameters() if p.requires_grad
            }
            assert adapters and all(".lora_" in name for name in adapters)
            first = dict(export.full_parameters(trainer.model, torch.bfloat16))
            second = dict(export.full_parameters(trainer.model))
            after = {n: full_tensor(p) for n, p in trainer.model.named_parameters() if p.requires_grad}
    finally:
        close_world(world)
    base = load_file(Path(tiny_model) / "model.safetensors")
    assert set(first) == set(base) - {"lm_head.weight"}  # the plain model's names (tied output left out)
    assert all(tensor.dtype == torch.bfloat16 for tensor in first.values())
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(second[name], base[name])  # merged: the adapter's update is in
    assert torch.equal(first[name], second[name].to(torch.bfloat16))
    assert all(torch.equal(adapters[n], after[n]) for n in adapters)  # merging left the adapter as it was


def test_a_resumed_lora_run_ends_with_the_weights_of_an_uninterrupted_one(tiny_model, tmp_path, rollouts):
    straight = load_file(
        train(offline(tiny_model, tmp_path / "straight", rollouts, 3)).final_dir / "model.safetensors"
    )
    out = tmp_path / "run"
    train(offline(tiny_model, out, rollouts, 2))
    weights = [
        name for name in checkpoint_shards(out / "checkpoints" / "step-000001") if name.startswith("model.")
    ]
    assert weights and all(".lora_" in name for name in weights)  # the base comes from the pretrained model
    resumed = load_file(train(offline(tiny_model, out, rollouts, 3)).final_dir / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


def test_unknown_target_modules_are_refused_by_name(tiny_model, tmp_path, rollouts):
    with pytest.raises(InputError, match="lora.target_modules"):
        train(offline(tiny_model, tmp_path / "run", rollouts, 1, target_modules=["no_such_proj"]))
    with (
        warnings.catch_warnings(),  # peft's own warning about the tied layer, before our refusal
        pytest.raises(InputError, match=r"lm_head shares its weight with model\.embed_tokens\.weight"),
    ):
        warnings.simplefilter("ignore")
        train(offline(tiny_model, tmp_path / "tied", rollouts, 1, target_modules=["lm_head"]))
    with pytest.raises(InputError, match="all-linear stands alone"):
        offline(tiny_model, tmp_path / "run", rollouts, 1, target_modules=["all-linear", "q_proj"])
