"""The TRL-style reward function: trainer calls in, verified and shaped rewards out."""

from __future__ import annotations

import json

import pytest
from genesys_testplugins import Echo

from genesys.config import VerifyConfig
from genesys.rewards import RewardConfig
from genesys.verification.engine import VerificationEngine
from genesys.verification.reward_function import RewardFunction, rollout_rows

VERIFIERS = {"echo": Echo}


def trainer_columns(count: int) -> dict:
    """Dataset columns as GRPOTrainer passes them: one value per completion, plus non-row extras."""
    return {
        "task_type": ["echo"] * count,
        "verification_info": [json.dumps({"expected": "yes"})] * count,
        "problem_id": [f"p{i // 2}" for i in range(count)],
        "trainer_state": object(),
    }


def test_rewards_for_text_and_chat_completions_with_a_length_term():
    config = VerifyConfig(
        workers=1, progress=False, reward=RewardConfig("exact", target_length=10, coef=0.01)
    )
    with RewardFunction(config, VERIFIERS) as reward_func:
        plain = reward_func(
            ["say yes"] * 3,
            ["yes", "no", "yes"],
            completion_ids=[[0] * 10, [0] * 10, [0] * 30],
            **trainer_columns(3),
        )
        chat = reward_func(
            [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "say yes"}]] * 2,
            [[{"role": "assistant", "content": "yes"}], [{"role": "assistant", "content": "nope"}]],
            completion_ids=[[0] * 12, [0] * 10],
            **trainer_columns(2),
        )
    assert plain == pytest.approx([1.0, 0.0, 1.0 - 0.01 * 20])
    assert chat == pytest.approx([1.0 - 0.01 * 2, 0.0])
    assert reward_func.__name__ == "genesys"
    assert reward_func.last_rows[0]["prompt"] == "say yes" and reward_func.last_rows[0]["problem_id"] == "p0"


def test_a_completion_without_a_verdict_or_a_measurable_length_gets_none():
    config = VerifyConfig(workers=1, progress=False, reward=RewardConfig("clip", target_length=5))
    columns = {"task_type": ["echo", "mystery", "echo"], "verification_info": [{"expected": "yes"}] * 3}
    with VerificationEngine(config, VERIFIERS) as pool:
        reward_func = RewardFunction(config, pool=pool)
        with reward_func:
            rewards = reward_func(
                ["q"] * 3, ["yes", "yes", "yes"], **columns
            )  # no completion_ids and no tokenizer
        assert pool.outstanding == 0 and pool.verify_rows([]) == []  # a pool it was given stays open
    assert rewards == [None, None, None]
    errors = [row["error"] for row in reward_func.last_rows]
    assert errors[0].startswith("reward_error: ") and "--tokenizer" in errors[0]
    assert errors[1].startswith("unknown_task_type: ")
    assert reward_func.last_rows[0]["score"] == 1.0


def test_prompts_and_completions_must_pair_up():
    with pytest.raises(ValueError, match="2 prompts and 3 completions"):
        rollout_rows(["a", "b"], ["x", "y", "z"], None, {})
