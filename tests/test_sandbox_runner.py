"""The in-sandbox runner's process supervision, run in this process (no sandbox around it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SUPPORT = Path(__file__).parent / "support"

LIMITS = {
    "time_limit": 2,
    "memory_limit": 256,
    "disk_limit": 16,
    "process_limit": 16,
    "output_limit": 1 << 16,
    "wall_limit": 5.0,
}


def template_replies(
    source: str, runs: int, workdir: Path, before: str = "", tests: list | None = None, **request: object
) -> list[dict]:
    """The replies to `runs` runs of `source` as a Python test (or of `argv=[...]`), forked by a
    template of a fresh interpreter that first ran `before` (see support/fresh_template.py for why not
    this process); `limits=`, `stdin=` as the request takes them; `tests`: one submission's tests
    instead, which reach the runner once its template is made."""
    request = {
        "source": source,
        "runs": runs,
        "limits": LIMITS,
        "workdir": str(workdir),
        "before": before,
        "tests": tests is not None,
        **request,
    }
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "fresh_template.py"), json.dumps(request)],
        input=json.dumps(tests or []),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


EXITS = {
    "detached stdout": (
        "import sys, codecs\nprint('x')\nsys.stdout = codecs.getwriter('utf-8')(sys.stdout.detach())\nsys.stdout.write('y\\n')",
        0,
        "x\ny\n",
    ),
    "closed and reopened": (
        "import sys\nprint('x', flush=True)\nsys.stdout.close()\nsys.stdout = open(1, 'w', closefd=False)\nprint('y')",
        0,
        "x\ny\n",
    ),
    "stdout set to None": ("import sys\nprint('x')\nsys.stdout.flush()\nsys.stdout = None", 0, "x\n"),
    "swapped stdout": (
        "import io, sys\nprint('first')\nsys.stdout = io.StringIO()\nprint('kept in memory')",
        0,
        "first\n",
    ),
    "atexit after an error": (
        "import atexit\natexit.register(print, 'bye')\nraise ValueError('boom')",
        1,
        "bye\n",
    ),
    "atexit after sys.exit": ("import atexit, sys\natexit.register(print, 'bye')\nsys.exit(3)", 3, "bye\n"),
}


def test_a_test_that_exits_is_collected_at_once(tmp_path: Path) -> None:
    source = "import os\nos.write(1, b'got ' + os.read(0, 100))"
    [reply] = template_replies(source, 1, tmp_path, stdin="input")
    assert (reply["stdout"], reply["exit_code"], reply["status"]) == ("got input", 0, "ok"), reply
    assert reply["wall_s"] < 2.5  # not held until the wall limit


def test_a_test_past_its_wall_limit_is_killed(tmp_path: Path) -> None:
    [reply] = template_replies(
        "import time\ntime.sleep(60)", 1, tmp_path, limits={**LIMITS, "wall_limit": 0.5}
    )
    assert reply["status"] == "time_limit", reply
    assert 0.5 <= reply["wall_s"] < 4.0


def test_a_program_past_its_file_size_limit_is_an_output_limit(tmp_path: Path) -> None:
    # Python ignores SIGXFSZ; an exec'd program must not inherit that and carry on with EFBIG.
    argv = ["/bin/sh", "-c", "exec head -c 4000000 /dev/zero > fill.bin"]
    [reply] = template_replies("", 1, tmp_path, argv=argv, limits={**LIMITS, "disk_limit": 1})
    assert reply["status"] == "output_limit", reply


@pytest.mark.parametrize("case", sorted(EXITS))
def test_python_tests_end_as_the_interpreter_would(case: str, tmp_path: Path) -> None:
    source, exit_code, stdout = EXITS[case]
    [reply] = template_replies(source, 1, tmp_path)
    assert (reply["exit_code"], reply["stdout"]) == (exit_code, stdout), reply


RLIMITS_PROGRAM = """
import resource
for name in ("CPU", "AS", "STACK", "FSIZE", "NPROC", "NOFILE", "CORE"):
    print(name, *resource.getrlimit(getattr(resource, "RLIMIT_" + name)))
"""


def test_a_python_test_runs_under_the_limits_the_runner_set(tmp_path: Path) -> None:
    [reply] = template_replies(RLIMITS_PROGRAM, 1, tmp_path)
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


def test_a_python_test_runs_only_its_own_exit_hooks(tmp_path: Path) -> None:
    # A hook the runner's interpreter registered before its template forked (a library it imported)
    # is not the program's: a test runs those its program registered, and no others.
    before = "import atexit, os\natexit.register(os.write, 1, b'inherited\\n')"
    source = "import atexit\natexit.register(print, 'bye')\nprint('hello')"
    [reply] = template_replies(source, 1, tmp_path, before)
    assert (reply["status"], reply["stdout"]) == ("ok", "hello\nbye\n"), reply


def test_each_test_of_a_submission_runs_with_its_own_arguments(tmp_path: Path) -> None:
    # The template keeps the spec of a submission's last test and is sent a new one only when it
    # differs: arguments equal under == but of another type (1, True, 1.0) are different tests.
    source = "def kind(value):\n    return type(value).__name__ + ':' + repr(value)"
    arguments = [[1], [True], [1.0], [1], [[1]], [1]]
    tests = [{"type": "function_call", "fn_name": "kind", "input": value} for value in arguments]
    tests.insert(3, {"type": "stdin_stdout", "input": "between"})
    replies = template_replies(source, 0, tmp_path, tests=tests)
    assert [reply["status"] for reply in replies] == ["ok"] * len(tests), replies
    results = [json.loads(reply["result"]) for reply in replies if "result" in reply]
    assert results == ["int:1", "bool:True", "float:1.0", "int:1", "list:[1]", "int:1"]


MEMORY_PROBE = """
import ctypes, re

def probe(mine):
    # Every other test's marker this process's writable memory holds, live or freed.
    mine = mine.split()[0]
    found = set()
    for line in open("/proc/self/maps"):
        span, perms = line.split()[:2]
        if perms.startswith("rw"):
            start, end = (int(part, 16) for part in span.split("-"))
            found.update(m.decode() for m in re.findall(rb"zygote-marker-[0-9]+", ctypes.string_at(start, end - start)))
    return sorted(found - {mine})
"""


def test_a_test_holds_no_other_tests_arguments(tmp_path: Path) -> None:
    # The template keeps what a submission's tests share; a function's arguments go to their test
    # alone, so no test finds another's in its memory, live or freed.
    arguments = [" ".join([f"zygote-marker-{n}"] * (1 + 400 * (n % 2 == 0))) for n in range(4)]  # long, short
    tests = [{"type": "function_call", "fn_name": "probe", "input": [argument]} for argument in arguments]
    replies = template_replies(MEMORY_PROBE, 0, tmp_path, tests=tests)
    assert [reply["status"] for reply in replies] == ["ok"] * 4, replies
    assert [json.loads(reply["result"]) for reply in replies] == [[]] * 4
