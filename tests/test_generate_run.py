"""Generation runs: rollout columns, target lengths, mixing, resume (also after SIGKILL), overlapped verification."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from genesys.config import VerifyConfig
from genesys.data.identity import task_key
from genesys.data.inputs import resolve_inputs
from genesys.data.io import RolloutWriter, iter_rows
from genesys.errors import InputError
from genesys.generate.backend import Completion, GenerationResult, PromptStyle, SamplingConfig
from genesys.generate.runner import GenerateConfig, run_generation
from genesys.generate.tiny_model import build_tiny_model
from genesys.rewards import RewardConfig
from genesys.schema import RESPONSE_COLUMNS, TASK_COLUMNS
from genesys.tasks.prompts import pick_target_length

GENESYS = str(Path(sys.executable).with_name("genesys"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    import torch

    torch.set_num_threads(
        1
    )  # a tiny model gains nothing from threads, and loses a lot beside busy neighbours
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def _rows(path: Path) -> list[dict]:
    return [record.row for record in iter_rows(resolve_inputs([str(path)]))]


def _config(model: str, output: Path, **overrides) -> GenerateConfig:
    settings = {
        "tasks": ["math-samples"],
        "model": model,
        "output": output,
        "backend": "transformers",
        "sampling": SamplingConfig(n=2, max_tokens=8, temperature=1.0, seed=0),
        "style": PromptStyle(continuation_prefix="<think>\n"),
        "max_tasks": 4,
        "backend_options": {"batch_size": 8},
        "progress": False,
    }
    return GenerateConfig(**(settings | overrides))


def test_rollouts_carry_task_and_response_columns(tiny_model, tmp_path):
    summary = run_generation(_config(tiny_model, tmp_path / "out.jsonl", max_tasks=3))
    rows = _rows(tmp_path / "out.jsonl")
    assert summary.generated == 6 == len(rows) and summary.tokens == sum(
        len(r["completion_ids"]) for r in rows
    )
    for row in rows:
        assert set(TASK_COLUMNS + RESPONSE_COLUMNS) <= set(row)
        assert row["model_name"] == tiny_model
        assert row["generation_config"]["backend"] == "transformers" and row["generation_config"]["n"] == 2
        assert row["generation_config"]["continuation_prefix"] == "<think>\n"
        assert row["machine_info"]["backend"] == "transformers" and "hostname" in row["machine_info"]
        assert len(row["completion_logprobs"]) == len(row["completion_ids"]) > 0
        assert row["finish_reason"] in ("stop", "length")
        assert isinstance(row["verification_info"], dict) and row["verification_info"]["ground_truth"]
    by_task = Counter(r["response_id"].rsplit("-", 1)[0] for r in rows)
    assert all(count == 2 for count in by_task.values()) and len(by_task) == 3
    assert {r["response_id"] for r in rows} == {f"{task_key(r)}-{i}" for r in rows for i in (0, 1)}


def test_target_lengths_are_sampled_per_task_asked_for_and_stored(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    config = _config(
        tiny_model,
        tmp_path / "out.jsonl",
        target_lengths=[100, 200, 300],
        max_tasks=12,
        sampling=SamplingConfig(n=2, max_tokens=4),
    )
    run_generation(config)
    rows = _rows(tmp_path / "out.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    per_task: dict[str, set[int]] = {}
    for row in rows:
        assert row["target_length"] in (100, 200, 300)
        assert f"Think for {row['target_length']} tokens before giving a response." in tokenizer.decode(
            row["prompt_ids"]
        )
        per_task.setdefault(row["problem_id"], set()).add(row["target_length"])
    assert all(
        len(targets) == 1 for targets in per_task.values()
    )  # one target per task, shared by its samples
    assert len({t for targets in per_task.values() for t in targets}) > 1  # 12 tasks do not all draw the same
    assert pick_target_length([100, 200, 300], "some-task", 0) == pick_target_length(
        [100, 200, 300], "some-task", 0
    )


def test_mixed_sources_by_ratio(tiny_model, tmp_path):
    config = _config(
        tiny_model,
        tmp_path / "out",
        tasks=["math-samples", "countdown:count=20"],
        mix=[1, 1],
        max_tasks=6,
        sampling=SamplingConfig(n=1, max_tokens=4),
    )
    run_generation(config)
    rows = _rows(tmp_path / "out")
    assert Counter(r["task_type"] for r in rows) == {"verifiable_math": 3, "countdown": 3}
    assert all(p.suffix == ".parquet" for p in (tmp_path / "out").iterdir())


def test_rerun_resumes_and_more_samples_only_adds_the_missing_ones(tiny_model, tmp_path):
    output = tmp_path / "out"
    run_generation(_config(tiny_model, output))
    again = run_generation(_config(tiny_model, output))
    assert again.generated == 0 and again.resumed == 8
    more = run_generation(_config(tiny_model, output, sampling=SamplingConfig(n=3, max_tokens=8)))
    assert more.generated == 4 and more.resumed == 8
    ids = [r["response_id"] for r in _rows(output)]
    assert len(ids) == len(set(ids)) == 12
    assert Counter(i.rsplit("-", 1)[1] for i in ids) == {"0": 4, "1": 4, "2": 4}


@pytest.mark.slow
def test_sigkill_then_same_command_gives_every_sample_exactly_once(tiny_model, tmp_path):
    output = tmp_path / "out"
    # 600 rollouts: the first shard is written after 256 rows (or 2 s), well before the end. One
    # torch thread keeps the pace steady beside other busy processes.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        GENESYS,
        "generate",
        "--tasks",
        "countdown:count=300",
        "--model",
        tiny_model,
        "-o",
        str(output),
        "--backend",
        "transformers",
        "-n",
        "2",
        "--max-tokens",
        "24",
        "--batch-size",
        "16",
        "--no-progress",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while not (output.exists() and any(output.glob("*.parquet"))):
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "no shard was written"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    partial = RolloutWriter(output).existing_keys()
    assert 0 < len(partial) < 600
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert finished.returncode == 0, finished.stderr
    ids = [r["response_id"] for r in _rows(output)]
    assert len(ids) == 600 and len(set(ids)) == 600
    assert partial <= set(ids)


class InstantBackend:
    """A backend that answers at once and records when each result was handed over."""

    name = "instant"

    def __init__(self, with_ids: bool = True, fail_after: int | None = None) -> None:
        self.yielded_at: list[float] = []
        self.with_ids = with_ids
        self.fail_after = fail_after  # results handed over before the backend breaks

    def info(self) -> dict:
        return {"backend": self.name}

    def close(self) -> None:
        pass

    async def generate(self, requests):
        for request in requests:
            if len(self.yielded_at) == self.fail_after:
                raise RuntimeError("the backend went away")
            self.yielded_at.append(time.monotonic())
            ids = [1, 2] if self.with_ids else None
            completions = [
                Completion(f"answer {i}", ids, [-0.5, -0.5], "stop") for i in request.sample_indices
            ]
            yield GenerationResult(request, [0], completions)


def test_verification_overlaps_generation_and_adds_scores(plugin_env, tmp_path):
    tasks = tmp_path / "slow.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "problem_id": str(i),
                    "task_type": "slow",
                    "prompt": f"p{i}",
                    "verification_info": {"sleep": 0.3},
                }
            )
            + "\n"
            for i in range(8)
        )
    )
    backend = InstantBackend()
    started = time.monotonic()
    config = GenerateConfig(
        tasks=[str(tasks)],
        model="instant",
        output=tmp_path / "out.jsonl",
        sampling=SamplingConfig(n=1),
        verify=VerifyConfig(workers=1, progress=False),
        progress=False,
    )
    summary = run_generation(config, backend=backend)
    elapsed = time.monotonic() - started
    assert elapsed >= 8 * 0.3  # verification took its time ...
    assert backend.yielded_at[-1] - backend.yielded_at[0] < 1.0  # ... while generation never waited for it
    rows = _rows(tmp_path / "out.jsonl")
    assert summary.generated == 8 and len(rows) == 8
    assert all(r["score"] == 1.0 and r["reward"] == 1.0 and r["error"] is None for r in rows)


def test_countdown_rollouts_are_verified_with_the_plugin(tiny_model, tmp_path):
    config = _config(
        tiny_model,
        tmp_path / "out.jsonl",
        tasks=["countdown:count=3"],
        verify=VerifyConfig(workers=1, progress=False),
    )
    run_generation(config)
    rows = _rows(tmp_path / "out.jsonl")
    assert len(rows) == 6
    assert all(
        r["score"] == 0.0 and r["error"] is None and "reason" in r["verification_result_info"] for r in rows
    )


def test_verify_refuses_unserved_task_types_before_loading_a_model(tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"task_type": "no_such_type", "prompt": "x"}) + "\n")
    config = GenerateConfig(
        tasks=[str(tasks)],
        model="/nonexistent",
        output=tmp_path / "o.jsonl",
        verify=VerifyConfig(progress=False),
        progress=False,
    )
    with pytest.raises(InputError, match="no_such_type"):
        run_generation(config)


def test_a_task_without_task_type_or_prompt_is_named(tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(
        json.dumps({"task_type": "countdown", "prompt": "x"}) + "\n" + json.dumps({"prompt": "y"}) + "\n"
    )
    config = GenerateConfig(
        tasks=[str(tasks)], model="/nonexistent", output=tmp_path / "o.jsonl", progress=False
    )
    with pytest.raises(InputError, match=r"task 1 of .*t\.jsonl.*task_type"):
        run_generation(config)
    tasks.write_text(
        json.dumps({"task_type": "countdown", "prompt": "x"})
        + "\n"
        + json.dumps({"task_type": "countdown"})
        + "\n"
    )
    with pytest.raises(InputError, match=r"task 1 of .*t\.jsonl.*'prompt' is missing"):
        run_generation(config)


def test_cli_rejects_flags_of_another_backend(tmp_path):
    result = subprocess.run(
        [
            GENESYS,
            "generate",
            "--tasks",
            "math-samples",
            "--model",
            "m",
            "-o",
            str(tmp_path / "o"),
            "--backend",
            "transformers",
            "--base-url",
            "http://x",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "--base-url applies to the openai backend" in result.stderr


def test_resuming_with_another_model_or_other_settings_is_refused(tiny_model, tmp_path):
    output = tmp_path / "out"
    run_generation(_config(tiny_model, output, max_tasks=1, sampling=SamplingConfig(n=1, max_tokens=2)))
    with pytest.raises(InputError, match="holds rollouts of model"):
        run_generation(_config("another-model", output, max_tasks=1))
    with pytest.raises(InputError, match=r"other settings \(temperature 1.0 -> 0.5\)"):
        run_generation(
            _config(
                tiny_model, output, max_tasks=1, sampling=SamplingConfig(n=1, max_tokens=2, temperature=0.5)
            )
        )
    assert (
        run_generation(
            _config(tiny_model, output, max_tasks=1, sampling=SamplingConfig(n=2, max_tokens=2))
        ).generated
        == 1
    )


def test_bad_target_length_settings_fail_before_any_work(tmp_path):
    for lengths, template, message in (
        ([0, 100], "Think for {target_length} tokens.", "positive integers"),
        ([100], "Think for {length} tokens.", "target-length-prompt"),
    ):
        config = GenerateConfig(
            tasks=["math-samples"],
            model="/nonexistent",
            output=tmp_path / "o.jsonl",
            target_lengths=lengths,
            target_length_prompt=template,
            progress=False,
        )
        with pytest.raises(InputError, match=message):
            run_generation(config)


def _echo_tasks(path: Path, count: int) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "problem_id": str(i),
                    "task_type": "echo",
                    "prompt": f"p{i}",
                    "verification_info": {"expected": "answer 0"},
                }
            )
            + "\n"
            for i in range(count)
        )
    )
    return path


def _instant_config(tasks: Path, output: Path, **overrides) -> GenerateConfig:
    settings = {
        "tasks": [str(tasks)],
        "model": "instant",
        "output": output,
        "sampling": SamplingConfig(n=2),
        "progress": False,
    }
    return GenerateConfig(**(settings | overrides))


def test_a_length_penalty_without_a_target_is_refused_before_generating(plugin_env, tmp_path):
    tasks = _echo_tasks(tmp_path / "t.jsonl", 3)
    backend = InstantBackend()
    verify = VerifyConfig(workers=1, progress=False, reward=RewardConfig("exact"))
    with pytest.raises(
        InputError, match=r"--verify --length-penalty exact: row \(problem_id='0'\).*--target-lengths"
    ):
        run_generation(_instant_config(tasks, tmp_path / "out.jsonl", verify=verify), backend=backend)
    assert backend.yielded_at == []  # nothing generated, so nothing lost
    run_generation(
        _instant_config(tasks, tmp_path / "out.jsonl", verify=verify, target_lengths=[2]), backend=backend
    )
    rows = _rows(tmp_path / "out.jsonl")
    assert (
        sorted((r["score"], r["reward"]) for r in rows) == [(0.0, 0.0)] * 3 + [(1.0, 1.0)] * 3
    )  # 2 ids against a target of 2


def test_cli_refuses_a_length_penalty_without_a_target_before_loading_the_model(tmp_path):
    command = [
        GENESYS,
        "generate",
        "--tasks",
        "math-samples",
        "--max-tasks",
        "2",
        "--model",
        "/nonexistent",
        "-o",
        str(tmp_path / "o.jsonl"),
        "--backend",
        "transformers",
        "--verify",
        "--length-penalty",
        "exact",
        "--no-progress",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert (
        result.returncode == 2 and "--target-lengths" in result.stderr and "Traceback" not in result.stderr
    ), result.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_rows_whose_reward_fails_after_generation_are_written_as_error_rows(plugin_env, tmp_path):
    tasks = _echo_tasks(tmp_path / "t.jsonl", 3)
    verify = VerifyConfig(workers=1, progress=False, reward=RewardConfig("clip", target_length=5))
    backend = InstantBackend(
        with_ids=False
    )  # a server that returns no token ids: nothing to count without a tokenizer
    summary = run_generation(_instant_config(tasks, tmp_path / "out.jsonl", verify=verify), backend=backend)
    rows = _rows(tmp_path / "out.jsonl")
    assert summary.generated == 6 == len(rows)
    assert sorted(r["score"] for r in rows) == [0.0] * 3 + [1.0] * 3  # the verdicts are kept
    assert all(
        r["reward"] is None and r["error"].startswith("reward_error: ") and "--tokenizer" in r["error"]
        for r in rows
    )


def test_rows_generated_before_a_failure_are_written(tmp_path):
    tasks = _echo_tasks(tmp_path / "t.jsonl", 5)
    output = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="the backend went away"):
        run_generation(_instant_config(tasks, output), backend=InstantBackend(fail_after=3))
    assert len(_rows(output)) == 6  # 3 tasks x 2 samples, kept for the rerun to build on
    assert run_generation(_instant_config(tasks, output), backend=InstantBackend()).generated == 4


def test_unreadable_task_rows_go_to_the_rejects_file_and_the_run_goes_on(tmp_path):
    tasks = _echo_tasks(tmp_path / "t.jsonl", 2)
    tasks.write_text(tasks.read_text() + "{broken\n")
    output = tmp_path / "out.jsonl"
    summary = run_generation(_instant_config(tasks, output), backend=InstantBackend())
    assert summary.generated == 4 == len(_rows(output))  # used to stop the run with an InputError
    assert summary.rejected == 1 and summary.rejects == tmp_path / "out.jsonl.rejects.jsonl"
    (reject,) = [json.loads(line) for line in summary.rejects.read_text().splitlines()]
    assert reject["location"] == f"{tasks}:3" and reject["raw"] == "{broken"


def test_a_finished_parquet_output_is_resumed_in_place_and_checked(tmp_path):
    tasks = _echo_tasks(tmp_path / "t.jsonl", 2)
    output = tmp_path / "out.parquet"
    run_generation(_instant_config(tasks, output, max_tasks=1), backend=InstantBackend())
    assert output.is_file() and not (tmp_path / "out.parquet.parts").exists()
    with pytest.raises(InputError, match="holds rollouts of model 'instant', not 'other'"):
        run_generation(_instant_config(tasks, output, model="other"), backend=InstantBackend())
    assert len(_rows(output)) == 2  # the finished file stays where it is
    assert run_generation(_instant_config(tasks, output), backend=InstantBackend()).generated == 2
    ids = [row["response_id"] for row in _rows(output)]
    assert len(ids) == len(set(ids)) == 4
