"""The backend registry (the `genesys_backends` hook) and a plugin's backend driven by `genesys generate`."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from conftest import GENESYS, read_jsonl

import genesys
from genesys.errors import InputError
from genesys.generate.backend import (
    BackendSpec,
    PromptStyle,
    backend_names,
    create_backend,
    resolve_backend_name,
)
from genesys.plugins import PluginError, new_plugin_manager


class Plugin:
    """A plugin object returning the given backend specs."""

    def __init__(self, *specs: BackendSpec) -> None:
        self.specs = list(specs)

    @genesys.hookimpl
    def genesys_backends(self) -> list[BackendSpec]:
        return self.specs


def _manager(*specs: BackendSpec, more: tuple[Plugin, ...] = ()):
    return new_plugin_manager(load_entry_points=False, extra_plugins=[Plugin(*specs), *more])


def test_the_built_in_backends_are_registered_through_the_hook():
    from genesys.generate import builtin

    pm = new_plugin_manager()
    assert pm.get_plugin("backends") is builtin  # the entry point in pyproject.toml
    assert backend_names(pm)[:4] == ["auto", "vllm", "transformers", "openai"]
    assert resolve_backend_name("openai", pm) == "openai"


def test_auto_takes_the_usable_backend_of_highest_priority():
    pm = _manager(
        BackendSpec("fast", "nowhere:Fast", usable=lambda: False, priority=30),
        BackendSpec("steady", "nowhere:Steady", usable=lambda: True, priority=20),
        BackendSpec("remote", "nowhere:Remote"),  # never chosen by auto
        BackendSpec("slow", "nowhere:Slow", usable=lambda: True, priority=10),
    )
    assert backend_names(pm) == ["auto", "fast", "steady", "slow", "remote"]
    assert resolve_backend_name("auto", pm) == "steady"
    assert resolve_backend_name("fast", pm) == "fast"  # named: no usability check
    with pytest.raises(
        InputError, match="--backend must be one of auto, fast, steady, slow, remote, got 'tgi'"
    ):
        resolve_backend_name("tgi", pm)
    with pytest.raises(InputError, match=r"--backend auto: no backend can run here \(tried: fast\)"):
        resolve_backend_name(
            "auto",
            _manager(
                BackendSpec("fast", "nowhere:Fast", usable=lambda: False),
                BackendSpec("remote", "nowhere:Remote"),
            ),
        )


def test_without_any_backend_the_error_says_to_reinstall():
    with pytest.raises(InputError, match="no generation backend is registered; reinstall genesys"):
        resolve_backend_name("transformers", new_plugin_manager(load_entry_points=False))


def test_two_plugins_claiming_one_name_or_a_bad_spec_are_refused():
    with pytest.raises(PluginError, match="backend 'twin' is claimed by two plugins"):
        backend_names(_manager(BackendSpec("twin", "a:A"), more=(Plugin(BackendSpec("twin", "b:B")),)))
    with pytest.raises(PluginError, match="not a BackendSpec"):
        backend_names(_manager(BackendSpec("auto", "a:A")))
    with pytest.raises(PluginError, match="not a BackendSpec"):
        backend_names(new_plugin_manager(load_entry_points=False, extra_plugins=[Plugin("vllm")]))


def test_a_backend_class_loads_only_when_built(plugin_env):
    import genesys_testplugins

    pm = _manager(BackendSpec("broken", "genesys_no_such_module:Backend"), more=(genesys_testplugins,))
    assert "broken" in backend_names(pm)
    with pytest.raises(InputError, match="--backend broken cannot be loaded .*genesys_no_such_module"):
        create_backend("broken", "m", PromptStyle(), {}, pm)
    backend = create_backend("scripted", "some-model", PromptStyle(), {}, pm)
    assert backend.info() == {"backend": "scripted", "model": "some-model"}
    asyncio.run(backend.update_weights({}))
    assert backend.weights_version == 1


def test_generate_runs_end_to_end_with_a_plugin_backend(plugin_env, tmp_path):
    output = tmp_path / "rollouts.jsonl"
    command = [
        GENESYS,
        "generate",
        "--tasks",
        "countdown:count=3",
        "--model",
        "no-model",
        "-o",
        str(output),
        "--backend",
        "scripted",
        "-n",
        "2",
        "--max-tokens",
        "9",
        "--no-progress",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=plugin_env)
    assert result.returncode == 0, result.stderr
    rows = read_jsonl(output)
    assert len(rows) == 6 and len({r["response_id"] for r in rows}) == 6
    for row in rows:
        sample = row["response_id"].rsplit("-", 1)[1]
        assert row["llm_response"] == f"{row['prompt'][-12:]} #{sample}"[:9]
        assert row["completion_ids"] == [ord(c) for c in row["llm_response"]] and row[
            "completion_logprobs"
        ] == [-1.0] * len(row["llm_response"])
        assert (
            row["generation_config"]["backend"] == "scripted" and row["machine_info"]["backend"] == "scripted"
        )
    command[command.index("scripted")] = "nothing"
    unknown = subprocess.run(command, capture_output=True, text=True, timeout=120, env=plugin_env)
    assert (
        unknown.returncode == 2
        and "--backend must be one of auto, vllm, transformers, openai, pipeline, scripted, got 'nothing'"
        in unknown.stderr
    )
