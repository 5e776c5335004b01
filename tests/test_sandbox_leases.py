"""Host-wide leases: sandbox uids and run ids are judged by lock files, not pids, so jobs in other pid
namespaces never share a uid and never have their live containers reaped."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_sandbox_backends import backend_skip_reason
from test_sandbox_lifecycle import wait_until

from genesys.sandbox.base import SandboxUnavailable
from genesys.sandbox.leases import RunLease, UidLease, lease_cpu

# A range of uids nothing else leases, in a lease directory of the test's own.
FIRST = 90000

# Takes a lease and holds it: prints its pid (1 in a fresh pid namespace) and what it holds.
HOLDER = """
import os, sys, time
from genesys.sandbox.leases import RunLease, UidLease
lease = UidLease(int(sys.argv[2]), int(sys.argv[3])) if sys.argv[1] == "uid" else RunLease()
print(os.getpid(), lease.uid if sys.argv[1] == "uid" else lease.run_id, flush=True)
time.sleep(600)
"""

# Opens a sandbox, prints its pid and the uid a submission runs as, then holds the sandbox open.
SANDBOX_HOLDER = """
import os, sys, time
from genesys.sandbox.backends import open_sandbox
from genesys.sandbox.base import Submission
sandbox = open_sandbox(sys.argv[1])
result = sandbox.run(Submission("python", "import os; print(os.getuid())", [{"type": "stdin_stdout", "input": ""}]))
print(os.getpid(), result.tests[0]["stdout"].strip(), flush=True)
if sys.argv[2:] == ["again"]:  # run once more when told, to show the sandbox still works
    sys.stdin.readline()
    result = sandbox.run(Submission("python", "print(6 * 7)", [{"type": "stdin_stdout", "input": ""}]))
    print(result.tests[0]["status"], result.tests[0]["stdout"].strip(), flush=True)
time.sleep(600)
"""


# Job one: a submission whose program holds 62 processes of its uid for a minute. Prints its pid
# once the submission is on its way.
PROCESS_HOLDER = '''
import os, sys, threading, time
from genesys.sandbox.backends import open_sandbox
from genesys.sandbox.base import Submission
from genesys.sandbox.limits import Limits
HOLD = """
import os, time
for _ in range(61):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
time.sleep(60)
"""
sandbox = open_sandbox(sys.argv[1])
# 62 forks of one interpreter share most pages, which the sum of their RSS counts 62 times
limits = Limits(time_limit=5, wall_limit=90, process_limit=64, memory_limit=4096)
hold = Submission("python", HOLD, [{"type": "stdin_stdout", "input": ""}], limits=limits, budget_s=90)
threading.Thread(target=sandbox.run, args=(hold,), daemon=True).start()
print(os.getpid(), "started", flush=True)
time.sleep(600)
'''

# Job two: once told, runs a Python row that starts 16 threads and a JavaScript row (node starts
# threads of its own); prints each test's language, status and output.
THREADED_ROWS = '''
import os, sys
from genesys.sandbox.backends import open_sandbox
from genesys.sandbox.base import Submission
THREADED = """
import threading
seen = []
threads = [threading.Thread(target=seen.append, args=(i,)) for i in range(16)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(sum(seen))
"""
sandbox = open_sandbox(sys.argv[1])
rows = [("python", THREADED)]
if "javascript" in sandbox.languages():
    rows.append(("javascript", "console.log([1, 2, 3].map((x) => x * 40).reduce((a, b) => a + b))"))
print(os.getpid(), len(rows), flush=True)
sys.stdin.readline()
for language, source in rows:
    test = sandbox.run(Submission(language, source, [{"type": "stdin_stdout", "input": ""}])).tests[0]
    print(language, test["status"], test["stdout"].strip(), flush=True)
'''


@functools.cache
def unshare_skip_reason() -> str | None:
    """Why this test cannot start processes in a fresh pid namespace here (None when it can)."""
    if not shutil.which("unshare"):
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot make a pid namespace here: {probe.stderr.strip()}"
    return None


@pytest.fixture
def pid_namespaces() -> None:
    reason = unshare_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def lease_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lease directory of this test's own (children inherit it through the environment)."""
    monkeypatch.setenv("GENESYS_LEASE_DIR", str(tmp_path / "leases"))
    return tmp_path / "leases"


@contextlib.contextmanager
def in_pid_namespace(program: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Run `program` as pid 1 of a fresh pid namespace; yields the process and its first line's words.
    The process is SIGKILLed on leaving (killing `unshare` kills its child)."""
    process = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c", program, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        words = process.stdout.readline().split()
        assert words, "the process in the fresh pid namespace ended early"
        assert words[0] == "1", "not in a fresh pid namespace"
        yield process, words[1:]
    finally:
        process.kill()
        process.wait()


def uid_free(uid: int) -> bool:
    try:
        UidLease(uid, 1).release()
    except SandboxUnavailable:
        return False
    return True


def test_uid_leases_in_one_process_differ_and_free_on_release(lease_dir: Path) -> None:
    with UidLease(FIRST, 2) as first, UidLease(FIRST, 2) as second:
        assert {first.uid, second.uid} == {FIRST, FIRST + 1}
        with pytest.raises(SandboxUnavailable, match="all 2 sandbox uids"):
            UidLease(FIRST, 2)
    assert uid_free(FIRST) and uid_free(FIRST + 1)
    assert sorted(os.listdir(lease_dir / "uids")) == [f"{FIRST}.lock", f"{FIRST + 1}.lock"]  # files stay


def test_cpu_leases_differ_none_when_all_are_taken_and_free_on_release(lease_dir: Path) -> None:
    first, second = lease_cpu({3, 5}), lease_cpu({5, 3})
    assert first is not None and second is not None
    assert (first.cpu, second.cpu) == (3, 5)
    assert lease_cpu({3, 5}) is None  # every CPU taken: nothing held, the runner is not pinned
    first.release()
    again = lease_cpu({3, 5})
    assert again is not None and again.cpu == 3
    again.release()
    second.release()


def test_uid_held_in_another_pid_namespace_is_not_handed_out(lease_dir: Path, pid_namespaces: None) -> None:
    with in_pid_namespace(HOLDER, "uid", str(FIRST), "2") as (holder, (held,)):
        with UidLease(FIRST, 2) as mine:
            assert mine.uid != int(held)
            with pytest.raises(SandboxUnavailable):
                UidLease(FIRST, 2)
        assert not uid_free(int(held))
        holder.kill()
        assert wait_until(lambda: uid_free(int(held)), 20), "the dead holder's uid stayed taken"


def test_a_file_of_another_user_is_skipped(lease_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file of another user")
    with UidLease(FIRST, 1):
        pass
    os.chown(lease_dir / "uids" / f"{FIRST}.lock", 12345, 12345)  # its owner could unlink it under our lock
    with UidLease(FIRST, 2) as lease:
        assert lease.uid == FIRST + 1


def test_run_lease_holder_dead(lease_dir: Path, pid_namespaces: None) -> None:
    assert RunLease.holder_dead("0" * 32) is None  # no such run on this host
    assert RunLease.holder_dead("../../etc/passwd") is None
    with RunLease() as mine:
        assert RunLease.holder_dead(mine.run_id) is False
    assert RunLease.holder_dead(mine.run_id) is None  # released: its file is gone
    with in_pid_namespace(HOLDER, "run") as (holder, (run_id,)):
        assert RunLease.holder_dead(run_id) is False
        holder.kill()
        assert wait_until(lambda: RunLease.holder_dead(run_id) is not False, 20)
    assert not (lease_dir / "runs" / f"{run_id}.lock").exists()  # the judge removed the dead run's file
    assert RunLease.holder_dead(run_id) is None


def dead_run() -> str:
    """The id of a run whose holder exited without letting go of its lease (as a SIGKILLed one would)."""
    take = "import os; from genesys.sandbox.leases import RunLease; print(RunLease().run_id, flush=True); os._exit(0)"
    return subprocess.run(
        [sys.executable, "-c", take], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_prune_removes_only_dead_runs_not_kept(lease_dir: Path) -> None:
    gone, kept = dead_run(), dead_run()
    assert (lease_dir / "runs" / f"{gone}.lock").exists()
    with RunLease() as live:
        assert RunLease.prune(keep={kept}) == 1
        assert sorted(os.listdir(lease_dir / "runs")) == sorted([f"{kept}.lock", f"{live.run_id}.lock"])
        assert RunLease.holder_dead(kept) is True and RunLease.holder_dead(live.run_id) is False


@pytest.fixture
def shared_temporary_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of the test's own (for this process and its children) that the
    programs' uid reaches as it reaches /tmp."""
    import tempfile

    temporary = Path(tempfile.mkdtemp(prefix="genesys-test-tmp-", dir="/tmp"))
    temporary.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    yield temporary
    shutil.rmtree(temporary, ignore_errors=True)


def test_a_subprocess_sandbox_removes_the_scratch_of_runs_that_died_and_keeps_live_ones(
    lease_dir: Path, shared_temporary_dir: Path
) -> None:
    """A worker killed at its deadline never closes its sandbox: its scratch directory was left in
    the temporary directory for good, one per killed worker."""
    from genesys.sandbox.unsandboxed import SubprocessSandbox

    def scratches() -> set[str]:
        return {
            path.name
            for path in shared_temporary_dir.iterdir()
            if path.name.startswith("genesys-unsandboxed-")
        }

    holders = []
    try:
        for _ in range(2):
            holders.append(
                subprocess.Popen(
                    [sys.executable, "-c", SANDBOX_HOLDER, "subprocess"], stdout=subprocess.PIPE, text=True
                )
            )
            assert holders[-1].stdout is not None and holders[-1].stdout.readline(), "its sandbox did not run"
        live, killed = holders
        both = scratches()
        assert len(both) == 2
        killed.kill()
        killed.wait()
        assert scratches() == both  # nothing of the killed run removed it
        sandbox = SubprocessSandbox({"python": {"run": sys.executable}})
        try:
            left = scratches()
            assert len(left) == 1 and left < both  # the live run's, still in use
            sandbox.warm_up()
            assert len(scratches()) == 2 and left < scratches()
        finally:
            sandbox.close()
        assert scratches() == left  # its own went with it
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def sandbox_skip_reason(kind: str) -> str | None:
    if kind == "bwrap" and os.geteuid() != 0:
        return "bwrap leases uids only when run as root"
    return unshare_skip_reason() or backend_skip_reason(kind)


@pytest.mark.parametrize(
    "kind", [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bwrap", marks=pytest.mark.bwrap)]
)
def test_sandboxes_in_other_pid_namespaces_get_other_uids(kind: str, lease_dir: Path) -> None:
    """Two jobs whose pids are equal (1, each in its own pid namespace) run their programs as other uids."""
    reason = sandbox_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    with (
        in_pid_namespace(SANDBOX_HOLDER, kind) as (_, (first,)),
        in_pid_namespace(SANDBOX_HOLDER, kind) as (_, (second,)),
    ):
        assert int(first) >= 1000 and int(second) >= 1000
        assert first != second


@pytest.mark.parametrize(
    "kind", [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bwrap", marks=pytest.mark.bwrap)]
)
def test_a_closed_sandbox_gives_its_uid_back(kind: str, lease_dir: Path) -> None:
    reason = sandbox_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    from genesys.sandbox.backends import open_sandbox
    from genesys.sandbox.base import Submission

    sandbox = open_sandbox(kind)
    try:
        result = sandbox.run(
            Submission("python", "import os; print(os.getuid())", [{"type": "stdin_stdout", "input": ""}])
        )
        uid = int(result.tests[0]["stdout"])
        assert not uid_free(uid)
    finally:
        sandbox.close()
    assert uid_free(uid)


@pytest.mark.bwrap
def test_a_bwrap_sandbox_runs_on_a_cpu_of_its_own_and_gives_it_back(lease_dir: Path) -> None:
    """Two sandboxes at once run their programs on two different single CPUs (where the host has two
    to lend); a closed sandbox's CPU goes to the next one."""
    reason = backend_skip_reason("bwrap")
    if reason:
        pytest.skip(reason)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    from genesys.sandbox.backends import open_sandbox
    from genesys.sandbox.base import Submission

    program = "import os; print(*sorted(os.sched_getaffinity(0)))"

    def cpus_of(sandbox: object) -> list[int]:
        result = sandbox.run(Submission("python", program, [{"type": "stdin_stdout", "input": ""}]))  # type: ignore[attr-defined]
        return [int(word) for word in result.tests[0]["stdout"].split()]

    first, second = open_sandbox("bwrap"), open_sandbox("bwrap")
    try:
        mine, theirs = cpus_of(first), cpus_of(second)
        assert len(mine) == 1 and len(theirs) == 1 and mine != theirs
        first.close()
        third = open_sandbox("bwrap")
        try:
            assert cpus_of(third) == mine
        finally:
            third.close()
    finally:
        first.close()
        second.close()


@pytest.fixture
def docker_client() -> Iterator[object]:
    reason = unshare_skip_reason() or backend_skip_reason("docker")
    if reason:
        pytest.skip(reason)
    import docker

    client = docker.from_env()
    yield client
    client.close()


@pytest.mark.docker
def test_reaping_spares_a_live_run_in_another_pid_namespace(docker_client, lease_dir: Path) -> None:
    """A container of a run held by a live process (other pid namespace, same hostname) survives
    `reap_stale`; once the holder is killed, the next `reap_stale` removes it."""
    from genesys.sandbox.docker_backend import (
        DEFAULT_IMAGE,
        LABEL,
        RUN_LABEL,
        reap_stale,
    )

    python = json.loads(docker_client.images.get(DEFAULT_IMAGE).labels["genesys.toolchains"])["python"]["run"]
    with in_pid_namespace(HOLDER, "run") as (holder, (run_id,)):
        container = docker_client.containers.run(
            DEFAULT_IMAGE,
            [python, "-c", "import time; time.sleep(600)"],
            detach=True,
            network_mode="none",
            labels={LABEL: "1", RUN_LABEL: run_id, "genesys.expires": str(time.time() + 600)},
        )
        try:
            no_containers = dead_run()
            reap_stale(docker_client)
            assert container.id in [c.id for c in docker_client.containers.list(all=True)], (
                "a live run's container was reaped"
            )
            assert not (lease_dir / "runs" / f"{no_containers}.lock").exists(), (
                "a dead run's lock file was kept"
            )
            holder.kill()
            holder.wait()

            def reaped() -> bool:
                reap_stale(docker_client)
                return container.id not in [c.id for c in docker_client.containers.list(all=True)]

            assert wait_until(reaped, 30), "the dead run's container was not reaped"
        finally:
            with contextlib.suppress(Exception):
                container.remove(force=True)


@pytest.mark.docker
def test_reaping_ignores_a_container_that_goes_away_while_it_lists_them(
    docker_client, lease_dir: Path
) -> None:
    """Another run's container that removes itself between the listing and its inspection (a run
    ending as a worker of the next one starts) made `reap_stale`, and with it the sandbox's start and
    the worker's verifier, fail with docker's NotFound: every row that worker took was an error."""
    from genesys.sandbox.docker_backend import DEFAULT_IMAGE, LABEL, RUN_LABEL, reap_stale

    python = json.loads(docker_client.images.get(DEFAULT_IMAGE).labels["genesys.toolchains"])["python"]["run"]
    with RunLease() as live:
        container = docker_client.containers.run(
            DEFAULT_IMAGE,
            [python, "-c", "import time; time.sleep(600)"],
            detach=True,
            network_mode="none",
            labels={LABEL: "1", RUN_LABEL: live.run_id, "genesys.expires": str(time.time() + 600)},
        )
        inspect = docker_client.api.inspect_container

        def removed_first(container_id: str) -> object:
            if container_id == container.id:
                container.remove(force=True)  # gone between the listing and this inspection
            return inspect(container_id)

        try:
            docker_client.api.inspect_container = removed_first
            reap_stale(docker_client)
        finally:
            docker_client.api.inspect_container = inspect
            with contextlib.suppress(Exception):
                container.remove(force=True)
        assert container.id not in [c.id for c in docker_client.containers.list(all=True)]


@pytest.mark.docker
def test_a_docker_sandbox_in_another_pid_namespace_keeps_its_containers(
    docker_client, lease_dir: Path
) -> None:
    """A job opening a docker sandbox here (which reaps) leaves a live job's pool alone, though that job's
    pid means another process here."""
    from genesys.sandbox.docker_backend import DockerSandbox

    with in_pid_namespace(SANDBOX_HOLDER, "docker", "again") as (other, _):
        DockerSandbox().close()
        assert other.stdin is not None and other.stdout is not None
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline().split() == ["ok", "42"], "the other job's sandbox broke"


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bwrap", marks=pytest.mark.bwrap)]
)
def test_a_job_holding_processes_does_not_starve_another_jobs_threads(kind: str, lease_dir: Path) -> None:
    """Two jobs, each pid 1 of its own pid namespace: while one job's program holds 62 processes
    (its process limit is 64), the other job's threaded Python and JavaScript rows still pass. Were
    their programs' uids the same, RLIMIT_NPROC would count both jobs' processes together."""
    reason = sandbox_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    with (
        in_pid_namespace(THREADED_ROWS, kind) as (second, (rows,)),
        in_pid_namespace(PROCESS_HOLDER, kind) as (_, (started,)),
    ):
        assert started == "started"
        held = wait_until(lambda: max(processes_by_uid().values(), default=0) >= 62, 120)
        assert held, "the first job's program never held its 62 processes"
        assert second.stdin is not None and second.stdout is not None
        second.stdin.write("go\n")
        second.stdin.flush()
        results = [second.stdout.readline().split() for _ in range(int(rows))]
    expected = {"python": "120", "javascript": "240"}
    assert results == [[row[0], "ok", expected[row[0]]] for row in results], results
    assert results[0][0] == "python"


def processes_by_uid() -> dict[int, int]:
    """How many processes each uid of 1000 and up runs on this host (sandboxed programs among them)."""
    counts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
            except OSError:
                continue
            if uid >= 1000:
                counts[uid] = counts.get(uid, 0) + 1
    return counts
