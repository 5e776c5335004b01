"""What `genesys validate` recomputes of a row: the final hidden states that produced its completion
tokens (checked against its TOPLOC proofs, chunk by chunk) and those tokens' logprobs under the
temperature and top-p the row names, from one prefill over prompt + completion.

Two engines do it, with the same answers (`Recomputed`):
- `TransformersRecomputer`: rows of similar length left-padded together, the positions generation
  used, a forward hook on the base model for the hidden states and the logits for the logprobs;
- `VLLMRecomputer`: vLLM's engine with the capture `genesys generate --proofs` uses, the proofs
  checked and the logprobs computed inside the engine's worker (`genesys.proofs.vllm_capture`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from genesys.config import DEFAULT_BACKEND, PROOF_BACKENDS, PromptStyle, ProofConfig, ValidateCommand
from genesys.errors import InputError
from genesys.proofs.checks import Problem, RowSampling
from genesys.proofs.sampling import SamplingKey
from genesys.proofs.toploc import ChunkErrors


@dataclass
class Pending:
    """A row waiting for the model: its ids, its decoded proofs (None when they cannot be checked),
    problems so far, and the proof settings it recorded (None when they are not allowed).

    A trajectory row is recomputed as its model turns, `parts` (one `Pending` each, see
    `genesys.proofs.trajectories`); its `completion_ids` are then the model's tokens of every turn and
    `claimed_logprobs` the row's logprobs of those tokens."""

    row: dict[str, Any]
    prompt_ids: list[int]
    completion_ids: list[int]
    sampling: RowSampling
    proofs: list[bytes] | None
    problems: list[Problem]
    settings: ProofConfig | None = None
    sampling_key: SamplingKey | None = None  # None: no sampling proof to check
    parts: list[Pending] | None = None
    claimed_logprobs: Any = None  # None: the row's completion_logprobs


@dataclass
class Recomputed:
    """A row's recomputation: each chunk's errors against its proofs (None: none to check), the
    logprob of each completion token and, for a row with a sampling proof, each token's sampling
    margin (`genesys.proofs.sampling.margins`)."""

    chunks: list[ChunkErrors] | None
    logprobs: list[float]
    margins: list[float] | None = None


class Recomputer(Protocol):
    """A model that recomputes rows, and what the checks without a model need of it."""

    tokenizer: Any
    stop_ids: set[int]
    vocab_size: int
    hidden_size: int
    weights_sha256: str

    def recompute(self, batch: Sequence[Pending]) -> list[Recomputed]: ...

    def close(self) -> None:
        """Free what the model holds (an engine's processes)."""


def recomputer(config: ValidateCommand) -> Recomputer:
    """The recomputer `config.backend` names (`auto`: the one `resolve_backend` picks)."""
    backend = resolve_backend(config.backend)
    try:
        config.check_backend(backend)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return VLLMRecomputer(config) if backend == "vllm" else TransformersRecomputer(config)


def resolve_backend(name: str) -> str:
    """`name`, or for `auto` the registered backend of highest priority among transformers and vllm
    that can run here: vllm where it is installed and a GPU is visible, else transformers."""
    if name != DEFAULT_BACKEND:
        return name
    from genesys.plugins.registry import backend_specs

    specs = [spec for spec in backend_specs().values() if spec.name in PROOF_BACKENDS]
    for spec in sorted(specs, key=lambda spec: -spec.priority):
        if spec.usable is not None and spec.usable():
            return spec.name
    return "transformers"


class TransformersRecomputer:
    """One left-padded prefill per batch with a transformers model (CPU or GPU)."""

    def __init__(self, config: ValidateCommand) -> None:
        from genesys.models import load_causal_lm, stop_token_ids
        from genesys.proofs.toploc import check_hidden_size
        from genesys.proofs.weights import weights_sha256

        options = config.backend_options
        self.device, self.tokenizer, self.model = load_causal_lm(config.model, options.device, options.dtype)
        self.hidden_size = self.model.config.get_text_config().hidden_size
        check_hidden_size(self.hidden_size, config.proofs)
        self.stop_ids = stop_token_ids(self.model.generation_config, self.tokenizer)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.weights_sha256 = weights_sha256(self.model)

    def recompute(self, batch: Sequence[Pending]) -> list[Recomputed]:
        from genesys.models import sampled_logprobs
        from genesys.proofs.sampling import margins
        from genesys.proofs.toploc import as_proof_dtype, verify_proofs

        recomputed = []
        for item, (hidden, logits) in zip(batch, self._prefill(batch)):
            chunks = (
                None
                if item.proofs is None or item.settings is None
                else verify_proofs(as_proof_dtype(hidden), item.proofs, item.settings)
            )
            temperature, top_p = item.sampling.temperature, item.sampling.top_p
            recomputed.append(
                Recomputed(
                    chunks,
                    sampled_logprobs(logits, item.completion_ids, temperature, top_p),
                    None
                    if item.sampling_key is None
                    else margins(logits, item.completion_ids, item.sampling_key, temperature, top_p),
                )
            )
        return recomputed

    def close(self) -> None:
        """Nothing to free but memory, which goes with the object."""

    def _prefill(self, batch: Sequence[Pending]) -> list[tuple[Any, Any]]:
        """Per row, the (C, hidden) states and (C, vocab) logits that produced its C completion tokens."""
        import torch

        from genesys.proofs.hf_capture import FinalHiddenStates

        sequences = [item.prompt_ids + item.completion_ids for item in batch]
        encoded = self.tokenizer.pad({"input_ids": sequences}, padding=True, return_tensors="pt").to(
            self.device
        )
        mask = encoded["attention_mask"]
        positions = (mask.long().cumsum(-1) - 1).masked_fill(
            mask == 0, 1
        )  # as `generate` numbers left-padded rows
        keep = max(len(item.completion_ids) for item in batch) + 1
        with torch.inference_mode(), FinalHiddenStates(self.model, last_only=False) as capture:
            logits = self.model(**encoded, position_ids=positions, logits_to_keep=keep).logits
        states = capture.prefill()
        width = states.shape[1]
        rows = []
        for row, item in enumerate(batch):
            count = len(item.completion_ids)
            rows.append(
                (states[row, width - count - 1 : width - 1], logits[row, keep - count - 1 : keep - 1].float())
            )
        return rows


class VLLMRecomputer:
    """vLLM's engine: one engine call per batch, the checks made in its worker."""

    def __init__(self, config: ValidateCommand) -> None:
        from transformers import AutoConfig, GenerationConfig

        from genesys.models import stop_token_ids
        from genesys.plugins.registry import backend_specs

        vllm_backend = backend_specs()["vllm"].load()  # the engine `genesys generate --backend vllm` runs
        options = config.backend_options.for_backend("vllm")  # engine_args, tensor_parallel_size
        policy = config.proofs  # each row is checked with its own settings; these only start the capture
        self.engine = vllm_backend(
            config.model,
            PromptStyle(),
            **{**options, "batch_size": config.batch_size},
            proofs=ProofConfig(
                policy.topk, policy.decode_batching_size or policy.max_decode_batching_size, sampling=False
            ),
        )
        self.tokenizer = self.engine.tokenizer
        model_config = AutoConfig.from_pretrained(config.model)
        try:
            generation_config = GenerationConfig.from_pretrained(config.model)
        except (
            OSError
        ):  # a checkpoint without generation_config.json: what transformers derives from its config
            generation_config = GenerationConfig.from_model_config(model_config)
        self.stop_ids = stop_token_ids(generation_config, self.tokenizer)
        self.vocab_size = model_config.get_text_config().vocab_size
        self.hidden_size = model_config.get_text_config().hidden_size
        self.weights_sha256 = self.engine.proof_settings["weights_sha256"]

    def recompute(self, batch: Sequence[Pending]) -> list[Recomputed]:
        from genesys.proofs.vllm_capture import Recomputation

        todo = [item for item in batch if item.completion_ids]  # an empty completion has nothing to recompute
        rows = [
            Recomputation(
                item.prompt_ids,
                item.completion_ids,
                None if item.settings is None else item.proofs,
                item.sampling.temperature,
                item.sampling.top_p,
                item.settings,
                item.sampling_key,
            )
            for item in todo
        ]
        checks = dict(zip(map(id, todo), self.engine.recompute(rows)))
        recomputed = []
        for item in batch:
            if not item.completion_ids:
                recomputed.append(
                    Recomputed(
                        None if item.proofs is None else [], [], None if item.sampling_key is None else []
                    )
                )
                continue
            check = checks[id(item)]
            if check is None:
                raise RuntimeError(
                    f"vLLM did not hand over the hidden states of every token of row {item.row.get('response_id')!r}"
                )
            chunks = None if check["chunks"] is None else [ChunkErrors(*errors) for errors in check["chunks"]]
            recomputed.append(Recomputed(chunks, check["logprobs"], check["margins"]))
        return recomputed

    def close(self) -> None:
        self.engine.close()
