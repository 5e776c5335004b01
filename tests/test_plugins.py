"""The plugin contract end to end: install a package, discover it, use it; clashes; listing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import GENESYS, SUPPORT, read_jsonl, rollout, write_jsonl

import genesys
from genesys.errors import PluginWarning
from genesys.plugins import (
    ENTRY_POINT_GROUP,
    PLUGINS_ENV_VAR,
    PluginError,
    new_plugin_manager,
    plugin_commands,
    plugin_infos,
    task_sets,
    verifier_entries,
)
from genesys.plugins.registry import plugin_problems


def install(
    root: Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]
) -> Path:
    """Install a plugin package into `root` as pip would lay it out (its modules and a `*.dist-info` with
    the entry points), without touching the test venv: put `root` on PYTHONPATH (or sys.path) to install it."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    return root


def env_with(*roots: Path, **extra: str) -> dict[str, str]:
    """The environment of a `genesys` subprocess that sees the plugins installed in `roots`."""
    env = {key: value for key, value in os.environ.items() if key != PLUGINS_ENV_VAR}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, roots), os.environ.get("PYTHONPATH", "")])
    return {**env, **extra}


def genesys_run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([GENESYS, *args], capture_output=True, text=True, env=env, timeout=120)


PALINDROME = """
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


@pytest.fixture
def installed_palindrome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A plugin package written the way DESIGN.md shows, installed; the environment that sees it."""
    root = install(
        tmp_path_factory.mktemp("palindrome-plugin"),
        "genesys-palindrome-test",
        "1.2.3",
        {"palindrome": "genesys_palindrome_test"},
        {"genesys_palindrome_test": PALINDROME},
    )
    return env_with(root)


def test_an_installed_plugin_is_discovered_listed_and_used(installed_palindrome, tmp_path: Path):
    listing = genesys_run("plugins", env=installed_palindrome)
    assert listing.returncode == 0, listing.stderr
    line = next(line for line in listing.stdout.splitlines() if "palindrome" in line)
    assert "1.2.3" in line and "genesys-palindrome-test" in line

    inputs = write_jsonl(
        tmp_path / "in.jsonl", [rollout("palindrome", "racecar"), rollout("palindrome", "genesys")]
    )
    result = genesys_run("verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), env=installed_palindrome)
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


# --- plugins that cannot be loaded, or look wrong ---------------------------------------------------

MATH_ROW = {
    "task_type": "verifiable_math",
    "prompt": "1 + 1?",
    "verification_info": {"ground_truth": "2"},
    "llm_response": "\\boxed{2}",
}


@pytest.fixture
def broken_plugins(tmp_path: Path) -> Path:
    """Two installed plugins of one distribution that cannot be loaded: an entry point naming a module
    that is not there, and a module that raises when imported."""
    return install(
        tmp_path / "site",
        "genesys-broken-test",
        "0.3",
        {"missing": "genesys_missing_test", "raising": "genesys_raising_test:hooks"},
        {"genesys_raising_test": "raise RuntimeError('no GPU driver\\nfound')\n"},
    )


def test_a_plugin_that_cannot_be_loaded_is_one_warning_and_every_other_command_works(
    broken_plugins: Path, tmp_path: Path
):
    env = env_with(broken_plugins)
    helped = genesys_run("--help", env=env)
    assert helped.returncode == 0, helped.stderr
    assert "verify" in helped.stdout and "Traceback" not in helped.stderr
    warnings = helped.stderr.strip().splitlines()
    assert len(warnings) == 2, helped.stderr  # one line per broken plugin
    missing = next(line for line in warnings if "'missing'" in line)
    assert missing.startswith("genesys: warning: plugin 'missing' (genesys-broken-test 0.3)")
    assert "ModuleNotFoundError: No module named 'genesys_missing_test'" in missing
    raising = next(line for line in warnings if "'raising'" in line)
    assert "RuntimeError: no GPU driver found" in raising

    inputs = write_jsonl(tmp_path / "in.jsonl", [MATH_ROW])
    verified = genesys_run("verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), "--no-progress", env=env)
    assert verified.returncode == 0, verified.stderr
    assert [r["score"] for r in read_jsonl(tmp_path / "out.jsonl")] == [1.0]
    assert "Traceback" not in verified.stderr

    listing = genesys_run("plugins", env=env)
    assert listing.returncode == 0, listing.stderr
    line = next(line for line in listing.stdout.splitlines() if "missing" in line)
    assert "genesys-broken-test" in line and "broken: ModuleNotFoundError" in line
    assert any(
        "math" in line and "verifiable_math" in line and "ok" in line for line in listing.stdout.splitlines()
    )


def test_a_module_in_genesys_plugins_that_cannot_be_imported_is_a_warning(tmp_path: Path):
    inputs = write_jsonl(tmp_path / "in.jsonl", [MATH_ROW])
    env = env_with(**{PLUGINS_ENV_VAR: "genesys_no_such_module_test"})
    verified = genesys_run("verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), "--no-progress", env=env)
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr.strip() == (
        "genesys: warning: plugin 'genesys_no_such_module_test' ($GENESYS_PLUGINS) cannot be loaded and is "
        "skipped: ModuleNotFoundError: No module named 'genesys_no_such_module_test'"
    )


MISSPELLED = """
    import genesys

    class Upper(genesys.Verifier):
        task_type = "upper"
        def verify(self, rollout):
            return genesys.Verdict(score=float(rollout.completion.isupper()))

    @genesys.hookimpl
    def genesys_verifier():
        return [Upper]
    """


def test_a_misspelled_or_unmarked_hook_is_listed_with_a_warning(tmp_path: Path):
    unmarked = MISSPELLED.replace("    @genesys.hookimpl\n", "").replace(
        "genesys_verifier()", "genesys_verifiers()"
    )
    root = install(
        tmp_path / "site",
        "genesys-typo-test",
        "0.1",
        {"misspelled": "genesys_misspelled_test", "unmarked": "genesys_unmarked_test"},
        {"genesys_misspelled_test": MISSPELLED, "genesys_unmarked_test": unmarked},
    )
    listing = genesys_run("plugins", env=env_with(root))
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[1]: line for line in listing.stdout.splitlines() if "genesys-typo-test" in line}
    assert (
        "warning: genesys_verifier is no genesys hook (did you mean genesys_verifiers?)" in rows["misspelled"]
    )
    assert "warning: genesys_verifiers lacks @genesys.hookimpl" in rows["unmarked"]
    assert all("it serves nothing" in row for row in rows.values())
    warned = listing.stderr.strip().splitlines()
    assert len(warned) == 2 and all(line.startswith("genesys: warning: plugin '") for line in warned)
    assert "genesys-typo-test 0.1" in warned[0] and "it serves nothing" in warned[1]


def test_the_installed_plugins_look_right():
    pm = new_plugin_manager()
    assert not pm.broken
    assert {
        name: plugin_problems(pm, name) for name, _ in pm.list_name_plugin() if plugin_problems(pm, name)
    } == {}


def test_a_plugin_implementing_no_hook_serves_nothing_and_one_with_a_spare_helper_is_fine():
    class Empty:
        pass

    class Helper:
        @genesys.hookimpl
        def genesys_tasks(self):
            return []

        def genesys_settings(self):  # not close to a hook's name
            return {}

    pm = new_plugin_manager(load_entry_points=False)
    pm.register(Empty(), name="empty")
    pm.register(Helper(), name="helper")
    assert plugin_problems(pm, "empty") == ["it implements no genesys hook: it serves nothing"]
    assert plugin_problems(pm, "helper") == []


def test_new_plugin_manager_warns_in_python_too(broken_plugins: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(broken_plugins))
    with pytest.warns(PluginWarning) as warned:
        pm = new_plugin_manager()
    assert {broken.name for broken in pm.broken} == {"missing", "raising"}
    assert sorted(str(w.message).split(" cannot")[0] for w in warned) == [
        "plugin 'missing' (genesys-broken-test 0.3)",
        "plugin 'raising' (genesys-broken-test 0.3)",
    ]
    assert "math" in dict(pm.list_name_plugin())
    infos = {info.name: info for info in plugin_infos(pm)}
    assert infos["raising"].status.startswith("broken: RuntimeError") and infos["math"].status == "ok"


class _Raising:
    @genesys.hookimpl
    def genesys_tasks(self):
        raise KeyError("tasks.json")


def test_a_hook_that_raises_is_a_plugin_error_naming_the_plugin():
    pm = new_plugin_manager(load_entry_points=False)
    pm.register(_Raising(), name="raising-plugin")
    with pytest.raises(
        PluginError, match="plugin 'raising-plugin' failed in genesys_tasks: KeyError: 'tasks.json'"
    ):
        task_sets(pm)


def test_every_hook_refuses_a_name_taken_twice_or_reserved_with_one_message():
    import click

    @click.command("verify")
    def verify() -> None:
        pass

    class Commands:
        @genesys.hookimpl
        def genesys_commands(self):
            return [verify]

    pm = new_plugin_manager(load_entry_points=False, extra_plugins=[Commands()])
    assert plugin_commands(pm) == {"verify": verify}
    with pytest.raises(PluginError) as excinfo:
        plugin_commands(pm, reserved=["verify"])
    assert str(excinfo.value).startswith("command 'verify' is claimed by two plugins: genesys and ")
    assert str(excinfo.value).endswith("; uninstall one of them")


def test_help_lists_the_built_in_commands_when_plugin_commands_clash(tmp_path: Path):
    root = install(
        tmp_path / "site",
        "genesys-clash-test",
        "0.1",
        {"hello-a": "genesys_cliplugin", "hello-b": "genesys_clash_test"},
        {
            "genesys_clash_test": """
                import click
                import genesys

                @genesys.hookimpl
                def genesys_commands():
                    return [click.Command("hello")]
                """
        },
    )
    helped = genesys_run("--help", env=env_with(root, SUPPORT))
    assert helped.returncode == 0 and "verify" in helped.stdout, helped.stderr
    assert helped.stderr.strip().startswith("genesys: warning: no plugin commands: command 'hello'")
