"""The command line made from the config models: TOML files, dotted overrides, errors naming keys, plugin commands."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import GENESYS, SUPPORT, read_jsonl, rollout, write_jsonl

from genesys.cli.flags import ConfigCommand, settings_of
from genesys.config import GenerateCommand, VerifyCommand
from genesys.errors import InputError


def genesys(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GENESYS, *args], capture_output=True, text=True, env=env, timeout=300)


def load(model: type, args: list[str], toml: Path | None = None):
    command = ConfigCommand("x", model, lambda config: config)
    return command.main([*(["--config", str(toml)] if toml else []), *args], standalone_mode=False)


def test_every_setting_has_a_dotted_flag_and_help():
    for model in (VerifyCommand, GenerateCommand):
        for setting in settings_of(model):
            assert setting.help or setting.key[-1] in ("sandbox", "reward"), setting.dotted
            assert setting.positional or setting.dashed in setting.names(), setting.dotted  # --data.max-tasks


def test_toml_then_flags_dotted_and_short(tmp_path: Path):
    toml = tmp_path / "run.toml"
    toml.write_text(
        'inputs = ["a.jsonl"]\noutput = "o.jsonl"\n[verify]\nworkers = 3\ntimeout = 9\n'
        '[sandbox]\ntime_limit = 1.5\n[reward]\nlength_penalty = "max"\ntarget_length = 100\n'
    )
    config = load(VerifyCommand, ["--verify.workers", "5", "--length-coef", "0.01", "-O", "budget=20"], toml)
    run = config.build()
    assert (
        run.workers,
        run.timeout,
        run.reward.length_penalty,
        run.reward.target_length,
        run.reward.coef,
    ) == (5, 9.0, "max", 100, 0.01)
    assert run.verifier_options() == {"budget": 20, "time_limit": 1.5}
    assert (
        load(VerifyCommand, ["x.jsonl", "-o", "o", "--no-progress", "--skip-unknown"]).build().skip_unknown
        is True
    )


def test_list_flags_take_several_values_and_csv_lists_split():
    config = load(
        GenerateCommand,
        [
            "--tasks",
            "math-samples",
            "countdown:count=4",
            "--model",
            "m",
            "-o",
            "out",
            "--mix",
            "1,3",
            "--target-lengths",
            "10,20",
            "-n",
            "4",
            "--no-chat-template",
            "--continuation-prefix",
            "<think>\\n",
        ],
    )
    assert (
        config.data.tasks == ["math-samples", "countdown:count=4"]
        and config.data.mix == [1.0, 3.0]
        and config.data.target_lengths == [10, 20]
    )
    assert (
        config.sampling.n == 4
        and config.style.chat_template is False
        and config.style.continuation_prefix == "<think>\n"
    )
    run = config.build("transformers")
    assert run.verify is None and run.backend_options == {}


@pytest.mark.parametrize(
    ("toml", "args", "message"),
    [
        ("[sampling]\ntemprature = 0.5\n", [], "unknown key 'sampling.temprature'"),
        (
            "[sampling]\ntemperature = 'hot'\n",
            [],
            "'sampling.temperature' (--temperature): Input should be a valid number",
        ),
        (
            "",
            ["--sampling.max-tokens", "many"],
            "'sampling.max_tokens' (--max-tokens): Input should be a valid integer",
        ),
        ("", ["--top-p", "1.5"], "'sampling.top_p' (--top-p)"),
        ("[reward]\nlength_penalty = 'linear'\n", [], "length_penalty must be one of"),
        ("model = 3\n", [], "'model' (--model): Input should be a valid string"),
        ("", ["--mix", "1,x"], "'data.mix.1' (--mix): Input should be a valid number"),
    ],
)
def test_bad_keys_and_types_are_named(tmp_path: Path, toml, args, message):
    path = tmp_path / "c.toml"
    path.write_text(
        'data = { tasks = ["math-samples"] }\nmodel = "m"\noutput = "o"\n' + toml
        if "model =" not in toml
        else 'data = { tasks = ["t"] }\noutput = "o"\n' + toml
    )
    with pytest.raises(InputError) as error:
        load(GenerateCommand, args, path)
    assert message in str(error.value)


def test_missing_required_settings_are_named():
    with pytest.raises(InputError, match=r"'output' \(-o\) is required"):
        load(VerifyCommand, ["in.jsonl"])


def test_cli_errors_are_one_line_with_exit_2(tmp_path: Path):
    config = tmp_path / "c.toml"
    config.write_text("[verify]\nworkerz = 2\n")
    done = genesys("verify", "in.jsonl", "-o", str(tmp_path / "o.jsonl"), "--config", str(config))
    assert (
        done.returncode == 2
        and "unknown key 'verify.workerz'" in done.stderr
        and len(done.stderr.strip().splitlines()) == 1
    )
    missing = genesys("verify", "in.jsonl", "-o", "o.jsonl", "--config", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_unknown_verifier_option_is_refused(tmp_path: Path):
    inputs = write_jsonl(tmp_path / "in.jsonl", [rollout("verifiable_math", "\\boxed{2}", ground_truth="2")])
    done = genesys(
        "verify", str(inputs), "-o", str(tmp_path / "o.jsonl"), "-O", "time_limt=3", "--no-progress"
    )
    assert (
        done.returncode == 2
        and "unknown verifier option(s) 'time_limt'" in done.stderr
        and "time_limit" in done.stderr
    )
    assert not (tmp_path / "o.jsonl").exists()
    ok = genesys(
        "verify",
        str(inputs),
        "-o",
        str(tmp_path / "o.jsonl"),
        "-O",
        "time_limit=3",
        "--no-progress",
        "--workers",
        "1",
    )
    assert ok.returncode == 0, ok.stderr and read_jsonl(tmp_path / "o.jsonl")[0]["score"] == 1.0


@pytest.mark.slow
def test_one_toml_serves_verify_and_generate_verify(tmp_path: Path):
    from genesys.generate.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    config = tmp_path / "shared.toml"
    config.write_text(
        "[verify]\nworkers = 1\ntimeout = 30\n[sandbox]\ntime_limit = 1\n"
        '[reward]\nlength_penalty = "overlong"\nmax_length = 6\noverlong_buffer = 2\n'
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    generated = tmp_path / "gen.jsonl"
    made = subprocess.run(
        [
            GENESYS,
            "generate",
            "--config",
            str(config),
            "--tasks",
            "math-samples",
            "--max-tasks",
            "2",
            "-n",
            "2",
            "--model",
            str(model),
            "-o",
            str(generated),
            "--max-tokens",
            "8",
            "--backend",
            "transformers",
            "--verify",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    rows = read_jsonl(generated)
    assert len(rows) == 4 and all(r["score"] is not None for r in rows)
    # overlong: 8-token completions at max_length 6 lose the whole penalty, so reward = score - 1
    assert all(
        r["reward"] == pytest.approx(r["score"] - (1.0 if len(r["completion_ids"]) >= 6 else 0.0), abs=1e-9)
        or len(r["completion_ids"]) < 6
        for r in rows
    )
    verified = tmp_path / "ver.jsonl"
    again = subprocess.run(
        [GENESYS, "verify", str(generated), "-o", str(verified), "--config", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    assert [r["reward"] for r in read_jsonl(verified)] == [r["reward"] for r in rows]


def test_a_plugin_adds_a_command(monkeypatch: pytest.MonkeyPatch):
    env = {
        **os.environ,
        "GENESYS_PLUGINS": "genesys_cliplugin",
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
    }
    listing = genesys("--help", env=env)
    assert listing.returncode == 0 and "hello" in listing.stdout
    said = genesys("hello", "--name", "plugins", env=env)
    assert said.returncode == 0 and said.stdout.strip() == "hello plugins"


def test_help_is_fast():
    for args in (["--help"], ["verify", "--help"]):
        started = time.monotonic()
        done = genesys(*args)
        assert done.returncode == 0 and "Usage" in done.stdout
    # the figure is printed, not asserted: a loaded machine makes timing flaky
    print(f"genesys verify --help: {time.monotonic() - started:.3f} s")


def test_a_plugin_that_reads_any_option_does_not_turn_off_the_check_for_other_task_types(
    tmp_path: Path, plugin_env
):
    # The test plugins declare no accepted_options (they read any option), but a run of math rows
    # uses only the math verifier: a misspelt option is still refused.
    inputs = write_jsonl(tmp_path / "in.jsonl", [rollout("verifiable_math", "\\boxed{2}", ground_truth="2")])
    done = genesys(
        "verify", str(inputs), "-o", str(tmp_path / "o.jsonl"), "-O", "time_limt=3", "--no-progress"
    )
    assert done.returncode == 2 and "unknown verifier option(s) 'time_limt'" in done.stderr, done.stderr
    echo = write_jsonl(tmp_path / "echo.jsonl", [rollout("echo", "yes", expected="yes")])
    used = genesys("verify", str(echo), "-o", str(tmp_path / "e.jsonl"), "-O", "time_limt=3", "--no-progress")
    assert used.returncode == 0, used.stderr  # the echo verifier may read it
