"""TOPLOC proofs: `generate --proofs` on the tiny model, `genesys validate` accepting honest rows and
rejecting tampered ones (each for the right reason), and the guards around the toploc package."""

from __future__ import annotations

import base64
import copy
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "toploc",
    reason="toploc is not installed: build it with `make install` (or see the proofs extra in pyproject.toml)",
)

import orjson  # noqa: E402
import torch  # noqa: E402
from conftest import GENESYS  # noqa: E402

from genesys.config import ProofConfig, ValidateCommand  # noqa: E402
from genesys.errors import InputError  # noqa: E402
from genesys.proofs.toploc import ProofError, as_proof_dtype, build_proofs, decode_proofs, verify_proofs  # noqa: E402
from genesys.proofs.validate import validate_files  # noqa: E402
from genesys.testing.tampering import (  # noqa: E402
    TINY_PROOF_POLICY,
    TINY_PROOFS,
    TINY_THRESHOLDS,
    claiming,
    copy_proofs,
    edit_logprobs,
    generate,
    perturbed_model,
    read_rows,
    swap_token,
    validate_tiny,
    write_tasks,
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("proofs")


@pytest.fixture(scope="module")
def tasks(work: Path) -> Path:
    return write_tasks(work / "tasks.jsonl")


@pytest.fixture(scope="module")
def honest(tiny_model: str, tasks: Path, work: Path) -> list[dict[str, Any]]:
    """Rows with proofs from the tiny model: 6 tasks x 2 samples of 24 tokens at most."""
    return generate(tiny_model, tasks, work / "honest.jsonl", TINY_PROOFS)


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def validate(
    model: str, rows: list[dict[str, Any]], work: Path, name: str, **settings: Any
) -> list[dict[str, Any]]:
    """`rows` validated against `model` with the tiny model's proof settings and thresholds."""
    return validate_tiny(
        model, write(work / f"{name}.jsonl", rows), work / f"{name}-validated.jsonl", **settings
    )


def assert_all_rejected_by(rows: list[dict[str, Any]], category: str) -> None:
    assert rows, "no tampered rows to validate"
    for row in rows:
        assert row["toploc_valid"] is False, row["toploc_errors"]
        assert category in row["toploc_problems"], (row["toploc_problems"], row["toploc_reason"])
        assert row["toploc_reason"]


# --- generation and honest validation ---------------------------------------------------------------


def test_generated_rows_carry_proofs_and_settings(honest: list[dict[str, Any]], tiny_model: str) -> None:
    assert len(honest) == 12
    for row in honest:
        chunks = -(-len(row["completion_ids"]) // TINY_PROOFS.decode_batching_size)
        assert len(row["toploc_proofs"]) == chunks
        config = (
            row["toploc_config"]
            if isinstance(row["toploc_config"], dict)
            else orjson.loads(row["toploc_config"])
        )
        assert config["topk"] == 16 and config["decode_batching_size"] == 8 and config["dtype"] == "bfloat16"
        assert config["model"] == tiny_model and len(config["weights_sha256"]) == 64


def test_honest_rows_are_all_valid(honest: list[dict[str, Any]], tiny_model: str, work: Path) -> None:
    validated = validate(tiny_model, honest, work, "honest")
    assert [row["toploc_valid"] for row in validated] == [True] * len(honest), [
        row["toploc_reason"] for row in validated
    ]
    for row in validated:
        errors = row["toploc_errors"]
        assert errors["failed_chunks"] == 0 and errors["chunks"] == len(row["toploc_proofs"])
        assert errors["max_logprob_diff"] <= 1e-3
        assert row["toploc_reason"] is None


def test_rows_of_another_model_claiming_this_one_are_rejected_by_the_proofs(
    honest, tiny_model, tasks, work
) -> None:
    from genesys.generate.tiny_model import build_tiny_model

    other = str(build_tiny_model(work / "other-model", seed=1))
    forged = claiming(generate(other, tasks, work / "other.jsonl", TINY_PROOFS), honest[0])
    assert_all_rejected_by(validate(tiny_model, forged, work, "other"), "proof")


def test_rows_naming_another_model_are_rejected_for_the_claim(
    tiny_model: str, tasks: Path, work: Path
) -> None:
    other = perturbed_model(tiny_model, work / "named-model", scale=1e-3, seed=7)
    rows = generate(other, tasks, work / "named.jsonl", TINY_PROOFS, n=1)
    validated = validate(tiny_model, rows, work, "named")
    assert_all_rejected_by(validated, "model")
    assert all(
        "expected" in row["toploc_reason"] and "weights hash" in row["toploc_reason"] for row in validated
    )


def test_rows_of_perturbed_weights_are_rejected_by_the_proofs(honest, tiny_model, tasks, work) -> None:
    perturbed = perturbed_model(tiny_model, work / "perturbed-model")
    forged = claiming(generate(perturbed, tasks, work / "perturbed.jsonl", TINY_PROOFS), honest[0])
    assert_all_rejected_by(validate(tiny_model, forged, work, "perturbed"), "proof")


def test_one_swapped_completion_token_is_rejected_by_the_proofs(honest, tiny_model, work) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    forged = [swap_token(row, tokenizer) for row in honest if len(row["completion_ids"]) > 8]
    validated = validate(tiny_model, forged, work, "swapped")
    assert_all_rejected_by(
        validated, "proof"
    )  # the logprob check alone misses some: the tiny model's are nearly uniform
    assert all("text" not in row["toploc_problems"] for row in validated)  # the forger decoded the text again


def test_a_proof_copied_from_another_row_is_rejected(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    assert_all_rejected_by(validate(tiny_model, copy_proofs(honest), work, "copied"), "proof")


def test_edited_logprobs_are_rejected_although_the_proofs_pass(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    validated = validate(tiny_model, [edit_logprobs(row, -0.5) for row in honest], work, "logprobs")
    assert_all_rejected_by(validated, "logprobs")
    assert all(
        row["toploc_errors"]["failed_chunks"] == 0 and row["toploc_problems"] == ["logprobs"]
        for row in validated
    )
    assert all(0.49 < row["toploc_errors"]["max_logprob_diff"] < 0.51 for row in validated)


def test_text_prompt_and_stop_rules_are_checked(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    other_text = copy.deepcopy(honest[0]) | {"llm_response": "a better answer"}
    other_prompt = copy.deepcopy(honest[1]) | {"prompt": "Prove the Riemann hypothesis."}
    too_long = next(copy.deepcopy(row) for row in honest if row["finish_reason"] == "length")
    too_long["generation_config"] = too_long["generation_config"] | {
        "max_tokens": len(too_long["completion_ids"]) - 1
    }
    rows = validate(tiny_model, [other_text, other_prompt, too_long], work, "claims")
    assert "completion_ids do not decode to llm_response" in rows[0]["toploc_reason"]
    assert "prompt_ids do not contain the row's prompt" in rows[1]["toploc_reason"]
    assert "more than max_tokens" in rows[2]["toploc_reason"] and "stop" in rows[2]["toploc_problems"]
    assert [row["toploc_valid"] for row in rows] == [False] * 3


def test_expected_sampling_settings_are_enforced(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    from genesys.config import ExpectedSampling

    rows = validate(
        tiny_model, honest[:2], work, "sampling", expect=ExpectedSampling(temperature=0.7, max_tokens=24)
    )
    assert all(
        row["toploc_problems"] == ["sampling"] and "temperature 1.0, expected 0.7" in row["toploc_reason"]
        for row in rows
    )


def test_rows_without_proofs_are_null_with_a_reason(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    rows = [{k: v for k, v in row.items() if k != "toploc_proofs"} for row in honest[:2]]
    validated = validate(tiny_model, rows, work, "unproved")
    assert [row["toploc_valid"] for row in validated] == [None, None]
    assert all(row["toploc_reason"] == "the row has no toploc_proofs" for row in validated)


def test_a_missing_or_null_proof_makes_the_row_invalid_without_crashing(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    missing = copy.deepcopy(honest[0])
    missing["toploc_proofs"] = missing["toploc_proofs"][:-1]
    null = copy.deepcopy(honest[1])
    null["toploc_proofs"][0] = base64.b64encode(bytes(2 + 2 * TINY_PROOFS.topk)).decode()
    rows = validate(tiny_model, [missing, null], work, "malformed")
    assert [row["toploc_problems"] for row in rows] == [["proof_format"], ["proof_format"]]
    assert "proofs for" in rows[0]["toploc_reason"] and "modulus 0" in rows[1]["toploc_reason"]


# --- resuming and the command line ---------------------------------------------------------------


def test_validate_resumes_after_a_partial_output(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    source = write(work / "resume.jsonl", honest)
    output = work / "resume-out.jsonl"
    full = validate(tiny_model, honest, work, "resume-reference")
    output.write_bytes(
        b"".join(orjson.dumps(row) + b"\n" for row in full[:5]) + b'{"response_id": "cut off mid-li'
    )
    config = ValidateCommand(
        inputs=[str(source)],
        model=tiny_model,
        output=str(output),
        backend="transformers",
        progress=False,
        proofs=TINY_PROOF_POLICY,
        thresholds=TINY_THRESHOLDS,
    )
    summary = validate_files(config)
    assert summary.resumed == 5 and summary.valid == len(honest) - 5
    rows = read_rows(output)
    assert sorted(row["response_id"] for row in rows) == sorted(row["response_id"] for row in full)
    assert all(row["toploc_valid"] for row in rows)


def test_unreadable_rows_go_to_the_rejects_file_and_are_counted(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    source = work / "unreadable.jsonl"
    source.write_bytes(orjson.dumps(honest[0]) + b"\n{broken\n" + orjson.dumps(honest[1]) + b"\n")
    output = work / "unreadable-out.jsonl"
    config = ValidateCommand(
        inputs=[str(source)],
        model=tiny_model,
        output=str(output),
        progress=False,
        proofs=TINY_PROOF_POLICY,
        thresholds=TINY_THRESHOLDS,
    )
    summary = validate_files(config)
    assert summary.valid == 2 and summary.rejected == 1  # unreadable rows used to be counted only
    (reject,) = read_rows(work / "unreadable-out.jsonl.rejects.jsonl")
    assert reject["location"] == f"{source}:2" and reject["raw"] == "{broken"
    assert "invalid JSON" in reject["error"]


@pytest.mark.slow
def test_cli_validates_prints_a_summary_and_resumes(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    source = write(
        work / "cli.jsonl",
        [*honest[:3], edit_logprobs(honest[3]), {k: v for k, v in honest[4].items() if k != "toploc_proofs"}],
    )
    output = work / "cli-out.jsonl"
    command = [
        GENESYS,
        "validate",
        str(source),
        "--model",
        tiny_model,
        "-o",
        str(output),
        "--backend",
        "transformers",
        "--proof-topk",
        "16",
        "--proof-chunk",
        "8",
        "--max-exp-mismatches",
        "1",
        "--max-mant-err-mean",
        "1.0",
        "--max-mant-err-median",
        "1.5",
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "validated 5 rows" in first.stderr and "with a logprobs problem" in first.stderr
    verdicts = {
        row["response_id"]: row["toploc_valid"] for row in read_rows(output)
    }  # unproved rows are written first
    assert [verdicts[row["response_id"]] for row in honest[:5]] == [True, True, True, False, None]
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "already in the output" in again.stderr
    assert len(read_rows(output)) == 5


# --- the guards around the toploc package ----------------------------------------------------------


def test_float32_activations_are_refused_not_turned_into_null_proofs() -> None:
    hidden = torch.randn(10, 64)
    with pytest.raises(ValueError, match="must be bfloat16 or float16, got float32"):
        build_proofs(hidden, TINY_PROOFS)
    proofs = decode_proofs(build_proofs(as_proof_dtype(hidden), TINY_PROOFS), 10, TINY_PROOFS)
    with pytest.raises(ValueError, match="got float32"):
        verify_proofs(hidden, proofs, TINY_PROOFS)
    assert all(
        chunk.exp_mismatches == 0 and chunk.mant_err_mean == 0
        for chunk in verify_proofs(as_proof_dtype(hidden), proofs, TINY_PROOFS)
    )


def test_float16_activations_verify_and_other_shapes_are_refused() -> None:
    hidden = torch.randn(12, 64).half()
    proofs = decode_proofs(build_proofs(hidden, TINY_PROOFS), 12, TINY_PROOFS)
    assert [chunk.exp_mismatches for chunk in verify_proofs(hidden, proofs, TINY_PROOFS)] == [0, 0]
    with pytest.raises(ValueError, match=r"\(tokens, hidden size\)"):
        build_proofs(hidden.unsqueeze(0), TINY_PROOFS)


def test_missing_proofs_are_refused_before_verifying() -> None:
    hidden = as_proof_dtype(torch.randn(20, 64))
    proofs = decode_proofs(build_proofs(hidden, TINY_PROOFS), 20, TINY_PROOFS)
    with pytest.raises(ProofError, match="2 proofs for 20 rows"):
        verify_proofs(hidden, proofs[:2], TINY_PROOFS)
    encoded = [base64.b64encode(p).decode() for p in proofs]
    with pytest.raises(ProofError, match="2 proofs for 20 completion tokens"):
        decode_proofs(encoded[:2], 20, TINY_PROOFS)


def test_large_honest_chunks_verify_through_the_tensor_path() -> None:
    """Chunks of 32 x 4096 values: the package's list-of-tensors path rejects some honest ones (positions
    beyond the modulus); the 2-D tensor path used here must accept every one."""
    settings = ProofConfig(topk=128, decode_batching_size=32)
    hidden = as_proof_dtype(torch.randn(32 * 40, 4096, generator=torch.Generator().manual_seed(0)))
    proofs = decode_proofs(build_proofs(hidden, settings), hidden.shape[0], settings)
    chunks = verify_proofs(hidden, proofs, settings)
    assert len(chunks) == 40 and all(c.exp_mismatches == 0 and c.mant_err_mean == 0 for c in chunks)


NULL_PROOF_SCRIPT = """
import torch
from genesys.config import ProofConfig
from genesys.proofs.toploc import ProofError, verify_proofs
settings = ProofConfig(topk=16, decode_batching_size=8)
try:
    verify_proofs(torch.randn(8, 64).bfloat16(), [bytes(2 + 2 * 16)], settings)
except ProofError as exc:
    print("refused:", exc)
"""


@pytest.mark.slow
def test_a_null_modulus_proof_is_refused_without_killing_the_process() -> None:
    run = subprocess.run(
        [sys.executable, "-c", NULL_PROOF_SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, (run.returncode, run.stderr)
    assert "refused: proof 0 has modulus 0" in run.stdout


@pytest.mark.parametrize(
    ("tokens", "hidden_size", "settings"),
    [(21, 64, TINY_PROOFS), (70, 4096, ProofConfig(topk=128, decode_batching_size=32))],
)
def test_proofs_are_those_the_package_builds_one_chunk_at_a_time(
    tokens: int, hidden_size: int, settings: ProofConfig
) -> None:
    """Full chunks and a shorter last one; at hidden 4096 a chunk has more values than the largest modulus."""
    import toploc

    hidden = as_proof_dtype(torch.randn(tokens, hidden_size, generator=torch.Generator().manual_seed(1)))
    expected = toploc.build_proofs_base64(
        hidden, settings.decode_batching_size, settings.topk, skip_prefill=True
    )
    assert build_proofs(hidden, settings) == expected
    assert len(expected) == -(-tokens // settings.decode_batching_size)


# --- non-finite logprobs ----------------------------------------------------------------------------


@pytest.mark.parametrize("position", [0, 1, 3])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_claimed_logprob_anywhere_is_a_problem(position: int, bad: float) -> None:
    from genesys.proofs.checks import claimed_logprobs_problem, logprob_problem

    claimed = [-1.0, -2.0, -0.5, -1.5]
    claimed[position] = bad
    problem = claimed_logprobs_problem(claimed, 4)
    assert problem is not None and problem.category == "logprobs"
    assert f"completion_logprobs[{position}] is {bad}" in problem.message
    recomputed = [-1.0, -2.0, -0.5, -1.5]
    worst, problem = logprob_problem(claimed, recomputed, tolerance=0.05)
    assert problem is not None and not worst <= 0.05  # max() would skip a NaN after the first position
    assert claimed_logprobs_problem([-1.0, True], 2).message == "completion_logprobs[1] is True, not a number"
    assert claimed_logprobs_problem([-1.0], 2).message.startswith("completion_logprobs is missing")


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` as one parquet file (where NaN and infinities can be written, unlike in JSON)."""
    import pyarrow.parquet as pq

    from genesys.data.io import rows_to_table

    pq.write_table(rows_to_table(rows), path)
    return path


def test_rows_with_a_non_finite_logprob_are_invalid_with_the_reason(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    rows = []
    for index, bad in enumerate([math.nan, math.inf, -math.inf]):
        row = copy.deepcopy(next(r for r in honest[index:] if len(r["completion_ids"]) > 4))
        row["completion_logprobs"][3] = bad
        rows.append(row | {"response_id": f"non-finite-{index}"})
    output = work / "non-finite-validated.jsonl"
    validate_files(
        ValidateCommand(
            inputs=[str(write_parquet(work / "non-finite.parquet", rows))],
            model=tiny_model,
            output=str(output),
            progress=False,
            proofs=TINY_PROOF_POLICY,
            thresholds=TINY_THRESHOLDS,
        )
    )
    validated = {row["response_id"]: row for row in read_rows(output)}
    for index, bad in enumerate(["nan", "inf", "-inf"]):
        row = validated[f"non-finite-{index}"]
        assert row["toploc_valid"] is False and row["toploc_problems"] == ["logprobs"]
        assert f"completion_logprobs[3] is {bad}: logprobs must be finite" in row["toploc_reason"]
        assert row["toploc_errors"]["failed_chunks"] == 0  # the proofs themselves pass


# --- proof settings: the model's defaults, each row's own ------------------------------------------


def _expected(hidden_size: int = 64, **policy: Any) -> Any:
    from genesys.config import ExpectedSampling, ProofPolicy
    from genesys.proofs.checks import Expected

    return Expected("m", "hash", ProofPolicy(**policy), ExpectedSampling(), hidden_size)


@pytest.mark.parametrize(
    ("claimed", "policy", "hidden_size", "accepted_or_reason"),
    [
        ((64, 32), {}, 64, ProofConfig(64, 32)),  # generate's default on a hidden size of 64
        ((128, 32), {}, 4096, ProofConfig(128, 32)),  # generate's default elsewhere
        ((256, 8), {}, 4096, ProofConfig(256, 8)),  # more values, smaller chunks: stronger, accepted
        ((16, 8), {}, 64, "topk below the smallest accepted, 64 (--min-proof-topk)"),
        ((16, 8), {"min_topk": 16}, 64, ProofConfig(16, 8)),
        ((100, 8), {"min_topk": 16}, 64, "topk beyond the model's hidden size 64"),
        ((64, 64), {}, 64, "more tokens per proof than the most accepted, 32 (--max-proof-chunk)"),
        ((64, 64), {"max_decode_batching_size": 64}, 64, ProofConfig(64, 64)),
        ((16, 8), {"topk": 16, "decode_batching_size": 8}, 64, ProofConfig(16, 8)),  # pinned exactly
        ((32, 8), {"topk": 16}, 64, "topk must be 16 (--proof-topk)"),
        ((16, 4), {"min_topk": 16, "decode_batching_size": 8}, 64, "decode_batching_size must be 8"),
        ((True, 8), {}, 64, "expected two positive integers"),
        ((64, 0), {}, 64, "expected two positive integers"),
        (("64", 32), {}, 64, "expected two positive integers"),
    ],
)
def test_each_row_is_checked_with_its_own_proof_settings_if_the_policy_allows_them(
    claimed: tuple[Any, Any], policy: dict[str, Any], hidden_size: int, accepted_or_reason: Any
) -> None:
    from genesys.proofs.checks import Problem, proof_settings

    topk, chunk = claimed
    toploc_config = {"topk": topk, "decode_batching_size": chunk, "dtype": "bfloat16"}
    settings = proof_settings(toploc_config, _expected(hidden_size, **policy))
    if isinstance(accepted_or_reason, ProofConfig):
        assert settings == accepted_or_reason
    else:
        assert isinstance(settings, Problem) and settings.category == "proof_format"
        assert accepted_or_reason in settings.message
    float16 = proof_settings(toploc_config | {"dtype": "float16"}, _expected(hidden_size, **policy))
    assert isinstance(float16, Problem)


def test_the_default_topk_is_what_the_model_allows() -> None:
    from genesys.proofs.toploc import proof_settings_for

    assert ProofConfig().topk is None
    assert proof_settings_for(ProofConfig(), 64) == ProofConfig(64, 32)
    assert proof_settings_for(ProofConfig(), 4096) == ProofConfig(128, 32)
    assert proof_settings_for(ProofConfig(topk=16, decode_batching_size=8), 64) == TINY_PROOFS
    with pytest.raises(InputError, match="--proof-topk 65 exceeds the model's hidden size 64"):
        proof_settings_for(ProofConfig(topk=65), 64)
    with pytest.raises(ValueError, match="resolve them"):
        build_proofs(as_proof_dtype(torch.randn(4, 64)), ProofConfig())


@pytest.fixture(scope="module")
def default_rows(tiny_model: str, tasks: Path, work: Path) -> list[dict[str, Any]]:
    """Rows with proofs of the default settings (`generate --proofs` without --proof-topk)."""
    return generate(tiny_model, tasks, work / "defaults.jsonl", ProofConfig(), n=1)


def test_default_proofs_on_a_small_model_validate_with_all_defaults(
    default_rows: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    assert all(row["toploc_config"]["topk"] == 64 for row in default_rows)  # the tiny model's hidden size
    assert all(row["toploc_config"]["decode_batching_size"] == 32 for row in default_rows)
    output = work / "defaults-validated.jsonl"
    validate_files(
        ValidateCommand(
            inputs=[str(work / "defaults.jsonl")], model=tiny_model, output=str(output), progress=False
        )
    )
    assert [row["toploc_valid"] for row in read_rows(output)] == [True] * len(default_rows), [
        row["toploc_reason"] for row in read_rows(output)
    ]


def test_rows_of_several_proof_settings_validate_each_with_its_own(
    honest: list[dict[str, Any]], default_rows: list[dict[str, Any]], tiny_model: str, tasks: Path, work: Path
) -> None:
    other = generate(
        tiny_model, tasks, work / "other-settings.jsonl", ProofConfig(topk=32, decode_batching_size=4), n=1
    )
    rows = [*honest[:4], *default_rows[:4], *other]
    validated = validate(tiny_model, rows, work, "mixed-settings")
    assert [row["toploc_valid"] for row in validated] == [True] * len(rows), [
        row["toploc_reason"] for row in validated
    ]
    # A swapped token is still caught with the row's own settings.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    forged = [swap_token(row, tokenizer) for row in other if len(row["completion_ids"]) > 8]
    assert_all_rejected_by(validate(tiny_model, forged, work, "mixed-swapped"), "proof")


def test_rows_with_settings_the_validator_forbids_are_invalid_not_a_crash(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    beyond = copy.deepcopy(honest[0])
    beyond["toploc_config"] = beyond["toploc_config"] | {"topk": 100}
    rows = validate(tiny_model, [beyond], work, "forbidden")
    assert rows[0]["toploc_problems"] == ["proof_format"]
    assert "topk beyond the model's hidden size 64" in rows[0]["toploc_reason"]
    output = work / "forbidden-defaults.jsonl"
    validate_files(
        ValidateCommand(
            inputs=[str(write(work / "small-topk.jsonl", honest[:2]))],
            model=tiny_model,
            output=str(output),
            progress=False,
        )
    )
    assert all(
        row["toploc_valid"] is False and "topk below the smallest accepted, 64" in row["toploc_reason"]
        for row in read_rows(output)
    )


@pytest.mark.slow
def test_cli_generate_proofs_then_validate_with_all_defaults_on_the_tiny_model(
    tiny_model: str, tasks: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    generate_command = [
        GENESYS, "generate", "--tasks", str(tasks), "--model", tiny_model, "-o", str(rows),
        "--backend", "transformers", "-n", "2", "--max-tokens", "40", "--proofs", "--no-progress",
    ]  # fmt: skip
    generated = subprocess.run(generate_command, capture_output=True, text=True, timeout=300)
    assert generated.returncode == 0, generated.stderr
    assert {row["toploc_config"]["topk"] for row in read_rows(rows)} == {64}
    output = tmp_path / "validated.jsonl"
    validate_command = [
        GENESYS,
        "validate",
        str(rows),
        "--model",
        tiny_model,
        "-o",
        str(output),
        "--no-progress",
    ]
    validated = subprocess.run(validate_command, capture_output=True, text=True, timeout=300)
    assert validated.returncode == 0, validated.stderr
    assert [row["toploc_valid"] for row in read_rows(output)] == [True] * 12, [
        row["toploc_reason"] for row in read_rows(output)
    ]
    # Bound to the trusted task set, with the one setting generate was given (--max-tokens) repeated.
    bound = tmp_path / "bound.jsonl"
    validate_command[validate_command.index(str(output))] = str(bound)
    validated = subprocess.run(
        [*validate_command, "--tasks", str(tasks), "--max-tokens", "40"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert validated.returncode == 0, validated.stderr
    assert [(row["toploc_valid"], row["trusted_task"]) for row in read_rows(bound)] == [(True, True)] * 12, [
        row["toploc_reason"] for row in read_rows(bound)
    ]
