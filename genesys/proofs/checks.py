"""What a row with proofs must satisfy besides its TOPLOC hash, each a small function over the row.

A proof shows that hidden states came from some weights; it does not show that the row's text is
what the tokens say (nor its task what the prompt tokens say), that its logprobs are the model's, or that the sampling and stopping rules were
kept. Each check returns the problems it found as `Problem`s: a category (counted in the summary)
and a sentence (written to the row's `toploc_reason`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from genesys.config import ExpectedSampling, ProofConfig, ProofPolicy
from genesys.proofs.toploc import PROOF_DTYPE


@dataclass(frozen=True)
class Problem:
    """One reason a row is not valid."""

    category: str
    message: str


@dataclass(frozen=True)
class Expected:
    """What rows must claim: the model (name and weights hash) and its hidden size, the proof settings
    allowed, the sampling settings."""

    model_name: str
    weights_sha256: str
    proofs: ProofPolicy
    sampling: ExpectedSampling
    hidden_size: int


SAMPLING_KEYS = ("temperature", "top_p", "max_tokens")  # the settings a row's logprobs and stopping depend on


@dataclass(frozen=True)
class RowSampling:
    """The sampling settings a row names in its `generation_config`."""

    temperature: float
    top_p: float
    max_tokens: int


def row_sampling(generation_config: dict[str, Any]) -> RowSampling | Problem:
    """The row's sampling settings, or the problem that they are missing or malformed."""
    try:
        sampling = RowSampling(
            float(generation_config["temperature"]),
            float(generation_config["top_p"]),
            int(generation_config["max_tokens"]),
        )
    except (KeyError, TypeError, ValueError):
        return Problem("sampling", "generation_config lacks a numeric temperature, top_p or max_tokens")
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or sampling.max_tokens < 1:
        return Problem("sampling", f"generation_config has impossible sampling settings {sampling}")
    return sampling


def model_problems(row: dict[str, Any], toploc_config: dict[str, Any], expected: Expected) -> list[Problem]:
    """The row's model name and weights hash against the expected ones."""
    problems = []
    if row.get("model_name") != expected.model_name:
        problems.append(
            Problem("model", f"model_name {row.get('model_name')!r}, expected {expected.model_name!r}")
        )
    if toploc_config.get("weights_sha256") != expected.weights_sha256:
        problems.append(Problem("model", "the weights hash differs from the model's"))
    return problems


def proof_settings(toploc_config: dict[str, Any], expected: Expected) -> ProofConfig | Problem:
    """The proof settings the row recorded, when the policy allows them for the model: a topk from
    `min_topk` (or the hidden size, when smaller) up to the hidden size, at most
    `max_decode_batching_size` tokens per proof, bfloat16; exactly the policy's topk and chunk size
    where it sets them. Otherwise the problem."""
    topk, chunk, dtype = (toploc_config.get(key) for key in ("topk", "decode_batching_size", "dtype"))
    policy, hidden = expected.proofs, expected.hidden_size
    claimed = f"proof settings topk {topk!r}, decode_batching_size {chunk!r}, dtype {dtype!r}"
    if not _positive_int(topk) or not _positive_int(chunk) or dtype != PROOF_DTYPE:
        return Problem("proof_format", f"{claimed}: expected two positive integers and {PROOF_DTYPE!r}")
    if policy.topk is not None and topk != policy.topk:
        return Problem("proof_format", f"{claimed}: topk must be {policy.topk} (--proof-topk)")
    if policy.topk is None and topk < min(policy.min_topk, hidden):
        return Problem(
            "proof_format",
            f"{claimed}: topk below the smallest accepted, {min(policy.min_topk, hidden)} (--min-proof-topk)",
        )
    if topk > hidden:
        return Problem("proof_format", f"{claimed}: topk beyond the model's hidden size {hidden}")
    if policy.decode_batching_size is not None and chunk != policy.decode_batching_size:
        return Problem(
            "proof_format",
            f"{claimed}: decode_batching_size must be {policy.decode_batching_size} (--proof-chunk)",
        )
    if policy.decode_batching_size is None and chunk > policy.max_decode_batching_size:
        return Problem(
            "proof_format",
            f"{claimed}: more tokens per proof than the most accepted, {policy.max_decode_batching_size} (--max-proof-chunk)",
        )
    return ProofConfig(topk, chunk)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def sampling_problems(sampling: RowSampling, expected: ExpectedSampling) -> list[Problem]:
    """Each sampling setting the row names that differs from an expected one."""
    problems = []
    for name in SAMPLING_KEYS:
        wanted = getattr(expected, name)
        if wanted is not None and getattr(sampling, name) != wanted:
            problems.append(Problem("sampling", f"{name} {getattr(sampling, name)}, expected {wanted}"))
    return problems


def stop_problems(
    ids: Sequence[int], finish_reason: Any, max_tokens: int, stop_ids: Collection[int]
) -> list[Problem]:
    """Whether the completion ends where the rules say: within max_tokens, at its first stop token."""
    problems = []
    if len(ids) > max_tokens:
        problems.append(Problem("stop", f"{len(ids)} completion tokens, more than max_tokens {max_tokens}"))
    early = next((i for i, token in enumerate(ids[:-1]) if token in stop_ids), None)
    if early is not None:
        problems.append(Problem("stop", f"the completion goes on after a stop token at position {early}"))
    ends_on_stop = bool(ids) and ids[-1] in stop_ids
    if finish_reason == "stop" and not ends_on_stop:
        problems.append(
            Problem("stop", "finish_reason 'stop' but the completion does not end with a stop token")
        )
    elif finish_reason == "length" and (ends_on_stop or len(ids) != max_tokens):
        problems.append(
            Problem(
                "stop",
                f"finish_reason 'length' but the completion has {len(ids)} tokens (max_tokens {max_tokens})"
                + (" and ends with a stop token" if ends_on_stop else ""),
            )
        )
    elif finish_reason not in ("stop", "length"):
        problems.append(Problem("stop", f"finish_reason {finish_reason!r} is neither 'stop' nor 'length'"))
    return problems


def prompt_problem(tokenizer: Any, prompt_ids: Sequence[int], prompt: Any) -> Problem | None:
    """Whether the row's task prompt is in what `prompt_ids` decode to (the model answered that task)."""
    if isinstance(prompt, str) and prompt not in tokenizer.decode(list(prompt_ids)):
        return Problem("text", "prompt_ids do not contain the row's prompt")
    return None


def decode_problem(tokenizer: Any, ids: Sequence[int], text: Any) -> Problem | None:
    """Whether the completion ids decode (special tokens skipped) to the row's `llm_response`."""
    if tokenizer.decode(list(ids), skip_special_tokens=True) != text:
        return Problem("text", "completion_ids do not decode to llm_response")
    return None


def claimed_logprobs_problem(claimed: Any, tokens: int) -> Problem | None:
    """Whether the row's `completion_logprobs` are one finite number per completion token."""
    if not isinstance(claimed, (list, tuple)) or len(claimed) != tokens:
        return Problem("logprobs", "completion_logprobs is missing or not one per completion token")
    for position, value in enumerate(claimed):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return Problem("logprobs", f"completion_logprobs[{position}] is {value!r}, not a number")
        if not math.isfinite(value):
            return Problem("logprobs", f"completion_logprobs[{position}] is {value}: logprobs must be finite")
    return None


def logprob_problem(
    claimed: Sequence[float], recomputed: Sequence[float], tolerance: float
) -> tuple[float, Problem | None]:
    """The largest |claimed - recomputed| logprob, and the problem when it is beyond `tolerance`; a
    difference that is not a number (either side NaN, or both the same infinity) is the largest."""
    worst = 0.0
    for c, r in zip(claimed, recomputed):
        difference = abs(float(c) - r)
        if math.isnan(difference):
            worst = math.nan
            break
        worst = max(worst, difference)
    if not worst <= tolerance:  # NaN compares false
        return worst, Problem(
            "logprobs",
            f"a completion logprob differs from the model's by {worst:.4g} (tolerance {tolerance:g})",
        )
    return worst, None
