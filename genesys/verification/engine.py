"""The verification engine: a pool of worker processes, hard deadlines, crash recovery.

The local `VerificationPool`: rows are submitted with a key and come back, in completion order, with
`score`, `verification_result_info` and `error` added. Rows go to workers in batches of one
task_type; each worker publishes which rollout it is on and since when (shared memory), and the
engine kills a worker whose rollout passes its deadline, records a timeout for that rollout, gives
the rest of its batches to other workers and starts a replacement. A worker that dies on its own
(segfault, out of memory) is handled the same way, with a `worker_crash` error.
"""

from __future__ import annotations

import inspect
import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from genesys.config import VerifyConfig
from genesys.errors import InputError
from genesys.plugins.specs import Verifier, typed_options, unknown_options
from genesys.schema import ErrorKind, VerifyError, completion_problem
from genesys.verification.fork_server import WORKER_MODULE, environment_changes, fork_context
from genesys.verification.pool import VerificationPool
from genesys.verification.stats import TypeStats
from genesys.verification.task_types import unknown_type_error
from genesys.verification.wire import Results, RowBatch, Stop
from genesys.verification.worker import (
    IDLE,
    SEQ_ASYNC_BATCH,
    SEQ_SETUP,
    STATE_CPU,
    STATE_SEQ,
    STATE_SLOTS,
    STATE_START,
    worker_main,
)

DEADLINE_GRACE_S = 0.05
SETUP_TIMEOUT_S = 300.0
TICK_S = 0.05
# Batches are sized to take about this long, from the measured per-row cost (wall clock). Each batch
# costs the engine and its worker a pickle, a send and two wake-ups; rows of a few ms each (sandboxed
# code on a busy machine) made batches of one or two rows at 0.05 s, and that overhead most of the
# engine's CPU per row. A caller with few rows still gets small batches (their fair share).
TARGET_BATCH_S = 0.2
MAX_BATCH_ROWS = 512
ASYNC_BATCH_ROWS = 64  # rows an async verifier runs at once per worker, unless max_parallel says
BATCHES_AHEAD = 2  # batches queued per worker so it never waits for the engine
MAX_REQUEUES = 3  # a row handed back by this many unexplained worker deaths is recorded as a crash
DEATH_REAP_S = 0.5


@dataclass
class _SentBatch:
    """A batch a worker holds, until its final Results come back."""

    batch_id: int
    task_type: str
    timeout: float
    remaining: dict[int, None]  # seqs not yet confirmed, in order
    size: int


class _Worker:
    def __init__(self, ctx: Any, classes: Mapping[str, type[Verifier]], options: Mapping[str, Any]) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.state = ctx.RawArray("d", STATE_SLOTS)
        args = (child_conn, self.state, dict(classes), dict(options), environment_changes())
        self.process = ctx.Process(target=worker_main, args=args, daemon=True)
        self.process.start()
        child_conn.close()
        self.inflight: deque[_SentBatch] = deque()
        self.rows_done = 0
        # Sends go through a thread, so the engine's loop (and its deadlines) never waits on a pipe.
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._send_forever, daemon=True).start()

    def _send_forever(self) -> None:
        """Send queued messages until told to stop, then close the connection.

        Only this thread closes it: were the engine to close it while a send is under way, a new
        worker's pipe could reuse the descriptor and receive a dead worker's batch.
        """
        try:
            while (message := self._outbox.get()) is not None:
                self.conn.send_bytes(message)
        except (OSError, ValueError):
            # The worker is gone. The engine notices its death and still reads the pipe until then,
            # so it stays open until kill() or stop() says the engine is done with it.
            while self._outbox.get() is not None:
                pass
        finally:
            self.conn.close()

    def send(self, message: RowBatch | Stop) -> None:
        """Queue `message`; it is pickled here, so a message that cannot be sent raises in the caller."""
        self._outbox.put(ForkingPickler.dumps(message))

    def stop(self) -> None:
        """Ask the worker to tear down and exit once its queue is empty."""
        self.send(Stop())
        self._outbox.put(None)

    def current_rollout(self) -> tuple[float, float] | None:
        """(seq, started) of what the worker is doing now, or None when idle."""
        start = self.state[STATE_START]
        seq = self.state[STATE_SEQ]
        if start == IDLE or self.state[STATE_START] != start:
            return None
        return seq, start

    def cpu_since_mark(self) -> float | None:
        """CPU seconds the worker has used since it began its current rollout (None where the
        process's CPU time cannot be read)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError, TypeError):
            return None
        ticks = int(fields[11]) + int(fields[12])  # utime and stime: fields 14 and 15 of stat(5)
        return max(0.0, ticks / os.sysconf("SC_CLK_TCK") - self.state[STATE_CPU])

    def kill(self) -> None:
        """Kill the process; the sender thread closes the connection once it is done with it."""
        self._outbox.put(None)
        self.process.kill()
        self.process.join(timeout=5)


class VerificationEngine(VerificationPool):
    """A pool of verification worker processes on this machine; use as a context manager.

    Unknown task types are recorded as errors (callers that must refuse them check
    `known_task_types` first).
    """

    def __init__(
        self,
        config: VerifyConfig | None = None,
        verifiers: Mapping[str, type[Verifier]] | None = None,
        expected_types: Collection[str] | None = None,
    ) -> None:
        """`expected_types`: the task types the caller knows it will submit (when it knows); only
        their verifiers' `preload` modules are imported before the workers fork."""
        super().__init__()
        self.config = config or VerifyConfig()
        if verifiers is None:
            from genesys.plugins.registry import verifier_entries

            verifiers = {task_type: entry.cls for task_type, entry in verifier_entries().items()}
        self.classes = dict(verifiers)
        # A verifier without `accepted_options` may read any option, so a run that uses one cannot
        # tell a typo; one that does not (where the caller knows its task types) checks against
        # what every verifier that says what it reads reads.
        used = [self.classes[name] for name in expected_types or () if name in self.classes] or list(
            self.classes.values()
        )
        declared = [cls for cls in self.classes.values() if cls.accepted_options is not None]
        if all(cls.accepted_options is not None for cls in used):
            unknown = unknown_options(self.config.verifier_options(), declared)
        else:
            unknown = []
        if unknown:
            raise InputError(
                f"unknown verifier option(s) {', '.join(map(repr, unknown))} (-O/--option); the installed verifiers read: "
                + ", ".join(sorted(set().union(*(cls.accepted_options for cls in declared))))
            )
        for cls in used:  # a typed option with a bad value is refused here, before any work
            typed_options(cls, self.config.verifier_options())
        self._stats: dict[str, TypeStats] = {}
        self._ctx = fork_context(
            preload_modules(self.classes, expected_types), declared_preloads(self.classes, expected_types)
        )
        self._workers: list[_Worker] = []
        self._retired: list[_Worker] = []  # stopped after max_rows_per_worker, still tearing down
        self._rows: dict[int, tuple[Hashable, dict[str, Any]]] = {}
        self._pending: dict[str, deque[int]] = {}
        self._done: list[tuple[Hashable, dict[str, Any]]] = []
        self._seq = itertools.count()
        self._batch_ids = itertools.count()
        self._row_cost: dict[str, float] = {}
        self._requeues: dict[int, int] = {}
        self._type_cycle: deque[str] = deque()
        self._deadlines_checked = 0.0  # when `_check_deadlines` last ran (see `_pump`)

    @property
    def known_task_types(self) -> set[str]:
        return set(self.classes)

    @property
    def stats(self) -> dict[str, TypeStats]:
        return self._stats

    def start(self) -> None:
        self._workers = [self._new_worker() for _ in range(max(1, self.config.workers))]

    def shutdown(self) -> None:
        for worker in self._workers:
            worker.stop()
        deadline = time.monotonic() + 10
        for worker in self._workers + self._retired:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.kill()
        self._workers, self._retired = [], []

    def _new_worker(self) -> _Worker:
        return _Worker(self._ctx, self.classes, self.config.verifier_options())

    def timeout_for(self, task_type: str) -> float:
        return self.config.timeout or float(self.classes[task_type].timeout)

    # --- feeding and collecting -----------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return len(self._rows) + len(self._done)

    def submit(self, key: Hashable, row: dict[str, Any]) -> None:
        if not self._workers:
            raise RuntimeError("the verification engine is not running: use it as a context manager")
        task_type = row.get("task_type")
        if task_type not in self.classes:
            self._finish(
                key,
                row,
                None,
                {},
                VerifyError(ErrorKind.UNKNOWN_TYPE, unknown_type_error(task_type, self.classes)),
            )
            return
        problem = completion_problem(row, self.config.completion_field)
        if problem:  # never sent: a row without an answer is an error, not a wrong answer
            self._finish(key, row, None, {}, VerifyError(ErrorKind.SCHEMA, problem))
            return
        seq = next(self._seq)
        self._rows[seq] = (key, row)
        queue = self._pending.get(task_type)
        if queue is None:
            queue = self._pending[task_type] = deque()
            self._type_cycle.append(task_type)
        queue.append(seq)
        while len(self._rows) > self.config.max_pending_rows:
            self._pump(TICK_S)

    def poll(self, timeout: float = 0.0) -> list[tuple[Hashable, dict[str, Any]]]:
        if not self._done:
            self._pump(timeout)
        done, self._done = self._done, []
        return done

    # --- the event loop --------------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        self._dispatch()
        conns = {w.conn: w for w in self._workers}
        if conns:
            for conn in wait(list(conns), timeout=min(timeout, TICK_S) if timeout > 0 else 0):
                self._receive(conns[conn])
        now = time.monotonic()
        if now - self._deadlines_checked >= TICK_S:  # not at every call: a caller may poll without waiting
            self._deadlines_checked = now
            self._check_deadlines()
        self._dispatch()

    def _receive(self, worker: _Worker) -> None:
        if worker not in self._workers:
            return
        try:
            while worker.conn.poll():
                self._handle_message(worker, worker.conn.recv())
        except (EOFError, OSError):
            self._handle_death(worker)

    def _handle_message(self, worker: _Worker, results: Results) -> None:
        worker.rows_done += len(results)
        batch = next(b for b in worker.inflight if b.batch_id == results.batch_id)
        for seq, score, details, error in results.outcomes():
            if seq in batch.remaining:
                del batch.remaining[seq]
                key, row = self._rows.pop(seq)
                self._requeues.pop(seq, None)
                self._finish(key, row, score, details, error)
        if results.final:
            worker.inflight.remove(batch)
            if results.elapsed is not None:
                cost = results.elapsed / batch.size
                previous = self._row_cost.get(batch.task_type)
                self._row_cost[batch.task_type] = cost if previous is None else 0.7 * previous + 0.3 * cost
            for seq in batch.remaining:  # rows the worker did not answer for are tried again
                self._pending[batch.task_type].appendleft(seq)

    def _finish(
        self,
        key: Hashable,
        row: dict[str, Any],
        score: float | None,
        details: dict,
        error: VerifyError | None,
    ) -> None:
        out = dict(row)
        out["score"] = score
        out["verification_result_info"] = details
        out["error"] = None if error is None else str(error)
        self._stats.setdefault(str(row.get("task_type")), TypeStats()).add(score, error)
        self._done.append((key, out))

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if not worker.process.is_alive():
                self._receive(worker)
                if worker in self._workers:
                    self._handle_death(worker)
                continue
            current = worker.current_rollout()
            if current is None or not worker.inflight:
                continue
            seq, started = current
            in_setup = seq == SEQ_SETUP
            limit = SETUP_TIMEOUT_S if in_setup else worker.inflight[0].timeout
            if now > started + limit + DEADLINE_GRACE_S:
                self._receive(worker)  # results that raced with the deadline still count
                if worker in self._workers and worker.current_rollout() == current:
                    what = "verifier setup" if in_setup else "verification"
                    cpu = worker.cpu_since_mark()
                    # How much CPU the work got tells a starved worker (a busy machine) from work
                    # that ran the whole time.
                    used = "" if cpu is None else f" (it got {cpu:.1f} s of CPU)"
                    self._replace(
                        worker,
                        blame=current[0],
                        error=VerifyError(ErrorKind.TIMEOUT, f"{what} exceeded {limit:g}s{used}"),
                    )

    def _handle_death(self, worker: _Worker) -> None:
        current = worker.current_rollout()
        worker.process.join(timeout=DEATH_REAP_S)  # its pipe can close just before it is reaped
        code = worker.process.exitcode
        blame = current[0] if current else None
        what = "verifier setup" if blame == SEQ_SETUP else "verification"
        self._replace(
            worker,
            blame=blame,
            error=VerifyError(ErrorKind.CRASH, f"worker process died (exit code {code}) during {what}"),
        )

    def _replace(self, worker: _Worker, blame: float | None, error: VerifyError) -> None:
        """Kill `worker`, record `error` for the rollout(s) it was stuck on, requeue the rest, start a new one."""
        worker.kill()
        self._workers.remove(worker)
        if worker.inflight:
            current = worker.inflight[0]
            if blame == SEQ_ASYNC_BATCH or blame == SEQ_SETUP:
                blamed = list(current.remaining)
            elif blame is not None and int(blame) in current.remaining:
                blamed = [int(blame)]
            else:
                blamed = []
            for seq in blamed:
                del current.remaining[seq]
                key, row = self._rows.pop(seq)
                self._requeues.pop(seq, None)
                self._finish(key, row, None, {}, error)
            for batch in reversed(worker.inflight):
                for seq in reversed(batch.remaining):
                    self._requeue_after_death(batch.task_type, seq, suspect=not blamed)
        self._workers.append(self._new_worker())

    def _requeue_after_death(self, task_type: str, seq: int, suspect: bool) -> None:
        """Give a dead worker's row to another. When the death was pinned on some other rollout the
        row is innocent; otherwise it is a suspect, and one that keeps coming back is given up on."""
        if not suspect:
            self._pending[task_type].appendleft(seq)
            return
        count = self._requeues[seq] = self._requeues.get(seq, 0) + 1
        if count > MAX_REQUEUES:
            key, row = self._rows.pop(seq)
            del self._requeues[seq]
            self._finish(
                key,
                row,
                None,
                {},
                VerifyError(ErrorKind.CRASH, f"{count} workers died while this row was queued on them"),
            )
        else:
            self._pending[task_type].appendleft(seq)

    def _dispatch(self) -> None:
        if not self._type_cycle:
            return
        for worker in list(self._workers):
            limit = self.config.max_rows_per_worker
            if limit is not None and worker.rows_done >= limit:
                if not worker.inflight:  # it takes no new batches; retired once the last one is back
                    self._retire(worker)
                continue
            while worker in self._workers and len(worker.inflight) < BATCHES_AHEAD:
                task_type = self._next_type(worker)
                if task_type is None:
                    break
                self._send_batch(worker, task_type)

    def _retire(self, worker: _Worker) -> None:
        """Replace a worker that has served its share of rows; it tears down and exits on its own."""
        worker.stop()
        self._workers.remove(worker)
        self._retired = [w for w in self._retired if w.process.is_alive()] + [worker]
        self._workers.append(self._new_worker())

    def _next_type(self, worker: _Worker) -> str | None:
        """The next task_type with pending rows that this worker may take (round robin, max_parallel)."""
        for _ in range(len(self._type_cycle)):
            task_type = self._type_cycle[0]
            self._type_cycle.rotate(-1)
            if not self._pending[task_type]:
                continue
            cap = self._worker_cap(task_type)
            if cap is not None and not any(b.task_type == task_type for b in worker.inflight):
                busy = sum(1 for w in self._workers if any(b.task_type == task_type for b in w.inflight))
                if busy >= cap:
                    continue
            return task_type
        return None

    def _worker_cap(self, task_type: str) -> int | None:
        """How many workers may hold this type at once. max_parallel bounds verifications in flight:
        for plain verifiers that is workers; an async one runs max_parallel rows in one worker."""
        cls = self.classes[task_type]
        if cls.max_parallel is None:
            return None
        return 1 if _is_async(cls) else cls.max_parallel

    def _batch_size(self, task_type: str) -> int:
        pending = len(self._pending[task_type])
        cls = self.classes[task_type]
        if _is_async(cls):  # an async batch runs concurrently: its size is the concurrency
            return max(1, min(pending, cls.max_parallel or ASYNC_BATCH_ROWS))
        fair_share = -(-pending // (len(self._workers) * BATCHES_AHEAD))
        cost = self._row_cost.get(task_type)
        by_cost = 8 if cost is None else int(TARGET_BATCH_S / max(cost, 1e-6))
        return max(1, min(MAX_BATCH_ROWS, by_cost, fair_share))

    def _send_batch(self, worker: _Worker, task_type: str) -> None:
        queue = self._pending[task_type]
        seqs = [queue.popleft() for _ in range(min(len(queue), self._batch_size(task_type)))]
        batch = _SentBatch(
            next(self._batch_ids), task_type, self.timeout_for(task_type), dict.fromkeys(seqs), len(seqs)
        )
        rows = [self._rows[seq][1] for seq in seqs]
        try:
            worker.send(RowBatch(batch.batch_id, task_type, batch.timeout, seqs, rows))
        except Exception as exc:  # a row that cannot be pickled (rows read from files always can)
            seq = next((seq for seq, row in zip(seqs, rows) if not _picklable(row)), seqs[0])
            raise TypeError(
                f"row {self._rows[seq][0]!r} cannot be sent to a verification worker: {exc}"
            ) from exc
        worker.inflight.append(batch)


def declared_preloads(
    classes: Mapping[str, type[Verifier]], expected_types: Collection[str] | None = None
) -> set[str]:
    """The `preload` the verifiers of `expected_types` (all of them when None) declare: modules too
    heavy for each worker to import again."""
    return {
        module
        for task_type, cls in classes.items()
        if expected_types is None or task_type in expected_types
        for module in cls.preload
    }


def preload_modules(
    classes: Mapping[str, type[Verifier]], expected_types: Collection[str] | None = None
) -> list[str]:
    """Modules the fork server imports before workers fork: the worker's own, those that define the
    verifier classes (every worker unpickles every class, so each would import them again), and the
    `declared_preloads` of `expected_types`."""
    defining = {cls.__module__ for cls in classes.values()} - {"__main__"}
    return [WORKER_MODULE, *sorted(defining | declared_preloads(classes, expected_types))]


def _picklable(row: dict[str, Any]) -> bool:
    try:
        ForkingPickler.dumps(row)
    except Exception:
        return False
    return True


def _is_async(cls: type[Verifier]) -> bool:
    return inspect.iscoroutinefunction(cls.verify)
