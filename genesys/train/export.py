"""The trained model's weights as engines and files take them: gathered from the shards one tensor
at a time, LoRA adapters merged in, in the dtype asked for.

`full_parameters(model, dtype)` is the one way out of a sharded model: it yields `(name, tensor)`
under the names of the plain transformers model (`model.layers.0.self_attn.q_proj.weight`, the
output layer left out when it is tied to the embeddings, as `named_parameters()` does), each tensor
whole, on the training device, in `dtype` (default: fp32, the master weights). Gathering is a
collective: every rank must draw the whole generator, in the same order.

`write_model` writes them as a Hugging Face folder in the model's own dtype (`declared_dtype`), which
transformers and vLLM load as it is: one safetensors file (at most `MAX_SHARD_BYTES`) at a time, so the
writing rank never holds more of the model than one file.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from genesys.train import lora
from genesys.train.parallel import full_tensor

MAX_SHARD_BYTES = 5 * 10**9  # safetensors files of a saved model are split at this size (and indexed)


def declared_dtype(config: Any) -> torch.dtype:
    """The dtype a transformers model config declares (`dtype`, formerly `torch_dtype`), fp32 when none."""
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def _exported(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(name in the plain model, parameter name in `model`) of every weight `full_parameters` yields,
    in its order: the parameters that are not adapter weights."""
    return [
        (lora.base_name(name), name)
        for name, _ in model.named_parameters()
        if not lora.is_adapter_weight(name)
    ]


def full_parameters(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the (sharded, possibly adapted) `model`, whole, merged with its LoRA adapter
    when it has one, as `(name of the plain model, tensor in dtype)`; one gather per tensor, so at
    most one full weight (and its adapter) is held at a time beyond what the caller keeps.
    Every rank must consume it entirely (see the module's docstring)."""
    adapters = lora.adapter_layers(model)
    named = dict(model.named_parameters())
    for plain, name in _exported(model):
        tensor = full_tensor(named[name].detach())
        module_name, _, leaf = name.rpartition(lora.BASE_LAYER)
        if module_name in adapters and leaf == "weight":
            prefix = f"{module_name}.lora_%s.{lora.ADAPTER}.weight"
            a, b = full_tensor(named[prefix % "A"].detach()), full_tensor(named[prefix % "B"].detach())
            tensor = lora.merged_weight(adapters[module_name], tensor, a, b)
        yield plain, tensor.to(dtype) if dtype is not None else tensor


def persistent_buffers(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The buffers a saved model holds (not the non-persistent ones such as rotary tables)."""
    saved = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name in saved:
            yield lora.base_name(name), full_tensor(buffer.detach())


def _model_tensors(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The saved model's tensors, whole: its merged weights in `dtype`, then its persistent buffers
    (floating ones in `dtype`). A collective, like `full_parameters`."""
    yield from full_parameters(model, dtype)
    for name, buffer in persistent_buffers(model):
        yield name, buffer.to(dtype) if buffer.is_floating_point() else buffer


def _model_layout(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Meta tensors of the shapes and dtypes `_model_tensors` yields, under the same names, in order."""
    named = dict(model.named_parameters())
    layout = {
        plain: torch.empty(named[name].shape, dtype=dtype, device="meta") for plain, name in _exported(model)
    }
    saved = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name in saved:
            layout[lora.base_name(name)] = torch.empty(
                buffer.shape, dtype=dtype if buffer.is_floating_point() else buffer.dtype, device="meta"
            )
    return layout


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


def write_model(
    path: Path,
    model: torch.nn.Module,
    dtype: torch.dtype,
    tokenizer: Any,
    keep: bool,
) -> None:
    """`model` (sharded, LoRA merged) as a Hugging Face folder at `path`, written by the rank that
    `keep`s: its weights in `dtype` as safetensors files of at most `MAX_SHARD_BYTES` (indexed when
    there are several), each written as soon as its tensors are gathered; the model's config declaring
    `dtype`, its generation config and the tokenizer. Every rank must call it."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(_model_layout(model, dtype), max_shard_size=MAX_SHARD_BYTES)
    pending = {filename: set(names) for filename, names in split.filename_to_tensors.items()}
    ready: dict[str, dict[str, torch.Tensor]] = {filename: {} for filename in pending}
    if keep:
        path.mkdir(parents=True, exist_ok=True)
    for name, tensor in _model_tensors(model, dtype):
        if not keep:
            continue
        filename = split.tensor_to_filename[name]
        ready[filename][name] = tensor.to("cpu", copy=True)
        pending[filename].discard(name)
        if not pending[filename]:
            save_file(ready.pop(filename), str(path / filename), metadata={"format": "pt"})
    if not keep:
        return
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    saved = copy.deepcopy(model.config)
    saved.dtype = dtype
    saved.use_cache = True  # the trainer turns the KV cache off; engines want it on
    saved.save_pretrained(path)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(path)
    tokenizer.save_pretrained(path)


def save_adapter(
    path: Path, peft_model: Any, state: dict[str, torch.Tensor], tokenizer: Any, dtype: torch.dtype
) -> None:
    """The LoRA adapter alone in `dtype` (peft's `adapter_config.json` and `adapter_model.safetensors`)
    and the tokenizer; `state` holds the adapter's full weights under the adapted model's names."""
    prefixed = {lora.PEFT_PREFIX + name: tensor.to(dtype) for name, tensor in state.items()}
    peft_model.save_pretrained(path, state_dict=prefixed, safe_serialization=True)
    tokenizer.save_pretrained(path)
