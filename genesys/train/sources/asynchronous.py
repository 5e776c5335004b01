"""Asynchronous rollouts on Ray: generation and verification run apart from the trainer, at most
`async.max_staleness` (k) policy steps behind it.

`cluster.rollout_workers` generation actors (`genesys.cluster.generation.GenerationActor`, one
`genesys.cluster.pool.ActorPool`) each take one job of task draws at a time; their rows go to
verification actors (`genesys.verification.ray_pool`), so a slow sandbox never holds up generation;
rewarded groups with signal wait in a ready queue, each tagged with the policy step that sampled
it. A thread of the trainer's process keeps this pipeline moving while the trainer computes.

How far generation may run ahead: weights of version v serve the steps v+1 .. v+k+1, so while the
trainer has taken `taken` batches and published version `version`, the groups in flight or ready
are capped at `(version + k + 1 - taken)` batches. With k = 0 that is the synchronous loop (the
next batch is generated only once the weights that must make it are published); with k = 1 the
next batch is generated while the trainer trains on the current one.

The trainer takes a group only if its policy step is at least `step - k`; an older one is dropped
and counted, and its place is generated again. Each job names the weights version published when
it was sent, and a worker loads that version before it generates unless it holds it already; so
when a worker dies, Ray restarts it and sends it the job again, and the restarted worker catches
up on the weights by itself (the restart is logged and counted, the job's draws counted as sent
again). The data position (the task stream's counter, and the draws sent but not yet trained) is
saved with each checkpoint; a resumed run sends those draws again first.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from genesys.cluster.generation import LANES, WEIGHTS_LANE, Generated, GenerationActor
from genesys.cluster.pool import ActorPool, Call
from genesys.cluster.session import ray_session
from genesys.cluster.weights import PublishedWeights, publish
from genesys.generate.episodes import generate_and_play
from genesys.generate.rows import PlannedTask, RowBuilder
from genesys.rewards import RewardStage
from genesys.schema import Row
from genesys.train.config import TrainConfig
from genesys.train.groups import has_signal
from genesys.train.order import ItemOrder
from genesys.train.sources.base import (
    DRAW_COLUMN,
    POLICY_STEP_COLUMN,
    NamedParameters,
    RewardTally,
    StepRollouts,
    usable,
)
from genesys.train.sources.online import colocated_vllm_options, draw_requests, draw_rows, row_builder
from genesys.verification.ray_pool import RayVerificationPool

log = logging.getLogger(__name__)
TICK_S = 0.02


@dataclass
class _Job:
    """Task draws sent to one worker: (stream position, task index) pairs, and their rows' plans."""

    draws: list[tuple[int, int]]
    plans: dict[str, PlannedTask]
    resent: bool = False  # its worker was restarted while it was out: counted in requests_resent


@dataclass
class _Load:
    """A published version sent to one worker's weights lane."""

    version: int


@dataclass
class _Group:
    """The rollouts of one draw: filled in as verification returns them."""

    position: int
    version: int
    rows: list[Row | None]
    pending: int


@dataclass
class _Broadcast:
    """The load of one published version on every worker, for the publish-to-loaded time."""

    weights: PublishedWeights
    waiting: set[int]
    last_loaded: float = 0.0


@dataclass
class _Counts:
    """What happened since the last batch was taken."""

    groups_seen: int = 0
    groups_dropped: int = 0
    stale_dropped: int = 0
    worker_restarts: int = 0
    requests_resent: int = 0
    generation_busy_s: float = 0.0
    generated_tokens: int = 0
    jobs: int = 0
    rewards: RewardTally = field(default_factory=RewardTally)
    extra: dict[str, float] = field(default_factory=dict)


class AsyncRollouts:
    """The rollout source of `cluster.backend = "ray"`: groups within the staleness bound."""

    def __init__(self, config: TrainConfig, tasks: list[Row], source_model: str, ray: Any) -> None:
        self.config = config
        self.tasks = tasks
        self.source_model = source_model
        self.ray = ray
        self.size = config.rollout.prompts_per_step
        self.bound = config.async_.max_staleness
        self.cluster = config.cluster
        self.run_id = uuid.uuid4().hex[:8]  # names this run's actors apart from other runs' on the cluster
        self.job_groups = math.ceil(self.size / self.cluster.rollout_workers)
        self.order = ItemOrder(len(tasks), config.sampling.seed)
        self.requeue: deque[tuple[int, int]] = deque()
        self.rewards = RewardStage(config.reward)
        self.builder: RowBuilder | None = None  # set with the workers, once the backend's name is resolved
        self.pool = RayVerificationPool(config.verify_config())
        self.workers: ActorPool | None = None
        self.taken = 0  # batches taken by the trainer (the trainer's step when it asks for the next)
        self.version = 0  # the newest published weights version
        self.published: PublishedWeights | None = None
        self.engine_dtype: Any = None  # the rollout workers' weights dtype, known once they are started
        self.broadcast: _Broadcast | None = None
        self.last_broadcast_s: float | None = None
        self.restarts_counted = 0  # worker restarts already reported in a batch's metrics
        self.live: dict[int, int] = {}  # position -> task index: sent, and neither trained on nor dropped
        self.verifying: dict[int, _Group] = {}
        self.ready: list[_Group] = []
        self.counts = _Counts()
        self.cond = threading.Condition()
        self.failure: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="genesys-async-rollouts", daemon=True)
        self._session: contextlib.ExitStack | None = None

    @classmethod
    def open(cls, config: TrainConfig, tasks: list[Row], source_model: str) -> AsyncRollouts:
        """The source on a Ray session of its own (joined or started here, left on `close`); its
        actors start with `start`, once the checkpoint's state is restored."""
        cluster = config.cluster
        needed = (
            cluster.rollout_workers * cluster.rollout_cpus + cluster.verifier_workers * cluster.verifier_cpus
        )
        session = contextlib.ExitStack()
        try:
            rollouts = cls(config, tasks, source_model, session.enter_context(ray_session(cluster, needed)))
        except BaseException:
            session.close()
            raise
        rollouts._session = session
        return rollouts

    # --- the trainer's side -------------------------------------------------------------------------

    def start(self, named_parameters: NamedParameters, step: int) -> None:
        """Bring the actors up for a run at `step` (the checkpoint's weights, published as version `step`)."""
        self.pool.start()
        self.taken = self.version = step
        self.workers = self._start_workers()
        if step:
            self.publish(named_parameters, step)
        self._thread.start()

    def publish(self, named_parameters: NamedParameters, version: int) -> None:
        """Publish the trainer's weights as `version`; every worker loads them before its next job."""
        weights = publish(self.ray, named_parameters, version, self.engine_dtype)
        with self.cond:
            assert self.workers is not None
            self.published, self.version = weights, version
            self.broadcast = _Broadcast(weights, set(range(len(self.workers))))
            self.workers.broadcast("load_weights", weights, tag=_Load(version), group=WEIGHTS_LANE)
            self.cond.notify_all()

    def next_batch(self, size: int) -> StepRollouts:
        """`size` groups whose policy step is within the bound (fewer when refilling gives up)."""
        started = time.perf_counter()
        waited = False
        with self.cond:
            while True:
                if self.failure is not None:
                    raise RuntimeError(f"asynchronous rollouts failed: {self.failure}") from self.failure
                self._drop_stale()
                if (
                    len(self.ready) >= size
                    or self.counts.groups_dropped >= self.config.rollout.max_refill_rounds * size
                ):
                    break
                if not waited:
                    log.info(
                        "step %d: waiting for rollouts (%d of %d groups ready, %d in flight)",
                        self.taken + 1,
                        len(self.ready),
                        size,
                        len(self.live) - len(self.ready),
                    )
                    waited = True
                self.cond.wait(0.5)
            batch, self.ready = self.ready[:size], self.ready[size:]
            for group in batch:
                self.live.pop(group.position)
            step = self._step_rollouts(batch, time.perf_counter() - started)
            self.taken += 1
            self.cond.notify_all()
        hist = step.extra["staleness_hist"]
        log.info(
            "step %d: staleness histogram %s, waited %.2f s", self.taken, hist, step.extra["trainer_wait_s"]
        )
        return step

    def state(self) -> dict[str, Any]:
        """The data position: the stream counter and the draws sent but not trained on (sent again on resume)."""
        with self.cond:
            return {"taken": self.order.taken, "requeue": [*self.requeue, *self.live.items()]}

    def load_state(self, state: dict[str, Any]) -> None:
        self.order.taken = state["taken"]
        self.requeue = deque((int(position), int(index)) for position, index in state["requeue"])

    def close(self) -> None:
        """Stop the pipeline and its actors, and leave the Ray session opened for it."""
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        try:
            if self.workers is not None:
                self.workers.close()
            self.pool.close()
        finally:
            if self._session is not None:
                self._session.close()

    # --- the pipeline thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    if self._stopping:
                        return
                    self._dispatch()
                ready = self._wait()
                with self.cond:
                    for ref, call in ready:
                        if isinstance(call.tag, _Job):
                            self._job_done(ref, call)
                        else:
                            self._load_done(ref, call)
                    self._count_restarts()
                    for key, row in self.pool.poll(0):
                        self._verified(key, row)
                    self.cond.notify_all()
        except BaseException as exc:  # the trainer hears of it at its next batch
            log.exception("asynchronous rollouts stopped")
            with self.cond:
                self.failure = exc
                self.cond.notify_all()

    def _wait(self) -> list[tuple[Any, Call]]:
        """The calls to the workers that are done, after at most one tick."""
        assert self.workers is not None
        if not self.workers.flying:
            time.sleep(TICK_S)
            return []
        return self.workers.ready(TICK_S)

    def _dispatch(self) -> None:
        """Send jobs to idle workers while the staleness budget allows more groups."""
        workers = self.workers
        assert workers is not None
        budget = (self.version + self.bound + 1 - self.taken) * self.size - len(self.live)
        for slot in range(len(workers)):
            if budget <= 0:
                return
            if workers.load(slot):
                continue
            count = min(self.job_groups, budget)
            draws = [self.requeue.popleft() for _ in range(min(count, len(self.requeue)))]
            draws += self.order.take(count - len(draws))
            self.live.update(draws)
            requests, plans = draw_requests(
                self.config, [(position, self.tasks[index]) for position, index in draws]
            )
            workers.check(slot)  # so a restart counts the job as sent again only if it came after this
            tasks = {key: plan.row for key, plan in plans.items()}  # environment tasks are played
            workers.submit("generate", requests, self.published, tasks, slot=slot, tag=_Job(draws, plans))
            self.counts.jobs += 1
            budget -= count

    def _job_done(self, ref: Any, call: Call) -> None:
        workers = self.workers
        assert workers is not None
        job: _Job = call.tag
        generated: Generated = workers.result(ref, call)
        self._count_resent(call)
        self.counts.generation_busy_s += generated.seconds
        assert self.builder is not None
        rows = draw_rows(self.builder, job.plans, generated.results)
        self.counts.generated_tokens += rows.tokens
        by_draw: dict[int, list[Row]] = {}
        for row in rows.rows:
            row[POLICY_STEP_COLUMN] = generated.weights_version
            by_draw.setdefault(row[DRAW_COLUMN], []).append(row)
        for position, group in by_draw.items():
            self.verifying[position] = _Group(
                position, generated.weights_version, [None] * len(group), len(group)
            )
            for sample, row in enumerate(group):
                self.pool.submit((position, sample), row)

    def _load_done(self, ref: Any, call: Call) -> None:
        assert self.workers is not None
        _, loaded_at = self.workers.result(ref, call)
        broadcast = self.broadcast
        if broadcast is None or broadcast.weights.version != call.tag.version:
            return
        broadcast.waiting.discard(call.slot)
        broadcast.last_loaded = max(broadcast.last_loaded, loaded_at)
        if not broadcast.waiting:
            self.last_broadcast_s = broadcast.last_loaded - broadcast.weights.published_at
            self.broadcast = None

    def _count_restarts(self) -> None:
        """Count the worker restarts the pool noticed, and the jobs Ray sends again for them."""
        workers = self.workers
        assert workers is not None
        self.counts.worker_restarts += workers.restarts - self.restarts_counted
        self.restarts_counted = workers.restarts
        for call in workers.flying.values():
            self._count_resent(call)

    def _count_resent(self, call: Call) -> None:
        job = call.tag
        if (
            isinstance(job, _Job)
            and not job.resent
            and self.workers is not None
            and self.workers.resent(call)
        ):
            job.resent = True
            self.counts.requests_resent += len(job.draws)

    def _verified(self, key: tuple[int, int], row: Row) -> None:
        position, sample = key
        group = self.verifying[position]
        group.rows[sample] = self.rewards.apply(row)
        group.pending -= 1
        if group.pending:
            return
        del self.verifying[position]
        self.counts.groups_seen += 1
        rows = [r for r in group.rows if r is not None]
        self.counts.rewards.add(rows)
        if self.config.rollout.filter_groups and not has_signal(rows, self.config.rollout.filter_signal):
            self.counts.groups_dropped += 1
            self.live.pop(position)
            return
        group.rows = rows  # type: ignore[assignment]
        self.ready.append(group)

    def _drop_stale(self) -> None:
        """Drop ready groups sampled by a policy more than `bound` steps older than the trainer's."""
        oldest = self.taken - self.bound
        stale = [group for group in self.ready if group.version < oldest]
        if not stale:
            return
        self.ready = [group for group in self.ready if group.version >= oldest]
        for group in stale:
            self.live.pop(group.position)
        self.counts.stale_dropped += len(stale)
        log.info("step %d: dropped %d groups older than policy step %d", self.taken + 1, len(stale), oldest)

    def _step_rollouts(self, batch: list[_Group], waited: float) -> StepRollouts:
        counts, self.counts = self.counts, _Counts()
        staleness = [self.taken - group.version for group in batch]
        groups = [group.rows for group in batch]
        step = StepRollouts(
            groups=groups,  # type: ignore[arg-type]
            groups_seen=counts.groups_seen,
            groups_dropped=counts.groups_dropped,
            rounds=counts.jobs,
            errors=sum(len(g) - len(usable(g)) for g in groups),
            generated_tokens=counts.generated_tokens,  # type: ignore[arg-type]
            generated_rewards=counts.rewards,
        )
        step.extra = {
            "staleness_mean": sum(staleness) / len(staleness) if staleness else None,
            "staleness_max": max(staleness, default=None),
            "staleness_hist": {str(s): n for s, n in sorted(Counter(staleness).items())},
            "trainer_wait_s": waited,
            "groups_stale_dropped": counts.stale_dropped,
            "worker_restarts": counts.worker_restarts,
            "requests_resent": counts.requests_resent,
            "generation_busy_s": counts.generation_busy_s,
            "weights_load_s": self.last_broadcast_s,
            "draws": sorted(group.position for group in batch),
        }
        return step

    def _start_workers(self) -> ActorPool:
        """The rollout workers: generation actors with a weights lane, named `<run>-rollout-<i>`."""
        from genesys.generate.backend import create_backend, resolve_backend_name

        cluster, config = self.cluster, self.config
        backend = resolve_backend_name(config.backend)
        self.builder = row_builder(config, backend)
        options = config.backend_options.for_backend(backend)
        if backend == "transformers":
            options.setdefault("batch_size", self.job_groups * config.sampling.n)
            options.setdefault("device", "cuda" if cluster.rollout_gpus > 0 else "cpu")
        if backend == "vllm":  # the engine in the actor's process, so that it takes weights in place
            options.update(colocated_vllm_options(config, options.get("engine_args")))
        self.engine_dtype = engine_dtype(backend, options, self.source_model)
        make_backend = functools.partial(create_backend, backend, self.source_model, config.style, options)
        return ActorPool(
            self.ray,
            GenerationActor,
            (make_backend, generate_and_play),
            size=cluster.rollout_workers,
            cpus=cluster.rollout_cpus,
            gpus=cluster.rollout_gpus,
            role="rollout worker",
            name=f"{self.run_id}-rollout",
            concurrency_groups=LANES,
        )


def engine_dtype(backend: str, options: dict[str, Any], model: str) -> Any:
    """The torch dtype the rollout workers' engine holds its weights in (published weights are cast
    to it before they leave the trainer): vLLM's `dtype` engine argument; for transformers its
    `dtype` option, else float32 on CPU and the checkpoint's own dtype on GPU. None when unknown."""
    import torch

    if backend == "vllm":
        name = str(options.get("engine_args", {}).get("dtype", "auto"))
    elif backend == "transformers":
        name = str(options.get("dtype") or ("float32" if options.get("device") == "cpu" else "auto"))
    else:
        return None
    if name == "auto":
        from transformers import AutoConfig

        name = str(getattr(AutoConfig.from_pretrained(model), "dtype", None) or "float32")
    dtype = getattr(torch, name.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) else None
