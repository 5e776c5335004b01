"""What every rollout source gives the trainer: the `RolloutSource` protocol and one step's groups.

The trainer calls a source through these methods only, whichever it is:

- `start(named_parameters, step)` once, after `load_state`: bring up what generates, holding the
  weights of `step` (the model the trainer starts from);
- `next_batch(size)`: this rank's `size` groups of rewarded rollouts (`StepRollouts`);
- `publish(named_parameters, version)` after each batch's optimizer steps: the new weights, to
  whatever generates (in place, or through Ray's object store; recorded rollouts take none);
- `state()` / `load_state(state)`: the data position, saved with each checkpoint, so a resumed run
  reads on exactly where it stopped: a dict whose `taken` counts what this rank took from its
  `genesys.train.order.ItemOrder` and whose other values are lists of what it holds back for later
  (`reshard_states` deals them out when a run resumes on another number of processes);
- `close()`: stop what it started.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from genesys.errors import InputError
from genesys.schema import Row
from genesys.train.config import TrainConfig
from genesys.train.order import resumed_taken

DRAW_COLUMN = "train_draw"  # the task's position in the run's task stream: one group per draw
POLICY_STEP_COLUMN = "policy_step"  # the weights version that sampled a rollout (asynchronous mode)

# (parameter name, tensor) pairs, as `model.named_parameters()` gives them.
NamedParameters = Iterable[tuple[str, Any]]


@dataclass
class RewardTally:
    """Sums over the rewards of rollouts (those without a reward, errors, are not counted)."""

    total: float = 0.0
    squares: float = 0.0
    count: int = 0

    def add(self, rows: Iterable[Row]) -> None:
        for row in rows:
            if row.get("reward") is not None:
                reward = float(row["reward"])
                self.total += reward
                self.squares += reward * reward
                self.count += 1


@dataclass
class StepRollouts:
    """The groups of one step on this rank and how they were obtained."""

    groups: list[list[Row]]
    groups_seen: int = 0
    groups_dropped: int = 0
    rounds: int = 0
    errors: int = 0  # rollouts whose verification failed (reward None): never trained on
    generated_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    # every generated rollout's reward, dropped groups included (None: the source keeps no other
    # groups than `groups`)
    generated_rewards: RewardTally | None = None
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # metrics of the asynchronous mode, logged as they are


class RolloutSource(Protocol):
    """Where a training step's groups come from (see the module's docstring)."""

    def start(self, named_parameters: NamedParameters, step: int) -> None: ...

    def next_batch(self, size: int) -> StepRollouts: ...

    def publish(self, named_parameters: NamedParameters, version: int) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class FileSource:
    """A source read from files once, with nothing to generate: `start`, `publish` and `close` have
    nothing to do, and its state is how far its seeded `order` (`genesys.train.order.ItemOrder`) got."""

    order: Any

    def start(self, named_parameters: NamedParameters, step: int) -> None:
        pass

    def publish(self, named_parameters: NamedParameters, version: int) -> None:
        pass

    def close(self) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {"taken": self.order.taken}

    def load_state(self, state: dict[str, Any]) -> None:
        self.order.taken = state["taken"]


def reshard_states(states: list[dict[str, Any]], rank: int, world: int) -> dict[str, Any]:
    """The source state of rank `rank` of `world` ranks resuming from `states`, the states of the
    ranks that wrote the checkpoint (see the module's docstring): the stream goes on after the last
    position any of them read (`resumed_taken`), and what they held back is dealt out in turn."""
    state: dict[str, Any] = {"taken": resumed_taken([old["taken"] for old in states], rank, world)}
    for key in states[0]:
        if key != "taken":
            held = [item for old in states for item in old[key]]
            state[key] = held[rank::world]
    return state


def usable(group: Sequence[Row]) -> list[Row]:
    """The rollouts of a group that have a reward."""
    return [row for row in group if row.get("reward") is not None]


def load_tasks(config: TrainConfig) -> list[Row]:
    """The tasks of `data.tasks`, mixed and checked (`genesys.tasks.prepare`): each has a prompt, a
    verifier serves its type (unless verify.skip_unknown), and the reward can be computed for it.
    Errors name the task."""
    from genesys.tasks.prepare import prepare_tasks, select_tasks

    selected = select_tasks(config.data.tasks or [], mix=config.data.mix, seed=config.sampling.seed)
    tasks = prepare_tasks(selected, reward=config.reward, verify=config.verify_config()).rows
    if not tasks:
        raise InputError(f"data.tasks: no tasks in {', '.join(config.data.tasks or [])}")
    return tasks
