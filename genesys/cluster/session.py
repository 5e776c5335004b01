"""A run's Ray session and what one actor is started with.

`ray_session(cluster)` joins the cluster at `cluster.address`, or starts a Ray instance on this
machine when none is given, and leaves it when the run ends (stopping the instance it started).
The actors see the genesys settings of this process's environment (`GENESYS_*`, `PYTHONPATH`), so
plugins found here are found there. `actor_options` declares what one actor needs and how Ray
supervises it: Ray restarts an actor that dies, however often (`max_restarts = -1`), and sends the
calls it was running, or that reached it while it restarted, again to the restarted actor, up to
`MAX_TASK_RETRIES` times each (`max_task_retries`); a call whose actor dies more often than that
fails with Ray's `RayActorError`. `restart_count` says how often Ray has restarted an actor.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from genesys.config import ClusterConfig
from genesys.errors import InputError

log = logging.getLogger(__name__)
NAMESPACE = "genesys"
# What actors inherit from the driver's environment: plugin selection and import paths.
FORWARDED_ENV = ("PYTHONPATH",)
FORWARDED_PREFIX = "GENESYS_"
MAX_RESTARTS = -1  # Ray restarts a dead actor every time (an exception in its constructor is not a death)
MAX_TASK_RETRIES = 3  # a call whose actor keeps dying under it is an infrastructure failure, not its work's


def import_ray() -> Any:
    """The `ray` module, or an InputError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError("cluster.backend = 'ray' needs Ray: pip install 'genesys-rl[ray]'") from None
    return ray


def forwarded_environment() -> dict[str, str]:
    """The variables of this process that actors must see too."""
    return {
        name: value
        for name, value in os.environ.items()
        if name in FORWARDED_ENV or name.startswith(FORWARDED_PREFIX)
    }


@contextlib.contextmanager
def ray_session(cluster: ClusterConfig, local_cpus: float = 0.0) -> Iterator[Any]:
    """Ray, connected for the duration of the block; yields the `ray` module.

    Without `cluster.address` a Ray instance is started here with `local_cpus` logical CPUs (at
    least this machine's core count), enough to place the run's actors. A session that is already
    connected (e.g. a test's) is used as it is and left running.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    options: dict[str, Any] = {
        "namespace": NAMESPACE,
        "runtime_env": {"env_vars": forwarded_environment()},
        "log_to_driver": False,
    }
    if cluster.address:
        options["address"] = cluster.address
    else:
        options.update(num_cpus=max(float(os.cpu_count() or 1), local_cpus), include_dashboard=False)
    try:
        ray.init(**options)
    except ConnectionError as exc:
        raise InputError(
            f"cluster.address {cluster.address!r}: no Ray cluster answers ({exc}); start one with `ray start --head`"
        ) from None
    log.info("ray: connected to %s", cluster.address or "a Ray instance started on this machine")
    try:
        yield ray
    finally:
        ray.shutdown()


def actor_options(cpus: float, gpus: float = 0.0, name: str | None = None) -> dict[str, Any]:
    """`.options(...)` of one actor: the resources it declares, Ray's restart policy, and its name
    when it has one (a restarted actor keeps it)."""
    options: dict[str, Any] = {
        "num_cpus": cpus,
        "num_gpus": gpus,
        "max_restarts": MAX_RESTARTS,
        "max_task_retries": MAX_TASK_RETRIES,
        "namespace": NAMESPACE,
    }
    if name is not None:
        options["name"] = name
    return options


def restart_count(ray: Any, actor: Any) -> int:
    """How often Ray has restarted `actor`, from the cluster's actor table (the state API would need
    the dashboard, which a run's own Ray instance does not start)."""
    return int(ray._private.state.actors(actor._actor_id.hex()).get("NumRestarts", 0))
