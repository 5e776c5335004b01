"""Rollouts with TOPLOC proofs, honest and tampered, to check that `genesys validate` accepts the
one and rejects the other (the proof tests, benchmarks/validate_cost.py, a validator's calibration
for another model).

Each tampering keeps the row self-consistent where a cheating worker could: it claims the expected
model's name and weights hash, and a swapped token's text is decoded again. Only the model can tell.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from genesys.config import GenerateConfig, ProofConfig, ProofPolicy, ProofThresholds, SamplingConfig

# Proofs small enough for the tiny model (hidden size 64), and a validator that accepts them (the
# default smallest topk on that model is its hidden size, 64: what `generate --proofs` gives it).
TINY_PROOFS = ProofConfig(topk=16, decode_batching_size=8)
TINY_PROOF_POLICY = ProofPolicy(min_topk=16)
# Thresholds calibrated on the tiny model with benchmarks/validate_cost.py (48 rows): honest rows
# (float32 or bfloat16 generation, float32 validation) reach at most 1 exponent mismatch, mantissa
# error mean 0.81 and median 1 in a chunk, while every tampered row has a chunk beyond these (one
# swapped token: worst chunks from exponent 1, mean 0.88, median 1 up; one weight matrix perturbed by
# 1e-2: mean 3.1 up). The paper's defaults (38, 10, 8) accept both kinds on this model.
TINY_THRESHOLDS = ProofThresholds(max_exp_mismatches=1, max_mant_err_mean=1.0, max_mant_err_median=1.5)

TASKS = [
    f"Compute {a} plus {b}, then explain the steps."
    for a, b in [(2, 3), (17, 25), (4, 40), (9, 11), (31, 8), (6, 6)]
]


def write_tasks(path: Path, count: int = len(TASKS)) -> Path:
    """A task file of `count` small math prompts."""
    import orjson

    rows = [
        {
            "problem_id": f"t{i}",
            "source": "toploc-tests",
            "task_type": "verifiable_math",
            "prompt": TASKS[i % len(TASKS)] + " " * (i // len(TASKS)),
            "verification_info": {"ground_truth": "0"},
        }
        for i in range(count)
    ]
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def generate(
    model: str,
    tasks: Path,
    output: Path,
    proofs: ProofConfig | None,
    *,
    n: int = 2,
    max_tokens: int = 24,
    dtype: str | None = None,
    backend: Any = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Rollouts of `tasks` by `model` (proofs on when given) with run seed `seed`; returns the rows.
    The transformers backend generates them, or `backend`, a running backend that is left open."""
    from genesys.generate.runner import run_generation

    options = {"batch_size": 8} | ({"dtype": dtype} if dtype else {})
    config = GenerateConfig(
        tasks=[str(tasks)],
        model=model,
        output=output,
        backend=backend.name if backend else "transformers",
        sampling=SamplingConfig(n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed),
        backend_options={} if backend else options,
        proofs=proofs,
        progress=False,
    )
    run_generation(config, backend=backend)
    return read_rows(output)


def read_rows(path: Path) -> list[dict[str, Any]]:
    import orjson

    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def validate_tiny(model: str, rows_path: Path, output: Path, **settings: Any) -> list[dict[str, Any]]:
    """The rows of `rows_path` validated against `model` on transformers with the tiny model's proof
    settings and thresholds (`settings`: other `ValidateCommand` fields, or those in their place), as
    `output` holds them."""
    from genesys.config import ValidateCommand
    from genesys.proofs.validate import validate_files

    validate_files(
        ValidateCommand(
            inputs=[str(rows_path)],
            model=model,
            output=str(output),
            backend="transformers",
            progress=False,
            **{"proofs": TINY_PROOF_POLICY, "thresholds": TINY_THRESHOLDS, **settings},
        )
    )
    return read_rows(output)


def perturbed_model(
    source: str,
    target: Path,
    scale: float = 1e-2,
    parameter: str = "model.layers.0.mlp.down_proj.weight",
    seed: int = 0,
) -> str:
    """A copy of `source` with Gaussian noise of std `scale` added to one weight matrix."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source, dtype="float32")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = dict(model.named_parameters())[parameter]
        weight.add_(torch.randn(weight.shape, generator=generator) * scale)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return str(target)


def claiming(rows: list[dict[str, Any]], honest: dict[str, Any]) -> list[dict[str, Any]]:
    """`rows` (made by another model) rewritten to claim the model, weights hash and settings of `honest`."""
    out = []
    for row in rows:
        row = copy.deepcopy(row)
        row.update(
            model_name=honest["model_name"],
            toploc_config=copy.deepcopy(honest["toploc_config"]),
            generation_config=copy.deepcopy(honest["generation_config"]),
        )
        out.append(row)
    return out


def swap_token(row: dict[str, Any], tokenizer: Any, position: int = 5) -> dict[str, Any]:
    """`row` with completion token `position` replaced by another ordinary token, its text decoded again."""
    row = copy.deepcopy(row)
    ids = row["completion_ids"]
    special = set(tokenizer.all_special_ids)
    ids[position] = next(
        t
        for t in range(ids[position] + 1, ids[position] + len(tokenizer))
        if t % len(tokenizer) not in special
    ) % len(tokenizer)
    row["llm_response"] = tokenizer.decode(ids, skip_special_tokens=True)
    return row


def copy_proofs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row that has a partner carrying the proofs of its partner: another row with as many, different, proofs."""
    forged = []
    for row in rows:
        partner = next(
            (
                o
                for o in rows
                if len(o["toploc_proofs"]) == len(row["toploc_proofs"])
                and o["toploc_proofs"] != row["toploc_proofs"]
            ),
            None,
        )
        if partner is not None:
            forged.append(copy.deepcopy(row) | {"toploc_proofs": list(partner["toploc_proofs"])})
    return forged


def edit_logprobs(row: dict[str, Any], delta: float = -1.0, position: int = 3) -> dict[str, Any]:
    """`row` claiming a lower behaviour logprob for one token (a larger importance ratio in training)."""
    row = copy.deepcopy(row)
    row["completion_logprobs"][position] += delta
    return row


def teacher_forced(row: dict[str, Any], text: str, model: str) -> dict[str, Any]:
    """`row` with its completion replaced by `text` (and an end of sequence) that `model` never
    sampled: proofs and logprobs from one prefill of the real model over prompt + `text`, as a worker
    choosing its completions (only correct ones, or a stronger model's) would make them. Everything
    but the sampling is consistent."""
    import torch

    from genesys.config import SamplingConfig
    from genesys.models import load_causal_lm, sampled_logprobs
    from genesys.proofs.hf_capture import FinalHiddenStates
    from genesys.proofs.toploc import as_proof_dtype, build_proofs

    row = copy.deepcopy(row)
    _, tokenizer, lm = load_causal_lm(model, "cpu", "float32")
    ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    prompt = list(row["prompt_ids"])
    with torch.inference_mode(), FinalHiddenStates(lm, last_only=False) as capture:
        logits = lm(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    first, count = len(prompt) - 1, len(ids)
    hidden = capture.prefill()[0, first : first + count]
    sampling = SamplingConfig(**{k: row["generation_config"][k] for k in ("temperature", "top_p")})
    settings = ProofConfig(row["toploc_config"]["topk"], row["toploc_config"]["decode_batching_size"])
    row.update(
        completion_ids=ids,
        llm_response=tokenizer.decode(ids, skip_special_tokens=True),
        completion_logprobs=sampled_logprobs(
            logits[first : first + count], ids, sampling.temperature, sampling.top_p
        ),
        toploc_proofs=build_proofs(as_proof_dtype(hidden), settings),
        finish_reason="stop",
    )
    return row
