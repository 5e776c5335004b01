"""Length-shaped rewards: exact values for every mode, errors, targets, token counting, engine and CLI wiring."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import GENESYS, read_jsonl, rollout, write_jsonl
from genesys_testplugins import Echo

import genesys
from genesys.config import VerifyConfig
from genesys.errors import InputError
from genesys.rewards import RewardConfig, RewardStage


def row(length: int, **extra) -> dict:
    return {"response_id": "r1", "problem_id": "p1", "completion_ids": list(range(length)), **extra}


def compute_reward(score, row, config: RewardConfig) -> float | None:
    return RewardStage(config).reward(score, row)


def reward(score, length, **config) -> float | None:
    return compute_reward(score, row(length), RewardConfig(**config))


@pytest.mark.parametrize(
    ("score", "length", "expected"),
    [(1.0, 1000, 1.0), (1.0, 1200, 0.94), (1.0, 700, 0.91), (0.0, 1500, -0.15), (0.5, 0, 0.2)],
)
def test_exact_subtracts_coef_times_distance_from_target(score, length, expected):
    assert reward(score, length, length_penalty="exact", target_length=1000) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("score", "length", "target", "expected"),
    [
        (1.0, 1000, 1000, 0.5),  # at the target: half the score
        (1.0, 1200, 1000, 0.44),  # 0.0003 * -200 + 0.5
        (1.0, 500, 1000, 0.65),  # 0.0003 * 500 + 0.5
        (0.5, 500, 1000, 0.325),
        (1.0, 3000, 1000, 0.0),  # clipped below at 0
        (1.0, 0, 1000, 0.8),
        (1.0, 0, 3000, 1.0),  # 0.0003 * 3000 + 0.5 = 1.4, clipped at 1
        (0.0, 100, 1000, 0.0),
    ],
)
def test_max_scales_score_by_clipped_linear_term(score, length, target, expected):
    assert reward(score, length, length_penalty="max", target_length=target) == pytest.approx(expected)


@pytest.mark.parametrize(("length", "expected"), [(999, 0.75), (1000, 0.75), (1001, 0.0)])
def test_clip_zeroes_completions_longer_than_target(length, expected):
    assert reward(0.75, length, length_penalty="clip", target_length=1000) == expected


@pytest.mark.parametrize(
    ("length", "penalty", "expected"),
    [
        (700, 1.0, 1.0),
        (800, 1.0, 1.0),
        (850, 1.0, 0.75),
        (900, 1.0, 0.5),
        (1000, 1.0, 0.0),
        (1500, 1.0, 0.0),
        (900, 0.5, 0.75),
    ],
)
def test_overlong_ramps_down_over_the_buffer(length, penalty, expected):
    config = {
        "length_penalty": "overlong",
        "max_length": 1000,
        "overlong_buffer": 200,
        "overlong_penalty": penalty,
    }
    assert reward(1.0, length, **config) == pytest.approx(expected)


def test_overlong_penalty_is_added_to_a_wrong_answer_too():
    assert reward(0.0, 950, length_penalty="overlong", max_length=1000, overlong_buffer=200) == pytest.approx(
        -0.75
    )


def test_custom_coefficient():
    assert reward(1.0, 1100, length_penalty="exact", target_length=1000, coef=0.001) == pytest.approx(0.9)


@pytest.mark.parametrize("mode", ["none", "exact", "max", "clip", "overlong"])
def test_an_error_verdict_has_no_reward_in_every_mode(mode):
    config = RewardConfig(mode, target_length=10, max_length=100, overlong_buffer=10)
    assert compute_reward(None, {}, config) is None


def test_none_mode_returns_the_score_without_needing_a_length():
    assert compute_reward(0.25, {}, RewardConfig()) == 0.25


def test_row_target_length_column_wins_over_the_default():
    shaped = compute_reward(1.0, row(1200, target_length=1200), RewardConfig("exact", target_length=1000))
    assert shaped == 1.0


def test_missing_target_is_an_error_naming_the_row_and_flag():
    with pytest.raises(InputError, match=r"response_id='r1'.*--target-length"):
        compute_reward(1.0, row(10), RewardConfig("exact"))


def test_missing_ids_without_tokenizer_is_an_error_naming_the_row():
    with pytest.raises(InputError, match=r"response_id='r9'.*--tokenizer"):
        compute_reward(
            1.0, {"response_id": "r9", "llm_response": "a b c"}, RewardConfig("clip", target_length=2)
        )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"length_penalty": "linear"}, "length_penalty must be one of"),
        ({"length_penalty": "overlong", "max_length": 100}, "needs --max-length and --overlong-buffer"),
        ({"length_penalty": "overlong", "max_length": 100, "overlong_buffer": 200}, "overlong buffer"),
        ({"coef": -1.0}, "coefficient"),
    ],
)
def test_bad_configs_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**config)


def test_tokenizer_counts_tokens_when_ids_are_missing(tmp_path: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "the": 1, "answer": 2, "is": 3, "four": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    text_row = {"response_id": "r2", "llm_response": "the answer is four , surely"}
    assert (
        RewardStage(RewardConfig("clip", target_length=5, tokenizer=str(tmp_path / "tok"))).completion_length(
            text_row
        )
        == 6
    )
    assert (
        compute_reward(1.0, text_row, RewardConfig("clip", target_length=5, tokenizer=str(tmp_path / "tok")))
        == 0.0
    )


def test_engine_writes_the_shaped_reward_and_keeps_the_score():
    rows = [
        {**rollout("echo", "yes", expected="yes", response_id="a"), "completion_ids": [0] * 1200},
        {**rollout("echo", "no", expected="yes", response_id="b"), "completion_ids": [0] * 800},
    ]
    config = VerifyConfig(progress=False, workers=1, reward=RewardConfig("exact", target_length=1000))
    out = genesys.verify_rollouts(rows, config=config, verifiers={"echo": Echo})
    assert [r["score"] for r in out] == [1.0, 0.0]
    assert [r["reward"] for r in out] == pytest.approx([0.94, -0.06])


def test_verify_cli_length_flags(tmp_path: Path, plugin_env):
    rows = [
        {**rollout("echo", "yes", expected="yes", response_id=f"r{n}"), "completion_ids": [0] * n}
        for n in (900, 1100)
    ]
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    command = [GENESYS, "verify", str(inputs), "-o", str(output), "--workers", "1", "--no-progress"]
    done = subprocess.run(
        [*command, "--length-penalty", "clip", "--target-length", "1000"],
        env=plugin_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert [(r["score"], r["reward"]) for r in read_jsonl(output)] == [(1.0, 1.0), (1.0, 0.0)]


def test_verify_cli_refuses_overlong_without_max_length(tmp_path: Path, plugin_env):
    inputs = write_jsonl(tmp_path / "in.jsonl", [rollout("echo", "yes", expected="yes")])
    command = [
        GENESYS,
        "verify",
        str(inputs),
        "-o",
        str(tmp_path / "o.jsonl"),
        "--length-penalty",
        "overlong",
    ]
    done = subprocess.run(command, env=plugin_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "overlong' length term needs --max-length and --overlong-buffer" in done.stderr


def test_verify_cli_refuses_rows_the_length_penalty_cannot_score_before_any_work(tmp_path: Path, plugin_env):
    rows = [
        {
            **rollout("echo", "yes", expected="yes", response_id="ok"),
            "completion_ids": [0] * 10,
            "target_length": 20,
        },
        {**rollout("echo", "yes", expected="yes", response_id="no-target"), "completion_ids": [0] * 10},
        {**rollout("echo", "yes", expected="yes", response_id="no-ids"), "target_length": 20},
        rollout(
            "nope", "x", response_id="unknown-type"
        ),  # recorded as an error with --skip-unknown: needs no length
    ]
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    command = [
        GENESYS,
        "verify",
        str(inputs),
        "-o",
        str(output),
        "--workers",
        "1",
        "--no-progress",
        "--length-penalty",
        "exact",
        "--skip-unknown",
    ]
    done = subprocess.run(command, env=plugin_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert (
        "2 row(s) lack what it needs" in done.stderr
        and f"{inputs}:2:" in done.stderr
        and "'target_length'" in done.stderr
    )
    assert not output.exists()  # refused before any work


def test_weighted_terms_sum_as_computed_by_hand():
    # L = 1200, T = 1000, score 1: exact = -0.001 * 200 = -0.2; overlong (M 1500, B 500) = -(1200 - 1000) / 500 = -0.4
    config = {
        "length_penalty": "exact",
        "target_length": 1000,
        "coef": 0.001,
        "max_length": 1500,
        "overlong_buffer": 500,
    }
    assert reward(1.0, 1200, **config, weights={"exact": 0.5, "overlong": 2.0}) == pytest.approx(
        1.0 - 0.5 * 0.2 - 2.0 * 0.4
    )  # 0.1
    assert reward(1.0, 1200, **config, weights={"score": 0.0}) == pytest.approx(-0.2)  # the length term alone
    assert reward(0.5, 1200, **config, weights={"score": 2.0, "exact": 0.0}) == 1.0  # weight 0 drops a term
    # max and clip as terms: their change to the score, so score + term is the length penalty's reward
    assert reward(
        1.0, 1200, length_penalty="none", target_length=1000, weights={"max": 1.0}
    ) == pytest.approx(0.44)
    assert reward(
        0.5, 1200, length_penalty="none", target_length=1000, weights={"clip": 0.5}
    ) == pytest.approx(0.25)
    assert RewardConfig("exact", weights={"overlong": 1.0}, max_length=10, overlong_buffer=5).terms == {
        "score": 1.0,
        "exact": 1.0,
        "overlong": 1.0,
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"weights": {"brevity": 1.0}}, "unknown reward term 'brevity'"),
        ({"weights": {"score": float("nan")}}, "must be a finite number"),
        ({"weights": {"overlong": 1.0}, "max_length": 100}, "needs --max-length and --overlong-buffer"),
        ({"target_length": -5}, "target length must be an integer >= 0"),
        ({"weights": {"score": 0.0}}, "leave no reward term"),
    ],
)
def test_bad_weights_and_targets_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**config)


BAD_ROWS = [
    ({"completion_ids": 7}, "completion_ids must be a list of token ids, got int 7"),
    ({"completion_ids": "1 2 3"}, "completion_ids must be a list of token ids, got str"),
    ({"completion_ids": {"ids": [1, 2, 3]}}, "completion_ids must be a list of token ids, got dict"),
    ({"completion_ids": [0] * 10, "target_length": -5}, "'target_length' must be an integer >= 0, got -5"),
    (
        {"completion_ids": [0] * 10, "target_length": 12.5},
        "'target_length' must be an integer >= 0, got 12.5",
    ),
]


@pytest.mark.parametrize(("columns", "message"), BAD_ROWS)
def test_rows_a_length_term_cannot_measure_are_refused_before_any_work_with_their_line(
    tmp_path: Path, plugin_env, columns, message
):
    rows = [
        {**rollout("echo", "yes", expected="yes", response_id="ok"), "completion_ids": [0] * 10},
        {**rollout("echo", "yes", expected="yes", response_id="bad"), **columns},
        {**rollout("echo", "yes", expected="yes", response_id="after"), "completion_ids": [0] * 3},
    ]
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    command = [
        GENESYS,
        "verify",
        str(inputs),
        "-o",
        str(output),
        "--workers",
        "1",
        "--no-progress",
        "--length-penalty",
        "clip",
        "--target-length",
        "5",
    ]
    done = subprocess.run(command, env=plugin_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{inputs}:2: row (response_id='bad'" in done.stderr and message in done.stderr
    assert not output.exists()


@pytest.mark.parametrize(("columns", "message"), BAD_ROWS)
def test_in_memory_rows_a_length_term_cannot_measure_become_error_rows(columns, message):
    rows = [
        {**rollout("echo", "yes", expected="yes", response_id="ok"), "completion_ids": [0] * 10},
        {**rollout("echo", "yes", expected="yes", response_id="bad"), **columns},
        {**rollout("echo", "no", expected="yes", response_id="after"), "completion_ids": [0] * 3},
    ]
    config = VerifyConfig(progress=False, workers=1, reward=RewardConfig("clip", target_length=5))
    ok, bad, after = genesys.verify_rollouts(rows, config=config, verifiers={"echo": Echo})
    assert (ok["score"], ok["reward"], ok["error"]) == (1.0, 0.0, None)
    assert (
        bad["score"] == 1.0
        and bad["reward"] is None
        and bad["error"].startswith("reward_error: row (response_id='bad'")
        and message in bad["error"]
    )
    assert (after["score"], after["reward"], after["error"]) == (0.0, 0.0, None)
    assert list(bad)[-4:] == [
        "score",
        "verification_result_info",
        "reward",
        "error",
    ]  # the verdict columns keep their order


def test_a_tokenizer_that_cannot_load_fails_when_the_stage_is_built():
    with pytest.raises(InputError, match="cannot load tokenizer"):
        RewardStage(RewardConfig("clip", target_length=5, tokenizer="/nonexistent/tokenizer"))
    assert (
        RewardStage(RewardConfig(tokenizer="/nonexistent/tokenizer")).tokenizer is None
    )  # no length term: nothing to count
