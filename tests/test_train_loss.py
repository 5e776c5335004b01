"""The GRPO loss, advantages, logprobs and batch layout, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from genesys.train.batch import TrainingSequence, collate, split  # noqa: E402
from genesys.train.logprobs import token_entropy, token_logprobs  # noqa: E402
from genesys.train.loss import clipped_token_loss, group_advantages, kl_estimate, reduce_loss  # noqa: E402

EPS_LOW, EPS_HIGH, DELTA = 0.2, 0.28, 4.0


def _loss(ratio: float, advantage: float):
    logprob = torch.tensor([[math.log(ratio)]], requires_grad=True)
    result = clipped_token_loss(
        logprob, torch.zeros(1, 1), torch.tensor([advantage]), eps_low=EPS_LOW, eps_high=EPS_HIGH, delta=DELTA
    )
    result.loss.sum().backward()
    return result, float(result.loss.detach()), float(logprob.grad)


def test_positive_advantage_above_one_plus_eps_high_is_clipped_without_gradient():
    result, loss, grad = _loss(1.5, 2.0)
    assert loss == pytest.approx(-(1 + EPS_HIGH) * 2.0)  # -1.28 * 2 = -2.56
    assert grad == 0.0
    assert result.clipped_high.item() and not result.clipped_low.item() and not result.bounded_by_delta.item()


def test_negative_advantage_below_one_minus_eps_low_is_clipped_without_gradient():
    result, loss, grad = _loss(0.5, -1.0)
    assert loss == pytest.approx(0.8)  # -min(0.5 * -1, 0.8 * -1) = -(-0.8)
    assert grad == 0.0
    assert result.clipped_low.item() and not result.clipped_high.item()


def test_negative_advantage_above_delta_is_bounded_by_delta():
    result, loss, grad = _loss(6.0, -1.0)
    assert loss == pytest.approx(DELTA)  # -min(min(6, 4) * -1, 1.28 * -1) = 4
    assert grad == 0.0
    assert result.bounded_by_delta.item() and not result.clipped_high.item()


def test_negative_advantage_between_one_plus_eps_and_delta_keeps_the_ratio_and_its_gradient():
    result, loss, grad = _loss(2.0, -1.0)
    assert loss == pytest.approx(2.0)  # -min(2 * -1, 1.28 * -1) = 2
    assert grad == pytest.approx(2.0)  # d(-rho * A)/d logp = -A * rho = 2
    assert not (result.clipped_low.item() or result.clipped_high.item() or result.bounded_by_delta.item())


@pytest.mark.parametrize("ratio, advantage", [(1.1, 0.5), (0.9, -0.5), (0.5, 1.5), (1.0, 1.0)])
def test_unclipped_tokens_give_minus_ratio_times_advantage(ratio, advantage):
    result, loss, grad = _loss(ratio, advantage)
    assert loss == pytest.approx(-ratio * advantage)
    assert grad == pytest.approx(-ratio * advantage)
    assert not (result.clipped_low.item() or result.clipped_high.item() or result.bounded_by_delta.item())


def test_token_normalisation_weights_every_token_equally_and_sequence_normalisation_every_sequence():
    token_loss = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert float(reduce_loss(token_loss, mask, "token", denominator=4)) == pytest.approx(
        (1 + 2 + 3 + 10) / 4
    )  # 4.0
    assert float(reduce_loss(token_loss, mask, "sequence", denominator=2)) == pytest.approx(
        (2.0 + 10.0) / 2
    )  # 6.0


def test_padding_contributes_nothing_whatever_its_values():
    mask = torch.tensor([[True, True, False]])
    clean = reduce_loss(torch.tensor([[1.0, 2.0, 0.0]]), mask, "token", denominator=2)
    noisy = reduce_loss(torch.tensor([[1.0, 2.0, 1e6]]), mask, "token", denominator=2)
    assert float(clean) == float(noisy) == pytest.approx(1.5)
    for normalize in ("token", "sequence"):
        token_loss = torch.tensor([[1.0, 2.0, 5.0]], requires_grad=True)
        reduce_loss(token_loss, mask, normalize, denominator=1).backward()
        assert token_loss.grad[0, 2] == 0.0


def test_micro_batch_shares_add_up_to_the_batch_mean():
    token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0]])
    mask = token_loss != 0
    whole = reduce_loss(token_loss, mask, "token", denominator=6)
    parts = reduce_loss(token_loss[:1], mask[:1], "token", 6) + reduce_loss(
        token_loss[1:], mask[1:], "token", 6
    )
    assert float(parts) == pytest.approx(float(whole)) == pytest.approx(21 / 6)


def test_group_advantages_subtract_the_group_mean_and_optionally_divide_by_its_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.0])
    plain = group_advantages(rewards, [4, 3])
    assert plain.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 1 / 6, 1 / 6, -1 / 3])
    scaled = group_advantages(rewards, [4, 3], scale_by_std=True, eps=0.0)
    assert scaled[:4].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0])  # std 0.5
    assert scaled[4:].tolist() == pytest.approx(
        [1 / 6 / math.sqrt(1 / 18)] * 2 + [-1 / 3 / math.sqrt(1 / 18)]
    )
    assert group_advantages(torch.tensor([0.7, 0.7]), [2], scale_by_std=True).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="7 rewards"):
        group_advantages(rewards[:6], [4, 3])


def test_kl_estimate_is_zero_for_equal_policies_and_matches_k3():
    logp = torch.tensor([[-1.0, -2.0]])
    assert kl_estimate(logp, logp).tolist() == [[0.0, 0.0]]
    value = float(kl_estimate(torch.tensor([[-1.0]]), torch.tensor([[-1.5]])))
    assert value == pytest.approx(math.exp(-0.5) + 0.5 - 1)


def test_token_logprobs_and_entropy_equal_a_log_softmax_at_the_temperature():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11)
    tokens = torch.randint(0, 11, (2, 3))
    for temperature in (1.0, 0.7):
        log_softmax = torch.log_softmax(logits / temperature, dim=-1)
        expected = log_softmax.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(token_logprobs(logits, tokens, temperature), expected, atol=1e-6)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        assert torch.allclose(token_entropy(logits, temperature), entropy, atol=1e-5)


def test_collate_aligns_completions_and_masks_padding():
    batch = collate(
        [TrainingSequence([1, 2, 3], [7], [-0.5], 1.0), TrainingSequence([4], [8, 9], [-0.1, -0.2], -1.0)],
        pad_id=0,
    )
    assert batch.input_ids.tolist() == [[1, 2, 3, 7, 0], [0, 0, 4, 8, 9]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 3], [0, 0, 0, 1, 2]]
    assert batch.completion_ids.tolist() == [[7, 0], [8, 9]]
    assert batch.completion_mask.tolist() == [[True, False], [True, True]]
    assert torch.allclose(batch.behaviour_logprobs, torch.tensor([[-0.5, 0.0], [-0.1, -0.2]]))
    assert batch.advantages.tolist() == [1.0, -1.0]
    assert batch.tokens == 3
    assert [len(chunk) for chunk in split(list(range(5)), 2)] == [2, 2, 1]


def test_a_sequence_needs_one_logprob_per_completion_token():
    with pytest.raises(ValueError, match="2 completion ids but 1 logprobs"):
        TrainingSequence([1], [2, 3], [-1.0], 0.0)


@pytest.mark.parametrize(
    "log_ratio, advantage, branch",
    [
        (100.0, 2.0, "clipped_high"),  # exp(100) overflows float32: clipped, so no gradient
        (100.0, -1.0, "bounded_by_delta"),  # bounded at delta: no gradient
        (-200.0, -1.0, "clipped_low"),  # exp(-200) underflows to 0: clipped at 1 - eps_low
    ],
)
def test_an_overflowing_ratio_of_a_clipped_token_has_a_zero_gradient_not_nan(log_ratio, advantage, branch):
    logprob = torch.tensor([[0.0, log_ratio - 5.0]], requires_grad=True)
    behaviour = torch.tensor([[0.0, -5.0]])
    result = clipped_token_loss(
        logprob, behaviour, torch.tensor([advantage]), eps_low=EPS_LOW, eps_high=EPS_HIGH, delta=DELTA
    )
    loss = reduce_loss(result.loss, torch.tensor([[True, True]]), "token", denominator=2)
    loss.backward()
    assert math.isfinite(float(loss.detach()))
    assert torch.isfinite(logprob.grad).all(), logprob.grad
    assert float(logprob.grad[0, 1]) == 0.0  # the clipped token: no gradient
    assert float(logprob.grad[0, 0]) == pytest.approx(-advantage / 2)  # the other: -rho * A / tokens
    assert getattr(result, branch)[0, 1].item()
    assert math.isfinite(float(result.ratio[0, 1]))


def test_the_log_ratio_is_clamped_before_exp_and_nan_stays_nan():
    from genesys.train.loss import MAX_LOG_RATIO, clamped_log_ratio

    log_ratio = clamped_log_ratio(torch.tensor([1e4, -1e4, 0.5, math.nan]), torch.zeros(4))
    assert log_ratio[:3].tolist() == [MAX_LOG_RATIO, -MAX_LOG_RATIO, 0.5] and math.isnan(log_ratio[3])
    assert math.exp(MAX_LOG_RATIO) > DELTA  # within the clamp every branch is exact
    kl = kl_estimate(torch.tensor([[-500.0]]), torch.tensor([[-1.0]]))
    assert torch.isfinite(kl).all()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("normalize", ["token", "sequence"])
def test_non_finite_values_in_padding_never_reach_the_loss_or_its_gradient(bad, normalize):
    token_loss = torch.tensor([[1.0, 2.0, bad]], requires_grad=True)
    loss = reduce_loss(token_loss, torch.tensor([[True, True, False]]), normalize, denominator=1)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(3.0 if normalize == "token" else 1.5)
    assert token_loss.grad[0, 2] == 0.0
