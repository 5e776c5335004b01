"""Packed token-budget micro-batches: their layout, their split, and the same loss and gradients as
padded micro-batches; chunked vocabulary logprobs equal to the full projection, gradients included."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import write_jsonl  # noqa: E402

from genesys.errors import InputError  # noqa: E402
from genesys.train import TrainConfig  # noqa: E402
from genesys.train.batch import (  # noqa: E402
    SequenceTooLong,
    TrainingSequence,
    collate,
    pack,
    split_by_tokens,
)
from genesys.train.distributed import init_world  # noqa: E402
from genesys.train.logprobs import chunked_logprobs, token_entropy, token_logprobs  # noqa: E402
from genesys.train.parallel import full_tensor  # noqa: E402
from genesys.train.trainer import Trainer  # noqa: E402


def _sequence(prompt: int, completion: int, advantage: float = 1.0, start: int = 3) -> TrainingSequence:
    return TrainingSequence(
        list(range(start, start + prompt)),
        list(range(start + 50, start + 50 + completion)),
        [-1.0] * completion,
        advantage,
    )


def test_pack_lays_sequences_end_to_end_with_positions_restarting_and_targets_before_each_token():
    batch = pack(
        [TrainingSequence([1, 2, 3], [7], [-0.5], 1.0), TrainingSequence([4], [8, 9], [-0.1, -0.2], -1.0)]
    )
    assert batch.input_ids.tolist() == [[1, 2, 3, 7, 4, 8, 9]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert batch.attention_mask is None
    # The hidden state at 2 (token 3) predicts 7; at 4 (token 4) predicts 8, at 5 predicts 9.
    assert batch.targets.tolist() == [2, 4, 5]
    assert batch.completion_ids.tolist() == [[7, 0], [8, 9]]
    assert batch.completion_mask.tolist() == [[True, False], [True, True]]
    assert batch.advantages.tolist() == [1.0, -1.0]
    assert batch.tokens == 3 and batch.input_tokens == 7


def test_collate_targets_point_at_the_positions_before_each_completion_token():
    batch = collate(
        [TrainingSequence([1, 2, 3], [7], [-0.5], 1.0), TrainingSequence([4], [8, 9], [-0.1, -0.2], -1.0)],
        pad_id=0,
    )
    flat = batch.input_ids.reshape(-1)
    assert batch.targets.tolist() == [2, 7, 8]
    assert flat[batch.targets + 1].tolist() == [7, 8, 9]


def test_split_by_tokens_keeps_every_sequence_once_within_the_budget():
    rng = random.Random(0)
    sequences = [_sequence(rng.randint(1, 20), rng.randint(0, 40), start=i) for i in range(50)]
    groups = split_by_tokens(sequences, 64)
    assert sorted(id(s) for g in groups for s in g) == sorted(id(s) for s in sequences)
    assert all(sum(len(s) for s in g) <= 64 for g in groups)
    assert len(groups) <= sum(len(s) for s in sequences) // 64 + 3  # first-fit decreasing packs tightly


def test_a_sequence_longer_than_the_budget_is_refused_naming_it():
    with pytest.raises(
        SequenceTooLong, match=r"sequence 1 of the batch has 30 tokens \(prompt 10 \+ completion 20\)"
    ):
        split_by_tokens([_sequence(2, 2), _sequence(10, 20)], 16)


def test_the_budget_must_exceed_max_tokens_for_online_runs():
    with pytest.raises(
        ValueError, match=r"optim.micro_batch_tokens \(64\) must exceed sampling.max_tokens \(64\)"
    ):
        TrainConfig.load(
            None,
            {
                "model": "m",
                "output_dir": "o",
                "data": {"tasks": ["t.jsonl"]},
                "sampling": {"max_tokens": 64, "n": 4},
                "optim": {"micro_batch_tokens": 64},
            },
        )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_their_gradients_equal_the_full_projection(temperature):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 97, bias=False)
    hidden = torch.randn(23, 16, requires_grad=True)
    tokens = torch.randint(0, 97, (23,))
    weights = torch.randn(23)

    logits = head(hidden)
    full = (token_logprobs(logits, tokens, temperature), token_entropy(logits, temperature))
    ((full[0] * weights).sum() + full[1].sum()).backward()
    expected = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None

    chunked = chunked_logprobs(head, hidden, tokens, temperature, chunk=5)
    ((chunked[0] * weights).sum() + chunked[1].sum()).backward()
    for got, want in zip((*chunked, hidden.grad, head.weight.grad), (*full, *expected)):
        assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


def _rows(tasks: int = 6, samples: int = 4) -> list[dict[str, Any]]:
    """Recorded rollouts of varied prompt and completion lengths (so padding differs from packing)."""
    rng = random.Random(1)
    rows = []
    for task in range(tasks):
        prompt = [rng.randrange(3, 500) for _ in range(rng.randint(2, 12))]
        for sample in range(samples):
            length = rng.randint(1, 15)
            rows.append(
                {
                    "problem_id": f"t{task}",
                    "prompt": f"task {task}",
                    "prompt_ids": prompt,
                    "completion_ids": [rng.randrange(3, 500) for _ in range(length)],
                    "completion_logprobs": [rng.uniform(-8.0, -4.0) for _ in range(length)],
                    "reward": float(rng.random() < 0.5) + 0.1 * sample,
                }
            )
    return rows


def _gradients(model: str, tmp: Path, rollouts: Path, optim: dict[str, Any], loss: dict[str, Any]):
    config = TrainConfig.load(
        None,
        {
            "model": model,
            "output_dir": str(tmp),
            "progress": False,
            "sampling": {"seed": 0, "temperature": 0.8},
            "data": {"rollouts": [str(rollouts)]},
            "rollout": {"prompts_per_step": 6},
            "optim": {"steps": 1, **optim},
            "loss": loss,
            "checkpoint": {"every": 0},
        },
    )
    with Trainer(config, init_world()) as trainer:
        batch = trainer._next_batch()
        micro_batches = list(trainer._micro_batches(batch.sequences))
        totals = trainer._accumulate_gradients(batch, 0, record_mismatch=True)  # the one mini-batch
        gradients = {name: full_tensor(p.grad) for name, p in trainer.model.named_parameters()}
    return totals, gradients, micro_batches


@pytest.mark.parametrize(
    "loss", [{"normalize": "token"}, {"normalize": "sequence", "entropy_coef": 0.01, "kl_beta": 0.05}]
)
def test_packed_micro_batches_give_the_loss_and_gradients_of_padded_ones(tiny_model, tmp_path, loss):
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", _rows())
    padded = _gradients(tiny_model, tmp_path / "padded", rollouts, {"micro_batch_size": 5}, loss)
    packed = _gradients(tiny_model, tmp_path / "packed", rollouts, {"micro_batch_tokens": 48}, loss)
    assert len(packed[2]) > 1 and all(micro.input_tokens <= 48 for micro in packed[2])
    assert all(micro.attention_mask is None for micro in packed[2])
    assert sum(m.input_tokens for m in packed[2]) < sum(m.input_tokens for m in padded[2])  # no padding
    for key in ("loss", "tokens", "entropy_sum", "ratio_sum", "kl_sum", "mismatch"):
        assert packed[0][key] == pytest.approx(padded[0][key], rel=1e-5, abs=1e-6), key
    for name, gradient in padded[1].items():
        assert torch.allclose(packed[1][name], gradient, rtol=1e-5, atol=1e-7), (
            name,
            (packed[1][name] - gradient).abs().max(),
        )


def test_a_recorded_sequence_longer_than_the_budget_stops_the_run_before_any_update(tiny_model, tmp_path):
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", _rows())
    with pytest.raises(
        InputError, match=r"step 1: sequence \d+ of the batch has \d+ tokens .*optim.micro_batch_tokens = 12"
    ):
        _gradients(tiny_model, tmp_path / "run", rollouts, {"micro_batch_tokens": 12}, {})
