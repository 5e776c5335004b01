"""The verification worker process: runs verifiers on batches of rows sent by the engine.

The worker never enforces deadlines itself. Before each rollout it writes the rollout's sequence
number and start time into shared memory (`state`); the engine reads them and kills the whole
process when the deadline passes. That is the only hard deadline that works for any Python code.
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

from genesys.schema import ERROR_EXCEPTION, ERROR_SCHEMA, ERROR_TIMEOUT, Rollout, SchemaError, Verdict
from genesys.verifier import Verifier

# Shared-state slots and the markers the engine reads.
STATE_SEQ, STATE_START = 0, 1
SEQ_ASYNC_BATCH = -1.0  # the whole batch runs concurrently; its deadline covers the batch
SEQ_SETUP = -2.0  # a verifier's setup() is running
IDLE = 0.0
PARTIAL_RESULTS_EVERY_S = 0.25
PR_SET_PDEATHSIG = 1
ORPHAN_GRACE_S = 5.0  # teardown time a worker gets after its engine died

Result = tuple[int, float | None, dict[str, Any], str | None]


def _mark(state: Any, seq: float) -> None:
    state[STATE_START] = IDLE  # readers skip a half-written pair
    state[STATE_SEQ] = seq
    state[STATE_START] = time.monotonic()


def _json_safe(details: dict[str, Any]) -> dict[str, Any]:
    """`details` as plain JSON values; anything else (sympy objects, sets, ...) becomes its str()."""
    try:
        orjson.dumps(details, option=orjson.OPT_NON_STR_KEYS)
        return details
    except TypeError:
        return orjson.loads(orjson.dumps(details, default=str, option=orjson.OPT_NON_STR_KEYS))


def _verdict_to_result(seq: int, verdict: Any) -> Result:
    if not isinstance(verdict, Verdict):
        return (seq, None, {}, f"{ERROR_EXCEPTION}: verify() returned {type(verdict).__name__}, not a Verdict")
    return (seq, verdict.score, _json_safe(verdict.details), verdict.error)


def _exception_result(seq: int, exc: BaseException) -> Result:
    if isinstance(exc, SchemaError):
        return (seq, None, {}, f"{ERROR_SCHEMA}: {exc}")
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3)
    return (seq, None, {"traceback": "".join(tb)}, f"{ERROR_EXCEPTION}: {type(exc).__name__}: {exc}")


class WorkerVerifiers:
    """The verifier instances of one worker, created and set up on first use."""

    def __init__(self, classes: Mapping[str, type[Verifier]], options: Mapping[str, Any], state: Any) -> None:
        self.classes = classes
        self.options = options
        self.state = state
        self.instances: dict[str, Verifier] = {}
        self.setup_errors: dict[str, str] = {}

    def get(self, task_type: str) -> Verifier:
        if task_type in self.setup_errors:
            raise RuntimeError(self.setup_errors[task_type])
        instance = self.instances.get(task_type)
        if instance is None:
            _mark(self.state, SEQ_SETUP)
            try:
                instance = self.classes[task_type](self.options)
                instance.setup()
            except (Exception, SystemExit) as exc:
                self.setup_errors[task_type] = f"setup of {task_type!r} verifier failed: {type(exc).__name__}: {exc}"
                raise RuntimeError(self.setup_errors[task_type]) from exc
            finally:
                self.state[STATE_START] = IDLE
            self.instances[task_type] = instance
        return instance

    def teardown(self) -> None:
        for instance in self.instances.values():
            try:
                instance.teardown()
            except Exception:  # teardown must not keep the others from running
                traceback.print_exc()


def _run_sync_batch(conn: Connection, state: Any, verifier: Verifier, batch_id: int, items: list) -> list[Result]:
    results: list[Result] = []
    last_sent = time.monotonic()
    for seq, row in items:
        _mark(state, seq)
        try:
            results.append(_verdict_to_result(seq, verifier.verify(Rollout.from_row(row))))
        except (Exception, SystemExit) as exc:
            results.append(_exception_result(seq, exc))
        if time.monotonic() - last_sent > PARTIAL_RESULTS_EVERY_S:
            conn.send(("results", batch_id, results, False, None))
            results, last_sent = [], time.monotonic()
    return results


def _run_async_batch(
    loop: asyncio.AbstractEventLoop, conn: Connection, state: Any, verifier: Verifier, batch_id: int, timeout: float, items: list
) -> list[Result]:
    """Run the batch's rollouts concurrently, each under a soft `timeout`.

    Each finished rollout is sent at once and renews the batch's mark, so the engine's hard
    deadline only fires when no rollout has finished for a whole `timeout`; it then blames only
    the rollouts that never reported.
    """

    async def one(seq: int, row: dict[str, Any]) -> Result:
        try:
            async with asyncio.timeout(timeout) as deadline:
                verdict = await verifier.verify(Rollout.from_row(row))  # type: ignore[misc]
            result = _verdict_to_result(seq, verdict)
        except TimeoutError as exc:
            if not deadline.expired():  # the verifier's own timeout (a socket, a client): its error
                result = _exception_result(seq, exc)
            else:
                result = (seq, None, {}, f"{ERROR_TIMEOUT}: verification exceeded {timeout:g}s")
        except (Exception, SystemExit) as exc:
            result = _exception_result(seq, exc)
        _mark(state, SEQ_ASYNC_BATCH)
        conn.send(("results", batch_id, [result], False, None))
        return result

    async def run_all() -> None:
        await asyncio.gather(*(one(seq, row) for seq, row in items))

    _mark(state, SEQ_ASYNC_BATCH)
    loop.run_until_complete(run_all())
    return []


def _receive_forever(conn: Connection, inbox: queue.SimpleQueue) -> None:
    """Read engine messages as they come, so the engine's sends never wait on a busy worker.

    When the engine goes away without saying stop (it was killed), the worker gets a short grace
    to tear down and then ends itself, even if its verifier is stuck: no orphan outlives the run.
    """
    try:
        while True:
            message = conn.recv()
            inbox.put(message)
            if message[0] == "stop":
                return
    except (EOFError, OSError):
        inbox.put(("stop",))
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
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_receive_forever, args=(conn, inbox), daemon=True).start()
    verifiers = WorkerVerifiers(classes, options, state)
    loop = asyncio.new_event_loop()
    try:
        while True:
            message = inbox.get()
            if message[0] == "stop":
                break
            _, batch_id, task_type, timeout, items = message
            try:
                verifier = verifiers.get(task_type)
            except Exception as exc:
                verifier, results = None, [_exception_result(seq, exc) for seq, _ in items]
            started = time.monotonic()  # after setup: the engine sizes batches from this
            if verifier is not None and inspect.iscoroutinefunction(verifier.verify):
                results = _run_async_batch(loop, conn, state, verifier, batch_id, timeout, items)
            elif verifier is not None:
                results = _run_sync_batch(conn, state, verifier, batch_id, items)
            state[STATE_START] = IDLE
            conn.send(("results", batch_id, results, True, time.monotonic() - started))
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        verifiers.teardown()
        loop.close()
