"""`genesys train` end to end on a tiny random model: on-policy consistency, learning a toy task
through a real verifier plugin and the verification engine, checkpoints, offline mode, bad input."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import GENESYS, grpo_config, read_jsonl, train_arguments, write_jsonl  # noqa: E402

from genesys.errors import InputError  # noqa: E402
from genesys.testing.digits import digit_tasks  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402


def config(model: str, out: Path, tasks: Path | None = None, **sections: Any) -> TrainConfig:
    """`grpo_config` for 3 steps of 8 samples of at most 32 tokens (`optim` keys given replace those)."""
    sections["optim"] = {"steps": 3, **sections.get("optim", {})}
    return grpo_config(model, out, tasks, max_tokens=32, **sections)


def test_first_update_recomputes_the_sampling_logprobs_so_the_ratio_is_one(tiny_model, tmp_path, plugin_env):
    result = train(
        config(
            tiny_model,
            tmp_path / "run",
            digit_tasks(tmp_path / "tasks.jsonl"),
            optim={"steps": 1, "micro_batch_size": 5},
        )
    )
    first = result.metrics[0]
    assert first["logprob_mismatch"] <= 1e-4
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["ratio_max"] <= 1 + 1e-4
    assert first["clip_low_frac"] == first["clip_high_frac"] == first["delta_frac"] == 0.0
    assert first["tokens"] > 0 and first["groups_kept"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("lr, climbs", [(3e-3, True), (0.0, False)])
def test_a_tiny_model_learns_the_toy_task_and_does_not_without_a_learning_rate(
    tiny_model, tmp_path, plugin_env, lr, climbs
):
    result = train(
        config(
            tiny_model, tmp_path / "run", digit_tasks(tmp_path / "tasks.jsonl"), optim={"steps": 60, "lr": lr}
        )
    )
    rewards = [m["reward_mean"] for m in result.metrics]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert start < 0.2
    if climbs:
        assert end >= 0.8, rewards
    else:
        assert end < 0.2, rewards


def test_run_directory_holds_config_metrics_checkpoints_and_a_loadable_final_model(
    tiny_model, tmp_path, plugin_env
):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    train(
        config(
            tiny_model,
            out,
            digit_tasks(tmp_path / "tasks.jsonl"),
            optim={"steps": 5},
            checkpoint={"every": 1, "keep": 2},
        )
    )
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000003", "step-000004"]
    assert (out / "checkpoints" / "step-000004" / "model.safetensors").is_file()
    assert (out / "checkpoints" / "step-000004" / "trainer_state.json").is_file()
    assert (out / "checkpoints" / "step-000004" / "trainer_state.safetensors").is_file()
    assert not list((out / "checkpoints").rglob("*.pt"))  # no pickle anywhere
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    required = {
        "step",
        "reward_mean",
        "score_mean",
        "loss",
        "grad_norm",
        "lr",
        "clip_low_frac",
        "clip_high_frac",
        "delta_frac",
        "ratio_mean",
        "ratio_max",
        "entropy",
        "completion_len_mean",
        "groups_dropped",
        "tokens_per_s",
        "step_seconds",
    }
    assert required <= metrics[0].keys()
    import tomllib

    assert tomllib.loads((out / "config.toml").read_text())["optim"]["steps"] == 5
    again = train(
        config(
            tiny_model,
            out,
            digit_tasks(tmp_path / "tasks.jsonl"),
            optim={"steps": 5},
            checkpoint={"every": 1, "keep": 2},
        )
    )
    assert again.already_complete and len(again.metrics) == 5  # a finished run is not trained again
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert not torch.equal(final.model.embed_tokens.weight, start.model.embed_tokens.weight)


def test_several_updates_per_batch_reuse_the_recorded_logprobs(tiny_model, tmp_path, plugin_env):
    result = train(
        config(
            tiny_model,
            tmp_path / "run",
            digit_tasks(tmp_path / "tasks.jsonl"),
            optim={"steps": 4, "updates_per_batch": 2, "lr": 1e-2},
        )
    )
    first, second = result.metrics[0], result.metrics[1]
    assert first["logprob_mismatch"] <= 1e-4 and second["logprob_mismatch"] is None
    assert second["reward_mean"] == first["reward_mean"]  # the same batch
    assert second["ratio_max"] > 1.0 + 1e-4  # the policy moved since sampling: the ratio is no longer 1
    assert result.metrics[2]["reward_mean"] != first["reward_mean"]  # a new batch


def test_sequence_normalisation_kl_entropy_and_gradient_checkpointing_run_and_are_logged(
    tiny_model, tmp_path, plugin_env
):
    result = train(
        config(
            tiny_model,
            tmp_path / "run",
            digit_tasks(tmp_path / "tasks.jsonl"),
            optim={"steps": 2, "micro_batch_size": 7},
            loss={"normalize": "sequence", "kl_beta": 0.1, "entropy_coef": 0.01, "scale_by_std": True},
            gradient_checkpointing=True,
        )
    )
    assert result.metrics[0]["kl"] == pytest.approx(
        0.0, abs=1e-6
    )  # the policy is the reference before its first update
    assert result.metrics[1]["kl"] > 0.0


@pytest.mark.slow
def test_offline_training_from_a_generate_verify_file(tiny_model, tmp_path, plugin_env):
    tasks = digit_tasks(tmp_path / "tasks.jsonl", count=6)
    rollouts = tmp_path / "rollouts.jsonl"
    subprocess.run(
        [
            GENESYS,
            "generate",
            "--tasks",
            str(tasks),
            "--model",
            tiny_model,
            "-o",
            str(rollouts),
            "-n",
            "4",
            "--max-tokens",
            "16",
            "--backend",
            "transformers",
            "--verify",
            "--workers",
            "1",
            "--no-progress",
        ],
        check=True,
        env=plugin_env,
        capture_output=True,
    )
    result = train(
        config(
            tiny_model,
            tmp_path / "run",
            data={"rollouts": [str(rollouts)]},
            rollout={"prompts_per_step": 2},
            optim={"steps": 3, "micro_batch_size": 4},
        )
    )
    assert len(result.metrics) == 3
    first = result.metrics[0]
    assert first["logprob_mismatch"] <= 1e-4  # the recorded logprobs are the model's own
    assert first["groups_kept"] == 2
    assert (result.final_dir / "model.safetensors").is_file()


def _run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([GENESYS, "train", *args], capture_output=True, text=True, env=env, timeout=300)


def test_cli_overrides_and_bad_config_keys_are_refused_by_name(tiny_model, tmp_path, plugin_env):
    toml = tmp_path / "run.toml"
    toml.write_text(
        f'model = "{tiny_model}"\noutput_dir = "{tmp_path / "run"}"\n[data]\ntasks = ["{digit_tasks(tmp_path / "tasks.jsonl")}"]\n[optim]\nsteps = 1\n'
    )
    unknown = _run_cli(str(toml), "--optim.lrr", "1", env=plugin_env)
    assert unknown.returncode == 2 and "--optim.lrr" in unknown.stderr
    toml.write_text(toml.read_text() + "[loss]\neps_low = 0.2\nclip = 3\n")
    bad_key = _run_cli(str(toml), env=plugin_env)
    assert bad_key.returncode == 2 and "unknown key 'loss.clip'" in bad_key.stderr
    wrong_type = _run_cli("--config", str(toml.with_name("none.toml")), env=plugin_env)
    assert wrong_type.returncode == 2 and "none.toml" in wrong_type.stderr
    toml.write_text(toml.read_text().replace("clip = 3\n", ""))
    typed = _run_cli(str(toml), "--optim.lr", "fast", env=plugin_env)
    assert typed.returncode == 2 and "optim.lr" in typed.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_bad_input_is_refused_before_any_training(tiny_model, tmp_path, plugin_env):
    no_verifier = write_jsonl(
        tmp_path / "tasks.jsonl",
        [{"problem_id": "p", "task_type": "no_such_type", "prompt": "hi", "verification_info": {}}],
    )
    with pytest.raises(InputError, match="no_such_type"):
        train(config(tiny_model, tmp_path / "a", no_verifier))
    with pytest.raises(InputError, match="does-not-exist"):
        train(
            config(str(tmp_path / "does-not-exist"), tmp_path / "b", digit_tasks(tmp_path / "digits.jsonl"))
        )
    no_logprobs = write_jsonl(
        tmp_path / "rollouts.jsonl",
        [{"prompt": "p", "prompt_ids": [1, 2], "completion_ids": [3], "reward": 1.0}],
    )
    with pytest.raises(InputError, match=r"rollouts.jsonl:1: rollout has no completion_logprobs"):
        train(config(tiny_model, tmp_path / "c", data={"rollouts": [str(no_logprobs)]}))
    with pytest.raises(InputError, match="delta must exceed"):
        config(tiny_model, tmp_path / "d", digit_tasks(tmp_path / "digits.jsonl"), loss={"delta": 1.1})
    assert not any((tmp_path / name / "metrics.jsonl").exists() for name in "abc")


@pytest.mark.slow
def test_a_run_killed_mid_training_resumes_to_the_same_weights(tiny_model, tmp_path, plugin_env):
    """SIGKILL after the step-4 checkpoint, rerun the same command: the final weights equal those of
    an uninterrupted run, bit for bit (CPU, same seed and thread count)."""
    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    env = {**plugin_env, "OMP_NUM_THREADS": "1"}

    def command(out: Path) -> list[str]:
        return [GENESYS, *train_arguments(tiny_model, out, tasks, 8, 16)]

    subprocess.run(command(tmp_path / "straight"), check=True, env=env, capture_output=True, timeout=600)
    killed = tmp_path / "killed"
    process = subprocess.Popen(command(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    try:
        _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 5, process)
    finally:
        process.kill()
        process.wait()
    assert (killed / "checkpoints" / "step-000004").is_dir() and not (killed / "final").exists()
    subprocess.run(command(killed), check=True, env=env, capture_output=True, timeout=600)
    from safetensors.torch import load_file

    straight = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    resumed = load_file(killed / "final" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert [m["step"] for m in read_jsonl(metrics)] == list(range(1, 9))
    assert [m["reward_mean"] for m in read_jsonl(metrics)] == [
        m["reward_mean"] for m in read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    ]


def _wait_for(condition, process: subprocess.Popen, timeout: float = 300.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "the run did not get far enough in time"
        time.sleep(0.05)


def test_report_to_an_unknown_tracker_is_refused(tiny_model, tmp_path):
    with pytest.raises(InputError, match="report_to: unknown tracker 'mlflow'"):
        config(tiny_model, tmp_path / "run", tmp_path / "tasks.jsonl", report_to=["mlflow"])


def recorded(problem_id: str, reward: float, valid: bool | None, key: Any = None) -> dict[str, Any]:
    """A recorded rollout; with `key`, attested as genesys validate --tasks and genesys verify write it."""
    row = {
        "problem_id": problem_id,
        "prompt": f"task {problem_id}",
        "prompt_ids": [1, 2, 3],
        "completion_ids": [4, 5],
        "completion_logprobs": [-1.0, -1.0],
        "reward": reward,
    }
    row = row if valid is None else row | {"toploc_valid": valid}
    if key is not None:
        row["trusted_task"] = row["sampling_proven"] = True
        row["attestation"] = key.sign(row)
    return row


def test_require_proofs_drops_and_counts_rollouts_not_attested_valid(tiny_model, tmp_path):
    from genesys.data.attestation import TrustKey
    from genesys.train.distributed import World
    from genesys.train.sources.recorded import RecordedRollouts

    key = TrustKey.load(tmp_path / "trust.key", create=True)
    rows = [
        recorded("a", 1.0, True, key),
        recorded("a", 0.0, True, key),
        recorded("a", 1.0, False, key),
        recorded("a", 0.0, None, key),
        recorded("b", 1.0, True),  # a flag only: no attestation
        recorded("b", 0.0, True) | {"toploc_valid": "true"},
        recorded("c", 0.5, True, key),
        recorded("c", 0.0, True, key) | {"reward": 1.0},  # changed after it was attested
    ]
    path = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    data = {"rollouts": [str(path)], "require_proofs": True}
    source = RecordedRollouts(
        config(tiny_model, tmp_path / "run", data=data, proofs={"trust_key": str(key.path)}), World()
    )
    assert source.rows_unproven == 5
    (group,) = source.groups  # c's one counted rollout is no group
    assert [row["problem_id"] for row in group] == ["a", "a"] and all(
        row["toploc_valid"] is True for row in group
    )
    unchecked = RecordedRollouts(
        config(tiny_model, tmp_path / "run", data={"rollouts": [str(path)]}), World()
    )
    assert unchecked.rows_unproven == 0 and sum(len(group) for group in unchecked.groups) == 8


@pytest.mark.slow
def test_require_proofs_needs_recorded_rollouts_and_says_when_none_counts(tiny_model, tmp_path, plugin_env):
    with pytest.raises(InputError, match="data.require_proofs applies to recorded rollouts"):
        config(
            tiny_model, tmp_path / "a", digit_tasks(tmp_path / "tasks.jsonl"), data={"require_proofs": True}
        )
    path = write_jsonl(tmp_path / "rollouts.jsonl", [recorded("a", 1.0, True), recorded("a", 0.0, None)])
    toml = tmp_path / "run.toml"
    toml.write_text(
        f'model = "{tiny_model}"\noutput_dir = "{tmp_path / "run"}"\n[data]\nrollouts = ["{path}"]\n'
    )
    from genesys.data.attestation import TrustKey

    key = TrustKey.load(tmp_path / "trust.key", create=True)
    refused = _run_cli(str(toml), "--require-proofs", "--trust-key", str(key.path), env=plugin_env)
    assert refused.returncode == 2, refused.stderr
    assert "no rollouts that data.require_proofs counts (2 dropped; the first:" in " ".join(
        refused.stderr.split()
    )
