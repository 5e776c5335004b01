"""One config vocabulary: a setting two commands share has one key, one type and one default in both;
renamed keys and flags still work, with a warning naming the new spelling; the sandbox limits have
one definition (`Limits`) that the `[sandbox]` keys, their flags, the code verifier's options and the
help are made from; every command builds the verification engine's settings the same way."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import GENESYS

from genesys.cli import BUILTIN_COMMANDS
from genesys.cli.flags import ConfigCommand, settings_of
from genesys.config import (
    LIMIT_NAMES,
    GenerateCommand,
    Limits,
    SandboxConfig,
    TrainConfig,
    ValidateCommand,
    VerifyCommand,
    VerifyConfig,
    upgrade,
)
from genesys.errors import ConfigDeprecationWarning, InputError
from genesys.train.resolved_config import changed_keys

REQUIRED = "required"


def command_models() -> dict[str, type]:
    """The config model of every built-in command that has one, by command name."""
    models = {}
    for name, target in BUILTIN_COMMANDS.items():
        module, attribute = target.split(":")
        model = getattr(getattr(importlib.import_module(module), attribute), "model", None)
        if model is not None:
            models[name] = model
    return models


def _default(info: Any) -> Any:
    if info.is_required():
        return REQUIRED
    return info.default_factory() if info.default_factory is not None else info.default


def _bounds(info: Any) -> tuple[str, ...]:
    return tuple(sorted(repr(item) for item in info.metadata))


def leaves(model: type) -> dict[str, tuple[str, Any, tuple[str, ...]]]:
    """Every key of a command's model (sections flattened into dotted keys): (type, default, bounds).

    A section's defaults are those of the instance the command makes when the table is absent, so a
    command that set its own defaults for a shared section would show here."""
    found = {}
    for field_name, info in model.__pydantic_fields__.items():
        key = info.alias or field_name
        section = info.annotation
        if not dataclasses.is_dataclass(section):
            found[key] = (str(info.annotation), _default(info), _bounds(info))
            continue
        try:
            instance = _default(info)
        except ValueError:  # train's [data] must name tasks or rollouts: no instance without them
            instance = None
        for name, leaf in section.__pydantic_fields__.items():
            default = _default(leaf) if instance is None else getattr(instance, name)
            found[f"{key}.{name}"] = (str(leaf.annotation), default, _bounds(leaf))
    return found


def test_every_command_with_settings_is_walked():
    assert set(command_models()) == {"generate", "verify", "validate", "filter", "train", "sft"}


# validate's [proofs] is a policy (`ProofPolicy`): a key left unset accepts what each row recorded
# (within --max-proof-chunk), where generate's [proofs] says what to write; set, it names the same value.
POLICY_KEYS = {"proofs.decode_batching_size"}


def test_every_setting_shared_by_two_commands_has_the_same_name_type_and_default():
    by_key: dict[str, dict[str, Any]] = {}
    for command, model in command_models().items():
        for key, spec in leaves(model).items():
            by_key.setdefault(key, {})[command] = spec
    shared = {key: specs for key, specs in by_key.items() if len(specs) > 1}
    disagreements = [
        f"{key}: " + "; ".join(f"{command} {spec}" for command, spec in specs.items())
        for key, specs in shared.items()
        if len(set(map(repr, specs.values()))) > 1 and key not in POLICY_KEYS
    ]
    assert not disagreements, "\n".join(disagreements)
    # The walk does reach the settings this vocabulary is about, in every command that reads them.
    assert set(shared["backend"]) == {"generate", "validate", "train"}
    assert shared["backend"]["train"][1] == "auto"
    for key in ("sampling.n", "sampling.max_tokens", "sampling.temperature", "sampling.seed"):
        assert set(shared[key]) == {"generate", "train"}, key
    assert set(shared["data.mix"]) == {"generate", "train", "sft"}
    # validate, filter and offline train read their trusted task set from the same key, and validate
    # renders prompts again as generate wrote them
    assert set(shared["data.tasks"]) == {"generate", "train", "sft", "validate", "filter"}
    assert set(shared["data.system_prompt"]) == {"generate", "train", "sft", "validate"}
    assert set(shared["data.target_lengths"]) == {"generate", "validate"}
    assert set(shared["style.chat_template"]) == {"generate", "train", "sft", "validate"}
    assert set(shared["style.continuation_prefix"]) == {"generate", "train", "sft", "validate"}
    assert set(shared["proofs.trust_key"]) == {"validate", "verify", "filter", "train"}
    assert set(shared["data.rollouts"]) == {"train", "sft"}
    for key in ("model", "output_dir", "report_to", "precision", "optim.lr", "checkpoint.every"):
        assert set(shared[key]) >= {"train", "sft"}, key
    for key in ("backend_options.device", "backend_options.dtype", "backend_options.batch_size"):
        assert set(shared[key]) == {"generate", "validate", "train", "sft"}, key
    for key in ("verify.workers", "sandbox.time_limit", "reward.length_penalty", "cluster.backend"):
        assert set(shared[key]) == {"verify", "generate", "train"}, key
    assert set(shared["progress"]) == {"generate", "verify", "validate", "train", "sft"}


def test_no_command_keeps_a_key_it_renamed_and_every_new_key_exists():
    for command, model in command_models().items():
        keys = set(leaves(model))
        for old, new in getattr(model, "renamed", {}).items():
            assert old not in keys, (command, old)
            assert new in keys, (command, new)


# --- old spellings --------------------------------------------------------------------------------

OLD_TRAIN = {
    "model": "m",
    "output_dir": "out",
    "seed": 7,
    "data": {"tasks": ["math-samples"]},
    "rollout": {
        "backend": "transformers",
        "prompts_per_step": 2,
        "samples_per_prompt": 4,
        "max_tokens": 32,
        "temperature": 0.7,
        "top_p": 0.9,
    },
}
NEW_TRAIN = {
    "model": "m",
    "output_dir": "out",
    "backend": "transformers",
    "data": {"tasks": ["math-samples"]},
    "sampling": {"seed": 7, "n": 4, "max_tokens": 32, "temperature": 0.7, "top_p": 0.9},
    "rollout": {"prompts_per_step": 2},
}


def test_train_reads_its_old_rollout_keys_and_top_level_seed_with_a_warning_naming_each_new_key():
    with pytest.warns(ConfigDeprecationWarning) as caught:
        old = TrainConfig.load(None, OLD_TRAIN)
    messages = {str(w.message) for w in caught}
    assert messages == {
        "'seed' is deprecated; use 'sampling.seed'",
        "'rollout.backend' is deprecated; use 'backend'",
        "'rollout.samples_per_prompt' is deprecated; use 'sampling.n'",
        "'rollout.max_tokens' is deprecated; use 'sampling.max_tokens'",
        "'rollout.temperature' is deprecated; use 'sampling.temperature'",
        "'rollout.top_p' is deprecated; use 'sampling.top_p'",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigDeprecationWarning)
        new = TrainConfig.load(None, NEW_TRAIN)
    assert old == new
    assert (new.sampling.n, new.sampling.seed, new.backend, new.rollout.prompts_per_step) == (
        4,
        7,
        "transformers",
        2,
    )


def test_old_keys_in_a_file_and_old_dotted_flags_work_and_new_flags_win(tmp_path: Path):
    toml = tmp_path / "old.toml"
    toml.write_text(
        'model = "m"\noutput_dir = "out"\nseed = 3\n[data]\ntasks = ["math-samples"]\n'
        "[rollout]\nsamples_per_prompt = 4\nmax_tokens = 32\n"
    )
    command = ConfigCommand("train", TrainConfig, lambda config: config)
    with pytest.warns(ConfigDeprecationWarning) as caught:
        config = command.main(["--config", str(toml), "--sampling.max-tokens", "16"], standalone_mode=False)
    assert {str(w.message) for w in caught} == {
        "'seed' is deprecated; use 'sampling.seed'",
        "'rollout.samples_per_prompt' is deprecated; use 'sampling.n'",
        "'rollout.max_tokens' is deprecated; use 'sampling.max_tokens'",
    }
    assert (config.sampling.n, config.sampling.max_tokens, config.sampling.seed) == (4, 16, 3)
    with pytest.warns(ConfigDeprecationWarning) as caught:
        config = command.main(
            ["--config", str(toml), "--rollout.temperature", "0.5", "--rollout.max_tokens", "8"],
            standalone_mode=False,
        )
    assert "'rollout.temperature' is deprecated; use 'sampling.temperature'" in {
        str(w.message) for w in caught
    }
    assert (config.sampling.temperature, config.sampling.max_tokens) == (0.5, 8)
    # the old dotted flags work but are not offered in the help
    assert "--rollout.max_tokens" not in command.get_help(command.make_context("train", []))


def test_an_old_key_and_its_new_key_disagreeing_in_one_place_are_refused():
    with pytest.raises(
        InputError, match="'rollout.max_tokens' is the deprecated spelling of 'sampling.max_tokens'"
    ):
        with pytest.warns(ConfigDeprecationWarning):
            TrainConfig.load(None, {**NEW_TRAIN, "rollout": {"max_tokens": 8}})


def test_generate_reads_its_old_top_level_task_keys_as_data_keys(tmp_path: Path):
    toml = tmp_path / "gen.toml"
    toml.write_text(
        'tasks = ["math-samples"]\nmix = [1]\nmax_tasks = 3\nsystem_prompt = "be brief"\n'
        'target_lengths = [10]\nmodel = "m"\noutput = "o"\n'
    )
    command = ConfigCommand("generate", GenerateCommand, lambda config: config)
    with pytest.warns(ConfigDeprecationWarning) as caught:
        config = command.main(["--config", str(toml)], standalone_mode=False)
    assert {str(w.message) for w in caught} >= {
        "'tasks' is deprecated; use 'data.tasks'",
        "'system_prompt' is deprecated; use 'data.system_prompt'",
    }
    data = config.data
    assert (data.tasks, data.mix, data.max_tasks, data.system_prompt, data.target_lengths) == (
        ["math-samples"],
        [1.0],
        3,
        "be brief",
        [10],
    )
    run = config.build("transformers")
    assert (run.tasks, run.system_prompt, run.max_tasks) == (["math-samples"], "be brief", 3)


def test_generate_without_tasks_is_refused_naming_the_key_and_flag():
    with pytest.raises(InputError, match=r"'data.tasks' \(--tasks\) is required"):
        ConfigCommand("generate", GenerateCommand, lambda c: c).main(
            ["--model", "m", "-o", "o"], standalone_mode=False
        )


def test_validate_reads_its_old_flat_backend_settings_as_backend_options():
    with pytest.warns(ConfigDeprecationWarning) as caught:
        config = ValidateCommand(
            inputs=["r.jsonl"], model="m", output="o", backend="transformers", dtype="float32", batch_size=4
        )
    assert {str(w.message) for w in caught} == {
        "'dtype' is deprecated; use 'backend_options.dtype'",
        "'batch_size' is deprecated; use 'backend_options.batch_size'",
    }
    assert (config.backend_options.dtype, config.backend_options.batch_size, config.batch_size) == (
        "float32",
        4,
        4,
    )
    with pytest.warns(
        ConfigDeprecationWarning, match="'engine_args' is deprecated; use 'backend_options.args'"
    ):
        config = ConfigCommand("validate", ValidateCommand, lambda c: c).main(
            ["r.jsonl", "--model", "m", "-o", "o", "--backend", "vllm", "--engine_args", "max_model_len=64"],
            standalone_mode=False,
        )
    assert config.backend_options.args == {"max_model_len": 64}
    assert ValidateCommand(inputs=["r.jsonl"], model="m", output="o").batch_size == 8


def test_old_limit_names_still_build_limits():
    with pytest.warns(ConfigDeprecationWarning) as caught:
        old = Limits(time_s=3, memory_mb=256, wall_s=9)
    assert [str(w.message) for w in caught] == [
        "'time_s' is deprecated; use 'time_limit'",
        "'memory_mb' is deprecated; use 'memory_limit'",
        "'wall_s' is deprecated; use 'wall_limit'",
    ]
    assert old == Limits(time_limit=3, memory_limit=256, wall_limit=9)


def test_a_run_directory_written_with_old_keys_compares_by_the_new_names():
    new = TrainConfig.load(None, NEW_TRAIN).as_dict()
    written = {k: v for k, v in new.items() if k not in ("backend", "sampling")}
    written["seed"] = new["sampling"]["seed"]
    written["rollout"] = {
        **new["rollout"],
        "backend": new["backend"],
        "samples_per_prompt": 4,
        "max_tokens": 32,
        "temperature": 0.7,
        "top_p": 0.9,
    }
    assert changed_keys(upgrade(written, TrainConfig.renamed, warn=False), new) == []


def test_the_command_line_prints_one_warning_line_naming_the_new_key(tmp_path: Path):
    toml = tmp_path / "gen.toml"
    toml.write_text(
        'tasks = ["math-samples"]\nmodel = "m"\noutput = "o.jsonl"\nbackend = "no-such-backend"\n'
    )
    done = subprocess.run(
        [GENESYS, "generate", "--config", str(toml)], capture_output=True, text=True, timeout=120
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[0] == "genesys generate: warning: 'tasks' is deprecated; use 'data.tasks'"
    assert lines[1].startswith("genesys generate: error: --backend must be one of") and len(lines) == 2


# --- train's own checks on the shared sampling section -------------------------------------------


def test_training_online_needs_groups_and_a_temperature_above_zero():
    with pytest.raises(InputError, match=r"sampling.n \(-n\) is the group size and must be at least 2"):
        TrainConfig.load(None, {**NEW_TRAIN, "sampling": {"n": 1}})
    with pytest.raises(InputError, match="sampling.temperature .* must be above 0 to train"):
        TrainConfig.load(None, {**NEW_TRAIN, "sampling": {"n": 2, "temperature": 0.0}})
    offline = TrainConfig.load(None, {"model": "m", "output_dir": "o", "data": {"rollouts": ["r.jsonl"]}})
    assert offline.sampling.n == 1  # offline training samples nothing: the group size comes from the files


# --- the sandbox limits: one definition --------------------------------------------------------------


def test_sandbox_keys_flags_and_help_are_made_from_limits():
    sandbox = SandboxConfig.__pydantic_fields__
    limits = Limits.__pydantic_fields__
    assert [name for name in sandbox if name in limits] == list(LIMIT_NAMES)
    for name in LIMIT_NAMES:
        assert sandbox[name].default is None  # unset: the verifier's default, which is Limits'
        assert sandbox[name].json_schema_extra["flags"] == limits[name].json_schema_extra["flags"]
        assert sandbox[name].metadata == limits[name].metadata
        assert sandbox[name].description.startswith(limits[name].description)
    helps = {setting.dotted: setting.help for setting in settings_of(VerifyCommand)}
    assert helps["sandbox.time_limit"] == f"CPU seconds per test (default {Limits().time_limit:g})"
    assert helps["sandbox.memory_limit"].endswith(f"(default {Limits().memory_limit})")


def test_the_code_verifier_reads_typed_options_made_from_limits():
    from genesys.verifiers.code import CodeVerifier

    options = CodeVerifier.options_model.__pydantic_fields__
    assert set(LIMIT_NAMES) <= set(CodeVerifier.accepted_options) == set(options)
    for name in LIMIT_NAMES:
        assert options[name].default == Limits.__pydantic_fields__[name].default
    verifier = CodeVerifier({"time_limit": "3", "memory_limit": 256, "judge_model": "not mine"})
    assert verifier.settings.limits == Limits(time_limit=3.0, memory_limit=256)
    assert verifier.settings.sandbox == "auto" and verifier.settings.budget is None


def test_sandbox_settings_become_verifier_options_and_win_over_o_options(tmp_path: Path):
    toml = tmp_path / "v.toml"
    toml.write_text("[sandbox]\ntime_limit = 1.5\nwall_limit = 4\n")
    config = ConfigCommand("verify", VerifyCommand, lambda c: c).main(
        ["in.jsonl", "-o", "o.jsonl", "--config", str(toml), "-O", "time_limit=9", "-O", "memory_limit=128"],
        standalone_mode=False,
    )
    assert config.build().verifier_options() == {"time_limit": 1.5, "wall_limit": 4.0, "memory_limit": 128}


def test_a_bad_typed_verifier_option_is_refused_before_any_work():
    from genesys.verification.engine import VerificationEngine
    from genesys.verifiers.code import CodeVerifier

    with pytest.raises(InputError, match=r"'time_limit' \(verifiable_code\).*greater than 0"):
        VerificationEngine(
            VerifyConfig(workers=1, progress=False, options={"time_limit": -1}),
            {"verifiable_code": CodeVerifier},
        )
    with pytest.raises(InputError, match=r"'sandbox' \(verifiable_code\)"):
        VerificationEngine(
            VerifyConfig(workers=1, progress=False, options={"sandbox": "chroot"}),
            {"verifiable_code": CodeVerifier},
        )


# --- one way to the verification engine's settings -----------------------------------------------

SHARED_TABLES = (
    "[verify]\nworkers = 3\ntimeout = 9\n[sandbox]\ntime_limit = 1\n[reward]\nlength_penalty = 'max'\n"
    "target_length = 100\n[cluster]\nverifier_workers = 3\n"
)


def test_every_command_builds_the_same_verify_config_from_the_same_tables(tmp_path: Path):
    toml = tmp_path / "shared.toml"
    toml.write_text(SHARED_TABLES)
    verify = ConfigCommand("verify", VerifyCommand, lambda c: c).main(
        ["in.jsonl", "-o", "o.jsonl", "--config", str(toml), "--no-progress"], standalone_mode=False
    )
    generate = ConfigCommand("generate", GenerateCommand, lambda c: c).main(
        ["--config", str(toml), "--tasks", "t.jsonl", "--model", "m", "-o", "o", "--verify"],
        standalone_mode=False,
    )
    train = ConfigCommand("train", TrainConfig, lambda c: c).main(
        ["--config", str(toml), "--tasks", "t.jsonl", "--model", "m", "-o", "o", "-n", "2"],
        standalone_mode=False,
    )
    built = [verify.build(), generate.build("transformers").verify, train.verify_config()]
    assert built[0] == built[1] == built[2]
    assert built[0].cluster.verifier_workers == 3 and built[0].sandbox.time_limit == 1.0
    assert built[0].workers == 3 and built[0].reward.target_length == 100


def test_validate_picks_the_engine_of_auto_as_generate_would():
    from genesys.generate.builtin import vllm_usable
    from genesys.proofs.recompute import resolve_backend

    assert resolve_backend("auto") == ("vllm" if vllm_usable() else "transformers")
    assert resolve_backend("transformers") == "transformers"
