"""The memory plan: `genesys train --dry-run` from the model's config alone, the refusal of a run that
cannot fit, and how strategy, precision and LoRA change the estimate."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import GENESYS, REPO  # noqa: E402

from genesys.errors import InputError  # noqa: E402
from genesys.train import TrainConfig, memory_plan, train  # noqa: E402
from genesys.train.memory_plan import Layout, MemoryPlan, ModelFacts, estimate, outside_steps  # noqa: E402

SEVEN_B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "vocab_size": 152064}


def _config_only(tiny_model: str, path: Path, **overrides) -> Path:
    """A model directory holding only the tiny model's config (with `overrides`): no weights at all."""
    path.mkdir()
    config = json.loads((Path(tiny_model) / "config.json").read_text())
    config.pop("layer_types", None)  # one per layer: derived again from num_hidden_layers
    (path / "config.json").write_text(json.dumps({**config, **overrides}))
    return path


def _dry_run(model: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            GENESYS,
            "train",
            "--model",
            str(model),
            "-o",
            str(out),
            "--data.rollouts",
            "r.jsonl",
            "--dry-run",
            *flags,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


@pytest.mark.slow
def test_dry_run_prints_the_config_and_the_estimate_without_any_weights(tiny_model, tmp_path):
    model = _config_only(tiny_model, tmp_path / "model")
    done = _dry_run(model, tmp_path / "run", "--optim.micro_batch_tokens", "4096")
    assert done.returncode == 0, done.stderr
    assert "micro_batch_tokens = 4096" in done.stdout  # the resolved config
    parts = (
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "engine",
        "total",
        "loading",
        "peak",
        "available",
    )
    for part in parts:
        assert re.search(rf"^  {part} +\d", done.stdout, re.M), part
    assert "fits: yes" in done.stdout
    assert not (tmp_path / "run").exists()  # nothing started


@pytest.mark.slow
def test_a_run_that_cannot_fit_is_refused_with_the_numbers(tiny_model, tmp_path):
    model = _config_only(
        tiny_model, tmp_path / "model", **SEVEN_B, num_attention_heads=28, num_key_value_heads=4
    )
    done = _dry_run(model, tmp_path / "run", "--optim.micro_batch_tokens", "8192")
    assert done.returncode == 1
    total = float(re.search(r"^  total +([\d.]+) GiB", done.stdout, re.M).group(1))
    assert total > 7e9 * 16 / 2**30  # fp32 weights, gradients and AdamW: 16 bytes per parameter
    assert re.search(r"fits: no: about [\d.]+ GiB per rank, this machine's RAM has [\d.]+ GiB", done.stdout)
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text("")
    config = TrainConfig.load(
        None,
        {"model": str(model), "output_dir": str(tmp_path / "run"), "data": {"rollouts": [str(rollouts)]}},
    )
    with pytest.raises(
        InputError, match=r"this run needs about [\d.]+ GiB per rank but this machine's RAM has"
    ):
        train(config)  # refused before any weight is read (there are none to read)


def test_an_sft_run_gets_the_same_estimate_and_is_refused_before_any_weight_is_read(tiny_model, tmp_path):
    from genesys.config import SftConfig
    from genesys.train.memory_plan import ASSUMED_PROMPT_TOKENS, ASSUMED_SFT_COMPLETION_TOKENS, plan_memory
    from genesys.train.sft import sft

    model = _config_only(
        tiny_model, tmp_path / "model", **SEVEN_B, num_attention_heads=28, num_key_value_heads=4
    )
    config = SftConfig.load(
        None,
        {
            "model": str(model),
            "output_dir": str(tmp_path / "run"),
            "data": {"tasks": ["arithmetic:count=10"]},
            "optim": {"micro_batch_size": 2},
        },
    )
    plan = plan_memory(config, 1, torch.device("cpu"))
    assert plan.layout.tokens == 2 * (ASSUMED_PROMPT_TOKENS + ASSUMED_SFT_COMPLETION_TOKENS)
    assert plan.parts["engine"] == 0 and "no generation engine" in plan.table()
    with pytest.raises(
        InputError, match=r"this run needs about [\d.]+ GiB per rank but this machine's RAM has"
    ):
        sft(config)


FACTS = ModelFacts(
    params=1_000_000_000,
    trainable=1_000_000_000,
    largest_layer=50_000_000,
    layers=24,
    hidden=2048,
    vocab=151936,
    layer_bytes_per_token=100_000,
    other_bytes_per_token=20_000,
)
LAYOUT = Layout(
    world_size=1,
    strategy="ddp",
    precision="fp32",
    lora_rank=0,
    lora_targets=("q_proj",),
    tokens=4096,
    sequences=1,
    packed=True,
    gradient_checkpointing=False,
    device_type="cuda",
    flash_attention=True,
)


def test_fsdp2_shards_weights_gradients_and_optimizer_by_the_world_size():
    one = estimate(LAYOUT, FACTS)
    assert (one["weights"], one["gradients"], one["optimizer"]) == (4e9, 4e9, 8e9)
    four = estimate(replace(LAYOUT, world_size=4, strategy="fsdp2"), FACTS)
    assert four["gradients"] == 1e9 and four["optimizer"] == 2e9
    assert four["weights"] == 1e9 + 2 * 50_000_000 * 4  # the shard and two gathered layers
    assert four["activations"] == one["activations"]
    ddp = estimate(replace(LAYOUT, world_size=4), FACTS)
    assert ddp["gradients"] == 8e9  # replicated, and DistributedDataParallel's buckets beside them


def test_bf16_keeps_an_fp32_master_and_halves_activations_lora_trains_only_the_adapters():
    bf16 = estimate(replace(LAYOUT, precision="bf16"), FACTS)
    assert bf16["weights"] == 2e9 + 4e9 and bf16["optimizer"] == 8e9
    adapters = replace(FACTS, trainable=10_000_000)
    lora = estimate(replace(LAYOUT, precision="bf16", lora_rank=16), adapters)
    assert lora["weights"] == 2e9 + 4e7  # frozen bf16 weights, fp32 master of the adapters only
    assert lora["gradients"] == 4e7 and lora["optimizer"] == 8e7


def test_loading_holds_the_pretrained_model_on_rank_0_and_a_checkpoint_one_file_of_each_kind():
    bf16 = replace(FACTS, declared_bytes=2)
    four = replace(LAYOUT, world_size=4, strategy="fsdp2")
    parts = estimate(four, bf16)
    moments = outside_steps(four, bf16, parts, checkpoints=True)
    assert moments["loading"] == 1e9 + 2e9  # its fp32 quarter, and the bf16 model rank 0 reads
    kept = parts["weights"] + parts["gradients"] + parts["optimizer"]
    assert (
        moments["checkpoint"] == kept + 2e9 + 2 * 2**30
    )  # a 2 GB model file; 3 GB of state per rank, in 2 GiB files
    lora = outside_steps(replace(four, lora_rank=16), bf16, parts, checkpoints=False)
    assert lora == {"loading": 1e9 + 4e9}  # adapters start from an fp32 base; no checkpoints written
    sixteen = replace(LAYOUT, world_size=16, strategy="fsdp2")
    parts = {"weights": 25e7, "gradients": 25e7, "optimizer": 5e8, "activations": 5e8, "engine": 0}
    moments = outside_steps(sixteen, bf16, parts, checkpoints=False)  # 0.25 + 2 GB on rank 0
    plan = MemoryPlan(sixteen, bf16, parts, "cpu", capacity=int(moments["loading"]) - 1, moments=moments)
    assert plan.total < plan.capacity and not plan.fits  # a step fits, reading the model on rank 0 does not
    assert "loading" in plan.table() and "peak" in plan.table()


def test_a_gpu_plan_checks_the_step_against_the_gpu_and_leaves_host_moments_out(
    tiny_model, tmp_path, monkeypatch
):
    gpu = 80 * 2**30
    monkeypatch.setattr(memory_plan, "device_capacity", lambda device, local: ("a GPU (cuda:0)", gpu))
    config = TrainConfig.load(
        None, {"model": tiny_model, "output_dir": str(tmp_path / "run"), "data": {"rollouts": ["r.jsonl"]}}
    )
    plan = memory_plan.plan_memory(config, 1, torch.device("cuda"))
    assert plan.moments == {} and plan.peak == plan.total and plan.fits  # loading is host memory on a GPU
    memory_plan.check_fits(plan)
    gpu = plan.total - 1
    with pytest.raises(InputError, match="a GPU"):
        memory_plan.check_fits(memory_plan.plan_memory(config, 1, torch.device("cuda")))


def test_a_colocated_vllm_engine_on_a_gpu_gets_what_the_training_steps_leave(
    tiny_model, tmp_path, monkeypatch
):
    pytest.importorskip("vllm")
    from genesys.train.sources.online import colocated_vllm_options

    gpu = 2**30
    monkeypatch.setattr(memory_plan, "device_capacity", lambda device, local: ("a GPU (cuda:0)", gpu))
    settings = {
        "model": tiny_model,
        "output_dir": str(tmp_path / "run"),
        "backend": "vllm",
        "sampling": {"n": 4},
    }
    config = TrainConfig.load(None, {**settings, "data": {"tasks": ["t.jsonl"]}})
    plan = memory_plan.plan_memory(config, 1, torch.device("cuda"))
    training = plan.total - plan.parts["engine"]
    assert plan.engine_share == round((gpu - training) / gpu - memory_plan.ENGINE_MARGIN, 3)
    assert plan.parts["engine"] == int(plan.engine_share * gpu) and plan.fits
    assert memory_plan.default_engine_share(config, 1, "cuda") == plan.engine_share
    assert memory_plan.default_engine_share(config, 1, "cpu") is None
    options = colocated_vllm_options(config, None, plan.engine_share)
    assert options["engine_args"]["gpu_memory_utilization"] == plan.engine_share
    # A share the run names is kept, and the plan checks it: vLLM's own default would not fit here.
    named = {
        **settings,
        "data": {"tasks": ["t.jsonl"]},
        "backend_options": {"args": {"gpu_memory_utilization": 0.92}},
    }
    config = TrainConfig.load(None, named)
    assert memory_plan.default_engine_share(config, 1, "cuda") is None
    assert (
        colocated_vllm_options(config, {"gpu_memory_utilization": 0.92}, None)["engine_args"][
            "gpu_memory_utilization"
        ]
        == 0.92
    )
    with pytest.raises(InputError, match="gpu_memory_utilization"):
        memory_plan.check_fits(memory_plan.plan_memory(config, 1, torch.device("cuda")))


def test_activations_follow_the_token_budget_not_the_batch():
    small, large = (estimate(replace(LAYOUT, tokens=tokens), FACTS)["activations"] for tokens in (2048, 4096))
    checkpointed = estimate(replace(LAYOUT, gradient_checkpointing=True), FACTS)["activations"]
    per_token = FACTS.layers * FACTS.layer_bytes_per_token + FACTS.other_bytes_per_token
    assert large - small == 2048 * (
        per_token + FACTS.layer_bytes_per_token
    )  # saved, and one layer's gradients
    assert checkpointed < large


@pytest.mark.slow
def test_the_estimate_is_within_20_percent_of_the_measured_peak_for_three_shapes():
    done = subprocess.run(
        # 16 rollouts a shape: two steps of two micro-batches each, the same peak as the table's 32
        [
            sys.executable,
            "benchmarks/train_memory.py",
            "--table",
            "estimate",
            "--budget",
            "1024",
            "--sequences",
            "16",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    ratios = [
        float(line.split("|")[-2])
        for line in done.stdout.splitlines()
        if re.match(r"\| (small|wide|deep) ", line)
    ]
    assert len(ratios) == 3, done.stdout
    assert all(0.8 <= ratio <= 1.2 for ratio in ratios), done.stdout


@pytest.mark.slow
def test_the_gpu_suite_smoke_mode_builds_models_from_configs_and_trains(tmp_path):
    done = subprocess.run(
        ["bash", "benchmarks/gpu_suite.sh", "--smoke"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=os.environ | {"PYTHON": sys.executable},
    )
    assert "| smoke fp32 transformers" in done.stdout, done.stdout + done.stderr
    assert re.search(r"\| smoke fp32 transformers +\| +\d+\.\d+ \| +\d+ \|", done.stdout), done.stdout
