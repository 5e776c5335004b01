"""The bookkeeping of the one supervised actor pool (`genesys.cluster.pool`), against a stand-in for
Ray that runs nothing: which actor a call goes to, Ray's restart policy on every actor, restarts
noticed from the actor table, and a clean close. The pool on a real Ray, actors killed included,
is tested in test_train_ray.py."""

from __future__ import annotations

import itertools
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from genesys.cluster import pool as pool_module
from genesys.cluster.pool import ActorFailed, ActorPool
from genesys.cluster.session import MAX_TASK_RETRIES, NAMESPACE


class RayActorError(Exception):
    pass


class FakeRay:
    """Records actors, calls and kills; a call finishes when the test says so."""

    exceptions = SimpleNamespace(RayActorError=RayActorError)

    def __init__(self) -> None:
        self.ids = itertools.count()
        self.created: list[dict[str, Any]] = []
        self.calls: list[tuple[int, str, tuple[Any, ...], str | None]] = []
        self.values: dict[int, Any] = {}
        self.finished: list[int] = []
        self.restarts: dict[str, int] = {}
        self.killed: list[int] = []
        self.cancelled: list[int] = []
        self._private = SimpleNamespace(state=SimpleNamespace(actors=self._actor_table))

    def _actor_table(self, actor_id: str) -> dict[str, Any]:
        return {"NumRestarts": self.restarts.get(actor_id, 0)}

    def remote(self, cls: Any = None, **decorator: Any) -> Any:
        if cls is None:
            return lambda c: self.remote(c, **decorator)
        ray = self

        class Remote:
            def options(self, **options: Any) -> Any:
                ray.created.append({**decorator, **options})
                return self

            def remote(self, *args: Any) -> Handle:
                return Handle(ray, len(ray.created) - 1)

        return Remote()

    def finish(self, ref: int, value: Any = None) -> None:
        self.values[ref] = value
        self.finished.append(ref)

    def wait(self, refs: list[int], num_returns: int, timeout: float | None) -> tuple[list[int], list[int]]:
        done = [ref for ref in refs if ref in self.finished][:num_returns]
        return done, [ref for ref in refs if ref not in done]

    def get(self, ref: int) -> Any:
        value = self.values[ref]
        if isinstance(value, Exception):
            raise value
        return value

    def cancel(self, ref: int) -> None:
        self.cancelled.append(ref)

    def kill(self, handle: Handle) -> None:
        self.killed.append(handle.index)


class Handle:
    def __init__(self, ray: FakeRay, index: int) -> None:
        self.ray, self.index = ray, index
        self._actor_id = SimpleNamespace(hex=lambda: f"actor{index}")

    def __getattr__(self, method: str) -> Any:
        ray, index = self.ray, self.index

        class Method:
            group: str | None = None

            def options(self, concurrency_group: str) -> Method:
                self.group = concurrency_group
                return self

            def remote(self, *args: Any) -> int:
                ref = next(ray.ids)
                ray.calls.append((index, method, args, self.group))
                return ref

        return Method()


class Worker:
    pass


def make_pool(ray: FakeRay, size: int = 3, **options: Any) -> ActorPool:
    return ActorPool(ray, Worker, ("arg",), size=size, cpus=2, gpus=0.5, role="test actor", **options)


def test_every_actor_is_started_with_rays_restart_policy_and_its_name():
    ray = FakeRay()
    make_pool(ray, size=2, name="run-rollout", concurrency_groups={"weights": 1})
    assert ray.created == [
        {
            "concurrency_groups": {"weights": 1},
            "num_cpus": 2,
            "num_gpus": 0.5,
            "max_restarts": -1,
            "max_task_retries": MAX_TASK_RETRIES,
            "namespace": NAMESPACE,
            "name": f"run-rollout-{index}",
        }
        for index in range(2)
    ]


def test_calls_go_to_the_least_loaded_actor_and_broadcasts_count_for_no_load():
    ray = FakeRay()
    pool = make_pool(ray)
    first = pool.submit("verify", "rows a", load=10)
    pool.submit("verify", "rows b", load=3)
    pool.submit("verify", "rows c", load=5)
    pool.broadcast("load_weights", "w", group="weights")
    pool.submit("verify", "rows d", load=1)  # to actor 1, which holds the least (3)
    assert [(slot, args[0]) for slot, method, args, _ in ray.calls if method == "verify"] == [
        (0, "rows a"),
        (1, "rows b"),
        (2, "rows c"),
        (1, "rows d"),
    ]
    assert [(slot, group) for slot, method, _, group in ray.calls if method == "load_weights"] == [
        (0, "weights"),
        (1, "weights"),
        (2, "weights"),
    ]
    assert [pool.load(slot) for slot in range(3)] == [10, 4, 5]
    ray.finish(first, "verified a")
    ((ref, call),) = pool.ready(timeout=0)
    assert pool.result(ref, call) == "verified a" and call.slot == 0 and pool.load(0) == 0
    assert pool.least_loaded() == (0, 0)


def test_a_restart_in_rays_actor_table_is_noticed_once_and_marks_the_calls_it_caught(caplog, monkeypatch):
    ray = FakeRay()
    pool = make_pool(ray, size=2)
    before = pool.submit("generate", "chunk 1", slot=1)
    ray.restarts["actor1"] = 1  # Ray restarts actor 1 (and sends it chunk 1 again)
    monkeypatch.setattr(pool_module, "CHECK_EVERY_S", 0.0)
    with caplog.at_level(logging.WARNING, logger="genesys.cluster.pool"):
        assert pool.ready(timeout=0) == []  # nothing finished, but the restart shows
        after = pool.submit("generate", "chunk 2", slot=1)
        ray.finish(before, "one")
        ray.finish(after, "two")
        done = dict(pool.ready(timeout=0))
    assert [pool.resent(done[before]), pool.resent(done[after])] == [True, False]
    assert [pool.result(ref, call) for ref, call in done.items()] == ["one", "two"]
    assert pool.restarts == 1
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "test actor 1 was restarted by Ray (1 restart so far); its calls out were sent to it again"
    ]


def test_a_call_ray_gave_up_on_fails_naming_the_actor():
    ray = FakeRay()
    pool = make_pool(ray, size=2)
    ref = pool.submit("verify", "rows", slot=1)
    ray.finish(ref, RayActorError("the actor died 4 times"))
    ((ref, call),) = pool.ready(timeout=0)
    with pytest.raises(ActorFailed, match="test actor 1 failed: the actor died 4 times"):
        pool.result(ref, call)


def test_close_cancels_the_calls_out_and_kills_every_actor():
    ray = FakeRay()
    pool = make_pool(ray)
    refs = [pool.submit("generate", index) for index in range(4)]
    ray.finish(refs[0])
    pool.ready(timeout=0)
    pool.close()
    assert sorted(ray.cancelled) == refs[1:]  # a cancelled call is not sent again by Ray
    assert ray.killed == [0, 1, 2] and pool.actors == [] and not pool.flying
