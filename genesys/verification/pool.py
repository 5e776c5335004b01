"""The verification pool interface: how the CLI, generation and the trainer have rows verified.

A pool takes rows under a key (`submit`) and hands them back (`poll`, `drain`) in completion order,
with `score`, `verification_result_info` and `error` added; rewards are a later stage
(`genesys.rewards.RewardStage`). `VerificationEngine` implements it with worker processes on this
machine; a pool spread over machines implements the same abstract methods and inherits the rest.

`submit`/`poll`/`drain` are for one driving thread. Other threads call `verify_rows(rows)` and asyncio
code awaits `verify_many(rows)`: both hand the rows to a thread that drives the pool for them, so an
event loop never blocks on verification. Do not drive a pool both ways at once.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Self

from genesys.schema import Row
from genesys.verification.stats import TypeStats

DRAIN_TICK_S = 0.05


class VerificationPool(ABC):
    """Verifies rows; use as a context manager (`start` on entry, `close` on exit)."""

    def __init__(self) -> None:
        self._driver: _Driver | None = None
        self._driver_lock = threading.Lock()

    @property
    @abstractmethod
    def known_task_types(self) -> set[str]:
        """The task types this pool has verifiers for; rows of others come back as errors."""

    @property
    @abstractmethod
    def stats(self) -> dict[str, TypeStats]:
        """Totals per task_type of the rows verified so far."""

    @property
    @abstractmethod
    def outstanding(self) -> int:
        """Rows submitted and not yet returned by `poll`/`drain`."""

    @abstractmethod
    def start(self) -> None:
        """Bring the workers up."""

    @abstractmethod
    def submit(self, key: Hashable, row: Row) -> None:
        """Queue one row under `key`; may wait for results when too many rows are in flight."""

    @abstractmethod
    def poll(self, timeout: float = 0.0) -> list[tuple[Hashable, Row]]:
        """Verified rows finished so far as (key, row) pairs, waiting up to `timeout` s for the first."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers (they tear their verifiers down)."""

    def drain(self) -> Iterator[tuple[Hashable, Row]]:
        """Yield verified rows until everything submitted is done."""
        while self.outstanding:
            yield from self.poll(DRAIN_TICK_S)

    def close(self) -> None:
        """Fail what callers of `verify_rows`/`verify_many` still wait for, then shut down."""
        with self._driver_lock:
            driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()
        self.shutdown()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def verify_rows(self, rows: Sequence[Row]) -> list[Row]:
        """Verify `rows` from any thread, blocking; returns them verified, in input order."""
        return self._submit_request(rows).result()

    async def verify_many(self, rows: Sequence[Row]) -> list[Row]:
        """Verify `rows` without blocking the event loop; returns them verified, in input order."""
        return await asyncio.wrap_future(self._submit_request(rows))

    def _submit_request(self, rows: Sequence[Row]) -> Future[list[Row]]:
        with self._driver_lock:
            if self._driver is None:
                self._driver = _Driver(self)
            return self._driver.request(list(rows))


@dataclass
class _Request:
    rows: list[Row]
    future: Future[list[Row]] = field(default_factory=Future)
    remaining: int = 0

    def __post_init__(self) -> None:
        self.remaining = len(self.rows)


class _Driver:
    """A thread that drives a pool for requests from other threads: submits their rows, polls, and
    completes each request's future once all its rows are back."""

    def __init__(self, pool: VerificationPool) -> None:
        self.pool = pool
        self.inbox: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self.open: dict[int, _Request] = {}
        self.ids = itertools.count()
        self.failure: BaseException | None = None
        self.lock = threading.Lock()  # a request is either queued before a failure, or told of it
        self.thread = threading.Thread(target=self._run, name="genesys-verification-driver", daemon=True)
        self.thread.start()

    def request(self, rows: list[Row]) -> Future[list[Row]]:
        request = _Request(rows)
        with self.lock:
            if self.failure is not None:
                request.future.set_exception(self.failure)
            elif not rows:
                request.future.set_result([])
            else:
                self.inbox.put(request)
        return request.future

    def stop(self) -> None:
        self.inbox.put(None)
        self.thread.join()

    def _run(self) -> None:
        try:
            while self._take_requests():
                for (request_id, index), row in self.pool.poll(DRAIN_TICK_S):  # type: ignore[misc]
                    self._deliver(request_id, index, row)
            self._fail(RuntimeError("the verification pool was closed before these rows were verified"))
        except BaseException as exc:  # the pool broke: every caller hears why, not only the one running
            self._fail(exc)

    def _take_requests(self) -> bool:
        """Submit the rows of new requests, waiting for one while none is open; False once stopped."""
        while True:
            try:
                request = self.inbox.get(block=not self.open)
            except queue.Empty:
                return True
            if request is None:
                return False
            request_id = next(self.ids)
            self.open[request_id] = request
            for index, row in enumerate(request.rows):
                self.pool.submit((request_id, index), row)

    def _deliver(self, request_id: int, index: int, row: Row) -> None:
        request = self.open[request_id]
        request.rows[index] = row
        request.remaining -= 1
        if not request.remaining:
            del self.open[request_id]
            _settle(request.future, request.rows)

    def _fail(self, exc: BaseException) -> None:
        with self.lock:
            self.failure = exc
            while True:  # requests not yet taken fail too
                try:
                    request = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if request is not None:
                    self.open[next(self.ids)] = request
        for request in self.open.values():
            _settle(request.future, exception=exc)
        self.open.clear()


def _settle(
    future: Future[list[Row]], result: list[Row] | None = None, exception: BaseException | None = None
) -> None:
    """Complete `future` unless its caller cancelled it (its rows were verified all the same)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass
