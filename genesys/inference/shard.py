"""One stage's share of a transformers decoder, built without the rest of the model ever in memory.

`load_stage` builds the model on the meta device (shapes, no storage) from a config that says the
stage has `end - start` layers, drops what the stage does not run (the embedding unless it is the
first stage, the final norm and output layer unless it is the last), and then materialises what is
left tensor by tensor from the safetensors checkpoint: local layer `j` is the checkpoint's layer
`start + j`. A tied output layer is read from the embedding's tensor. Buffers the checkpoint does not
hold (the rotary embedding's frequencies) are computed by building their module again on the device.
So a stage holds, and reads from disk, its own layers and nothing else: a model too large for one
machine can be split across several.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from genesys.checkpoints import Checkpoint, meta_model, tied_names, weights_dtype
from genesys.errors import InputError


@dataclass
class StageModules:
    """What a stage runs: the base model with its layers (`base`), the output layer on the last stage."""

    base: nn.Module
    output: nn.Module | None
    config: Any  # the text config, saying the stage has `end - start` layers
    device: str
    dtype: torch.dtype
    read: list[str]  # the checkpoint tensors this stage read


def _stage_config(config: Any, start: int, end: int) -> Any:
    config = copy.deepcopy(config)
    text = config.get_text_config()
    text.num_hidden_layers = end - start
    if getattr(text, "layer_types", None):
        text.layer_types = list(text.layer_types[start:end])
    return config


def _set(root: nn.Module, name: str, value: torch.Tensor, parameter: bool) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = root.get_submodule(owner_name)
    if parameter:
        owner._parameters[leaf] = value if isinstance(value, nn.Parameter) else nn.Parameter(value, False)
    else:
        owner._buffers[leaf] = value


def load_stage(
    model: str, layer_range: tuple[int, int], first: bool, last: bool, device: str | None, dtype: str | None
) -> StageModules:
    """Layers `[start, end)` of `model`, with the embedding when `first` and the final norm and output
    layer when `last`, on `device` in `dtype` (`load_causal_lm`'s defaults), read from its checkpoint."""
    from transformers import AutoConfig

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        config = AutoConfig.from_pretrained(model)
    except OSError as exc:
        raise InputError(f"--model {model!r} cannot be loaded: {exc}") from None
    start, end = layer_range
    # On CPU, bfloat16 weights would run far slower than float32 on most processors.
    torch_dtype = weights_dtype(model, config, dtype or ("float32" if device == "cpu" else "auto"))
    stage_config = _stage_config(config, start, end)
    skeleton = meta_model(stage_config, torch_dtype)
    aliases = tied_names(skeleton)
    base = skeleton.base_model
    if not isinstance(getattr(base, "layers", None), nn.ModuleList) or not hasattr(base, "norm"):
        raise InputError(
            f"--model {model!r}: the pipeline backend splits decoders whose base model has `layers` and "
            "`norm` (the Llama, Qwen and Mistral families)"
        )
    layers_path = next(name for name, module in skeleton.named_modules() if module is base.layers)
    local_layer = re.compile(rf"^{re.escape(layers_path)}\.(\d+)\.")
    output_layer = skeleton.get_output_embeddings()
    output_name = next(name for name, module in skeleton.named_modules() if module is output_layer)
    if not first:
        base.embed_tokens = None
    if not last:
        base.norm = nn.Identity()
        _replace_module(skeleton, output_name, None)

    def in_checkpoint(name: str) -> str:
        return local_layer.sub(lambda m: f"{layers_path}.{start + int(m.group(1))}.", name)

    loaded: dict[str, nn.Parameter] = {}  # by checkpoint name, so tied names share one tensor
    with Checkpoint(model) as checkpoint:
        for name, parameter in list(skeleton.named_parameters(remove_duplicate=False)):
            candidates = [in_checkpoint(alias) for alias in aliases[id(parameter)]]
            key = next((c for c in candidates if c in checkpoint), None)
            if key is None:
                raise InputError(
                    f"--model {model!r}: the checkpoint has no tensor {candidates[0]!r} "
                    f"(needed by the stage of layers {start}..{end - 1})"
                )
            if key not in loaded:
                tensor = checkpoint.read(key)
                if tuple(tensor.shape) != tuple(parameter.shape):
                    raise InputError(
                        f"--model {model!r}: tensor {key!r} has shape {tuple(tensor.shape)} in the "
                        f"checkpoint, {tuple(parameter.shape)} in the model its config describes"
                    )
                loaded[key] = nn.Parameter(tensor.to(device=device, dtype=torch_dtype), requires_grad=False)
            _set(skeleton, name, loaded[key], parameter=True)
        for name, buffer in list(skeleton.named_buffers()):
            key = in_checkpoint(name)
            if buffer.is_meta and key in checkpoint:
                _set(skeleton, name, checkpoint.read(key).to(device=device, dtype=buffer.dtype), False)
        read = list(checkpoint.read_names)
    _rebuild_computed_buffers(skeleton, device)
    base, output = skeleton.base_model, (skeleton.get_submodule(output_name) if last else None)
    return StageModules(base.eval(), output, stage_config.get_text_config(), device, torch_dtype, read)


def _replace_module(root: nn.Module, name: str, module: nn.Module | None) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent), leaf, module)


def _rebuild_computed_buffers(root: nn.Module, device: str) -> None:
    """Build again, on `device`, each module whose buffers are still on the meta device: buffers that
    are computed from the config when the module is built (the rotary embedding's frequencies)."""
    for name, module in list(root.named_modules()):
        if not any(b.is_meta for b in module.buffers(recurse=False)):
            continue
        if any(p.is_meta for p in module.parameters(recurse=False)) or not hasattr(module, "config"):
            raise InputError(
                f"the pipeline backend cannot build {name} ({type(module).__name__}) of this model: its "
                "buffers are neither in the checkpoint nor computed from its config"
            )
        with torch.device(device):
            rebuilt = type(module)(module.config)
        _replace_module(root, name, rebuilt)
    left = [n for n, t in [*root.named_parameters(), *root.named_buffers()] if t.is_meta]
    if left:
        raise InputError(f"the pipeline backend left {', '.join(left[:3])} of this model unmaterialised")
