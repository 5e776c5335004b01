"""The trained model built on every rank without its weights, then filled from one reader.

With N processes on a machine, loading the pretrained model in each of them would hold N full
copies in its memory before sharding threw most of it away. Instead:

1. `empty_model` builds the model on every rank from its config alone: parameters on the meta device
   (no memory, no initialisation; accelerate's `init_empty_weights`), buffers such as rotary tables
   computed for real;
2. the caller adds LoRA adapters (on the meta device too) and shards it (`genesys.train.parallel`);
3. `materialize` gives each rank storage for its shards only, on its device;
4. `load_pretrained` reads the weights on rank 0 alone, in the checkpoint's own dtype, and sends them
   out one tensor at a time (`set_model_state_dict` with `broadcast_from_rank0`): every rank keeps
   its shard, in fp32. A resumed run reads its trained weights from its checkpoint's shards instead
   (`genesys.train.checkpoint.load_shards`: each rank reads only the slices it holds).

Peak host memory of the load: rank 0 holds the pretrained model once in its own dtype, every other
rank its shards and one full tensor in flight (`benchmarks/train_memory.py --loading` measures it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from genesys.errors import InputError
from genesys.train.distributed import World
from genesys.train.parallel import shard_model


def empty_model(path: str, gradient_checkpointing: bool = False) -> tuple[Any, torch.nn.Module]:
    """(tokenizer, model) of the model at `path` with fp32 parameters on the meta device and its buffers
    computed on the CPU; no KV cache, optionally gradient checkpointed. Output layers tied to the
    embeddings stay tied."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"model {path!r} cannot be loaded: {exc}") from None
    config.use_cache = False
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # parameters replaced on their way to the meta device lost their ties
    try:  # what from_pretrained would read beside the weights
        model.generation_config = GenerationConfig.from_pretrained(path)
    except OSError:
        pass  # a model without generation_config.json keeps the one its config implies
    if gradient_checkpointing:  # the method's newer name first
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    return tokenizer, model


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Give the (sharded) `model`'s meta parameters storage on `device`, uninitialised; its buffers
    keep their values and its tied parameters stay tied (an output layer tied to the embeddings:
    `to_empty` gives a plain module a new parameter under each name)."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    ties = _ties(model)
    model.to_empty(device=device)
    for alias, source in ties.items():
        parameter = model.get_parameter(source)
        if model.get_parameter(alias) is not parameter:
            owner, _, name = alias.rpartition(".")
            setattr(model.get_submodule(owner), name, parameter)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


def _ties(model: torch.nn.Module) -> dict[str, str]:
    """Each name of a parameter registered under several names -> the first of its names."""
    first: dict[int, str] = {}
    ties = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            ties[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return ties


def load_pretrained(
    model: torch.nn.Module,
    path: str,
    world: World,
    prepare: Callable[[torch.nn.Module], None] | None = None,
    dtype: torch.dtype | str = "auto",
) -> None:
    """Fill the materialized, sharded `model` with the weights at `path`: rank 0 loads them in `dtype`
    (default: the checkpoint's own) and `prepare`s the loaded model as the caller prepared `model`
    (e.g. adds the same adapters); every rank keeps its shards. Every rank must call it. When rank 0
    cannot load the model, every rank raises (an InputError, or on rank 0 what stopped it)."""
    source, failure = None, None
    if world.is_main:
        try:
            source = _read(path, dtype)
            if prepare is not None:
                prepare(source)
        except Exception as exc:  # the other ranks wait for the weights: they must hear of it
            failure = exc
    message = world.gather(f"{type(failure).__name__}: {failure}" if failure else "")[0]
    if isinstance(failure, OSError | ValueError):
        raise InputError(f"model {path!r} cannot be loaded: {failure}") from None
    if failure is not None:
        raise failure
    if message:
        raise InputError(f"model {path!r} cannot be loaded (on rank 0: {message})")
    weights = source.state_dict() if source is not None else {}
    set_model_state_dict(
        model, weights, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )


def sharded_pretrained(
    path: str, world: World, mesh: Any, precision: str, device: torch.device, frozen: bool = False
) -> torch.nn.Module:
    """The pretrained model at `path` sharded on `mesh` (`genesys.train.parallel.shard_model`) on every
    rank, read by rank 0 alone (the steps above, without adapters); `frozen`: no weight requires a
    gradient. Every rank must call it."""
    _, model = empty_model(path)
    if frozen:
        model.eval().requires_grad_(False)
    model = shard_model(model, mesh, precision)
    materialize(model, device)
    load_pretrained(model, path, world)
    return model


def _read(path: str, dtype: torch.dtype | str) -> torch.nn.Module:
    """The model at `path` on the CPU in `dtype`."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
