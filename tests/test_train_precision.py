"""`precision = "bf16"` is real mixed precision: bf16 weights and activations in the forward and
backward passes, fp32 master weights, gradients and optimizer state. A bf16 model stays bf16 in its
checkpoints and `final/` (which transformers and vLLM load as they are), and resumes exactly from
the fp32 master weights kept in the trainer state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import checkpoint_shards, write_jsonl  # noqa: E402
from conftest import recorded_rows as rows  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from genesys.train import TrainConfig, train  # noqa: E402


def bf16_copy(model: str, target: Path) -> str:
    """The model at `model` saved in bfloat16 (its config declaring it) at `target`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).save_pretrained(target)
    AutoTokenizer.from_pretrained(model).save_pretrained(target)
    return str(target)


@pytest.fixture(scope="module")
def bf16_model(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return bf16_copy(tiny_model, tmp_path_factory.mktemp("bf16") / "model")


def config(model: str, out: Path, rollouts: Path, steps: int, precision: str = "bf16") -> TrainConfig:
    return TrainConfig.load(
        None,
        {
            "model": model,
            "output_dir": str(out),
            "precision": precision,
            "sampling": {"seed": 0},
            "progress": False,
            "data": {"rollouts": [str(rollouts)]},
            "rollout": {"prompts_per_step": 2},
            "optim": {"steps": steps, "lr": 1e-2, "max_grad_norm": 1.0, "micro_batch_size": 64},
            "checkpoint": {"every": 1, "keep": 5},
        },
    )


def test_bf16_computes_in_bf16_and_keeps_fp32_master_weights_gradients_and_optimizer_state(tiny_model):
    from transformers import AutoModelForCausalLM

    from genesys.train.distributed import close_world, init_world
    from genesys.train.loading import sharded_pretrained
    from genesys.train.parallel import clip_grad_norm, device_mesh, local_tensor

    world = init_world()
    try:
        cpu = torch.device("cpu")
        model = sharded_pretrained(tiny_model, world, device_mesh(world, "fsdp2", cpu), "bf16", cpu)
        plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        seen: dict[str, torch.dtype] = {}

        def record(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            seen.update(weight=module.weight.dtype, input=inputs[0].dtype, output=output.dtype)

        model.model.layers[1].mlp.down_proj.register_forward_hook(record)
        ids = torch.tensor([[5, 6, 7, 8, 9]])
        logits = model(input_ids=ids).logits
        assert seen == {"weight": torch.bfloat16, "input": torch.bfloat16, "output": torch.bfloat16}
        assert logits.dtype == torch.bfloat16
        with torch.no_grad():
            exact = plain(input_ids=ids).logits
        difference = (logits.float() - exact).abs().max()
        assert 0 < difference < 0.05  # rounded to bf16, and close
        logits.float().logsumexp(-1).mean().backward()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()
        assert all(local_tensor(p).dtype == torch.float32 for p in model.parameters())  # master weights
        assert all(local_tensor(p.grad).dtype == torch.float32 for p in model.parameters())
        assert all(
            local_tensor(state[key]).dtype == torch.float32
            for state in optimizer.state.values()
            for key in ("exp_avg", "exp_avg_sq")
        )
    finally:
        close_world(world)


def test_a_bf16_model_stays_bf16_in_checkpoints_and_final_and_resumes_exactly(bf16_model, tmp_path):
    from transformers import AutoModelForCausalLM

    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", rows())
    straight = train(config(bf16_model, tmp_path / "straight", rollouts, 3)).final_dir
    out = tmp_path / "run"
    train(config(bf16_model, out, rollouts, 2))
    first = out / "checkpoints" / "step-000001"
    for folder in (first, out / "final", straight):
        weights = load_file(folder / "model.safetensors")
        assert {tensor.dtype for tensor in weights.values()} == {torch.bfloat16}, folder
        assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    start = load_file(Path(bf16_model) / "model.safetensors")
    assert (first / "model.safetensors").stat().st_size <= 1.1 * (
        Path(bf16_model) / "model.safetensors"
    ).stat().st_size
    shards = checkpoint_shards(first)  # the fp32 master weights, whole (one process)
    master = {name.removeprefix("model."): t for name, t in shards.items() if name.startswith("model.")}
    assert master.keys() == {name for name in start if name != "lm_head.weight"}
    assert {tensor.dtype for tensor in master.values()} == {torch.float32}
    assert any(not torch.equal(master[name].to(torch.bfloat16).float(), master[name]) for name in master)
    loaded = AutoModelForCausalLM.from_pretrained(out / "final", dtype="auto")
    assert loaded.dtype == torch.bfloat16
    resumed = train(config(bf16_model, out, rollouts, 3)).final_dir  # from step 1's master weights
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_an_fp32_model_trained_in_bf16_is_written_in_fp32(tiny_model, tmp_path):
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", rows())
    out = tmp_path / "run"
    train(config(tiny_model, out, rollouts, 2))
    first = out / "checkpoints" / "step-000001"
    assert {t.dtype for t in load_file(first / "model.safetensors").values()} == {torch.float32}
    assert {t.dtype for t in checkpoint_shards(first).values()} == {torch.float32}


@pytest.mark.slow
@pytest.mark.vllm
def test_a_bf16_checkpoint_loads_in_vllm_as_it_is(tmp_path):
    pytest.importorskip("vllm")
    from vllm import LLM, SamplingParams

    from genesys.generate.tiny_model import build_tiny_model

    # vLLM's CPU attention wants a head dim of at least 64
    model = bf16_copy(str(build_tiny_model(tmp_path / "fp32", hidden_size=128, heads=2)), tmp_path / "bf16")
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", rows())
    final = train(config(model, tmp_path / "run", rollouts, 2)).final_dir
    torch.set_num_threads(1)
    engine = LLM(
        model=str(final),
        dtype="auto",
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        enforce_eager=True,
        seed=0,
    )
    try:
        assert engine.llm_engine.model_config.dtype == torch.bfloat16
        output = engine.generate({"prompt_token_ids": [10, 20, 30]}, SamplingParams(max_tokens=4, seed=0))
        assert len(output[0].outputs[0].token_ids) >= 1
    finally:
        del engine
