"""`genesys sandbox build` and `genesys sandbox check` as a user runs them."""

from __future__ import annotations

import subprocess

import pytest
from conftest import GENESYS
from test_sandbox_backends import backend_skip_reason


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GENESYS, "sandbox", *args], capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.bwrap
def test_check_reports_each_backend() -> None:
    done = run("check")
    for backend in ("docker", "bwrap", "subprocess"):
        assert backend in done.stdout
    usable = [kind for kind in ("docker", "bwrap") if backend_skip_reason(kind) is None]
    assert done.returncode == (0 if usable else 1), done.stdout + done.stderr
    if usable:
        assert "python" in done.stdout and "yes" in done.stdout


@pytest.mark.slow
@pytest.mark.docker
def test_build_without_a_registry_builds_offline_and_reuses_the_image() -> None:
    reason = backend_skip_reason("docker")  # builds the image if it is not current
    if reason:
        pytest.skip(reason)
    from genesys.sandbox.docker_backend import DEFAULT_IMAGE  # $GENESYS_SANDBOX_IMAGE or the usual tag

    done = run("build")  # no registry reachable: falls back to the offline build, which is cached
    assert done.returncode == 0, done.stderr
    assert f"{DEFAULT_IMAGE} is up to date" in done.stderr or "built (online)" in done.stderr


@pytest.mark.slow
@pytest.mark.docker
def test_build_with_an_unknown_python_says_so() -> None:
    if backend_skip_reason("docker"):
        pytest.skip("needs a Docker daemon")
    done = run("build", "--offline", "--tag", "genesys-sandbox:never", "--python", "/nonexistent/python3")
    assert done.returncode == 1
    assert "/nonexistent/python3" in done.stderr


def test_shipped_dockerfile_declares_the_toolchains_it_installs() -> None:
    import json
    import re

    from genesys.sandbox.image import DOCKERFILE, ONLINE_TOOLCHAINS

    text = open(DOCKERFILE).read()
    label = re.search(r'LABEL genesys\.toolchains="((?:[^"\\]|\\.)*)"', text)
    assert label is not None
    assert json.loads(label.group(1).replace('\\"', '"')) == ONLINE_TOOLCHAINS
    assert "COPY runner.py /opt/genesys/runner.py" in text and "USER 65534" in text


def test_check_says_partly_when_some_languages_fail() -> None:
    from genesys.sandbox.backends import BackendCheck
    from genesys.sandbox.commands import check_rows, works

    partial = BackendCheck("subprocess", True, languages={"python": "ok", "rust": "compile error: denied"})
    whole = BackendCheck("bwrap", True, languages={"python": "ok", "cpp": "ok"})
    broken = BackendCheck("docker", False, "no daemon")
    assert [works(report) for report in (partial, whole, broken)] == ["partly", "yes", "no"]
    rows = check_rows([partial, whole, broken])
    assert rows[0][1] == "[yellow]partly[/yellow]"
    assert rows[0][2].startswith("python\n") and "rust: compile error: denied" in rows[0][2]
    assert rows[1][1] == "[green]yes[/green]" and rows[1][2] == "python, cpp"
    assert rows[2][1] == "[red]no[/red]"
