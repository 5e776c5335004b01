"""Nothing outlives its owner: containers and sandboxed processes go away when the process that
opened them is SIGKILLed mid-submission (as the engine does at a deadline); backend selection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from test_sandbox_backends import BACKENDS, backend_skip_reason, host_processes_with

from genesys.sandbox.backends import open_sandbox
from genesys.sandbox.base import SandboxUnavailable, Submission

# Opens a sandbox, reports its containers, then runs a program that sleeps under a marker name.
SECRET_NAME = "GENESYS_TEST_SECRET"
OWNER = """
import sys
from genesys.sandbox.backends import open_sandbox
from genesys.sandbox.base import Submission
from genesys.sandbox.limits import Limits
sandbox = open_sandbox(sys.argv[1])
sandbox.run(Submission("python", "print(1)", [{"type": "stdin_stdout", "input": ""}]))
print("containers", *(c.id for c in getattr(sandbox, "containers", list)()), flush=True)
sleeper = f"import os, sys\\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', {sys.argv[2]!r}])"
# Its own limits would end it only after two minutes: only the owner's death can end it sooner.
sandbox.run(Submission("python", sleeper, [{"type": "stdin_stdout", "input": ""}], limits=Limits(time_limit=60), budget_s=200))
"""


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.fixture
def docker_backend() -> None:
    """Skip, saying why, where the docker backend cannot run."""
    reason = backend_skip_reason("docker")
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("kind", BACKENDS)
def test_sigkilled_owner_leaves_nothing_behind(kind: str) -> None:
    reason = backend_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    marker = f"genesys-orphan-check-{os.getpid()}-{kind}"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, kind, marker], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    containers = owner.stdout.readline().split()[1:]
    assert wait_until(lambda: host_processes_with(marker), 60), "the sleeping program never started"
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert wait_until(lambda: not host_processes_with(marker), 30), "sandboxed processes outlived their owner"
    if kind == "docker":
        import docker

        client = docker.from_env()

        def gone() -> bool:
            return not [c for c in client.containers.list(all=True) if c.id in containers]

        assert containers and wait_until(gone, 30), "the owner's containers outlived it"


@pytest.mark.docker
def test_pool_containers_are_hardened(docker_backend: None) -> None:
    from genesys.sandbox.base import RUNNER_CAPABILITIES
    from genesys.sandbox.docker_backend import INIT_UID, DockerSandbox

    with DockerSandbox() as sandbox:
        sandbox.warm_up()
        (container,) = sandbox.containers()
        container.reload()
        host, config = container.attrs["HostConfig"], container.attrs["Config"]
        python = sandbox.toolchains["python"]["run"]
        init_status = container.exec_run(
            [python, "-c", "print(open('/proc/1/status').read())"]
        ).output.decode()
    assert host["NetworkMode"] == "none" and config["NetworkDisabled"]
    assert (
        host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    )
    assert host["Memory"] > 0 and host["MemorySwap"] == host["Memory"]
    assert host["PidsLimit"] > 0 and host["NanoCpus"] > 0
    assert "size=" in host["Tmpfs"]["/tmp"]
    # Root only to start (a docker exec gets the first user's capabilities): the init drops to its own uid at once.
    assert {cap.removeprefix("CAP_") for cap in host["CapAdd"]} == {
        cap.removeprefix("CAP_") for cap in RUNNER_CAPABILITIES
    }
    uids = next(line.split()[1:] for line in init_status.splitlines() if line.startswith("Uid:"))
    assert uids == [str(INIT_UID)] * 4, init_status
    assert not config["Env"] or not any(SECRET_NAME in item for item in config["Env"])


@pytest.mark.docker
def test_stale_containers_are_reaped(docker_backend: None) -> None:
    import docker

    from genesys.sandbox.docker_backend import (
        DEFAULT_IMAGE,
        LABEL,
        RUN_LABEL,
        reap_stale,
    )

    # A run whose holder exited without letting go of its lease (as a SIGKILLed one would).
    take_lease = "import os; from genesys.sandbox.leases import RunLease; print(RunLease().run_id, flush=True); os._exit(0)"
    dead_run = subprocess.run(
        [sys.executable, "-c", take_lease], capture_output=True, text=True, check=True
    ).stdout.strip()
    client = docker.from_env()
    python = json.loads(client.images.get(DEFAULT_IMAGE).labels["genesys.toolchains"])["python"]["run"]
    stale = client.containers.run(
        DEFAULT_IMAGE,
        [python, "-c", "import time; time.sleep(600)"],
        detach=True,
        network_mode="none",
        labels={LABEL: "1", RUN_LABEL: dead_run},
    )
    try:
        assert reap_stale(client) >= 1
        assert stale.id not in [c.id for c in client.containers.list(all=True)]
    finally:
        try:
            stale.remove(force=True)
        except docker.errors.NotFound:
            pass


def test_auto_refuses_clearly_without_docker_or_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable) as caught:
        open_sandbox("auto")
    message = str(caught.value)
    assert "docker:" in message and "bwrap:" in message and "--sandbox subprocess" in message


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sandbox backend 'firejail'"):
        open_sandbox("firejail")


def test_subprocess_backend_warns_loudly_and_runs(caplog: pytest.LogCaptureFixture) -> None:
    program = textwrap.dedent(
        """
        import sys
        print(sum(int(x) for x in sys.stdin.read().split()))
        """
    )
    with open_sandbox("subprocess") as sandbox:
        result = sandbox.run(Submission("python", program, [{"type": "stdin_stdout", "input": "1 2 3"}]))
    assert any(
        record.levelname == "WARNING" and "NOT a sandbox" in record.getMessage() for record in caplog.records
    )
    assert result.compiled and result.tests[0]["status"] == "ok" and result.tests[0]["stdout"] == "6\n"


@pytest.mark.slow
@pytest.mark.docker
def test_a_container_stopped_from_outside_is_a_sandbox_error(docker_backend: None) -> None:
    import threading

    from genesys.sandbox.base import SandboxError
    from genesys.sandbox.docker_backend import DockerSandbox
    from genesys.sandbox.limits import Limits

    with DockerSandbox() as sandbox:
        sandbox.warm_up()
        (container,) = sandbox.containers()
        threading.Timer(1.0, lambda: container.kill()).start()
        sleeper = Submission(
            "python",
            "import time\ntime.sleep(30)",
            [{"type": "stdin_stdout", "input": ""}],
            limits=Limits(time_limit=20),
        )
        with pytest.raises(SandboxError, match="container stopped"):
            sandbox.run(sleeper)
        # A fresh container takes its place.
        result = sandbox.run(Submission("python", "print(7)", [{"type": "stdin_stdout", "input": ""}]))
        assert result.tests[0]["stdout"] == "7\n"


def test_the_host_hears_of_a_test_while_a_later_one_runs() -> None:
    # The runner writes a submission's reports together while its tests are quick, but a test
    # that runs long sends the reports before it first: the host judges them as they come.
    heard: list[float] = []

    def on_test(index: int, report: dict) -> dict:
        heard.append(time.monotonic())
        return report

    program = "import sys, time\ntime.sleep(float(sys.stdin.read() or 0))\nprint('done')"
    tests = [{"type": "stdin_stdout", "input": seconds} for seconds in ("", "", "3")]
    with open_sandbox("subprocess") as sandbox:
        result = sandbox.run(Submission("python", program, tests, on_test=on_test))
    assert [test["status"] for test in result.tests] == ["ok"] * 3, result.tests
    assert heard[2] - heard[1] > 1.5  # the quick tests' reports did not wait for the slow one
