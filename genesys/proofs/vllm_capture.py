"""TOPLOC proofs from a vLLM engine: the final hidden states that produced each sampled token, taken
inside the engine's worker while it generates, with no second forward pass.

vLLM returns no hidden states. Its V1 model runner passes every step's final hidden states (what its
output layer reads: one row per scheduled token) to `_get_prompt_logprobs_dict`, together with the
tokens scheduled per request, while the requests' state still describes that step. `ProofCapture`,
mixed into the worker through vLLM's `worker_extension_cls`, wraps that method: for each request whose
sampling params carry `PROOF_KEY` in `extra_args`, it keeps the rows from the position the mark
names on (on the CPU, in the model's dtype) by position, so a request recomputed after a preemption
overwrites its rows. A finished completion of C tokens then has the C rows that produced them (from
its last prompt position on); the worker builds their proofs (only base64 strings come back) and
forgets them.

The same capture recomputes rows for `genesys validate`: a prefill of prompt + completion (all but
its last token; the prefix cache not read, so every position is computed) gives the C rows at once.
The worker checks them against the row's proofs and computes the completion's logprobs under the
row's temperature and top-p with the model's own output layer, so only a few numbers per row come back.

The cost is a gather and a copy to the CPU of one row per sampled token (issued without waiting for
the device), and the proofs' building when the engine call ends, on the worker's thread.
vLLM's V2 model runner (the GPU default in recent releases) has no such method: the engine of a run
with proofs is built with the V1 runner (`VLLM_USE_V2_MODEL_RUNNER=0`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROOF_KEY = "genesys_proof"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
EXTENSION = f"{__name__}.ProofCapture"
# The seeded sampler's logits processor (genesys.proofs.vllm_sampling, which imports vLLM) and its mark.
SAMPLING_PROCESSOR = "genesys.proofs.vllm_sampling:SeededSampling"
SAMPLING_KEY = "genesys_sampling"
# What the worker's seeded sampler recorded: by sample name, position -> (token, logprob).
SAMPLED: dict[str, dict[int, tuple[int, float]]] = {}


def proof_extra_args(key: str, n: int, first: int) -> dict[str, Any]:
    """The `extra_args` that mark a request for capture: its key, how many samples it asks for (vLLM
    runs the samples of n > 1 as child requests named `{index}_{parent id}`) and the first position
    to keep (the last prompt position: its state produced the first completion token)."""
    return {PROOF_KEY: {"key": key, "n": n, "first": first}}


def sampling_extra_args(key: str, seed: int, samples: list[int]) -> dict[str, Any]:
    """The `extra_args` that mark a request (`SamplingParams(seed=seed)`) for the seeded sampler: its
    key (as the capture names samples) and its samples' indices."""
    return {SAMPLING_KEY: {"key": key, "seed": seed, "samples": samples}}


def sample_name(key: str, index: int) -> str:
    """How the worker names the rows of sample `index` of the request marked `key`."""
    return f"{key}:{index}"


@dataclass
class Recomputation:
    """A row for the engine to recompute: its ids, its proofs' bytes (None: none to check), the
    sampling settings its logprobs were recorded under and the proof settings it recorded (None: the
    engine's). The completion has at least one token."""

    prompt_ids: list[int]
    completion_ids: list[int]
    proofs: list[bytes] | None
    temperature: float
    top_p: float
    settings: Any = None  # a ProofConfig
    sampling_key: Any = None  # a genesys.proofs.sampling.SamplingKey: the sampling proof to measure

    def request(self) -> dict[str, Any]:
        """What the worker's `Capture.check` takes of it."""
        key = self.sampling_key
        request = {
            "ids": self.completion_ids,
            "proofs": self.proofs,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "sampling": None if key is None else [key.seed, key.sample],
        }
        if self.settings is not None:
            request["topk"] = self.settings.topk
            request["decode_batching_size"] = self.settings.decode_batching_size
        return request


@dataclass
class _Rows:
    """The captured rows of one sample: hidden states by position, from the last prompt position on."""

    first: int  # the first position kept: the last prompt position
    pieces: list[tuple[int, Any]] = field(default_factory=list)  # (start position, rows), in step order

    def assemble(self, count: int) -> Any:
        """The `count` rows that produced the completion's tokens, later pieces winning; None if one is missing."""
        import torch

        if not self.pieces:
            return None
        ends = [start + piece.shape[0] for start, piece in self.pieces]
        if (
            all(start == end for (start, _), end in zip(self.pieces[1:], ends))
            and self.pieces[0][0] == self.first
        ):
            rows = torch.cat([piece for _, piece in self.pieces])  # one run of positions (no preemption)
            return rows[:count] if rows.shape[0] >= count else None
        rows = torch.empty(count, self.pieces[0][1].shape[1], dtype=self.pieces[0][1].dtype)
        filled = torch.zeros(count, dtype=torch.bool)
        for start, piece in self.pieces:
            lo, hi = max(start, self.first), min(start + piece.shape[0], self.first + count)
            if lo < hi:
                rows[lo - self.first : hi - self.first] = piece[lo - start : hi - start]
                filled[lo - self.first : hi - self.first] = True
        return rows if bool(filled.all()) else None


class Capture:
    """What one worker captured: the rows of each marked sample, found once per request id."""

    def __init__(self) -> None:
        self.samples: dict[str, _Rows] = {}  # by sample name
        self._by_request: dict[str, _Rows | None] = {}  # None: a request not marked for proofs

    def _sample_of(self, req_id: str, state: Any) -> _Rows | None:
        """The rows of request `req_id` (`state`: its state in the runner), or None when it is not marked."""
        if req_id not in self._by_request:
            mark = (state.sampling_params.extra_args or {}).get(PROOF_KEY) if state.sampling_params else None
            sample = None
            if mark is not None:
                index = int(req_id.split("_", 1)[0]) if mark["n"] > 1 else 0
                sample = self.samples.setdefault(sample_name(mark["key"], index), _Rows(first=mark["first"]))
            self._by_request[req_id] = sample
        return self._by_request[req_id]

    def step(self, runner: Any, hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> None:
        """Keep the rows of this step's marked requests, from their last prompt position on: one
        gather and one copy to the CPU for the whole step, neither waiting for the device."""
        import numpy as np
        import torch

        samples, starts, firsts, counts = [], [], [], []
        step_starts = runner.query_start_loc.np
        for req_id, count in num_scheduled_tokens.items():
            state = runner.requests[req_id]
            sample = self._sample_of(req_id, state)
            if sample is None:
                continue
            skip = max(
                0, sample.first - state.num_computed_tokens
            )  # positions before the first kept are not needed
            if skip < count:
                samples.append(sample)
                starts.append(state.num_computed_tokens + skip)
                firsts.append(int(step_starts[runner.input_batch.req_id_to_index[req_id]]) + skip)
                counts.append(count - skip)
        if not samples:
            return
        # Row indices of every kept token in the step's hidden states: each sample's run of `count` rows from `first`.
        lengths = np.asarray(counts)
        index = np.repeat(np.asarray(firsts) - (np.cumsum(lengths) - lengths), lengths) + np.arange(
            lengths.sum()
        )
        # Without waiting for the device: the copy is read once the engine call has ended.
        rows = hidden_states.index_select(0, torch.from_numpy(index).to(hidden_states.device)).to(
            "cpu", non_blocking=True
        )
        for sample, start, piece in zip(samples, starts, rows.split(counts)):
            sample.pieces.append((start, piece))

    def take(self, lengths: dict[str, int], settings: Any) -> dict[str, list[str] | None]:
        """The proofs of each finished sample named in `lengths` (its completion's token count); None
        for one whose rows were not all captured. Everything captured is forgotten."""
        from genesys.proofs.toploc import as_proof_dtype, build_proofs

        proofs: dict[str, list[str] | None] = {}
        for name, rows in self._take_rows(lengths).items():
            proofs[name] = (
                []
                if lengths[name] == 0
                else None
                if rows is None
                else build_proofs(as_proof_dtype(rows), settings)
            )
        return proofs

    def check(
        self, requests: dict[str, dict[str, Any]], settings: Any, model: Any
    ) -> dict[str, dict[str, Any] | None]:
        """For each recomputed row named in `requests` ({"ids": its completion ids, "proofs": their
        bytes or None, "temperature", "top_p", "sampling": its sampling proof's [seed, sample] or
        None, and optionally its own "topk" and "decode_batching_size" in place of `settings`}): each
        chunk's errors against the proofs (None without proofs), the completion tokens' logprobs and
        sampling margins (None without a sampling proof); None for a row whose rows were not all
        captured."""
        from genesys.config import ProofConfig
        from genesys.models import sampled_logprobs
        from genesys.proofs.sampling import SamplingKey, margins
        from genesys.proofs.toploc import as_proof_dtype, verify_proofs

        lengths = {name: len(request["ids"]) for name, request in requests.items()}
        device = next(model.parameters()).device
        checks: dict[str, dict[str, Any] | None] = {}
        for name, rows in self._take_rows(lengths).items():
            if rows is None:
                checks[name] = None
                continue
            request = requests[name]
            own = (
                ProofConfig(request["topk"], request["decode_batching_size"])
                if "topk" in request
                else settings
            )
            chunks = (
                None
                if request["proofs"] is None
                else verify_proofs(as_proof_dtype(rows), request["proofs"], own)
            )
            logits = model.compute_logits(rows.to(device)).float()
            checks[name] = {
                "chunks": None
                if chunks is None
                else [[c.exp_mismatches, c.mant_err_mean, c.mant_err_median] for c in chunks],
                "logprobs": sampled_logprobs(
                    logits, request["ids"], request["temperature"], request["top_p"]
                ),
                "margins": None
                if request.get("sampling") is None
                else margins(
                    logits,
                    request["ids"],
                    SamplingKey(*request["sampling"]),
                    request["temperature"],
                    request["top_p"],
                ),
            }
        return checks

    def _take_rows(self, lengths: dict[str, int]) -> dict[str, Any]:
        """The assembled rows of each sample in `lengths` (None where some are missing or none are
        wanted), once the device's last copies have landed; everything captured is forgotten."""
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        rows = {
            name: self.samples[name].assemble(count) if count and name in self.samples else None
            for name, count in lengths.items()
        }
        self.samples.clear()
        self._by_request.clear()
        return rows


def take_sampled(lengths: dict[str, int]) -> dict[str, tuple[list[int], list[float]] | None]:
    """The tokens and logprobs the seeded sampler recorded (`SAMPLED`) for each sample named in
    `lengths` (its completion's token count); None for one with a position missing. Everything
    recorded is forgotten."""
    taken: dict[str, tuple[list[int], list[float]] | None] = {}
    for name, count in lengths.items():
        steps = SAMPLED.get(name, {})
        if not all(position in steps for position in range(count)):
            taken[name] = None
            continue
        picked = [steps[position] for position in range(count)]
        taken[name] = ([token for token, _ in picked], [logprob for _, logprob in picked])
    SAMPLED.clear()
    return taken


class ProofCapture:
    """Worker methods (a vLLM worker extension) that capture hidden states and build their proofs."""

    def genesys_install_proof_capture(self) -> None:
        """Wrap the model runner's per-step hook; refuse a runner that has none."""
        runner = self.model_runner
        if not all(
            hasattr(runner, name)
            for name in ("_get_prompt_logprobs_dict", "query_start_loc", "input_batch", "requests")
        ):
            raise RuntimeError(
                f"TOPLOC proofs with vLLM need its V1 model runner, got {type(runner).__name__}; set {V2_RUNNER_ENV}=0 before the engine starts"
            )
        if getattr(runner, "genesys_capture", None) is not None:
            return
        capture = runner.genesys_capture = Capture()
        original = runner._get_prompt_logprobs_dict

        def capture_then_continue(hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> Any:
            capture.step(runner, hidden_states, num_scheduled_tokens)
            return original(hidden_states, num_scheduled_tokens)

        runner._get_prompt_logprobs_dict = capture_then_continue

    def genesys_take_proofs(
        self, lengths: dict[str, int], topk: int, decode_batching_size: int
    ) -> dict[str, list[str] | None]:
        """The proofs of the finished samples named in `lengths` (`Capture.take`)."""
        from genesys.config import ProofConfig

        return self.model_runner.genesys_capture.take(lengths, ProofConfig(topk, decode_batching_size))

    def genesys_take_sampled(self, lengths: dict[str, int]) -> dict[str, Any]:
        """The tokens and logprobs the seeded sampler recorded for the samples named in `lengths`
        (`take_sampled`)."""
        return take_sampled(lengths)

    def genesys_take_checks(
        self, requests: dict[str, dict[str, Any]], topk: int, decode_batching_size: int
    ) -> dict[str, dict[str, Any] | None]:
        """The checks of the recomputed rows named in `requests` (`Capture.check`)."""
        from genesys.config import ProofConfig

        return self.model_runner.genesys_capture.check(
            requests, ProofConfig(topk, decode_batching_size), self.model_runner.get_model()
        )
