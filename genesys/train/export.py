"""The trained model's weights as engines and files take them: gathered from the shards one tensor
at a time, LoRA adapters merged in, in the dtype asked for.

`full_parameters(model, dtype)` is the one way out of a sharded model: it yields `(name, tensor)`
under the names of the plain transformers model (`model.layers.0.self_attn.q_proj.weight`, the
output layer left out when it is tied to the embeddings, as `named_parameters()` does), each tensor
whole, on the training device, in `dtype` (default: fp32, the master weights). Gathering is a
collective: every rank must draw the whole generator, in the same order.

`model_state` collects those tensors (and the persistent buffers) on one rank for a checkpoint;
`save_model` writes them as a Hugging Face folder in the model's own dtype (`declared_dtype`), which
transformers and vLLM load as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from genesys.train import lora
from genesys.train.parallel import full_tensor

MAX_SHARD_SIZE = "5GB"  # safetensors files of a saved model are split at this size (and indexed)


def declared_dtype(config: Any) -> torch.dtype:
    """The dtype a transformers model config declares (`dtype`, formerly `torch_dtype`), fp32 when none."""
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def full_parameters(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the (sharded, possibly adapted) `model`, whole, merged with its LoRA adapter
    when it has one, as `(name of the plain model, tensor in dtype)`; one gather per tensor, so at
    most one full weight (and its adapter) is held at a time beyond what the caller keeps.
    Every rank must consume it entirely (see the module's docstring)."""
    adapters = lora.adapter_layers(model)
    named = dict(model.named_parameters())
    for name, parameter in named.items():
        if lora.is_adapter_weight(name):
            continue
        tensor = full_tensor(parameter.detach())
        module_name, _, leaf = name.rpartition(lora.BASE_LAYER)
        if module_name in adapters and leaf == "weight":
            prefix = f"{module_name}.lora_%s.{lora.ADAPTER}.weight"
            a, b = full_tensor(named[prefix % "A"].detach()), full_tensor(named[prefix % "B"].detach())
            tensor = lora.merged_weight(adapters[module_name], tensor, a, b)
        yield lora.base_name(name), tensor.to(dtype) if dtype is not None else tensor


def persistent_buffers(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The buffers a saved model holds (not the non-persistent ones such as rotary tables)."""
    saved = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name in saved:
            yield lora.base_name(name), full_tensor(buffer.detach())


def model_state(model: torch.nn.Module, dtype: torch.dtype, keep: bool) -> dict[str, torch.Tensor]:
    """The merged model's full state (parameters and persistent buffers) in `dtype`, on the CPU, when
    `keep` (the rank that writes); an empty dict elsewhere. Every rank must call it."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in full_parameters(model, dtype):
        if keep:
            state[name] = tensor.to("cpu", copy=True)
    for name, buffer in persistent_buffers(model):
        if keep:
            state[name] = buffer.to("cpu", dtype=dtype if buffer.is_floating_point() else None, copy=True)
    return state


def trainable_state(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The full fp32 values of the parameters being trained, under `model`'s own names (adapter
    weights included), on the CPU when `keep`; an empty dict elsewhere. Every rank must call it."""
    state: dict[str, torch.Tensor] = {}
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            tensor = full_tensor(parameter.detach())
            if keep:
                state[name] = tensor.to("cpu", copy=True)
    return state


def save_model(
    path: Path,
    state: dict[str, torch.Tensor],
    config: Any,
    generation_config: Any,
    tokenizer: Any,
    dtype: torch.dtype,
) -> None:
    """A Hugging Face model folder: `state` as safetensors (split and indexed when large), the
    model's config declaring `dtype`, its generation config (when it has one) and the tokenizer."""
    from huggingface_hub import save_torch_state_dict

    path.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(state, path, max_shard_size=MAX_SHARD_SIZE, metadata={"format": "pt"})
    saved = copy.deepcopy(config)
    saved.dtype = dtype
    saved.use_cache = True  # the trainer turns the KV cache off; engines want it on
    saved.save_pretrained(path)
    if generation_config is not None:
        generation_config.save_pretrained(path)
    tokenizer.save_pretrained(path)


def save_adapter(
    path: Path, peft_model: Any, state: dict[str, torch.Tensor], tokenizer: Any, dtype: torch.dtype
) -> None:
    """The LoRA adapter alone in `dtype` (peft's `adapter_config.json` and `adapter_model.safetensors`)
    and the tokenizer; `state` holds the adapter's full weights under the adapted model's names."""
    prefixed = {lora.PEFT_PREFIX + name: tensor.to(dtype) for name, tensor in state.items()}
    peft_model.save_pretrained(path, state_dict=prefixed, safe_serialization=True)
    tokenizer.save_pretrained(path)
