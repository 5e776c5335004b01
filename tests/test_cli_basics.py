"""What every command line tool answers: its version, in each spelling, and shell completion."""

from __future__ import annotations

import os
import subprocess

from conftest import GENESYS


def genesys(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GENESYS, *args], capture_output=True, text=True, timeout=120, env=env)


def test_version_in_every_spelling() -> None:
    answers = [genesys(flag) for flag in ("-V", "--version")]
    assert all(done.returncode == 0 for done in answers), [done.stderr for done in answers]
    assert answers[0].stdout == answers[1].stdout
    assert answers[0].stdout.startswith("genesys ")
    report = genesys("version")
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0] == answers[0].stdout.strip()
    assert lines[1].startswith("python ")
    assert any(line.startswith("pluggy ") for line in lines[2:])


def test_bash_completion_completes_commands() -> None:
    script = genesys(env={**os.environ, "_GENESYS_COMPLETE": "bash_source"})
    assert script.returncode == 0 and "complete " in script.stdout
    words = {
        **os.environ,
        "_GENESYS_COMPLETE": "bash_complete",
        "COMP_WORDS": "genesys ver",
        "COMP_CWORD": "1",
    }
    assert genesys(env=words).stdout.split() == ["plain,verify", "plain,version"]
