"""Hugging Face causal LMs as generation and proofs load them, and the logprobs they sample.

One place for what `genesys.generate`, `genesys.proofs` and `genesys.train` share: loading a model
and its tokenizer for inference (`load_causal_lm`; training builds its sharded model itself,
`genesys.train.loading`), `load_tokenizer` and `load_generation_config` for a process that holds
part of a model, the tokens that end a completion (`stop_token_ids`), whether a model's output layer
can skip positions (`takes_logits_to_keep`), and the sampling distribution a token's logprob is
taken under (`sampling_warpers`, `sampled_logprobs`). Importing this module imports torch and
transformers.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)
from transformers.utils import logging as transformers_logging

from genesys.config import SamplingConfig
from genesys.errors import InputError


def load_tokenizer(model: str) -> Any:
    """The tokenizer of `model` (a path or hub name), padding on the left with eos when it has no pad."""
    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except OSError as exc:
        raise InputError(f"--model {model!r} cannot be loaded: {exc}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_generation_config(model: str) -> Any:
    """`model`'s generation config, as `from_pretrained` gives a loaded model (from its config when it
    has no generation_config.json)."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model)
    except OSError:
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(model))


def load_causal_lm(
    model: str,
    device: str | None = None,
    dtype: str | None = None,
    model_kwargs: dict[str, Any] | None = None,
) -> tuple[str, Any, Any]:
    """(device, tokenizer, model) for a model path or hub name; the tokenizer pads on the left.

    `device` defaults to cuda when available, `dtype` to the checkpoint's own on GPU and float32 on CPU.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(model)
    # On CPU, bfloat16 weights would run far slower than float32 on most processors.
    dtype = dtype or ("float32" if device == "cpu" else "auto")
    loaded = (
        AutoModelForCausalLM.from_pretrained(model, dtype=dtype, **(model_kwargs or {})).to(device).eval()
    )
    return device, tokenizer, loaded


@cache
def _forward_takes(model_class: type, name: str) -> bool:
    return name in inspect.signature(model_class.forward).parameters


def takes_logits_to_keep(model: Any) -> bool:
    """Whether `model`'s forward takes `logits_to_keep` (the positions its output layer projects)."""
    return _forward_takes(type(model), "logits_to_keep")


def stop_token_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    """The tokens that end a completion: the model's generation eos ids and the tokenizer's eos."""
    ids: set[int] = set()
    for candidate in (generation_config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(candidate, int):
            ids.add(candidate)
        elif candidate:
            ids.update(candidate)
    return ids


def sampling_warpers(sampling: SamplingConfig) -> list[LogitsProcessor]:
    """Temperature then top-p, as transformers would apply them, for the sampler placed after them."""
    if sampling.temperature <= 0:
        return []
    warpers: list[LogitsProcessor] = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    return warpers


def sampled_logprobs(logits: torch.Tensor, ids: list[int], temperature: float, top_p: float) -> list[float]:
    """The logprob of each token of `ids` under the distribution sampled from at that position
    (`logits`: one row per token): the logits after temperature and top-p, as generation records them."""
    scores = logits
    for warper in sampling_warpers(SamplingConfig(temperature=temperature, top_p=top_p)):
        scores = warper(None, scores)
    tokens = torch.tensor(ids, device=scores.device).unsqueeze(1)
    return (scores.gather(1, tokens) - scores.logsumexp(dim=1, keepdim=True)).squeeze(1).tolist()
