"""The verification pool interface: the engine behind it, the async and threaded facades, typed errors."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable

import pytest
from conftest import rollout
from genesys_testplugins import Echo, Hang, Slow

from genesys.config import VerifyConfig
from genesys.schema import ErrorKind, VerifyError
from genesys.verification.engine import VerificationEngine
from genesys.verification.pool import VerificationPool
from genesys.verification.stats import TypeStats

VERIFIERS = {cls.task_type: cls for cls in (Echo, Hang, Slow)}


def engine(workers: int = 2) -> VerificationEngine:
    return VerificationEngine(VerifyConfig(progress=False, workers=workers), VERIFIERS)


def echo_rows(prefix: str, count: int) -> list[dict]:
    return [
        rollout("echo", "yes" if i % 2 else "no", expected="yes", response_id=f"{prefix}{i}")
        for i in range(count)
    ]


def test_the_engine_is_a_pool_and_verify_many_returns_rows_in_input_order():
    async def main(pool: VerificationPool) -> list[list[dict]]:
        return await asyncio.gather(*(pool.verify_many(echo_rows(prefix, 50)) for prefix in "abc"))

    with engine() as pool:
        assert isinstance(pool, VerificationPool) and {"echo", "hang", "slow"} <= pool.known_task_types
        results = asyncio.run(main(pool))
        assert pool.stats["echo"].count == 150 and pool.stats["echo"].mean_score == 0.5
    for prefix, rows in zip("abc", results):
        assert [r["response_id"] for r in rows] == [f"{prefix}{i}" for i in range(50)]
        assert [r["score"] for r in rows] == [float(i % 2) for i in range(50)]
        assert all(
            r["error"] is None and "pid" in r["verification_result_info"] and "reward" not in r for r in rows
        )


def test_verify_many_leaves_the_event_loop_free_while_rows_are_verified():
    async def main(pool: VerificationPool) -> tuple[list[dict], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        rows = await pool.verify_many([rollout("slow", "x", sleep=0.3) for _ in range(3)])
        seen, _ = ticks, ticker.cancel()
        return rows, seen

    with engine(workers=1) as pool:
        rows, ticks = asyncio.run(main(pool))
    assert [r["score"] for r in rows] == [1.0] * 3
    assert ticks > 5  # the loop kept running while the pool verified (about 90 ticks in 0.9 s)


def test_verify_rows_serves_several_threads_at_once():
    results: dict[str, list[dict]] = {}
    with engine() as pool:
        threads = [
            threading.Thread(
                target=lambda p=prefix: results.__setitem__(p, pool.verify_rows(echo_rows(p, 40)))
            )
            for prefix in "xyz"
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert pool.verify_rows([]) == []
    assert {p: [r["response_id"] for r in rows] for p, rows in results.items()} == {
        p: [f"{p}{i}" for i in range(40)] for p in "xyz"
    }


def test_errors_come_back_as_rows_and_a_cancelled_caller_does_not_disturb_the_others():
    async def main(pool: VerificationPool) -> list[dict]:
        hung = asyncio.create_task(pool.verify_many([rollout("hang", "x")]))
        await asyncio.sleep(0.1)
        hung.cancel()
        return await pool.verify_many(
            [rollout("echo", "a", expected="a"), rollout("mystery", "b"), rollout("hang", "c")]
        )

    with engine() as pool:
        echo, unknown, hang = asyncio.run(main(pool))
    assert echo["score"] == 1.0
    assert unknown["score"] is None and unknown["error"].startswith(
        "unknown_task_type: unknown task_type 'mystery'"
    )
    assert hang["score"] is None and hang["error"].startswith("timeout: verification exceeded 1s (it got ")


@pytest.mark.slow
def test_closing_the_pool_fails_the_callers_still_waiting():
    async def main() -> None:
        pool = engine(workers=1)
        pool.start()
        waiting = asyncio.create_task(pool.verify_many([rollout("slow", "x", sleep=5.0)]))
        await asyncio.sleep(0.2)
        pool.close()
        with pytest.raises(RuntimeError, match="closed before these rows were verified"):
            await waiting
        with pytest.raises(RuntimeError, match="not running"):
            await pool.verify_many([rollout("echo", "a", expected="a")])

    asyncio.run(main())


def test_a_broken_pool_fails_every_caller_with_the_reason():
    bad = {**rollout("echo", "yes", response_id="bad"), "extra": lambda: 0}  # cannot be sent to a worker

    async def main(pool: VerificationPool) -> list:
        return await asyncio.gather(
            pool.verify_many([bad]), pool.verify_many(echo_rows("ok", 3)), return_exceptions=True
        )

    with engine(workers=1) as pool:
        outcomes = asyncio.run(main(pool))
        with pytest.raises(TypeError):
            pool.verify_rows(echo_rows("later", 1))
    assert all(
        isinstance(o, TypeError) and "cannot be sent to a verification worker" in str(o) for o in outcomes
    )


class InlinePool(VerificationPool):
    """A pool that verifies in the driving thread: the facade needs nothing but the abstract methods."""

    def __init__(self) -> None:
        super().__init__()
        self._done: list[tuple[Hashable, dict]] = []
        self._stats: dict[str, TypeStats] = {}

    known_task_types = property(lambda self: {"echo"})
    stats = property(lambda self: self._stats)
    outstanding = property(lambda self: len(self._done))

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def submit(self, key: Hashable, row: dict) -> None:
        score = float(row["llm_response"] == "yes")
        self._stats.setdefault("echo", TypeStats()).add(score, None)
        self._done.append((key, {**row, "score": score, "verification_result_info": {}, "error": None}))

    def poll(self, timeout: float = 0.0) -> list[tuple[Hashable, dict]]:
        done, self._done = self._done, []
        return done


def test_any_pool_implementation_gets_the_facades():
    with InlinePool() as pool:
        rows = asyncio.run(pool.verify_many(echo_rows("r", 6)))
        assert [r["score"] for r in rows] == [0.0, 1.0] * 3 and [r["response_id"] for r in rows] == [
            f"r{i}" for i in range(6)
        ]
        assert [r["score"] for r in pool.verify_rows(echo_rows("s", 2))] == [0.0, 1.0]
        assert pool.stats["echo"].count == 8


def test_error_text_and_stats_come_from_the_typed_error():
    assert (
        str(VerifyError(ErrorKind.TIMEOUT, "verification exceeded 2s")) == "timeout: verification exceeded 2s"
    )
    assert str(VerifyError(ErrorKind.CRASH, "worker process died")) == "worker_crash: worker process died"
    assert (
        str(VerifyError(ErrorKind.VERDICT, "timeout: the verifier's own words"))
        == "timeout: the verifier's own words"
    )
    stats = TypeStats()
    for score, error in [
        (1.0, None),
        (None, VerifyError(ErrorKind.TIMEOUT, "x")),
        (None, VerifyError(ErrorKind.EXCEPTION, "y")),
        (0.0, None),
    ]:
        stats.add(score, error)
    assert (stats.count, stats.scored, stats.timeouts, stats.errors, stats.mean_score) == (4, 2, 1, 1, 0.5)
