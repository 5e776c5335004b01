"""The verification engine: ordering, deadlines, crashes, errors as data, async, max_parallel."""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import time

import pytest
from conftest import rollout
from genesys_testplugins import (
    AsyncBusy,
    AsyncEcho,
    Boom,
    Crash,
    Echo,
    EnvProbe,
    ErrorObject,
    ExitInSetup,
    FlakySetup,
    Hang,
    Junk,
    Odd,
    RegexHang,
    SerialSlow,
    Slow,
)

import genesys
from genesys.config import VerifyConfig
from genesys.verification.engine import VerificationEngine

VERIFIERS = {
    cls.task_type: cls
    for cls in (
        Echo,
        EnvProbe,
        Odd,
        Slow,
        ExitInSetup,
        FlakySetup,
        RegexHang,
        AsyncBusy,
        ErrorObject,
        SerialSlow,
        Hang,
        Crash,
        Boom,
        Junk,
        AsyncEcho,
    )
}


def run(rows, **config):
    return genesys.verify_rollouts(rows, config=VerifyConfig(progress=False, **config), verifiers=VERIFIERS)


def test_results_come_back_in_input_order_with_verdict_columns():
    rows = [
        rollout("echo", "yes" if i % 3 else "no", expected="yes", response_id=f"r{i}") for i in range(300)
    ]
    out = run(rows, workers=2)
    assert [r["response_id"] for r in out] == [f"r{i}" for i in range(300)]
    assert [r["score"] for r in out] == [1.0 if i % 3 else 0.0 for i in range(300)]
    assert all(r["reward"] == r["score"] and r["error"] is None for r in out)
    assert all("pid" in r["verification_result_info"] for r in out)
    # every input column is kept as it came
    assert out[0]["verification_info"] == rows[0]["verification_info"]
    assert out[0]["metadata"] == rows[0]["metadata"]


def test_a_hanging_verifier_costs_only_its_timeout():
    rows = [rollout("echo", "yes", expected="yes") for _ in range(20)]
    rows.insert(7, rollout("hang", "anything"))
    started = time.monotonic()
    out = run(rows, workers=2)
    elapsed = time.monotonic() - started
    hung = out[7]
    assert hung["score"] is None and hung["reward"] is None
    assert hung["error"].startswith("timeout:")
    assert all(r["score"] == 1.0 for i, r in enumerate(out) if i != 7)
    # Hang.timeout is 1 s: the run pays that once (plus worker start-up), never forever.
    assert elapsed < 8.0


def test_timeout_flag_overrides_the_verifier_timeout():
    rows = [rollout("slow", "x", sleep=3.0), rollout("echo", "a", expected="a")]
    out = run(rows, workers=2, timeout=0.5)
    assert out[0]["error"].startswith("timeout:") and "0.5s" in out[0]["error"]
    assert out[1]["score"] == 1.0


def test_a_crashing_worker_is_replaced_and_only_its_row_fails():
    rows = [rollout("echo", "yes", expected="yes") for _ in range(40)]
    rows[5] = rollout("crash", "x")
    rows[30] = rollout("crash", "y")
    out = run(rows, workers=2)
    for i in (5, 30):
        assert out[i]["score"] is None and out[i]["error"].startswith("worker_crash:")
    assert all(r["score"] == 1.0 for i, r in enumerate(out) if i not in (5, 30))


def test_a_send_under_way_to_a_dead_worker_never_reaches_its_replacement(monkeypatch):
    # Every engine send takes a while after reading its descriptor. Were the engine to close a dead
    # worker's pipe under such a send, the replacement's new pipe could reuse the descriptor and
    # receive the dead worker's batch (CI once failed this way).
    def slow_send(self, buf):
        handle = self._handle
        time.sleep(0.02)
        view = memoryview(buf)
        while view:
            view = view[os.write(handle, view) :]

    monkeypatch.setattr(multiprocessing.connection.Connection, "_send", slow_send)
    rows = [rollout("echo", "yes", expected="yes") for _ in range(40)]
    rows[5] = rollout("crash", "x")
    rows[30] = rollout("crash", "y")
    out = run(rows, workers=2)
    assert [i for i, r in enumerate(out) if r["score"] is None] == [5, 30]


def test_a_batch_sent_to_a_worker_that_died_while_idle_is_verified_elsewhere():
    rows = [rollout("echo", "yes", expected="yes") for _ in range(4)]
    with VerificationEngine(VerifyConfig(progress=False, workers=1), VERIFIERS) as engine:
        engine.submit(0, rows[0])
        assert [row["score"] for _, row in engine.drain()] == [1.0]
        worker = engine._workers[0]
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join()
        for key in (1, 2, 3):
            engine.submit(key, rows[key])
        engine._dispatch()  # hand the batch to the dead worker before the engine has noticed
        time.sleep(0.3)  # the send fails meanwhile
        done = dict(engine.drain())
    assert sorted(done) == [1, 2, 3] and all(row["score"] == 1.0 for row in done.values())


def test_rows_queued_behind_many_crashes_are_still_verified():
    # A death pinned on one rollout leaves the rows queued behind it innocent: however often that
    # happens they are verified, never given up on as repeat crash suspects.
    crashes = set(range(2, 60, 5))
    rows = [
        rollout("crash", "x") if i in crashes else rollout("echo", "yes", expected="yes") for i in range(60)
    ]
    out = run(rows, workers=2)
    assert [i for i, r in enumerate(out) if r["score"] is None] == sorted(crashes)
    assert all(out[i]["error"].startswith("worker_crash: worker process died") for i in crashes)


def test_exceptions_and_bad_rows_are_errors_not_wrong_answers():
    rows = [
        rollout("boom", "x"),
        rollout("echo", "no", expected="yes"),
        {**rollout("echo", "x"), "verification_info": "{not json"},
    ]
    out = run(rows, workers=1)
    assert out[0]["score"] is None and out[0]["error"].startswith("exception: ValueError: verifier bug")
    assert "traceback" in out[0]["verification_result_info"]
    assert out[1]["score"] == 0.0 and out[1]["error"] is None
    assert (
        out[2]["score"] is None
        and out[2]["error"].startswith("invalid_row:")
        and "verification_info" in out[2]["error"]
    )


def test_a_verdict_that_is_not_one_is_an_invalid_verdict_naming_the_plugin():
    scores = ["1", True, 1.5]
    rows = [rollout("junk", "x", score=score) for score in scores]
    rows += [rollout("junk", "x", score=0.5, bare=True), rollout("junk", "x", score=1)]
    out = run(rows, workers=1)
    for row in out[:-1]:
        assert row["score"] is None, row
        assert row["error"].startswith("invalid_verdict: genesys_testplugins.Junk"), row["error"]
    assert "'1' (str)" in out[0]["error"] and "True (bool)" in out[1]["error"]
    assert "returned float, not a Verdict" in out[3]["error"]
    assert out[-1]["score"] == 1.0 and out[-1]["error"] is None


def test_unknown_task_type_in_engine_is_an_error_row():
    out = run([rollout("nope", "x")], workers=1)
    assert out[0]["score"] is None
    assert out[0]["error"].startswith("unknown_task_type:") and "echo" in out[0]["error"]


def test_async_verifier_runs_rows_concurrently_with_soft_timeouts():
    rows = [rollout("async_echo", "a", expected="a", sleep=0.3) for _ in range(20)]
    rows.append(rollout("async_echo", "a", expected="a", sleep=10))
    started = time.monotonic()
    out = run(rows, workers=1)
    assert all(r["score"] == 1.0 for r in out[:20])
    assert out[20]["error"].startswith("timeout:")
    assert time.monotonic() - started < 8  # 20 x 0.3 s serially would be 6 s on top of the 2 s timeout


def test_max_parallel_limits_concurrent_workers():
    rows = [rollout("serial_slow", "x", sleep=0.05) for _ in range(12)]
    out = run(rows, workers=2)
    intervals = sorted(
        (r["verification_result_info"]["start"], r["verification_result_info"]["end"]) for r in out
    )
    assert all(later[0] >= earlier[1] - 1e-3 for earlier, later in zip(intervals, intervals[1:]))


def test_without_max_parallel_workers_do_overlap():
    rows = [rollout("slow", "x", sleep=0.2) for _ in range(8)]
    out = run(rows, workers=2)
    intervals = sorted(
        (r["verification_result_info"]["start"], r["verification_result_info"]["end"]) for r in out
    )
    assert any(later[0] < earlier[1] for earlier, later in zip(intervals, intervals[1:]))


def test_details_that_are_not_json_become_strings():
    (out,) = run([rollout("odd_details", "x")], workers=1)
    assert out["score"] == 0.5
    assert out["verification_result_info"] == {"values": "{3}", "obj": "1/3", "7": "int key"}


def test_workers_are_replaced_after_max_rows_per_worker():
    rows = [rollout("echo", "yes", expected="yes") for _ in range(200)]
    out = run(rows, workers=2, max_rows_per_worker=10)
    assert all(r["score"] == 1.0 for r in out)
    pids = {r["verification_result_info"]["pid"] for r in out}
    assert len(pids) > 2  # two workers at a time, replaced as they wear out
    unlimited = run(rows, workers=2, max_rows_per_worker=None)
    assert len({r["verification_result_info"]["pid"] for r in unlimited}) == 2


def test_a_setup_that_exits_makes_error_rows_and_the_run_ends():
    out = run([rollout("exit_in_setup", "x"), rollout("echo", "a", expected="a")], workers=1)
    assert (
        out[0]["score"] is None and "setup of 'exit_in_setup' verifier failed: SystemExit" in out[0]["error"]
    )
    assert out[1]["score"] == 1.0


def test_a_setup_that_fails_once_is_torn_down_and_tried_again_before_any_row_fails():
    """A setup that failed once failed every batch its worker took, and the worker, answering at
    once, took most of the run: one sandbox container removed at the wrong moment made 984 of
    1,000 rows errors."""
    out = run([rollout("flaky_setup", "x") for _ in range(20)], workers=1)
    assert all(r["score"] == 1.0 and r["error"] is None for r in out), out[0]
    assert out[0]["verification_result_info"] == {"attempts": 2, "torn_down": 1}


def test_a_verifier_holding_the_gil_cannot_stall_the_engine():
    big = rollout("echo", "a", expected="a")
    big["prompt"] = "x" * 4_000_000  # far more than a pipe buffer: the send waits on the stuck worker
    started = time.monotonic()
    out = run([rollout("regex_hang", "x"), big, rollout("echo", "b", expected="b")], workers=1)
    assert out[0]["error"].startswith("timeout:")
    assert out[1]["score"] == 1.0 and out[2]["score"] == 1.0
    assert time.monotonic() - started < 20


@pytest.mark.slow
def test_async_batches_are_judged_on_progress_not_on_their_total_time():
    out = run([rollout("async_busy", "x") for _ in range(60)], workers=1)  # 3 s of blocking work, 1 s timeout
    assert [r["score"] for r in out] == [1.0] * 60


def test_an_exception_object_as_error_becomes_text():
    (out,) = run([rollout("error_object", "x")], workers=1)
    assert out["score"] is None and out["error"] == "ValueError: bad gold"


def test_only_the_expected_types_preload_their_modules():
    from genesys.verification.engine import preload_modules
    from genesys.verifiers.code import CodeVerifier
    from genesys.verifiers.math import MathVerifier

    classes = {"verifiable_math": MathVerifier, "verifiable_code": CodeVerifier, "echo": Echo}
    # Every worker unpickles every class, so the modules defining them are always imported first.
    defining = ["genesys.verifiers.code", "genesys.verifiers.math", "genesys_testplugins"]
    assert preload_modules(classes, {"verifiable_code", "echo"}) == ["genesys.verification.worker", *defining]
    assert preload_modules(classes, {"verifiable_math"}) == [
        "genesys.verification.worker",
        *sorted([*defining, "genesys.verifiers.math_grade"]),
    ]
    assert preload_modules(classes) == preload_modules(classes, {"verifiable_math"})


def test_workers_see_the_environment_of_when_the_run_starts(monkeypatch):
    # The fork server keeps the environment of the first engine; each run's workers get the current one.
    probe = rollout("env_probe", "x", name="GENESYS_TEST_SETTING")
    monkeypatch.setenv("GENESYS_TEST_SETTING", "first")
    assert run([probe], workers=1)[0]["verification_result_info"] == {"value": "first"}
    monkeypatch.setenv("GENESYS_TEST_SETTING", "second")
    assert run([probe], workers=1)[0]["verification_result_info"] == {"value": "second"}


def test_a_row_that_cannot_be_sent_to_a_worker_is_named():
    rows = [
        rollout("echo", "yes", expected="yes", response_id="fine"),
        {**rollout("echo", "yes", response_id="bad"), "extra": lambda: 0},
    ]
    with pytest.raises(TypeError, match="row 1 cannot be sent to a verification worker"):
        run(rows, workers=1)


def test_a_timeout_says_how_much_cpu_the_rollout_got():
    # A sleeping verifier gets no CPU before its deadline: the error tells a starved or waiting
    # worker from one that computed the whole time.
    out = run([rollout("slow", "x", sleep=3.0)], workers=1, timeout=0.5)
    error = out[0]["error"]
    assert error.startswith("timeout: verification exceeded 0.5s (it got ")
    assert float(error.split("(it got ")[1].split(" s of CPU")[0]) < 0.3
