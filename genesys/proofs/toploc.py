"""TOPLOC proofs over last-layer hidden states, through the `toploc` package, with guards it lacks.

What is proved: the hidden states that produced the completion tokens, one row per token (the last
prompt position, then every completion position but the last), so a completion of C tokens has C
rows; the prompt enters them through attention. Each chunk of `decode_batching_size` rows gets one
proof: a polynomial through the positions (reduced by a modulus) and the bfloat16 bits of the chunk's
`topk` largest values by magnitude. A validator recomputes the rows with one prefill and compares, per
chunk, exponents and mantissas at its own top-k positions.

Building takes each chunk's top-k positions and values itself, for all the full chunks of a
completion in one `topk` on the states' own device, and hands them to the package's
`ProofPoly.from_points_tensor`: the same proofs as the package's `build_proofs`, which takes the
top-k of one chunk at a time through Python and costs about four times as much per proof at topk 16
(the polynomial's interpolation dominates at topk 128). Verifying takes the package's 2-D tensor path
with `skip_prefill=True`; its other paths and inputs fail in ways that are guarded here:
- float32 activations make its builder log an error and return all-zero proofs, float16 ones make its
  verifier abort the process: only bfloat16 and float16 activations are accepted (a float32 model's
  states are rounded to bfloat16 by the caller, `as_proof_dtype`), and float16 ones are cast to
  bfloat16 before they reach the package;
- the list-of-tensors verifier evaluates at positions not reduced by the modulus, rejecting honest
  chunks of more than 65,497 values: only the 2-D tensor path is used;
- a proof with modulus 0 kills the process (SIGFPE), and a proof or chunk of the wrong size fails
  inside the package's worker threads (abort): every proof's length and modulus is checked before
  any is verified, whoever calls `verify_proofs`;
- proofs are paired with chunks by `zip`, so a missing proof would leave its chunk unchecked: the
  number of proofs must be exactly the number of chunks.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from genesys.config import DEFAULT_PROOF_TOPK, ProofConfig, ProofThresholds
from genesys.errors import InputError

if TYPE_CHECKING:
    import torch

PROOF_DTYPE = "bfloat16"
# What `build_proofs` and `verify_proofs` accept; the package itself is only ever given bfloat16.
ACCEPTED_DTYPES = ("bfloat16", "float16")
# The package searches moduli downwards from this one; any other nonzero modulus is well-formed too.
MAX_MODULUS = 65497


class ProofError(ValueError):
    """Proofs that cannot be checked: wrong count, undecodable, wrong length or a zero modulus."""


@dataclass(frozen=True)
class ChunkErrors:
    """How far one chunk's recomputed top-k values are from its proof."""

    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float

    def within(self, thresholds: ProofThresholds) -> bool:
        """Whether the chunk passes `thresholds`."""
        return (
            self.exp_mismatches <= thresholds.max_exp_mismatches
            and self.mant_err_mean <= thresholds.max_mant_err_mean
            and self.mant_err_median <= thresholds.max_mant_err_median
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def require_toploc() -> Any:
    """The toploc module, or an InputError saying how to build it."""
    try:
        import toploc
    except ImportError as exc:
        raise InputError(
            f"TOPLOC proofs need the toploc package ({exc}); build it against your torch: pip install setuptools ninja && "
            "pip install --no-build-isolation --no-binary toploc toploc==0.1.6"
        ) from None
    return toploc


def proof_count(tokens: int, settings: ProofConfig) -> int:
    """How many proofs a completion of `tokens` tokens has: one per started chunk."""
    return math.ceil(tokens / settings.decode_batching_size)


def check_hidden_size(hidden_size: int, settings: Any) -> None:
    """Refuse a topk (of `settings`, when set) larger than one hidden state: a chunk of one token
    would have too few values."""
    if settings.topk is not None and settings.topk > hidden_size:
        raise InputError(
            f"--proof-topk {settings.topk} exceeds the model's hidden size {hidden_size}; give at most {hidden_size}"
        )


def default_topk(hidden_size: int) -> int:
    """The topk proofs of a model of `hidden_size` get when none is given."""
    return min(DEFAULT_PROOF_TOPK, hidden_size)


def proof_settings_for(settings: ProofConfig, hidden_size: int) -> ProofConfig:
    """`settings` for a model of `hidden_size`: its topk (refused beyond the hidden size), or when
    unset `default_topk`."""
    check_hidden_size(hidden_size, settings)
    if settings.topk is not None:
        return settings
    return replace(settings, topk=default_topk(hidden_size))


def as_proof_dtype(hidden: torch.Tensor) -> torch.Tensor:
    """`hidden` rounded to the dtype proofs commit to (bfloat16), whatever the model's dtype."""
    import torch

    return hidden.to(torch.bfloat16)


def _as_rows(hidden: torch.Tensor, settings: ProofConfig, device: str | None = "cpu") -> torch.Tensor:
    """`hidden` (tokens, hidden size; bfloat16 or float16) as a contiguous bfloat16 tensor on `device`
    (None: where it is), as the package's 2-D tensor path needs; any other shape or dtype is refused."""
    import torch

    if hidden.dim() != 2:
        raise ValueError(
            f"hidden states must be a (tokens, hidden size) tensor, got shape {tuple(hidden.shape)}"
        )
    dtype = str(hidden.dtype).removeprefix("torch.")
    if dtype not in ACCEPTED_DTYPES:
        raise ValueError(
            f"hidden states must be bfloat16 or float16, got {dtype} (toploc returns null proofs for it); round them with as_proof_dtype"
        )
    if settings.topk is None:
        raise ValueError("proof settings without a topk: resolve them for the model with proof_settings_for")
    check_hidden_size(hidden.shape[1], settings)
    return hidden.detach().to(device=device or hidden.device, dtype=torch.bfloat16).contiguous()


def build_proofs(hidden: torch.Tensor, settings: ProofConfig) -> list[str]:
    """The base64 proofs of a completion's hidden states (tokens, hidden size; bfloat16 or float16),
    one per chunk of `decode_batching_size` rows (the last one may be shorter)."""
    rows = _as_rows(hidden, settings, device=None)
    chunk, full = settings.decode_batching_size, rows.shape[0] // settings.decode_batching_size
    groups = [rows[: full * chunk].view(full, chunk * rows.shape[1]), rows[full * chunk :].reshape(1, -1)]
    proof_poly = require_toploc().ProofPoly
    proofs = []
    for group in groups:
        if group.numel() == 0:
            continue
        positions = (
            group.abs().topk(settings.topk, dim=1).indices
        )  # by magnitude, in the chunk's flattened rows
        values = group.gather(1, positions)
        for chunk_positions, chunk_values in zip(positions.cpu(), values.cpu()):
            try:
                proofs.append(proof_poly.from_points_tensor(chunk_positions, chunk_values).to_base64())
            except RuntimeError as exc:  # no modulus below 65,498 keeps the chunk's top-k positions apart
                raise RuntimeError(f"toploc could not build a proof: {exc}") from None
    return proofs


def decode_proofs(proofs: Any, tokens: int, settings: ProofConfig) -> list[bytes]:
    """The proofs of a row as bytes, each checked to be well-formed for `tokens` completion tokens.

    Raises ProofError for a count other than one per chunk, a proof that is not base64 of
    `2 + 2 * topk` bytes, or a modulus of 0 or above the package's largest.
    """
    if not isinstance(proofs, (list, tuple)) or not all(isinstance(p, str) for p in proofs):
        raise ProofError("toploc_proofs must be a list of base64 strings")
    expected = proof_count(tokens, settings)
    if len(proofs) != expected:
        raise ProofError(
            f"{len(proofs)} proofs for {tokens} completion tokens; chunks of {settings.decode_batching_size} need {expected}"
        )
    decoded = []
    for index, proof in enumerate(proofs):
        try:
            raw = base64.b64decode(proof, validate=True)
        except (binascii.Error, ValueError):
            raise ProofError(f"proof {index} is not valid base64") from None
        _check_proof_bytes(index, raw, settings)
        decoded.append(raw)
    return decoded


def _check_proof_bytes(index: int, raw: bytes, settings: ProofConfig) -> None:
    """Refuse a proof the package would crash on: `2 + 2 * topk` bytes, a modulus in 1..MAX_MODULUS."""
    if len(raw) != 2 + 2 * settings.topk:
        raise ProofError(
            f"proof {index} has {len(raw)} bytes; topk {settings.topk} needs {2 + 2 * settings.topk}"
        )
    modulus = int.from_bytes(raw[:2], "big")
    if not 0 < modulus <= MAX_MODULUS:
        raise ProofError(f"proof {index} has modulus {modulus}, outside 1..{MAX_MODULUS}")


def verify_proofs(hidden: torch.Tensor, proofs: list[bytes], settings: ProofConfig) -> list[ChunkErrors]:
    """Each chunk's errors: recomputed hidden states (tokens, hidden size; bfloat16 or float16) against
    the proofs' bytes, all checked to be well-formed first (a ProofError otherwise)."""
    rows = _as_rows(hidden, settings)
    if len(proofs) != proof_count(rows.shape[0], settings):
        raise ProofError(f"{len(proofs)} proofs for {rows.shape[0]} rows of hidden states")
    for index, raw in enumerate(proofs):
        _check_proof_bytes(index, raw, settings)
    if not proofs:
        return []
    results = require_toploc().verify_proofs_bytes(
        rows, proofs, settings.decode_batching_size, settings.topk, skip_prefill=True
    )
    return [ChunkErrors(r.exp_mismatches, r.mant_err_mean, r.mant_err_median) for r in results]
