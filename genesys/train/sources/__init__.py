"""Where the trainer's rollouts come from: one `RolloutSource` protocol, three sources.

- `base`: the protocol (`start`, `next_batch`, `publish`, `state`/`load_state`, `close`), one
  step's groups (`StepRollouts`) and the training tasks (`load_tasks`, through `genesys.tasks.prepare`);
- `online`: generated, verified and rewarded in the trainer's process (the on-policy mode);
- `recorded`: groups read from rollout files (`data.rollouts`, the offline mode);
- `asynchronous`: rollout workers and verifiers on Ray, within `async.max_staleness` steps of the
  trainer (`cluster.backend = "ray"`); the module is not named `async`, a Python keyword.

`open_source` is the one place that picks a source from the config; the trainer only calls the
protocol's methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from genesys.schema import Row
from genesys.train.config import TrainConfig
from genesys.train.distributed import World
from genesys.train.sources.base import RolloutSource


def open_source(
    config: TrainConfig, world: World, tasks: Sequence[Row] | None, source_model: str, device: Any
) -> RolloutSource:
    """The rollout source `config` asks for, open: recorded rollouts (`data.rollouts`), rollout
    workers on Ray (`cluster.backend = "ray"`), or generation on this rank's `device` from
    `source_model`. `tasks` are the run's tasks (`base.load_tasks`); recorded rollouts need none."""
    if config.offline:
        from genesys.train.sources.recorded import RecordedRollouts

        return RecordedRollouts(config, world)
    assert tasks is not None
    if config.cluster.ray:
        from genesys.train.sources.asynchronous import AsyncRollouts

        return AsyncRollouts.open(config, list(tasks), source_model)
    from genesys.train.sources.online import OnlineRollouts

    return OnlineRollouts.open(config, world, tasks, source_model, device)
