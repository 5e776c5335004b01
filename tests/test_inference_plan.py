"""The planner's formulas on cases computed by hand, and its command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genesys.errors import InputError
from genesys.inference.plan import Device, ModelShape, Network, Ring, device, plan, split_layers

# 4 layers, hidden 8, MLP 16, 2 heads of 4, 1 KV head, vocabulary 10, bf16, untied.
SHAPE = ModelShape("toy", 4, 8, 16, 2, 1, 4, 10, tied_embeddings=False, bytes_per_param=2)
# 10,000 bytes of memory, 1,000 B/s, 1,000 FLOP/s: every figure below is small enough to check by hand.
TOY_DEVICE = Device("toy", memory_gb=1e-5, bandwidth_gbs=1e-6, tflops=1e-9)
SLOW_LINK = Network(latency_s=1.0, bits_per_second=8000)  # 1,000 bytes per second


def test_parameters_of_a_layer_and_of_the_model():
    # q 8*2*4 + k,v 2*8*1*4 + o 2*4*8 + MLP 3*8*16 + norms 2*8
    assert SHAPE.layer_params == 64 + 64 + 64 + 384 + 16 == 592
    assert SHAPE.params == 4 * 592 + 80 + 8 + 80  # layers, embedding, final norm, output layer
    tied = ModelShape("toy", 4, 8, 16, 2, 1, 4, 10, tied_embeddings=True, bytes_per_param=2)
    assert tied.params == SHAPE.params - 80


def test_stage_memory_batch_and_roofline_steps():
    result = plan(SHAPE, 2, TOY_DEVICE, SLOW_LINK, batch=1, micro_batches=2, context=10)
    first, last = result.stages
    assert first.weights_bytes == (2 * 592 + 80) * 2 == 2528
    assert last.weights_bytes == (2 * 592 + 8 + 80) * 2 == 2544
    assert first.kv_bytes_per_token == last.kv_bytes_per_token == 2 * 2 * 1 * 4 * 2 == 32
    # (10,000 * 0.9 - weights) / (32 bytes * 10 tokens)
    assert first.max_batch == 20 and last.max_batch == 20
    # flops 2*1184 + attention 4*1*10*2*2*4 = 3008 > bytes 1184*2 + 10*32 = 2688: compute-bound, 3.008 s
    assert first.step_s == pytest.approx(3.008) and first.bound == "compute"
    # flops 2*(1184 + 88) + 640 = 3184
    assert last.step_s == pytest.approx(3.184) and last.bound == "compute"
    assert first.activation_bytes_per_hop == 8 * 2 and last.activation_bytes_per_hop == 4


def test_schedules_in_closed_form():
    result = plan(SHAPE, 2, TOY_DEVICE, SLOW_LINK, batch=1, micro_batches=2, context=10)
    round_s = 3.008 + 3.184 + 2 * 1.0 + 16 / 1000 + 4 / 1000  # steps, two latencies, two transfers
    sync, big, interleaved = result.schedules
    assert sync.token_latency_s == pytest.approx(round_s)
    assert sync.tokens_per_s == pytest.approx(1 / round_s)
    assert interleaved.tokens_per_s == pytest.approx(2 / round_s)  # 2 * 3.184 < round: not saturated
    assert interleaved.bound == "stage steps (compute)"
    assert result.saturating_micro_batches == 3  # ceil(8.212 / 3.184)
    three = plan(SHAPE, 2, TOY_DEVICE, SLOW_LINK, batch=1, micro_batches=3, context=10)
    assert three.schedules[2].tokens_per_s == pytest.approx(3 / (3 * 3.184))  # the last stage bounds it
    assert three.schedules[2].bound == "stage 1 compute"
    # Batch 2 doubles every compute-bound step.
    assert big.batch == 2 and big.token_latency_s == pytest.approx(2 * (3.008 + 3.184) + 2 + 0.032 + 0.008)


def test_one_stage_has_no_hops_and_latency_then_costs_nothing():
    result = plan(SHAPE, 1, TOY_DEVICE, SLOW_LINK, batch=1, micro_batches=1, context=10)
    (stage,) = result.stages
    assert stage.weights_bytes == SHAPE.params * 2
    assert result.schedules[0].token_latency_s == pytest.approx(stage.step_s)


def test_synchronous_token_costs_n_latencies_plus_the_steps():
    ring = Ring.uniform([0.002] * 4, latency_s=0.1)
    assert ring.period_s(1) == pytest.approx(4 * 0.1 + 4 * 0.002)
    assert ring.saturating_micro_batches() == 204  # ceil(0.408 / 0.002)
    assert ring.throughput(3, 300) == pytest.approx(3 / 0.002)


def test_layers_split_evenly_the_first_stages_taking_the_rest():
    assert split_layers(10, 3) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(InputError, match="--stages"):
        split_layers(4, 5)


def test_devices_from_the_table_overridden_or_described():
    assert device("H100").memory_gb == 80
    assert device("h100", memory_gb=94).memory_gb == 94
    assert device("mine", 16, 500, 50).tflops == 50
    with pytest.raises(InputError, match="--gpu 'mine'"):
        device("mine")


def test_a_config_json_or_model_directory_is_read(tmp_path: Path):
    config = {
        "num_hidden_layers": 4,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 10,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert ModelShape.load(str(tmp_path)).params == SHAPE.params
    assert ModelShape.load(str(tmp_path / "config.json")).kv_heads == 1
    with pytest.raises(InputError, match="no such config.json"):
        ModelShape.load(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "hidden_size"}))
    with pytest.raises(InputError, match="'hidden_size'"):
        ModelShape.load(str(tmp_path))


def test_the_command_prints_tables_and_json(tmp_path: Path):
    from click.testing import CliRunner

    from genesys.cli import cli

    config = {
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = [
        "plan-inference",
        "--model",
        str(tmp_path),
        "--stages",
        "4",
        "--latency-ms",
        "100",
        "--gpu",
        "rtx4090",
    ]
    shown = CliRunner().invoke(cli, [*args, "--simulate"])
    assert shown.exit_code == 0, shown.output
    assert "interleaved" in shown.output and "simulated / planned" in shown.output
    printed = CliRunner().invoke(cli, [*args, "--batch", "4", "--json"])
    data = json.loads(printed.output)
    assert len(data["stages"]) == 4 and data["batch"] == 4
    assert {s["name"] for s in data["schedules"]} == {"synchronous", "interleaved"}


def test_default_micro_batches_are_the_saturating_number_as_far_as_memory_holds():
    # batch 10: ring 30.08 + 31.84 + 2 + 0.16 + 0.04 s, so 3 micro-batches saturate; 20 sequences fit
    result = plan(SHAPE, 2, TOY_DEVICE, SLOW_LINK, batch=10, context=10)
    assert result.saturating_micro_batches == 3
    assert result.micro_batches == 2
    assert any("3 micro-batches would saturate" in note for note in result.notes)
    assert plan(SHAPE, 2, TOY_DEVICE, SLOW_LINK, batch=5, context=10).micro_batches == 3
