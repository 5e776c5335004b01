"""The discrete-event simulation against the closed forms, and the schedule claims it reproduces."""

from __future__ import annotations

import itertools

import pytest

from genesys.inference.plan import GPUS, ModelShape, Network, Ring, plan, ring_for, stages_of
from genesys.inference.simulate import simulate

# A 7B-class dense shape (Qwen2.5-7B's sizes), bf16.
SEVEN_B = ModelShape("7b", 28, 3584, 18944, 28, 4, 128, 152064, tied_embeddings=False, bytes_per_param=2)


@pytest.mark.parametrize("latency", [0.0, 0.01, 0.1])
def test_simulation_agrees_with_the_closed_form_within_one_percent(latency: float):
    """Over N in 1..8 and M in 1..64, stages of different speeds and a transfer time on each link."""
    for stages, micro_batches in itertools.product(range(1, 9), (1, 2, 3, 5, 8, 16, 64)):
        steps = [0.004 * (1 + (i % 3) / 2) for i in range(stages)]
        ring = Ring.uniform(steps, latency, transfer_s=0.0005)
        result = simulate(ring, 2, micro_batches, rounds=12, warmup=3)
        expected = ring.throughput(2, micro_batches)
        assert result.tokens_per_s == pytest.approx(expected, rel=0.01), (stages, micro_batches, latency)
        assert result.token_latency_s == pytest.approx(ring.period_s(micro_batches), rel=0.01)


def _ring(batch: int, stages: int = 4, latency: float = 0.1, gpu: str = "h100", context: int = 512) -> Ring:
    """Links of 100 Gbit/s: the claims are about the steps; at 1 Gbit/s sending a batch of 32
    hidden states (229 KB) takes 1.8 ms a hop, as long as an H100's whole step."""
    network = Network(latency, bits_per_second=100e9)
    return ring_for(SEVEN_B, stages_of(SEVEN_B, stages), GPUS[gpu], network, batch, context)[0]


@pytest.mark.parametrize("latency", [0.01, 0.1])
def test_memory_bound_interleaving_gives_what_one_bigger_synchronous_batch_gives(latency: float):
    b, m = 4, 8
    interleaved = simulate(_ring(b, latency=latency), b, m, rounds=12, warmup=3)
    synchronous = simulate(_ring(m * b, latency=latency), m * b, 1, rounds=12, warmup=3)
    assert interleaved.tokens_per_s == pytest.approx(synchronous.tokens_per_s, rel=0.02)


def test_compute_bound_interleaving_wins_by_the_sum_of_the_steps_over_the_longest():
    """Synchronous pays every stage's step per token, a saturated ring only the longest: N times for
    balanced stages; here the last stage also runs the output layer, so a 4-stage 7B gains about 3.4."""
    b, stages = 512, 4  # 512 sequences per micro-batch: compute-bound on an H100
    ring = _ring(b, stages=stages, latency=0.0)
    m = ring.saturating_micro_batches()
    interleaved = simulate(ring, b, m, rounds=12, warmup=3)
    big = _ring(m * b, stages=stages, latency=0.0)
    synchronous = simulate(big, m * b, 1, rounds=12, warmup=3)
    gain = interleaved.tokens_per_s / synchronous.tokens_per_s
    assert gain == pytest.approx(big.round_s / (m * ring.busiest_s), rel=0.01)
    assert 3 < gain < stages


def test_a_straggler_bounds_throughput_at_batch_over_its_step():
    ring = Ring.uniform([0.01, 0.01, 0.03, 0.01], 0.02)
    result = simulate(ring, 8, 64, rounds=12, warmup=3)
    assert result.tokens_per_s == pytest.approx(8 / 0.03, rel=0.01)
    assert result.stage_utilisation[2] == pytest.approx(1.0, abs=0.01)
    assert result.stage_utilisation[0] < 0.36  # busy a third of the time, idle while the straggler works


def test_jitter_costs_throughput_the_closed_form_does_not_see():
    ring = Ring.uniform([0.01] * 4, 0.0)
    steady = simulate(ring, 1, 4, rounds=30, warmup=5)
    jittered = simulate(ring, 1, 4, rounds=30, warmup=5, jitter=0.5, seed=1)
    assert steady.tokens_per_s == pytest.approx(100.0)
    assert jittered.tokens_per_s < 0.97 * steady.tokens_per_s


def test_plan_saturating_micro_batches_reach_the_straggler_bound():
    result = plan(SEVEN_B, 4, GPUS["rtx4090"], Network(0.05), batch=1, context=512, slowdown=(1, 1, 2, 1))
    ring = next(iter(result.rings.values()))
    m = ring.saturating_micro_batches()
    assert ring.throughput(1, m) == pytest.approx(1 / max(ring.step_s))
    assert ring.throughput(1, m - 1) < 1 / max(ring.step_s)
