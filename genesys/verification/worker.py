"""The verification worker process: runs verifiers on batches of rows sent by the engine.

The worker never enforces deadlines itself. Before each rollout it writes the rollout's sequence
number, start time and the process's CPU time so far into shared memory (`state`); the engine reads
them and kills the whole process when the deadline passes (that is the only hard deadline that
works for any Python code), saying how much CPU the rollout got before it did.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

import orjson

from genesys.plugins.specs import Verifier
from genesys.schema import ErrorKind, InvalidVerdict, Rollout, SchemaError, Verdict, VerifyError
from genesys.verification.wire import Results, RowBatch, Stop

# Shared-state slots and the markers the engine reads.
STATE_SEQ, STATE_START, STATE_CPU = 0, 1, 2
STATE_SLOTS = 3
SEQ_ASYNC_BATCH = -1.0  # the whole batch runs concurrently; its deadline covers the batch
SEQ_SETUP = -2.0  # a verifier's setup() is running
IDLE = 0.0
PARTIAL_RESULTS_EVERY_S = 0.25
PR_SET_PDEATHSIG = 1
ORPHAN_GRACE_S = 5.0  # teardown time a worker gets after its engine died


def _mark(state: Any, seq: float) -> None:
    state[STATE_START] = IDLE  # readers skip a half-written record
    state[STATE_SEQ] = seq
    state[STATE_CPU] = time.process_time()
    state[STATE_START] = time.monotonic()


def _json_safe(details: dict[str, Any]) -> dict[str, Any]:
    """`details` as plain JSON values; anything else (sympy objects, sets, ...) becomes its str()."""
    try:
        orjson.dumps(details, option=orjson.OPT_NON_STR_KEYS)
        return details
    except TypeError:
        return orjson.loads(orjson.dumps(details, default=str, option=orjson.OPT_NON_STR_KEYS))


def _plugin(verifier: Verifier) -> str:
    """The verifier class a verdict came from, as its plugin's users would look it up."""
    return f"{type(verifier).__module__}.{type(verifier).__qualname__}"


def _add_verdict(results: Results, seq: int, verdict: Any, verifier: Verifier) -> None:
    if not isinstance(verdict, Verdict):
        message = f"{_plugin(verifier)}.verify() returned {type(verdict).__name__}, not a Verdict"
        results.add(seq, None, {}, VerifyError(ErrorKind.INVALID_VERDICT, message))
        return
    error = None if verdict.error is None else VerifyError(ErrorKind.VERDICT, verdict.error)
    results.add(seq, verdict.score, _json_safe(verdict.details), error)


def _add_exception(results: Results, seq: int, exc: BaseException, verifier: Verifier | None = None) -> None:
    if isinstance(exc, SchemaError):
        results.add(seq, None, {}, VerifyError(ErrorKind.SCHEMA, str(exc)))
        return
    if isinstance(exc, InvalidVerdict) and verifier is not None:
        results.add(seq, None, {}, VerifyError(ErrorKind.INVALID_VERDICT, f"{_plugin(verifier)}: {exc}"))
        return
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3)
    results.add(
        seq,
        None,
        {"traceback": "".join(tb)},
        VerifyError(ErrorKind.EXCEPTION, f"{type(exc).__name__}: {exc}"),
    )


class WorkerVerifiers:
    """The verifier instances of one worker, created and set up on first use."""

    def __init__(self, classes: Mapping[str, type[Verifier]], options: Mapping[str, Any], state: Any) -> None:
        self.classes = classes
        self.options = options
        self.state = state
        self.instances: dict[str, Verifier] = {}
        self.setup_errors: dict[str, str] = {}

    def get(self, task_type: str) -> Verifier:
        """The set-up verifier of `task_type`. A setup that fails is torn down and tried once more
        (what it met may have been passing: a sandbox container another run removed as it was
        listed); failing twice, it fails every batch of this worker."""
        if task_type in self.setup_errors:
            raise RuntimeError(self.setup_errors[task_type])
        instance = self.instances.get(task_type)
        if instance is None:
            _mark(self.state, SEQ_SETUP)
            try:
                try:
                    instance = self._set_up(task_type)
                except (Exception, SystemExit):
                    instance = self._set_up(task_type)  # once more: what it met may have passed
            except (Exception, SystemExit) as exc:
                self.setup_errors[task_type] = (
                    f"setup of {task_type!r} verifier failed: {type(exc).__name__}: {exc}"
                )
                raise RuntimeError(self.setup_errors[task_type]) from exc
            finally:
                self.state[STATE_START] = IDLE
            self.instances[task_type] = instance
        return instance

    def _set_up(self, task_type: str) -> Verifier:
        """A new instance of the verifier, set up; one whose setup raised is torn down first."""
        instance = self.classes[task_type](self.options)
        try:
            instance.setup()
        except BaseException:
            try:
                instance.teardown()
            except Exception:  # what a half-made verifier's teardown raises: the setup's error counts
                pass
            raise
        return instance

    def teardown(self) -> None:
        for instance in self.instances.values():
            try:
                instance.teardown()
            except Exception:  # teardown must not keep the others from running
                traceback.print_exc()


def _run_sync_batch(conn: Connection, state: Any, verifier: Verifier, batch: RowBatch) -> Results:
    """Verify the batch's rollouts one by one; returns the outcomes not yet sent."""
    results = Results(batch.batch_id)
    last_sent = time.monotonic()
    for seq, row in zip(batch.seqs, batch.rows):
        _mark(state, seq)
        try:
            _add_verdict(results, seq, verifier.verify(Rollout.from_row(row)), verifier)
        except (Exception, SystemExit) as exc:
            _add_exception(results, seq, exc, verifier)
        if time.monotonic() - last_sent > PARTIAL_RESULTS_EVERY_S:
            conn.send(results)
            results, last_sent = Results(batch.batch_id), time.monotonic()
    return results


def _run_async_batch(
    loop: asyncio.AbstractEventLoop, conn: Connection, state: Any, verifier: Verifier, batch: RowBatch
) -> Results:
    """Run the batch's rollouts concurrently, each under the batch's timeout (a soft one here).

    Each finished rollout is sent at once (none is left to return) and renews the batch's mark, so
    the engine's hard deadline only fires when no rollout has finished for a whole timeout; it then
    blames only the rollouts that never reported.
    """

    async def one(seq: int, row: dict[str, Any]) -> None:
        result = Results(batch.batch_id)
        try:
            async with asyncio.timeout(batch.timeout) as deadline:
                verdict = await verifier.verify(Rollout.from_row(row))  # type: ignore[misc]
            _add_verdict(result, seq, verdict, verifier)
        except TimeoutError as exc:
            if not deadline.expired():  # the verifier's own timeout (a socket, a client): its error
                _add_exception(result, seq, exc, verifier)
            else:
                result.add(
                    seq, None, {}, VerifyError(ErrorKind.TIMEOUT, f"verification exceeded {batch.timeout:g}s")
                )
        except (Exception, SystemExit) as exc:
            _add_exception(result, seq, exc, verifier)
        _mark(state, SEQ_ASYNC_BATCH)
        conn.send(result)

    async def run_all() -> None:
        await asyncio.gather(*(one(seq, row) for seq, row in zip(batch.seqs, batch.rows)))

    _mark(state, SEQ_ASYNC_BATCH)
    loop.run_until_complete(run_all())
    return Results(batch.batch_id)


def _receive_forever(conn: Connection, inbox: queue.SimpleQueue) -> None:
    """Read engine messages as they come, so the engine's sends never wait on a busy worker.

    When the engine goes away without saying stop (it was killed), the worker gets a short grace
    to tear down and then ends itself, even if its verifier is stuck: no orphan outlives the run.
    """
    try:
        while True:
            message = conn.recv()
            inbox.put(message)
            if isinstance(message, Stop):
                return
    except (EOFError, OSError):
        inbox.put(Stop())
        time.sleep(ORPHAN_GRACE_S)
        os._exit(1)


def _die_with_parent() -> None:
    """Have the kernel kill this worker when the process it was forked from exits (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def worker_main(
    conn: Connection,
    state: Any,
    classes: Mapping[str, type[Verifier]],
    options: Mapping[str, Any],
    environment: tuple[dict[str, str], list[str]],
) -> None:
    """Serve batches from the engine until told to stop.

    `environment`: the variables the engine's process has set and removed since the fork server
    started, applied here so that the worker sees the engine's current environment.
    """
    _die_with_parent()
    changed, removed = environment
    os.environ.update(changed)
    for key in removed:
        os.environ.pop(key, None)
    inbox: queue.SimpleQueue[RowBatch | Stop] = queue.SimpleQueue()
    threading.Thread(target=_receive_forever, args=(conn, inbox), daemon=True).start()
    verifiers = WorkerVerifiers(classes, options, state)
    loop = asyncio.new_event_loop()
    try:
        while True:
            batch = inbox.get()
            if isinstance(batch, Stop):
                break
            results = Results(batch.batch_id)
            try:
                verifier = verifiers.get(batch.task_type)
            except Exception as exc:
                verifier = None
                for seq in batch.seqs:
                    _add_exception(results, seq, exc)
            started = time.monotonic()  # after setup: the engine sizes batches from this
            if verifier is not None and inspect.iscoroutinefunction(verifier.verify):
                results = _run_async_batch(loop, conn, state, verifier, batch)
            elif verifier is not None:
                results = _run_sync_batch(conn, state, verifier, batch)
            state[STATE_START] = IDLE
            conn.send(results.closing(time.monotonic() - started))
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        verifiers.teardown()
        loop.close()
