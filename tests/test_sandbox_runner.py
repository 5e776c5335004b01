"""The in-sandbox runner's process supervision, run in this process (no sandbox around it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genesys.sandbox import runner

SUPPORT = Path(__file__).parent / "support"

LIMITS = {"time_s": 2, "memory_mb": 256, "disk_mb": 16, "processes": 16, "output_bytes": 1 << 16, "wall_s": 5.0}


def echo_stdin() -> int:
    os.write(1, b"got " + os.read(0, 100))
    return 0


def sleep_forever() -> int:
    time.sleep(60)
    return 0


@pytest.fixture(autouse=True)
def spare_this_process_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a sandbox the runner kills every process left under it; here that would be pytest's own."""
    monkeypatch.setattr(runner, "kill_leftovers", lambda: None)


@pytest.fixture(params=["pidfd", "polling"])
def exit_watch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the runner learns that a test exited: a pidfd, or polling where none can be had."""
    if request.param == "polling":
        monkeypatch.setattr(runner, "_exit_watch", lambda pid: None)
    return request.param


def test_a_test_that_exits_is_collected_at_once(exit_watch: str) -> None:
    started = time.monotonic()
    outcome = runner.run_child(runner.fork_child(echo_stdin), b"input", LIMITS)
    assert bytes(outcome.stdout) == b"got input" and outcome.exit_code == 0 and outcome.killed_for is None
    assert runner.classify(outcome, LIMITS) == "ok"
    assert time.monotonic() - started < 2.5  # not held until the wall limit


def test_a_test_past_its_wall_limit_is_killed(exit_watch: str) -> None:
    limits = {**LIMITS, "wall_s": 0.5}
    outcome = runner.run_child(runner.fork_child(sleep_forever), b"", limits)
    assert outcome.killed_for == "time_limit" and runner.classify(outcome, limits) == "time_limit"
    assert 0.5 <= outcome.wall_s < 4.0



def test_a_program_past_its_file_size_limit_is_an_output_limit(tmp_path) -> None:
    # Python ignores SIGXFSZ; an exec'd program must not inherit that and carry on with EFBIG.
    limits = {**LIMITS, "disk_mb": 1}
    fill = runner._exec_child(["/bin/sh", "-c", "exec head -c 4000000 /dev/zero > fill.bin"], str(tmp_path), limits, "cpp")
    outcome = runner.run_child(runner.fork_child(fill), b"", limits)
    assert runner.classify(outcome, limits) == "output_limit", (outcome.exit_code, outcome.signal, bytes(outcome.stderr))


def zygote_replies(source: str, runs: int, workdir: Path, before: str = "") -> list[dict]:
    """The replies to `runs` runs of `source` as a Python test, forked from a zygote of a fresh
    interpreter that first ran `before` (see support/fresh_zygote.py for why not this process)."""
    request = {"source": source, "runs": runs, "limits": LIMITS, "workdir": str(workdir), "before": before}
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "fresh_zygote.py"), json.dumps(request)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


EXITS = {
    "detached stdout": ("import sys, codecs\nprint('x')\nsys.stdout = codecs.getwriter('utf-8')(sys.stdout.detach())\nsys.stdout.write('y\\n')", 0, "x\ny\n"),
    "closed and reopened": ("import sys\nprint('x', flush=True)\nsys.stdout.close()\nsys.stdout = open(1, 'w', closefd=False)\nprint('y')", 0, "x\ny\n"),
    "stdout set to None": ("import sys\nprint('x')\nsys.stdout.flush()\nsys.stdout = None", 0, "x\n"),
    "swapped stdout": ("import io, sys\nprint('first')\nsys.stdout = io.StringIO()\nprint('kept in memory')", 0, "first\n"),
    "atexit after an error": ("import atexit\natexit.register(print, 'bye')\nraise ValueError('boom')", 1, "bye\n"),
    "atexit after sys.exit": ("import atexit, sys\natexit.register(print, 'bye')\nsys.exit(3)", 3, "bye\n"),
}


@pytest.mark.parametrize("case", sorted(EXITS))
def test_python_tests_end_as_the_interpreter_would(case: str, tmp_path: Path) -> None:
    source, exit_code, stdout = EXITS[case]
    [reply] = zygote_replies(source, 1, tmp_path)
    assert (reply["exit_code"], reply["stdout"]) == (exit_code, stdout), reply


RLIMITS_PROGRAM = """
import resource
for name in ("CPU", "AS", "STACK", "FSIZE", "NPROC", "NOFILE", "CORE"):
    print(name, *resource.getrlimit(getattr(resource, "RLIMIT_" + name)))
"""


def test_a_python_test_runs_under_the_limits_the_runner_set(tmp_path: Path) -> None:
    [reply] = zygote_replies(RLIMITS_PROGRAM, 1, tmp_path)
    assert reply["status"] == "ok", reply
    assert reply["stdout"].split("\n")[:-1] == [
        "CPU 2 3",
        f"AS {256 << 20} {256 << 20}",
        f"STACK {64 << 20} {64 << 20}",
        f"FSIZE {16 << 20} {16 << 20}",
        "NPROC 16 16",
        "NOFILE 256 256",
        "CORE 0 0",
    ]


def test_a_test_gone_before_its_gate_opens_is_not_limited_and_never_runs() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert runner._limit_process(pid, LIMITS) is False


def test_a_python_test_that_stops_its_zygote_is_still_collected_at_once(tmp_path: Path) -> None:
    # The zygote's report is how the runner learns that a Python test ended; a stopped zygote
    # sends none until the runner continues it, which it does while it waits.
    source = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nprint(42)"
    for reply in zygote_replies(source, 2, tmp_path):
        assert (reply["status"], reply["stdout"]) == ("ok", "42\n"), reply
        assert reply["wall_s"] < LIMITS["wall_s"] / 2, reply


def test_a_python_test_runs_only_its_own_exit_hooks(tmp_path: Path) -> None:
    # A hook the runner's interpreter registered before its zygote forked (a library it imported)
    # is not the program's: a test runs those its program registered, and no others.
    before = "import atexit, os\natexit.register(os.write, 1, b'inherited\\n')"
    source = "import atexit\natexit.register(print, 'bye')\nprint('hello')"
    [reply] = zygote_replies(source, 1, tmp_path, before)
    assert (reply["status"], reply["stdout"]) == ("ok", "hello\nbye\n"), reply
