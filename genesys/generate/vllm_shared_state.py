"""vLLM's process-wide parallel state, kept while any vLLM engine core of this process still runs.

vLLM keeps its distributed state in module globals of `vllm.distributed.parallel_state`, one set per
process: torch.distributed's default group, the world group and the model-parallel groups (tensor,
pipeline, ...). An engine core that runs in this process (a colocated engine, and every engine built
after one: it sets `VLLM_ENABLE_V1_MULTIPROCESSING=0` for the process) sets that state up when it
starts, or reuses it when another core already did (`init_distributed_environment` and
`ensure_model_parallel_initialized` keep what exists). But every core tears all of it down when it
shuts down, closed or garbage-collected (`EngineCore.shutdown` calls `cleanup_dist_env_and_memory`),
and each other core of the process then fails its next step ("pipeline model parallel group is not
initialized"): the trainer's engine after an evaluation engine closed, say.

`share` counts an engine's in-process core among the state's users. vLLM 0.32 has no setting that
keeps the state, so `share` also puts a function of its own in place of the teardown that
`EngineCore.shutdown` calls: vLLM's teardown runs when the core shutting down is the last user, and
otherwise only the closed engine's memory is released.
The cores that share the state all run their model in this process on one device (vLLM's `uni`
executor, one model replica), so their parallel sizes cannot disagree; an engine with more workers
runs them in processes of their own.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

# The in-process engine clients (vLLM's `InprocClient`) registered with `share`. A client's finalizer
# (`_finalizer`, which shuts its core down) is no longer alive once its shutdown began.
_clients: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.RLock()  # reentrant: a collection inside `share` may shut a core down
_teardown: Callable[..., None] | None = None  # vLLM's own `cleanup_dist_env_and_memory`
_process: int | None = None  # the process whose cores registered (a forked child inherits the count)


def share(llm: Any) -> None:
    """Count `llm`'s engine core among the users of this process's parallel state, if it runs here."""
    from vllm.v1.engine import core
    from vllm.v1.engine.core_client import InprocClient

    client = llm.llm_engine.engine_core
    if not isinstance(client, InprocClient):  # a core in its own process holds its own state
        return
    global _teardown, _process
    with _lock:
        _process = os.getpid()
        if core.cleanup_dist_env_and_memory is not _teardown_after_last_user:
            _teardown = core.cleanup_dist_env_and_memory
            core.cleanup_dist_env_and_memory = _teardown_after_last_user
        _clients.add(client)


def users() -> int:
    """How many registered engine cores of this process still run."""
    with _lock:
        return sum(client._finalizer.alive for client in _clients)


def _teardown_after_last_user(*args: Any, **kwargs: Any) -> None:
    """What an engine core calls as it shuts down: vLLM's teardown once no other core uses the state;
    before that, only the release of the closed engine's memory."""
    if os.getpid() == _process and users():
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return
    assert _teardown is not None
    _teardown(*args, **kwargs)
