"""Sampling proofs: a sampler whose randomness anyone holding the seed can recompute, and its check.

The sampler is the Gumbel-max trick with keyed noise: at completion position t of sample s of a
request seeded `seed`, the token is

    argmax_j  scores_t[j] + g(seed, s, t, j)

where `scores_t` are the model's logits after temperature and top-p (`genesys.models.sampling_warpers`:
tokens outside the nucleus are -inf) and g is standard Gumbel noise, `-log(-log(u))`, with `u` made
from a 32-bit integer hash: the key of the step, hashed from (seed, s, t), combined with the hash of
token j. That draws token j with probability softmax(scores_t)[j], exactly as plain sampling does.
The hashing is integer arithmetic (exact on every device) and the logarithms are float32, so the
transformers backend, vLLM's engine and a validator on another machine make the same noise (to the
last bit or so). Greedy decoding (temperature 0) adds none. Only tokens whose score is close enough
to the best to be picked get noise: on a trained model's peaked distributions, a small part of the
vocabulary.

Generation writes `sampling_proof = {"sampler": SAMPLER, "seed": <request seed>, "sample": <index>}`
into every row it draws this way (`genesys.generate.rows`); `genesys validate` writes
`sampling_proven`.

A validator recomputes the logits with one prefill and measures, at each position, the **margin**: how
far the row's token's perturbed score lies below the largest (0 when the token is the sampler's pick;
infinite when it is outside the nucleus). Honest rows have margins at the level of the numerical
difference between the two machines' logits; a completion the model did not sample from that seed
(a teacher-forced one, a stronger model's, a chosen one) has margins of the order of the noise itself
at nearly every token. A row is sampling-valid when its largest margin is within the tolerance
(`--max-sampling-margin`).

The seed is the request's: `genesys.data.identity.request_seed(run seed, task key)`, and the sample
index is the one in the row's `response_id`. A validator told the run seed (`--seed`) and the samples
per task (`-n`) derives both itself, so a worker cannot try seeds or sample indices until one gives an
answer it likes; without them, it checks the row against the seed the row names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from genesys.config import ExpectedSampling
from genesys.data.identity import request_seed
from genesys.proofs.checks import Problem
from genesys.schema import SchemaError, parse_json_field

if TYPE_CHECKING:
    import torch

SAMPLER = "gumbel-v1"  # the name rows carry in `sampling_proof`; a new noise function gets a new name
_MASK32 = 0xFFFFFFFF
NO_SAMPLING_PROOF = (
    "the row has no sampling_proof: its tokens may be any the worker chose (generate --proofs writes one; "
    "validate --allow-unsampled accepts rows without)"
)


@dataclass(frozen=True)
class SamplingKey:
    """What a row's noise is made from: its request's seed and its sample index."""

    seed: int
    sample: int


# --- the noise ---------------------------------------------------------------------------------------


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """The "lowbias32" integer hash of 32-bit values held in an int32 tensor, in place: multiplication
    wraps around (two's complement, as on every device torch runs on) and the shifts are made
    logical by masking, so the bits are those of the unsigned 32-bit hash."""
    x ^= (x >> 16) & 0xFFFF
    x *= 0x7FEB352D
    x ^= (x >> 15) & 0x1FFFF
    x *= 0x846CA68B - (1 << 32)  # the constant as a signed 32-bit value
    x ^= (x >> 16) & 0xFFFF
    return x


def _int32(values: Sequence[int]) -> list[int]:
    """32-bit values as the signed numbers an int32 tensor holds."""
    return [(v & _MASK32) - ((v & 0x80000000) << 1) for v in values]


def step_keys(
    seeds: Sequence[int], samples: Sequence[int], positions: Sequence[int], device: Any
) -> torch.Tensor:
    """One 32-bit key per (seed, sample, position) triple, as an int32 tensor on `device`."""
    import torch

    def column(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(_int32(values), dtype=torch.int32, device=device)

    return _mix32(_mix32(_mix32(column(seeds)) ^ column(samples)) ^ column(positions))


@lru_cache(maxsize=8)
def token_hashes(vocab_size: int, device: str) -> torch.Tensor:
    """The hash of every token id of a vocabulary, (vocab_size,) int32: what the noise keys."""
    import torch

    return _mix32(torch.arange(vocab_size, dtype=torch.int32, device=device))


def noise(keys: torch.Tensor, hashes: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise, float32, for each (key, token hash) pair (broadcast)."""
    return gumbel(_mix32(keys ^ hashes))


def gumbel(hashed: torch.Tensor) -> torch.Tensor:
    """-log(-log(u)) for u made from the top 23 bits of 32-bit hashes: (k + 1/2) / 2**23, exact in
    float32 and strictly between 0 and 1 (with 24 bits, k + 1/2 would round up to 2**24 and u to 1)."""
    uniform = ((hashed >> 9) & 0x7FFFFF).float().add_(0.5).mul_(2.0**-23)
    return uniform.log_().neg_().log_().neg_()


def gumbel_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The noise of every token, (len(keys), vocab_size): what the sampler adds to the scores."""
    return noise(keys.unsqueeze(1), token_hashes(vocab_size, str(keys.device)).unsqueeze(0))


# The noise lies within [NOISE_LOW, NOISE_HIGH] (23-bit uniforms), so a token whose score is further
# than their difference below its row's best cannot be picked: only the rest get noise (a small part
# of a trained model's vocabulary; the result is the same as adding noise to every token).
NOISE_HIGH = -math.log(-math.log(1 - 2.0**-24))
NOISE_LOW = -math.log(-math.log(2.0**-24))
_REACH = NOISE_HIGH - NOISE_LOW + 1.0  # and some room for rounding


# --- sampling and measuring ------------------------------------------------------------------------


def perturbed(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`scores` (after temperature and top-p, one row per key) plus the keys' noise, where a token
    could be picked; -inf elsewhere."""
    import torch

    scores = scores.float()
    reachable = scores >= scores.max(dim=-1, keepdim=True).values - _REACH
    if int(reachable.sum()) * 4 > reachable.numel():  # most tokens reachable: all get noise (faster)
        return scores + gumbel_noise(keys, scores.shape[-1])
    rows, tokens = reachable.nonzero(as_tuple=True)
    hashes = token_hashes(scores.shape[-1], str(scores.device))
    out = torch.full_like(scores, float("-inf"))
    out[rows, tokens] = scores[rows, tokens] + noise(keys[rows], hashes[tokens])
    return out


def choose(scores: torch.Tensor, keys: torch.Tensor, temperature: float) -> torch.Tensor:
    """The sampler's tokens, (rows, 1): the largest perturbed score of each row (greedy: of the scores)."""
    if temperature <= 0:
        return scores.argmax(dim=-1, keepdim=True)
    return perturbed(scores, keys).argmax(dim=-1, keepdim=True)


def margins(
    logits: torch.Tensor, ids: Sequence[int], key: SamplingKey, temperature: float, top_p: float
) -> list[float]:
    """For a completion (`logits`: the model's, one row per token of `ids`), how far each token's
    perturbed score (after temperature and top-p) is below the row's largest: 0 for the sampler's
    pick, infinite for a token outside the nucleus."""
    import torch

    from genesys.config import SamplingConfig
    from genesys.models import sampling_warpers

    scores = logits.float()
    for warper in sampling_warpers(SamplingConfig(temperature=temperature, top_p=top_p)):
        scores = warper(None, scores)
    tokens = torch.tensor(list(ids), device=scores.device)
    chosen = scores.gather(1, tokens.unsqueeze(1)).squeeze(1)
    if temperature <= 0:
        return (scores.max(dim=-1).values - chosen).tolist()
    keys = step_keys([key.seed] * len(ids), [key.sample] * len(ids), range(len(ids)), scores.device)
    best = perturbed(scores, keys).max(dim=-1).values
    own = noise(keys, token_hashes(scores.shape[-1], str(scores.device))[tokens])
    return (best - (chosen + own)).tolist()  # a -inf token: inf


# --- how the validator judges a row --------------------------------------------------------------


def sampling_key(
    row: dict[str, Any], expect: ExpectedSampling, required: bool
) -> SamplingKey | Problem | None:
    """The key of the row's `sampling_proof`, the problem with it, or None when the row has none
    (a problem when one is `required`).

    With the trusted run seed (`expect.seed`), the seed must be the one derived from it and the task
    key in the row's `response_id`, and the sample index the one `response_id` names; with
    `expect.n`, the index must be below it. Otherwise the worker could have tried seeds or sample
    indices until one gave an answer it liked."""
    if row.get("sampling_proof") in (None, ""):
        return Problem("unsampled", NO_SAMPLING_PROOF) if required else None
    try:
        proof = parse_json_field(row["sampling_proof"], "sampling_proof")  # a JSON string from parquet
    except SchemaError as exc:
        return Problem("sampling_proof", str(exc))
    if proof.get("sampler") != SAMPLER or not all(
        _nonnegative_int(proof.get(name)) for name in ("seed", "sample")
    ):
        return Problem(
            "sampling_proof", f"sampling_proof {proof!r} is not a {SAMPLER} proof with a seed and a sample"
        )
    key = SamplingKey(proof["seed"], proof["sample"])
    if expect.seed is not None:
        task, _, index = str(row.get("response_id") or "").rpartition("-")
        if not task or str(key.sample) != index:
            return Problem(
                "sampling_proof",
                f"sampling_proof names sample {key.sample}, response_id {row.get('response_id')!r} another",
            )
        expected = request_seed(expect.seed, task)
        if key.seed != expected:
            return Problem(
                "sampling_proof",
                f"sampled with seed {key.seed}, not {expected}, this task's seed in run seed {expect.seed} (--seed)",
            )
    if expect.n is not None and key.sample >= expect.n:
        return Problem(
            "sampling_proof", f"sample index {key.sample} is beyond the {expect.n} samples per task (-n)"
        )
    return key


def _nonnegative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def margin_problem(row_margins: Sequence[float], tolerance: float) -> tuple[dict[str, Any], Problem | None]:
    """The row's measured margins (`max_sampling_margin`, the largest finite one, and
    `sampling_outside_nucleus`, how many tokens the sampler could not have picked at all), and the
    problem when a token is outside the nucleus or beyond `tolerance`."""
    outside = [i for i, margin in enumerate(row_margins) if not math.isfinite(margin)]  # inf, or NaN logits
    worst = max((margin for margin in row_margins if math.isfinite(margin)), default=0.0)
    measured: dict[str, Any] = {"max_sampling_margin": worst}
    if outside:
        measured["sampling_outside_nucleus"] = len(outside)
        return measured, Problem(
            "sampling_proof",
            f"completion token {outside[0]} cannot be the seeded sampler's pick: it is outside the nucleus of the row's top-p"
            + (f" ({len(outside)} such tokens)" if len(outside) > 1 else ""),
        )
    if worst > tolerance:
        position = max(range(len(row_margins)), key=lambda i: row_margins[i])
        return measured, Problem(
            "sampling_proof",
            f"completion token {position} is not the seeded sampler's pick (margin {worst:.4g}, tolerance {tolerance:g})",
        )
    return measured, None


def sampling_proven(row: dict[str, Any], problems: Sequence[Problem], errors: dict[str, Any]) -> bool | None:
    """The row's `sampling_proven` after validation: null without a sampling proof (or when its
    tokens were not recomputed), false when the proof failed, true when every token checked out."""
    if row.get("sampling_proof") in (None, ""):
        return None
    if any(problem.category == "sampling_proof" for problem in problems):
        return False
    return True if "max_sampling_margin" in errors else None
