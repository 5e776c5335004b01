"""The trained model spread over the training processes with torch's FSDP2 (`fully_shard`).

Every run goes through here, one process or many: each decoder layer, then the whole model, is
wrapped by `fully_shard` on a device mesh of the processes. One process training in fp32 is the
exception: with nothing to shard and nothing to cast, the model stays a plain module on the device
(FSDP2 would compute the same numbers, bit for bit, through per-layer copies of the weights,
collectives of one process, hooks and DTensor dispatch: a fifth to a quarter of a small model's
forward, backward, optimizer and weight export time on CPU). Everything downstream (`full_tensor`,
`local_tensor`, `clip_grad_norm`, checkpoints) takes either.

- `fsdp2` shards parameters, gradients and optimizer state over the processes (a 1-D mesh):
  a layer's full weights exist only while it computes.
- `ddp` replicates the model on each process and all-reduces gradients: FSDP2 on a 2-D mesh whose
  shard dimension has size 1 (torch's hybrid sharding with nothing to shard).

Mixed precision is FSDP2's own: the sharded parameters (the master weights, which the optimizer
updates) stay fp32, the gathered parameters the forward and backward passes use are bf16 with
`precision = "bf16"`, and gradients are reduced and kept in fp32 (one process in bf16 is wrapped
for this). With `precision = "fp32"` one process computes exactly what an unwrapped model computes,
bit for bit (tested), which is why it runs unwrapped.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from genesys.train.distributed import World

STRATEGIES = ("fsdp2", "ddp")
COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16}  # None: the parameters' own dtype (fp32)


def device_mesh(world: World, strategy: str, device: torch.device) -> DeviceMesh:
    """The mesh of all processes: sharded over them (`fsdp2`) or replicated across them (`ddp`).
    One mesh per strategy and device type for the process group's life (its subgroups are made once);
    a process that leaves its group and joins another (two trainings in one torchrun) gets new ones."""
    if strategy not in STRATEGIES:
        raise ValueError(f"parallel.strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    return _mesh(dist.group.WORLD, world.size, strategy, device.type)


@functools.cache
def _mesh(group: dist.ProcessGroup, size: int, strategy: str, device_type: str) -> DeviceMesh:
    if strategy == "ddp":
        return init_device_mesh(device_type, (size, 1), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (size,), mesh_dim_names=("shard",))


def block_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (decoder layers), each sharded as one unit: the classes a
    transformers model lists in `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


def shard_model(model: torch.nn.Module, mesh: DeviceMesh, precision: str) -> torch.nn.Module:
    """`model`, its blocks and then itself wrapped by `fully_shard` on `mesh`, in place; its parameters
    become DTensors (this rank's shard), moved to the mesh's device (a model loaded on the CPU
    reaches the GPU one block at a time, never whole). Frozen parameters (a LoRA base, a reference
    model) are sharded the same way and get no gradients. On a mesh of one process in fp32 the model
    is only moved to the device (see the module's docstring)."""
    if mesh.size() == 1 and COMPUTE_DTYPES[precision] is None:
        on_meta = any(parameter.is_meta for parameter in model.parameters())  # `materialize` moves it
        return model if on_meta else model.to(_mesh_device(mesh))
    policy = MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPES[precision], reduce_dtype=torch.float32)
    for block in block_modules(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def _mesh_device(mesh: DeviceMesh) -> torch.device:
    """The device of this process in `mesh` (the current one of its type, as `fully_shard` takes it)."""
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, torch.get_device_module(mesh.device_type).current_device())


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of `tensor`: gathered from every rank's shard for a DTensor (a collective every
    rank must call), the tensor itself otherwise."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of `tensor` (its shard for a DTensor)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """Scale the gradients so that their global L2 norm (over every rank's shards) is at most
    `max_norm` (inf: no clipping); returns the norm before clipping, the same on every rank."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    norm = full_tensor(norm)
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return float(norm)


def set_gradient_sync(model: torch.nn.Module, strategy: str, last_micro_batch: bool) -> None:
    """Before a micro-batch's backward pass: under `ddp`, gradients are all-reduced only after the
    last micro-batch of a step (they accumulate locally until then); under `fsdp2` every
    micro-batch reduce-scatters its gradients, so that no rank ever holds a full gradient. An
    unwrapped model (one process) has nothing to synchronise."""
    if strategy == "ddp" and isinstance(model, FSDPModule):
        model.set_requires_all_reduce(last_micro_batch)
