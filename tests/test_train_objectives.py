"""The loss family beside GRPO (dr_grpo, gspo, cispo), importance-sampling weights (tis, mis), the
top-p nucleus in the trainer's logprobs and dropout switched off, against numbers worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from genesys.train.correction import importance_weights  # noqa: E402
from genesys.train.dropout import disable_dropout  # noqa: E402
from genesys.train.logprobs import token_logprobs  # noqa: E402
from genesys.train.loss import (  # noqa: E402
    cispo_token_loss,
    clipped_token_loss,
    gspo_token_loss,
    loss_denominator,
    policy_token_loss,
    reduce_loss,
)

LN = math.log


# --- dr_grpo ---------------------------------------------------------------------------------------


def test_dr_grpo_divides_by_sequences_times_max_tokens_whatever_the_lengths():
    # 3 sequences of 2, 5 and 1 tokens, max_tokens 8: grpo divides by 8 tokens, dr_grpo by 3 * 8 = 24
    assert loss_denominator("grpo", "token", tokens=8, sequences=3, budget=24) == 8
    assert loss_denominator("grpo", "sequence", tokens=8, sequences=3, budget=24) == 3
    assert loss_denominator("dr_grpo", "token", tokens=8, sequences=3, budget=24) == 24
    assert loss_denominator("dr_grpo", "token", tokens=20, sequences=3, budget=24) == 24
    assert loss_denominator("grpo", "token", tokens=0, sequences=0, budget=0) == 1.0  # never 0
    token_loss = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert float(reduce_loss(token_loss, mask, "token", 24.0)) == pytest.approx(6 / 24)


def test_dr_grpo_token_loss_is_grpos_and_refuses_std_scaling():
    logprobs, old, adv = torch.tensor([[LN(1.5), LN(0.9)]]), torch.zeros(1, 2), torch.tensor([2.0])
    kwargs = {"eps_low": 0.2, "eps_high": 0.2, "delta": 4.0}
    dr = policy_token_loss("dr_grpo", logprobs, old, adv, torch.ones(1, 2, dtype=torch.bool), **kwargs)
    grpo = clipped_token_loss(logprobs, old, adv, **kwargs)
    assert torch.equal(dr.loss, grpo.loss)
    assert dr.loss.tolist()[0] == pytest.approx([-1.2 * 2, -0.9 * 2])
    from genesys.train import TrainConfig

    base = {"model": "m", "output_dir": "o", "data": {"tasks": ["t"]}, "sampling": {"n": 2}}
    with pytest.raises(ValueError, match="dr_grpo.*scale_by_std"):
        TrainConfig.load(None, {**base, "loss": {"type": "dr_grpo", "scale_by_std": True}})


# --- gspo ------------------------------------------------------------------------------------------


def test_gspo_takes_one_ratio_per_sequence_the_exp_of_its_mean_log_ratio():
    # sequence 0: token ratios 1.2 and 0.8 (+ a padding token); s = exp((ln 1.2 + ln 0.8) / 2) = sqrt(0.96)
    # sequence 1: one token of ratio 1.5, advantage > 0: clipped at 1 + eps_high = 1.2
    logprobs = torch.tensor([[LN(1.2), LN(0.8), 5.0], [LN(1.5), 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    result = gspo_token_loss(
        logprobs, torch.zeros(2, 3), torch.tensor([1.0, 2.0]), mask, eps_low=0.2, eps_high=0.2
    )
    s0 = math.sqrt(0.96)
    assert result.ratio[0, :2].tolist() == pytest.approx([s0, s0])
    assert result.ratio[1, 0].item() == pytest.approx(1.5)
    assert result.loss[0, :2].tolist() == pytest.approx([-s0, -s0])  # -s * A, A = 1
    assert result.loss[1, 0].item() == pytest.approx(-1.2 * 2.0)  # clipped
    assert result.clipped_high.tolist() == [[False, False, False], [True, True, True]]
    reduce_loss(result.loss, mask, "sequence", 2.0).backward()
    # sequence 0's mean over its 2 tokens: d/dlogp_t of -s * A / 2 / 2 = -s * (1/2) / 2 per token
    # (s's gradient is s * grad of the mean log-ratio, 1/2 per token); sequence 1 is clipped: 0
    assert logprobs.grad[0, :2].tolist() == pytest.approx([-s0 / 4, -s0 / 4])
    assert logprobs.grad[1].tolist() == [0.0, 0.0, 0.0]
    assert logprobs.grad[0, 2].item() == 0.0  # padding


# --- cispo -----------------------------------------------------------------------------------------


def test_cispo_clips_the_detached_weight_and_keeps_every_gradient():
    # ratios 2.0 (weight clipped to 1.28), 0.5 (clipped to 0.8), 1.1 (kept); advantage 1.5
    logprobs = torch.tensor([[LN(2.0), LN(0.5), LN(1.1)]], requires_grad=True)
    result = cispo_token_loss(logprobs, torch.zeros(1, 3), torch.tensor([1.5]), eps_low=0.2, eps_high=0.28)
    assert result.loss[0].tolist() == pytest.approx(
        [-1.28 * 1.5 * LN(2.0), -0.8 * 1.5 * LN(0.5), -1.1 * 1.5 * LN(1.1)]
    )
    result.loss.sum().backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-1.28 * 1.5, -0.8 * 1.5, -1.1 * 1.5])
    assert result.clipped_high.tolist() == [[True, False, False]]
    assert result.clipped_low.tolist() == [[False, True, False]]


def test_an_unknown_loss_type_is_refused():
    with pytest.raises(ValueError, match="loss type"):
        policy_token_loss(
            "ppo", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1, dtype=torch.bool),
            eps_low=0.2, eps_high=0.2, delta=4.0,
        )  # fmt: skip


# --- importance weights ----------------------------------------------------------------------------

# trainer-old vs sampler per-token ratios 0.5, 3.0 | 1.5, 2.5 (second sequence has a padding column)
OLD = torch.tensor([[LN(0.5), LN(3.0), 0.0], [LN(1.5), LN(2.5), 9.0]])
SAMPLER = torch.zeros(2, 3)
MASK = torch.tensor([[True, True, False], [True, True, False]])


def test_tis_truncates_token_weights_at_the_cap():
    w = importance_weights(OLD, SAMPLER, MASK, mode="tis", level="token", cap=2.0)
    assert w.weights[:, :2].flatten().tolist() == pytest.approx([0.5, 2.0, 1.5, 2.0])
    assert w.capped.tolist() == [[False, True, False], [False, True, False]]


def test_mis_drops_tokens_above_the_cap():
    w = importance_weights(OLD, SAMPLER, MASK, mode="mis", level="token", cap=2.0)
    assert w.weights[:, :2].flatten().tolist() == pytest.approx([0.5, 0.0, 1.5, 0.0])


def test_sequence_level_weights_are_the_product_of_the_tokens_and_shared_by_them():
    # sequence 0: 0.5 * 3.0 = 1.5 (under the cap); sequence 1: 1.5 * 2.5 = 3.75 (padding ignored)
    tis = importance_weights(OLD, SAMPLER, MASK, mode="tis", level="sequence", cap=2.0)
    assert tis.weights[:, :2].flatten().tolist() == pytest.approx([1.5, 1.5, 2.0, 2.0])
    mis = importance_weights(OLD, SAMPLER, MASK, mode="mis", level="sequence", cap=2.0)
    assert mis.weights[:, :2].flatten().tolist() == pytest.approx([1.5, 1.5, 0.0, 0.0])
    assert mis.capped.tolist() == [[False, False, False], [True, True, False]]


def test_no_correction_weighs_every_token_one_and_weights_carry_no_gradient():
    assert (
        importance_weights(OLD, SAMPLER, MASK, mode="none", level="token", cap=2.0).weights.tolist()
        == [[1.0] * 3] * 2
    )
    old = OLD.clone().requires_grad_(True)
    assert not importance_weights(
        old, SAMPLER, MASK, mode="tis", level="token", cap=2.0
    ).weights.requires_grad


# --- the nucleus -----------------------------------------------------------------------------------


def test_top_p_logprobs_are_those_of_the_renormalised_nucleus():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the first two (0.5 < 0.7 <= 0.8)
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]] * 3]))
    tokens = torch.tensor([[0, 1, 2]])
    got = token_logprobs(logits, tokens, temperature=1.0, top_p=0.7)[0].tolist()
    # token 2 is outside the nucleus: it still counts, with its own mass added (0.15 / 0.95)
    assert got == pytest.approx([LN(0.5 / 0.8), LN(0.3 / 0.8), LN(0.15 / 0.95)], abs=1e-6)
    assert token_logprobs(logits, tokens, temperature=1.0, top_p=1.0)[0].tolist() == pytest.approx(
        [LN(0.5), LN(0.3), LN(0.15)], abs=1e-6
    )


def test_the_trainer_nucleus_matches_the_samplers_logprobs():
    from genesys.models import sampled_logprobs

    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    ids = [int(i) for i in logits.argsort(dim=1, descending=True)[:, 3]]  # each row's fourth choice
    sampler = sampled_logprobs(logits, ids, temperature=0.7, top_p=0.8)
    assert all(math.isfinite(value) for value in sampler)  # inside the nucleus: the sampler may draw them
    trainer = token_logprobs(logits.unsqueeze(0), torch.tensor([ids]), temperature=0.7, top_p=0.8)[0]
    assert trainer.tolist() == pytest.approx(sampler, abs=1e-5)


def test_the_nucleus_passes_gradient_only_to_the_kept_tokens():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]])).requires_grad_(True)
    token_logprobs(logits, torch.tensor([[0]]), 1.0, 0.7).sum().backward()
    grad = logits.grad[0, 0].tolist()
    assert grad[2:] == [0.0, 0.0]
    assert grad[:2] == pytest.approx([1 - 0.5 / 0.8, -0.3 / 0.8])


# --- dropout ---------------------------------------------------------------------------------------


def test_disable_dropout_zeroes_dropout_modules_and_attention_rates_but_not_the_config():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, attention_dropout=0.1,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.extra = torch.nn.Sequential(torch.nn.Dropout(0.3))
    assert disable_dropout(model) == 3  # two attention layers and the Dropout module
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in model.model.layers)
    assert model.extra[0].p == 0.0
    assert model.config.attention_dropout == 0.1
    assert disable_dropout(model) == 0


def test_the_intellect2_config_loads_with_the_reports_hyperparameters():
    from genesys.train import TrainConfig

    config = TrainConfig.load(
        Path(__file__).parents[1] / "configs" / "intellect2.toml",
        {"data": {"tasks": ["tasks.jsonl"]}, "output_dir": "out"},
    )
    assert (config.loss.type, config.loss.eps_low, config.loss.eps_high, config.loss.delta) == (
        "grpo",
        0.2,
        0.2,
        4.0,
    )
    assert (config.loss.kl_beta, config.sampling.n, config.optim.lr) == (0.001, 16, 3e-7)
    assert (config.async_.max_staleness, config.cluster.backend) == (2, "ray")
