"""TOPLOC proofs from a vLLM engine: the final hidden states that produced each sampled token, taken
inside the engine's worker while it generates, with no second forward pass.

vLLM returns no hidden states. Its V1 model runner passes every step's final hidden states (what its
output layer reads: one row per scheduled token) to `_get_prompt_logprobs_dict`, together with the
tokens scheduled per request, while the requests' state still describes that step. `ProofCapture`,
mixed into the worker through vLLM's `worker_extension_cls`, wraps that method: for each request whose
sampling params carry `PROOF_KEY` in `extra_args`, it keeps the rows from the last prompt position
on (bfloat16, on the CPU) by position, so a request recomputed after a preemption overwrites its rows.
A finished completion of C tokens then has the C rows that produced them; the worker builds their
proofs (only base64 strings come back) and forgets them.

The cost is a gather and a copy to the CPU of one row per sampled token, and the proofs' building.
vLLM's V2 model runner (the GPU default in recent releases) has no such method: the engine of a run
with proofs is built with the V1 runner (`VLLM_USE_V2_MODEL_RUNNER=0`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROOF_KEY = "genesys_proof"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
EXTENSION = f"{__name__}.ProofCapture"


def proof_extra_args(key: str, n: int) -> dict[str, Any]:
    """The `extra_args` that mark a request for capture: its key, and how many samples it asks for
    (vLLM runs the samples of n > 1 as child requests named `{index}_{parent id}`)."""
    return {PROOF_KEY: {"key": key, "n": n}}


def sample_name(key: str, index: int) -> str:
    """How the worker names the rows of sample `index` of the request marked `key`."""
    return f"{key}:{index}"


@dataclass
class _Rows:
    """The captured rows of one sample: hidden states by position, from the last prompt position on."""

    first: int  # the last prompt position: its state produced the first completion token
    pieces: list[tuple[int, Any]] = field(default_factory=list)  # (start position, rows), in step order

    def assemble(self, count: int) -> Any:
        """The `count` rows that produced the completion's tokens, later pieces winning; None if one is missing."""
        import torch

        if not self.pieces:
            return None
        rows = torch.empty(count, self.pieces[0][1].shape[1], dtype=torch.bfloat16)
        filled = torch.zeros(count, dtype=torch.bool)
        for start, piece in self.pieces:
            lo, hi = max(start, self.first), min(start + piece.shape[0], self.first + count)
            if lo < hi:
                rows[lo - self.first : hi - self.first] = piece[lo - start : hi - start]
                filled[lo - self.first : hi - self.first] = True
        return rows if bool(filled.all()) else None


class ProofCapture:
    """Worker methods (a vLLM worker extension) that capture hidden states and build their proofs."""

    def genesys_install_proof_capture(self) -> None:
        """Wrap the model runner's per-step hook; refuse a runner that has none."""
        runner = self.model_runner
        if not all(hasattr(runner, name) for name in ("_get_prompt_logprobs_dict", "query_start_loc", "input_batch", "requests")):
            raise RuntimeError(
                f"TOPLOC proofs with vLLM need its V1 model runner, got {type(runner).__name__}; set {V2_RUNNER_ENV}=0 before the engine starts"
            )
        if getattr(runner, "genesys_captured", None) is not None:
            return
        runner.genesys_captured = {}
        original = runner._get_prompt_logprobs_dict

        def capture_then_continue(hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> Any:
            _capture_step(runner, hidden_states, num_scheduled_tokens)
            return original(hidden_states, num_scheduled_tokens)

        runner._get_prompt_logprobs_dict = capture_then_continue

    def genesys_take_proofs(self, lengths: dict[str, int], topk: int, decode_batching_size: int) -> dict[str, list[str] | None]:
        """The proofs of each finished sample named in `lengths` (its completion's token count); None
        for one whose rows were not all captured. Every captured row is forgotten."""
        from genesys.config import ProofConfig
        from genesys.proofs.toploc import build_proofs

        settings = ProofConfig(topk, decode_batching_size)
        captured: dict[str, _Rows] = self.model_runner.genesys_captured
        proofs: dict[str, list[str] | None] = {}
        for name, count in lengths.items():
            if count == 0:
                proofs[name] = []
                continue
            rows = captured[name].assemble(count) if name in captured else None
            proofs[name] = None if rows is None else build_proofs(rows, settings)
        captured.clear()
        return proofs


def _capture_step(runner: Any, hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> None:
    """Keep the rows of this step's marked requests (from their last prompt position on)."""
    import torch

    captured: dict[str, _Rows] = runner.genesys_captured
    wanted: list[tuple[_Rows, int, int, int]] = []  # (sample, start position, first row in the step, rows)
    for req_id, count in num_scheduled_tokens.items():
        state = runner.requests.get(req_id)
        mark = (state.sampling_params.extra_args or {}).get(PROOF_KEY) if state is not None and state.sampling_params else None
        if mark is None:
            continue
        index = int(req_id.split("_", 1)[0]) if mark["n"] > 1 else 0
        name = sample_name(mark["key"], index)
        sample = captured.get(name)
        if sample is None:
            sample = captured[name] = _Rows(first=len(state.prompt_token_ids) - 1)
        start = state.num_computed_tokens
        skip = max(0, sample.first - start)  # prompt positions before the last one are not needed
        if skip < count:
            offset = int(runner.query_start_loc.np[runner.input_batch.req_id_to_index[req_id]])
            wanted.append((sample, start + skip, offset + skip, count - skip))
    if not wanted:
        return
    index = torch.cat([torch.arange(offset, offset + count) for _, _, offset, count in wanted]).to(hidden_states.device)
    rows = hidden_states.index_select(0, index).to(torch.bfloat16).cpu()
    for (sample, start, _, count), piece in zip(wanted, rows.split([count for *_, count in wanted])):
        sample.pieces.append((start, piece))
