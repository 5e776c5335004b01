"""The training processes: the process group `torchrun` describes, or a group of one process.

`torchrun --nproc-per-node N -m genesys.cli train CONFIG.toml` sets RANK, WORLD_SIZE, LOCAL_RANK and
the rendezvous address; each process then generates, verifies and trains on its share of the
batch, and rank 0 writes logs and checkpoints. Without those variables the process makes a group
of its own (an in-memory store, no network), so that collectives and the distributed checkpoint
state dicts work the same whatever the number of processes (`genesys.train.parallel` decides how
the model is spread over them). CPU tensors travel over gloo, CUDA tensors over nccl.

A process that made a group lets gloo's worker threads finish before the interpreter shuts down
(`_let_gloo_workers_finish`): without that, a rank sometimes died at exit with SIGABRT.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    joined: bool = False  # this process joined torchrun's process group (close_world leaves it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def device(self, requested: str | None) -> torch.device:
        """The device this rank trains on: `requested`, else its own GPU when there are GPUs, else the CPU."""
        if requested:
            return torch.device(requested)
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over all ranks."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        """Element-wise maxima over all ranks."""
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: list[float], op: Any) -> list[float]:
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value` (any picklable object), in rank order, on every rank."""
        if not self.distributed:
            return [value]
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, value)
        return gathered

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def _collective_device() -> torch.device:
    """Where World's small reductions run: CPU tensors wherever gloo takes part."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


def _backend() -> str:
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


# How long an exiting process leaves the GIL to gloo's worker threads. They need microseconds; the
# margin covers a worker that the scheduler of a loaded machine leaves waiting.
GLOO_WORKERS_GRACE_S = 0.2


@functools.cache
def _finish_gloo_workers_at_exit() -> None:
    atexit.register(_let_gloo_workers_finish)


def _let_gloo_workers_finish() -> None:
    """Leave the GIL to gloo's worker threads for a moment, before the interpreter shuts down.

    A gloo worker reports a collective done and only then drops its reference to it, and so to its
    tensors; dropping the last reference to a tensor Python has seen takes the GIL. A worker that
    gets there after the interpreter began shutting down is ended by CPython inside the collective's
    C++ destructor, and the process aborts with "terminate called without an active exception"
    (torch 2.13: `ProcessGroupGloo::runLoop` -> `~AsyncAllgatherCoalescedWork` ->
    `TensorImpl::decref_pyobject` -> `take_gil` -> `pthread_exit`). torch joins the workers only
    when the process group object is freed, and its DTensor caches keep the group alive until the
    process ends (`destroy_process_group` does not), so there is nothing to wait on: the main thread
    sleeps, the GIL released, at exit (atexit callbacks run while the interpreter is still whole)."""
    time.sleep(GLOO_WORKERS_GRACE_S)


# The torchrun groups this process has joined, numbered alike on every rank.
_worlds_joined = itertools.count()


def init_world() -> World:
    """Join the process group torchrun set up, or make a group of this process alone (which stays
    until the process ends, and which later runs in the process reuse). A process that already
    belongs to a group keeps it."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0")) if size > 1 else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if size > 1 else 0
    if dist.is_initialized():
        return World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=local_rank)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    timeout = datetime.timedelta(minutes=30)
    _finish_gloo_workers_at_exit()
    if size == 1:  # kept for the life of the process: an in-process engine (vLLM) may build on it
        dist.init_process_group(_backend(), store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return World()
    store, rank, size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    # Keys of its own in torchrun's store: a group made after an earlier one was destroyed (two
    # trainings in one process) would otherwise rendezvous on the keys the earlier one left there,
    # torch naming every world's groups alike, and a rank could join a peer's old group and hang.
    world_store = dist.PrefixStore(f"genesys-world-{next(_worlds_joined)}", store)
    dist.init_process_group(_backend(), store=world_store, rank=rank, world_size=size, timeout=timeout)
    return World(rank=rank, size=size, local_rank=local_rank, joined=True)


def close_world(world: World) -> None:
    """Leave torchrun's process group, if `init_world` joined it."""
    if world.joined and dist.is_initialized():
        dist.destroy_process_group()
