"""How `genesys` ends: interrupted (Ctrl-C), `genesys verify` exits having waited for every process
it started; done, the command freezes its heap first, so that the interpreter's exit does not walk it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GENESYS, rollout, write_jsonl


def _group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command) of every live process in process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cmdline = cmdline.strip() or stat[stat.index("(") : stat.rindex(")") + 1]
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            members.append((int(entry.name), f"{state} {cmdline}"))
    return members


@pytest.mark.slow
@pytest.mark.parametrize("to_group", [True, False], ids=["ctrl-c", "kill-int"])
def test_ctrl_c_leaves_no_process_of_the_run_behind(tmp_path: Path, plugin_env, to_group: bool):
    rows = [dict(rollout("slow", "x", sleep=0.05), problem_id=f"p{i}") for i in range(2000)]
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    run = subprocess.Popen(
        [GENESYS, "verify", str(inputs), "-o", str(output), "--workers", "2", "--no-progress"],
        env=plugin_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (output.exists() and output.stat().st_size > 0):
        time.sleep(0.1)  # workers are busy once the first rows are written
    assert len(_group_members(run.pid)) > 2, "the run should have started worker processes"
    if to_group:  # what Ctrl-C in a terminal does: SIGINT to the whole foreground group
        os.killpg(run.pid, signal.SIGINT)
    else:  # `kill -INT`: to the command alone
        os.kill(run.pid, signal.SIGINT)
    _, stderr = run.communicate(timeout=120)
    left = _group_members(run.pid)  # at the moment the command has exited
    assert run.returncode == 130, stderr
    assert "interrupted" in stderr.decode()
    assert left == [], f"processes of the run still alive after it exited: {left}"


def test_the_command_freezes_its_heap_when_done_only_when_it_is_the_process():
    script = (
        "import gc, json, sys\n"
        "from genesys.cli import main\n"
        "main(['--help'])\n"
        "called = gc.get_freeze_count()\n"
        "sys.argv = ['genesys', '--help']\n"
        "main()\n"
        "print(json.dumps([called, gc.get_freeze_count()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    called, as_the_command = json.loads(done.stdout.splitlines()[-1])
    assert called == 0 and as_the_command > 10000
