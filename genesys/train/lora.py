"""Low-rank adapters (LoRA) on the trained model, built with peft.

`add_adapters` injects peft's LoRA layers into the transformers model in place (the model keeps its
own class, so everything that calls it is unchanged) and freezes every other weight. Engines and
`final/` take merged weights: `merged_weight` adds an adapter's update `scaling * B @ A` to its base
weight without touching the adapter, so training goes on with it after every weight sync.

Names: inside an adapted model a base weight is `...q_proj.base_layer.weight` and the adapter's are
`...q_proj.lora_A.default.weight` / `lora_B`; `base_name` gives the plain model's name back.
"""

from __future__ import annotations

from typing import Any

import torch

from genesys.errors import InputError
from genesys.train.config import LoraConfig

ADAPTER = "default"  # peft's name for the one adapter
BASE_LAYER = ".base_layer."
PEFT_PREFIX = "base_model.model."  # what a PeftModel puts before the wrapped model's names


def add_adapters(model: torch.nn.Module, config: LoraConfig) -> Any:
    """Inject LoRA layers into `model` (in place) and return peft's wrapper of it (for saving the
    adapter); only the adapters' weights require gradients. An InputError names target modules the
    model does not have."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets: str | list[str] = (
        "all-linear" if config.target_modules == ["all-linear"] else list(config.target_modules)
    )
    peft_config = PeftLoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    try:
        wrapped = get_peft_model(model, peft_config, adapter_name=ADAPTER)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise InputError(f"lora.target_modules: {exc}") from None
    _refuse_shared_weights(model)
    return wrapped


def _refuse_shared_weights(model: torch.nn.Module) -> None:
    """An InputError for an adapted layer whose weight another layer shares (an output layer tied
    to the embeddings): its merged weight could not stay shared, so the model could not be saved."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    for module_name, layer in adapter_layers(model).items():
        shared = names.get(id(layer.base_layer.weight), [])
        if len(shared) > 1:
            raise InputError(
                f"lora.target_modules: {module_name} shares its weight with {', '.join(n for n in shared if BASE_LAYER not in n)} "
                "(tied embeddings); its merged weight could not stay tied: leave it out of the target modules"
            )


def is_adapter_weight(name: str) -> bool:
    """Whether parameter `name` belongs to an adapter (not to the model it adapts)."""
    return ".lora_" in name


def base_name(name: str) -> str:
    """The plain model's name of a parameter of an adapted model."""
    return name.replace(BASE_LAYER, ".")


def adapter_layers(model: torch.nn.Module) -> dict[str, Any]:
    """peft's LoRA layers of `model`, by module name."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def merged_weight(layer: Any, base: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`base + scaling * B @ A` (transposed for a fan-in/fan-out layer), computed in fp32, from the
    full tensors of a LoRA layer's base weight and its adapter's A and B."""
    delta = (b.float() @ a.float()) * layer.scaling[ADAPTER]
    if layer.fan_in_fan_out:
        delta = delta.T
    return base.float() + delta
