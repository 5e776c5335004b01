"""Sampling proofs: the seeded Gumbel-max sampler (`genesys.proofs.sampling`), rows the transformers
backend draws with it, and `genesys validate` telling them from completions the model never sampled
(teacher-forced ones, whose TOPLOC proofs and logprobs are the real model's) and from rows sampled
with a seed or sample index the worker chose."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("toploc", reason="toploc is not installed: build it with `make install`")
torch = pytest.importorskip("torch")

import orjson  # noqa: E402

from genesys.config import ExpectedSampling, ProofConfig, ProofPolicy  # noqa: E402
from genesys.data.identity import request_seed  # noqa: E402
from genesys.proofs.sampling import (  # noqa: E402
    NOISE_HIGH,
    NOISE_LOW,
    SamplingKey,
    choose,
    gumbel,
    gumbel_noise,
    margin_problem,
    margins,
    step_keys,
)
from genesys.testing.tampering import (  # noqa: E402
    TINY_PROOFS,
    generate,
    teacher_forced,
    validate_tiny,
    write_tasks,
)

FORCED = "The answer is \\boxed{5}."
RUN_SEED = 7


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sampling-proofs")


@pytest.fixture(scope="module")
def tasks(work: Path) -> Path:
    return write_tasks(work / "tasks.jsonl")


@pytest.fixture(scope="module")
def honest(tiny_model: str, tasks: Path, work: Path) -> list[dict[str, Any]]:
    """6 tasks x 3 samples with proofs, run seed 7, temperature 0.8 and top-p 0.95."""
    return generate(
        tiny_model, tasks, work / "honest.jsonl", TINY_PROOFS, n=3, temperature=0.8, top_p=0.95, seed=RUN_SEED
    )


def validate(
    model: str, rows: list[dict[str, Any]], work: Path, name: str, **settings: Any
) -> dict[str, dict[str, Any]]:
    """`rows` validated with transformers and the tiny model's proof settings, by response_id."""
    source = work / f"{name}.jsonl"
    source.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    validated = validate_tiny(model, source, work / f"{name}-validated.jsonl", **settings)
    return {row["response_id"]: row for row in validated}


def assert_invalid(row: dict[str, Any], category: str, reason: str = "") -> None:
    assert row["toploc_valid"] is False, row["toploc_errors"]
    assert row["toploc_problems"] == [category], row["toploc_reason"]
    assert reason in row["toploc_reason"]


# --- the sampler --------------------------------------------------------------------------------------


def test_the_sampler_draws_each_token_with_its_probability_and_never_outside_the_nucleus() -> None:
    draws = 40_000
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    keys = step_keys([11] * draws, [0] * draws, range(draws), "cpu")
    tokens = choose(probs.log().expand(draws, -1), keys, temperature=1.0).squeeze(1)
    frequencies = torch.bincount(tokens, minlength=5) / draws
    assert torch.allclose(frequencies, probs, atol=0.01), frequencies
    assert frequencies[4] == 0


def test_the_noise_depends_on_seed_sample_position_and_token_only() -> None:
    keys = step_keys([1, 1, 1, 2], [0, 0, 1, 0], [0, 1, 0, 0], "cpu")
    assert len(set(keys.tolist())) == 4
    noise = gumbel_noise(keys, 1000)
    # A row's noise is the same alone or in a batch, and over a smaller vocabulary it is a prefix.
    assert torch.equal(gumbel_noise(keys[2:3], 1000), noise[2:3])
    assert torch.equal(gumbel_noise(keys, 10), noise[:, :10])
    # Pinned: every sampling proof ever written depends on these numbers (a new noise is a new SAMPLER).
    assert step_keys([1], [0], [0], "cpu").tolist() == [604019821]
    assert noise[0, :3].tolist() == pytest.approx([-0.1763289, -0.0875164, 1.9395330], abs=1e-6)
    assert noise.isfinite().all() and abs(noise.mean().item() - 0.5772) < 0.1


def test_the_noise_is_finite_and_bounded_for_every_hash() -> None:
    extremes = torch.tensor([-1, 0, 0x7FFFFFFF, -(2**31), 511, -512], dtype=torch.int32)
    values = gumbel(extremes)
    assert values.isfinite().all()
    assert values.max().item() == pytest.approx(NOISE_HIGH, rel=1e-5)
    assert values.min().item() == pytest.approx(NOISE_LOW, rel=1e-5)


@pytest.mark.parametrize("spread", [1.0, 8.0, 40.0])
def test_noise_only_where_a_token_could_win_picks_what_noise_everywhere_would(spread: float) -> None:
    scores = torch.randn(64, 3000, generator=torch.Generator().manual_seed(2)) * spread
    keys = step_keys([3] * 64, [1] * 64, range(64), "cpu")
    expected = (scores + gumbel_noise(keys, 3000)).argmax(dim=-1)
    assert torch.equal(choose(scores, keys, 1.0).squeeze(1), expected)


def test_margins_are_zero_for_the_sampler_s_picks_and_infinite_outside_the_nucleus() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    key = SamplingKey(seed=5, sample=2)
    scores = logits / 0.7
    picks = choose(scores, step_keys([5] * 6, [2] * 6, range(6), "cpu"), 0.7).squeeze(1).tolist()
    assert margins(logits, picks, key, 0.7, 1.0) == [0.0] * 6
    others = [(token + 1) % 50 for token in picks]
    assert min(margins(logits, others, key, 0.7, 1.0)) > 0
    # Top-p 0.5 keeps few tokens: the least likely token is outside the nucleus.
    least = logits.argmin(dim=-1).tolist()
    assert margins(logits, least, key, 0.7, 0.5) == [float("inf")] * 6
    # Greedy: the margin is the logit gap to the most likely token.
    assert margins(logits, logits.argmax(dim=-1).tolist(), key, 0.0, 1.0) == [0.0] * 6


def test_a_token_outside_the_nucleus_or_beyond_the_tolerance_is_a_problem_and_json_safe() -> None:
    assert margin_problem([0.0, 0.01], 0.05) == ({"max_sampling_margin": 0.01}, None)
    measured, problem = margin_problem([0.0, 3.0], 0.05)
    assert measured == {"max_sampling_margin": 3.0} and "completion token 1 is not" in problem.message
    measured, problem = margin_problem([0.0, float("inf"), float("nan")], 0.05)
    assert measured == {"max_sampling_margin": 0.0, "sampling_outside_nucleus": 2}  # no inf or NaN in JSON
    assert "completion token 1 cannot be the seeded sampler's pick" in problem.message


# --- honest rows and forgeries (transformers backend) ------------------------------------------------


def test_honest_sampled_rows_are_valid_and_sampling_proven(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    assert len(honest) == 18
    for row in honest:
        task, _, index = row["response_id"].rpartition("-")
        assert row["sampling_proof"] == {
            "sampler": "gumbel-v1",
            "seed": request_seed(RUN_SEED, task),
            "sample": int(index),
        }
    validated = validate(tiny_model, honest, work, "honest", expect=ExpectedSampling(seed=RUN_SEED, n=3))
    for row in validated.values():
        assert row["toploc_valid"] is True and row["sampling_proven"] is True, row["toploc_reason"]
        assert row["toploc_errors"]["max_sampling_margin"] == 0.0


def test_a_teacher_forced_completion_is_invalid_although_its_proofs_and_logprobs_pass(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    forged = [teacher_forced(row, FORCED, tiny_model) for row in honest[:4]]
    for row in validate(tiny_model, forged, work, "forced").values():
        assert_invalid(row, "sampling_proof", "is not the seeded sampler's pick")
        assert row["sampling_proven"] is False
        errors = row["toploc_errors"]
        assert errors["failed_chunks"] == 0 and errors["max_logprob_diff"] < 1e-3  # the model's own
        assert errors["max_sampling_margin"] > 1.0
    # Without its sampling proof it is invalid too, unless the validator accepts unsampled rows.
    stripped = [row | {"sampling_proof": None} for row in forged]
    for row in validate(tiny_model, stripped, work, "forced-unsampled").values():
        assert_invalid(row, "unsampled", "has no sampling_proof")
        assert row["sampling_proven"] is None
    accepting = ProofPolicy(min_topk=16, require_sampling=False)
    for row in validate(tiny_model, stripped, work, "forced-allowed", proofs=accepting).values():
        assert row["toploc_valid"] is True and row["sampling_proven"] is None


def test_the_seed_and_sample_index_cannot_be_chosen_by_the_worker(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    # Rows of another run seed (a worker trying seeds until one gives an answer it likes).
    validated = validate(tiny_model, honest[:3], work, "other-seed", expect=ExpectedSampling(seed=0))
    for row in validated.values():
        assert_invalid(row, "sampling_proof", "this task's seed in run seed 0 (--seed)")
    # Claiming the expected seed does not make the ground seed's tokens the sampler's picks.
    claimed = []
    for row in honest[:3]:
        task = row["response_id"].rpartition("-")[0]
        claimed.append(row | {"sampling_proof": row["sampling_proof"] | {"seed": request_seed(0, task)}})
    validated = validate(tiny_model, claimed, work, "claimed-seed", expect=ExpectedSampling(seed=0))
    for row in validated.values():
        assert_invalid(row, "sampling_proof", "is not the seeded sampler's pick")
    # Sample indices beyond the run's n (a worker sampling more and keeping the best).
    validated = validate(tiny_model, honest, work, "beyond-n", expect=ExpectedSampling(seed=RUN_SEED, n=2))
    for response_id, row in validated.items():
        if response_id.endswith("-2"):
            assert_invalid(row, "sampling_proof", "beyond the 2 samples per task (-n)")
        else:
            assert row["toploc_valid"] is True, row["toploc_reason"]
    # Sample 2 relabelled as sample 0 of its task (its proof names sample 2).
    relabelled = copy.deepcopy(next(row for row in honest if row["response_id"].endswith("-2")))
    relabelled["response_id"] = relabelled["response_id"][:-1] + "0"
    validated = validate(tiny_model, [relabelled], work, "relabelled", expect=ExpectedSampling(seed=RUN_SEED))
    assert_invalid(next(iter(validated.values())), "sampling_proof", "names sample 2")


def test_rows_without_sampling_proofs_are_invalid_unless_allowed(
    tiny_model: str, tasks: Path, work: Path
) -> None:
    unsampled = ProofConfig(topk=16, decode_batching_size=8, sampling=False)
    rows = generate(tiny_model, tasks, work / "unsampled.jsonl", unsampled, n=1)
    assert all(row["sampling_proof"] is None and row["toploc_proofs"] for row in rows)
    for row in validate(tiny_model, rows, work, "unsampled").values():
        assert_invalid(row, "unsampled")
    allowed = ProofPolicy(min_topk=16, require_sampling=False)
    for row in validate(tiny_model, rows, work, "unsampled-allowed", proofs=allowed).values():
        assert row["toploc_valid"] is True and row["sampling_proven"] is None


def test_greedy_rows_are_sampling_proven_and_a_changed_token_is_not(
    tiny_model: str, tasks: Path, work: Path
) -> None:
    rows = generate(tiny_model, tasks, work / "greedy.jsonl", TINY_PROOFS, n=1, temperature=0.0)
    validated = validate(tiny_model, rows, work, "greedy")
    assert all(row["toploc_valid"] and row["sampling_proven"] for row in validated.values())
    forged = [teacher_forced(row, FORCED, tiny_model) for row in rows[:2]]
    for row in validate(tiny_model, forged, work, "greedy-forced").values():
        assert_invalid(row, "sampling_proof")
