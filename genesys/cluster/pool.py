"""The one supervised actor pool: `size` actors of one class, kept alive by Ray.

Every actor is started with Ray's restart policy (`session.actor_options`): when one dies, Ray
starts it again from the same constructor arguments under the same handle and name, and sends it
again the calls it was running or that reached it while it restarted. Nothing here replaces an
actor or resends work. What the pool does is the bookkeeping the callers share: which call went
to which actor, each actor's load (calls go to the least-loaded one unless a caller names one),
waiting for results, noticing from Ray's actor table that an actor was restarted (logged, and
counted in `restarts`; `resent` says whether a call's actor was restarted while it was out), and
killing the actors at the end.

Work sent to a pool must therefore be safe to run again on a fresh actor: each call carries what
it needs. Stateless actors (the verification engine, `genesys generate`'s generation actors) are
so by nature; the rollout workers of training hold weights, so every job names the weights it must
run on, and a restarted worker loads them before it generates (`genesys.cluster.generation`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from genesys.cluster.session import actor_options, restart_count

log = logging.getLogger(__name__)
CHECK_EVERY_S = 1.0  # how often `ready` looks up every actor's restarts, besides after each call


@dataclass
class Call:
    """One call out to an actor: its slot, the caller's tag, the load it counts for, and the
    actor's restart count (as far as the pool knew) when it was sent."""

    slot: int
    tag: Any
    load: int
    restarts: int


class ActorFailed(RuntimeError):
    """Ray gave up on a call: its actor died more often than the retries allow, or could not start."""


class ActorPool:
    """`size` actors of `cls(*args)`, each declaring `cpus` and `gpus`, supervised by Ray.

    `role` names the actors in logs and errors ("verifier actor 1"); with `name`, actor `i` is
    registered as `{name}-{i}` in the genesys namespace. `concurrency_groups` gives the actor
    lanes that run beside its default one (a call picks one with `group`).
    """

    def __init__(
        self,
        ray: Any,
        cls: type,
        args: tuple[Any, ...],
        *,
        size: int,
        cpus: float,
        gpus: float = 0.0,
        role: str = "actor",
        name: str | None = None,
        concurrency_groups: dict[str, int] | None = None,
    ) -> None:
        self.ray = ray
        self.role = role
        remote = (
            ray.remote(concurrency_groups=concurrency_groups)(cls) if concurrency_groups else ray.remote(cls)
        )
        self.actors = [
            remote.options(**actor_options(cpus, gpus, f"{name}-{index}" if name else None)).remote(*args)
            for index in range(size)
        ]
        self.flying: dict[Any, Call] = {}
        self.seen_restarts = [0] * size  # per actor: the restarts the pool has noticed
        self._checked_at = time.monotonic()

    def __len__(self) -> int:
        return len(self.actors)

    @property
    def restarts(self) -> int:
        """Restarts of this pool's actors noticed so far."""
        return sum(self.seen_restarts)

    def load(self, slot: int) -> int:
        """The load of the calls out to actor `slot`."""
        return sum(call.load for call in self.flying.values() if call.slot == slot)

    def least_loaded(self) -> tuple[int, int]:
        """The actor with the least load, and that load."""
        loads = [0] * len(self.actors)
        for call in self.flying.values():
            loads[call.slot] += call.load
        slot = min(range(len(loads)), key=loads.__getitem__)
        return slot, loads[slot]

    def submit(
        self,
        method: str,
        *args: Any,
        slot: int | None = None,
        load: int = 1,
        tag: Any = None,
        group: str | None = None,
    ) -> Any:
        """Call `method(*args)` on actor `slot` (the least-loaded one by default); returns its ref."""
        if slot is None:
            slot, _ = self.least_loaded()
        function = getattr(self.actors[slot], method)
        if group is not None:
            function = function.options(concurrency_group=group)
        ref = function.remote(*args)
        self.flying[ref] = Call(slot, tag, load, self.seen_restarts[slot])
        return ref

    def broadcast(self, method: str, *args: Any, tag: Any = None, group: str | None = None) -> None:
        """Call `method(*args)` on every actor; such calls count for no load."""
        for slot in range(len(self.actors)):
            self.submit(method, *args, slot=slot, load=0, tag=tag, group=group)

    def ready(self, timeout: float | None = None, num_returns: int | None = None) -> list[tuple[Any, Call]]:
        """Calls that finished, taken out of the pool: waits until `num_returns` of them (default all
        out) are done or `timeout` seconds passed. Their values come from `result`."""
        if not self.flying:
            return []
        refs = list(self.flying)
        done, _ = self.ray.wait(refs, num_returns=min(num_returns or len(refs), len(refs)), timeout=timeout)
        if time.monotonic() - self._checked_at >= CHECK_EVERY_S:  # a restart shows before its calls end
            self._checked_at = time.monotonic()
            for slot in range(len(self.actors)):
                self.check(slot)
        return [(ref, self.flying.pop(ref)) for ref in done]

    def result(self, ref: Any, call: Call) -> Any:
        """The value of a finished call; an ActorFailed when Ray gave up on it."""
        try:
            value = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:
            raise ActorFailed(f"{self.role} {call.slot} failed: {exc}") from exc
        self.check(call.slot)
        return value

    def resent(self, call: Call) -> bool:
        """Whether a call's actor was restarted while the call was out (so Ray sends it again)."""
        return self.seen_restarts[call.slot] > call.restarts

    def close(self) -> None:
        """Cancel the calls out and kill the actors (for good: a killed actor is not restarted, and a
        cancelled call is not sent again)."""
        for ref in self.flying:
            with contextlib.suppress(Exception):  # a call that finished meanwhile has nothing to cancel
                self.ray.cancel(ref)
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        self.flying.clear()

    def check(self, slot: int) -> None:
        """Look up in Ray's actor table whether actor `slot` was restarted since the pool last
        looked (done for every finished call and every `CHECK_EVERY_S` by `ready`; a caller may look
        before sending too). Ray counts a restart as soon as it begins one."""
        count = restart_count(self.ray, self.actors[slot])
        if count > self.seen_restarts[slot]:
            log.warning(
                "%s %d was restarted by Ray (%d restart%s so far); its calls out were sent to it again",
                self.role,
                slot,
                count,
                "" if count == 1 else "s",
            )
            self.seen_restarts[slot] = count
