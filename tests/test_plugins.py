"""The plugin contract end to end: install a package, discover it, use it; clashes; listing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import GENESYS, read_jsonl, rollout, write_jsonl

import genesys
from genesys.plugins import PluginError, new_plugin_manager, plugin_infos, verifier_entries

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


@pytest.fixture
def installed_palindrome(tmp_path_factory: pytest.TempPathFactory):
    """A plugin package written the way DESIGN.md shows, pip-installed into the test venv."""
    root = tmp_path_factory.mktemp("palindrome-plugin")
    (root / "genesys_palindrome_test").mkdir()
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["setuptools>=69"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "genesys-palindrome-test"
            version = "1.2.3"
            [project.entry-points.genesys]
            palindrome = "genesys_palindrome_test"
            """
        )
    )
    (root / "genesys_palindrome_test" / "__init__.py").write_text(
        textwrap.dedent(
            """
            import genesys

            class Palindrome(genesys.Verifier):
                task_type = "palindrome"
                timeout = 5.0
                def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
                    text = rollout.completion.strip()
                    return genesys.Verdict(score=float(text == text[::-1]))

            @genesys.hookimpl
            def genesys_verifiers():
                return [Palindrome]
            """
        )
    )
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", str(root)], check=True, timeout=300)
    yield
    subprocess.run([*PIP, "uninstall", "-y", "genesys-palindrome-test"], check=True, timeout=300)


def test_an_installed_plugin_is_discovered_listed_and_used(installed_palindrome, tmp_path: Path):
    listing = subprocess.run([GENESYS, "plugins"], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    line = next(line for line in listing.stdout.splitlines() if "palindrome" in line)
    assert "1.2.3" in line and "genesys-palindrome-test" in line

    inputs = write_jsonl(
        tmp_path / "in.jsonl", [rollout("palindrome", "racecar"), rollout("palindrome", "genesys")]
    )
    result = subprocess.run(
        [GENESYS, "verify", str(inputs), "-o", str(tmp_path / "out.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert [r["score"] for r in read_jsonl(tmp_path / "out.jsonl")] == [1.0, 0.0]


def test_the_example_countdown_plugin_is_installed_and_scores(tmp_path: Path):
    entries = verifier_entries(new_plugin_manager())
    assert entries["countdown"].plugin == "countdown"
    info = {"numbers": [25, 50, 3, 7], "target": 518}
    rows = [
        rollout(
            "countdown", "<think>50*...</think> <answer>(50 + 25) * 7 - 3 - 4</answer>", **info
        ),  # uses 4: not given
        rollout("countdown", "<answer>50 * 7 + 25 * 7</answer>", **info),  # 7 twice
        rollout("countdown", "so <answer>(25 - 7) * 50 / 3 + 218</answer>", **info),
        rollout("countdown", "<answer>7 * (50 + 25) - 3 * 1</answer>", **info),
        rollout("countdown", "no tags at all", **info),
        rollout(
            "countdown",
            "<answer>50 * (7 + 3) + 25 - 7</answer>",
            **{"numbers": [50, 7, 3, 25, 7], "target": 518},
        ),
    ]
    out = genesys.verify_rollouts(
        rows, config=genesys.verification.api.VerifyConfig(workers=1, progress=False)
    )
    reasons = [r["verification_result_info"].get("reason") for r in out]
    assert reasons[:2] == ["numbers_mismatch", "numbers_mismatch"]
    assert reasons[4] == "no_answer"
    assert [r["score"] for r in out] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]


class _Twin(genesys.Verifier):
    task_type = "echo"

    def verify(self, rollout):
        return genesys.Verdict(score=1.0)


class _TwinPlugin:
    @genesys.hookimpl
    def genesys_verifiers(self):
        return [_Twin]


def test_two_plugins_claiming_one_task_type_is_an_error_naming_both():
    import genesys_testplugins

    pm = new_plugin_manager(load_entry_points=False, extra_plugins=[genesys_testplugins])
    pm.register(_TwinPlugin(), name="twin-plugin")
    with pytest.raises(PluginError) as excinfo:
        verifier_entries(pm)
    message = str(excinfo.value)
    assert "'echo'" in message and "genesys_testplugins" in message and "twin-plugin" in message


def test_a_hook_returning_a_non_verifier_is_rejected():
    class Bad:
        @genesys.hookimpl
        def genesys_verifiers(self):
            return [object]

    pm = new_plugin_manager(load_entry_points=False, extra_plugins=[Bad()])
    with pytest.raises(PluginError, match="not a Verifier subclass"):
        verifier_entries(pm)


def test_plugin_infos_report_task_types(plugin_env):
    infos = {info.name: info for info in plugin_infos(new_plugin_manager())}
    assert "echo" in infos["genesys_testplugins"].task_types
    assert infos["countdown"].version == "0.1.0"


def test_the_cli_does_not_import_torch_transformers_or_vllm(plugin_env):
    code = (
        "import sys, genesys.cli\n"
        "for argv in (['plugins'], ['verify', '--help']):\n"
        "    try:\n"
        "        genesys.cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]\n"
        "print(','.join(heavy) or 'none')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=plugin_env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "none"


def test_genesys_plugins_may_name_a_module_an_entry_point_already_loaded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GENESYS_PLUGINS", "genesys.verifiers.math,genesys_testplugins")
    entries = verifier_entries(new_plugin_manager())
    assert entries["verifiable_math"].plugin == "math" and "echo" in entries
