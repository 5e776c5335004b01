"""The verification fork server started early: kept when it has what the verifiers declare, started
again when it lacks a declared preload and nothing was forked from it, never once something was.

Each case runs in an interpreter of its own: the fork server is one per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from genesys.verification import fork_server

SUPPORT = Path(__file__).parent / "support"

PRELUDE = """
import json, os
from multiprocessing import forkserver
import genesys
from conftest import rollout
from genesys.config import VerifyConfig
from genesys.verification import fork_server
from genesys_testplugins import Echo, EnvProbe, Preloaded

def server_pid():
    return forkserver._forkserver._forkserver_pid

def verify(rows, *classes):
    config = VerifyConfig(progress=False, workers=1)
    return genesys.verify_rollouts(rows, config=config, verifiers={c.task_type: c for c in classes})
"""


def run_case(body: str, top: str = "", script_file: Path | None = None, guard: bool = True) -> dict:
    """Run `body` under a main guard (or, `guard` False, at the top level) after PRELUDE and `top`;
    as `python -c`, or as `script_file` (a main script, which multiprocessing's children run first
    unless their server has)."""
    if guard:
        body = "\nif __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(body), "    ")
    script = PRELUDE + top + textwrap.dedent(body)
    path = [str(SUPPORT), str(SUPPORT.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    if script_file is None:
        command = [sys.executable, "-c", script]
    else:
        script_file.write_text(script)
        command = [sys.executable, str(script_file)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_an_early_server_is_kept_when_the_verifiers_declare_no_preload():
    out = run_case("""
        fork_server.start_early()
        early = server_pid()
        (row,) = verify([rollout("echo", "yes", expected="yes")], Echo)
        print(json.dumps({"early": early, "after": server_pid(), "score": row["score"]}))
    """)
    assert out["early"] is not None and out["after"] == out["early"]
    assert out["score"] == 1.0


def test_an_early_server_lacking_a_declared_preload_starts_again_with_it():
    out = run_case("""
        fork_server.start_early()
        early = server_pid()
        (row,) = verify([rollout("preloaded", "x")], Preloaded)
        info = row["verification_result_info"]
        print(json.dumps({"early": early, "after": server_pid(), **info}))
    """)
    assert out["after"] != out["early"]
    assert out["imported_in"] == out["after"]  # imported by the new server, before the worker forked


def test_a_server_something_was_forked_from_is_never_stopped():
    out = run_case("""
        fork_server.start_early()
        early = server_pid()
        fork_server.fork_context()  # what a process-isolated environment takes before it forks
        fork_server.fork_context(["genesys_preload_probe"], {"genesys_preload_probe"})
        print(json.dumps({"early": early, "after": server_pid()}))
    """)
    assert out["after"] == out["early"]


def test_workers_of_an_early_server_see_the_environment_of_when_the_run_starts():
    out = run_case("""
        os.environ["GENESYS_TEST_SETTING"] = "before"
        fork_server.start_early()
        os.environ["GENESYS_TEST_SETTING"] = "after"
        os.environ.pop("HOME", None)
        rows = [rollout("env_probe", "x", name="GENESYS_TEST_SETTING"), rollout("env_probe", "x", name="HOME")]
        out = verify(rows, EnvProbe)
        print(json.dumps([row["verification_result_info"]["value"] for row in out]))
    """)
    assert out == ["after", None]


def test_what_the_server_preloaded_is_frozen_in_the_processes_forked_from_it():
    out = run_case("""
        import gc
        fork_server.start_early()
        with fork_server.fork_context().Pool(1) as pool:
            frozen = pool.apply(gc.get_freeze_count)
        print(json.dumps({"frozen": frozen, "here": gc.get_freeze_count()}))
    """)
    assert out["frozen"] > 10000  # the worker's and the verifiers' modules
    assert out["here"] == 0  # the command's own heap is not the server's to freeze


def test_an_early_server_preloads_the_built_in_verifiers_only():
    modules = fork_server.builtin_verifier_modules()
    assert "genesys.verifiers.code" in modules and "genesys.verifiers.math" in modules
    assert all(module.startswith("genesys.verifiers.") for module in modules)  # no backends, no tasks


@pytest.mark.parametrize("early", [True, False], ids=["early server", "server the engine starts"])
def test_the_main_script_runs_in_the_server_once_not_in_every_worker(tmp_path: Path, early: bool):
    runs = tmp_path / "runs"
    top = f"\nwith open({str(runs)!r}, 'a') as handle:\n    handle.write('%d\\n' % os.getpid())\n"
    out = run_case(
        f"""
        if {early}:
            fork_server.start_early()
        rows = [rollout("echo", "yes", expected="yes") for _ in range(8)]
        config = VerifyConfig(progress=False, workers=2)
        out = genesys.verify_rollouts(rows, config=config, verifiers={{Echo.task_type: Echo}})
        workers = sorted({{row["verification_result_info"]["pid"] for row in out}})
        print(json.dumps({{"main": os.getpid(), "server": server_pid(), "workers": workers}}))
        """,
        top,
        tmp_path / "main_script.py",
    )
    ran_in = [int(line) for line in runs.read_text().split()]
    # The script's top ran here, then in the server, and in none of the two workers (each starts
    # with the pool, whether or not rows reach it).
    assert ran_in == [out["main"], out["server"]]
    assert out["workers"] and not set(out["workers"]) & set(ran_in)


def test_a_script_without_a_main_guard_verifies_with_the_classes_it_defines(tmp_path: Path):
    runs = tmp_path / "runs"
    top = f"""
with open({str(runs)!r}, 'a') as handle:
    handle.write('%d\\n' % os.getpid())

class Shout(genesys.Verifier):
    task_type = "shout"

    def verify(self, rollout):
        return genesys.Verdict(score=float(rollout.completion.isupper()), details={{"pid": os.getpid()}})
"""
    out = run_case(
        """
        rows = [rollout("shout", "YES"), rollout("shout", "no")]
        out = genesys.verify_rollouts(rows, config=VerifyConfig(progress=False, workers=2), verifiers={"shout": Shout})
        workers = sorted({row["verification_result_info"]["pid"] for row in out})
        print(json.dumps({"main": os.getpid(), "server": server_pid(), "workers": workers, "scores": [row["score"] for row in out]}))
        """,
        top,
        tmp_path / "unguarded.py",
        guard=False,
    )
    # The server ran the script up to the verification, which it refused; the workers found its
    # class there and did not run the script again.
    assert out["scores"] == [1.0, 0.0]
    assert [int(line) for line in runs.read_text().split()] == [out["main"], out["server"]]
    assert out["workers"] and out["server"] not in out["workers"]


def test_a_training_run_started_while_the_server_runs_the_main_script_is_refused(monkeypatch):
    pytest.importorskip("torch")
    from genesys.train import train

    monkeypatch.setattr(fork_server, "running_main_script", True)
    with pytest.raises(fork_server.MainScriptWork, match="a training run .* __name__"):
        train(None)  # refused before the configuration is read
    with pytest.raises(fork_server.MainScriptWork, match="verification"):
        fork_server.fork_context()
