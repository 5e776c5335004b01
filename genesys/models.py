"""Hugging Face causal LMs as generation, proofs and training load them, and the logprobs they sample.

One place for what `genesys.generate`, `genesys.proofs` and `genesys.train` share: loading a model
and its tokenizer (`load_causal_lm` for inference, `load_trainable_lm` for training), the tokens that
end a completion (`stop_token_ids`), whether a model's output layer can skip positions
(`takes_logits_to_keep`), and the sampling distribution a token's logprob is taken under
(`sampling_warpers`, `sampled_logprobs`). Importing this module imports torch and transformers.
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
    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except OSError as exc:
        raise InputError(f"--model {model!r} cannot be loaded: {exc}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
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


def load_trainable_lm(
    path: str,
    device: torch.device,
    gradient_checkpointing: bool = False,
    use_safetensors: bool | None = None,
) -> tuple[Any, torch.nn.Module]:
    """(tokenizer, model) to train: float32 weights on `device`, no KV cache, optionally checkpointed.
    `use_safetensors=True` reads safetensors weights only (never a pickled `pytorch_model.bin`)."""
    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, use_safetensors=use_safetensors
        )
    except OSError as exc:
        raise InputError(f"model {path!r} cannot be loaded: {exc}") from None
    model.to(device)
    model.config.use_cache = False
    if gradient_checkpointing:  # the method's newer name first
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    return tokenizer, model


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
