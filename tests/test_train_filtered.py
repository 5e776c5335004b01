"""Filtered tasks feed offline training: `genesys filter --emit rollouts` writes the rollouts of the kept
tasks, and `[data] keep_tasks` restricts recorded rollouts to the tasks of a filter's output."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import GENESYS, read_jsonl, write_jsonl
from test_train_run import config, recorded

from genesys.errors import InputError
from genesys.testing.digits import digit_tasks


def test_keep_tasks_serves_only_the_rollouts_of_the_listed_tasks(tiny_model, tmp_path):
    from genesys.train.distributed import World
    from genesys.train.sources.recorded import RecordedRollouts

    rows = [recorded(task, reward, None) for task in ("a", "b", "c") for reward in (1.0, 0.0)]
    path = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    kept = write_jsonl(
        tmp_path / "filtered.jsonl", [{"problem_id": "a", "pass_rate": 0.5}, {"problem_id": "c"}]
    )
    source = RecordedRollouts(
        config(tiny_model, tmp_path / "run", data={"rollouts": [str(path)], "keep_tasks": str(kept)}), World()
    )
    assert sorted(row["problem_id"] for group in source.groups for row in group) == ["a", "a", "c", "c"]
    none = write_jsonl(tmp_path / "none.jsonl", [{"problem_id": "z"}])
    with pytest.raises(InputError, match="data.keep_tasks: none of the 6 recorded rollouts"):
        RecordedRollouts(
            config(tiny_model, tmp_path / "run", data={"rollouts": [str(path)], "keep_tasks": str(none)}),
            World(),
        )
    with pytest.raises(InputError, match="data.keep_tasks picks among recorded rollouts"):
        config(
            tiny_model, tmp_path / "run", digit_tasks(tmp_path / "t.jsonl"), data={"keep_tasks": str(kept)}
        )


@pytest.mark.slow
def test_generate_filter_train_end_to_end(tiny_model, tmp_path, plugin_env):
    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([GENESYS, *args], env=plugin_env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done

    tasks = digit_tasks(tmp_path / "tasks.jsonl", count=8)
    rollouts = tmp_path / "rollouts.jsonl"
    run("generate", "--tasks", str(tasks), "--model", tiny_model, "-o", str(rollouts), "-n", "4",
        "--max-tokens", "16", "--backend", "transformers", "--verify", "--workers", "1", "--no-progress")  # fmt: skip
    bounds = ("--min-pass-rate", "0.001", "--max-pass-rate", "0.999")
    filtered = tmp_path / "filtered.jsonl"
    run("filter", str(rollouts), "-o", str(filtered), *bounds)
    kept_ids = {row["problem_id"] for row in read_jsonl(filtered)}
    assert kept_ids, "no task of useful difficulty: the test needs some"
    kept_rollouts = tmp_path / "kept-rollouts.jsonl"
    run("filter", str(rollouts), "-o", str(kept_rollouts), *bounds, "--emit", "rollouts")
    assert {row["problem_id"] for row in read_jsonl(kept_rollouts)} == kept_ids

    common = ("--model", tiny_model, "--backend", "transformers", "--no-progress", "--optim.steps", "2",
              "--rollout.prompts-per-step", "1", "--checkpoint.every", "0")  # fmt: skip
    run("train", *common, "-o", str(tmp_path / "from-emitted"), "--data.rollouts", str(kept_rollouts))
    toml = tmp_path / "offline.toml"
    toml.write_text(
        f"[data]\nrollouts = [{json.dumps(str(rollouts))}]\nkeep_tasks = {json.dumps(str(filtered))}\n"
    )
    trained = run("train", str(toml), *common, "-o", str(tmp_path / "kept"))
    assert "trained 2 steps" in trained.stdout
    assert (tmp_path / "kept" / "final").is_dir()
