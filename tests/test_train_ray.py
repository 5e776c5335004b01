"""Asynchronous training and verification on a local Ray instance: bounded staleness, weight
broadcast, a rollout worker killed mid-run, and `genesys verify` spread over Ray actors."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install 'genesys-rl[ray]'")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import GENESYS, REPO, SUPPORT, read_jsonl, rollout, train_arguments, write_jsonl  # noqa: E402

from genesys.cluster import NAMESPACE  # noqa: E402
from genesys.testing.digits import TURNS_TASK_TYPE, digit_tasks  # noqa: E402
from genesys.train import TrainConfig, train  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (4 logical CPUs: 2 rollout, 1 verifier actor, spare),
    whose actors load the test plugins."""
    env = {
        "GENESYS_PLUGINS": "genesys_testplugins",
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), str(REPO)]),
        "OMP_NUM_THREADS": "1",
    }
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        namespace=NAMESPACE,
        runtime_env={"env_vars": env},
    )
    yield ray
    ray.shutdown()


def ray_config(
    model: str, out: Path, tasks: Path, staleness: int = 1, steps: int = 12, **sections: Any
) -> TrainConfig:
    data: dict[str, Any] = {
        "model": model,
        "output_dir": str(out),
        "backend": "transformers",
        "progress": False,
        "data": {"tasks": [str(tasks)]},
        "sampling": {"n": 8, "max_tokens": 32, "seed": 0},
        "rollout": {"prompts_per_step": 4},
        "optim": {"steps": steps, "lr": 3e-3, "max_grad_norm": 1.0, "micro_batch_size": 32},
        "checkpoint": {"every": 0},
        "verify": {"workers": 1},
        "async": {"max_staleness": staleness},
        "cluster": {"backend": "ray", "rollout_workers": 2, "verifier_workers": 1},
    }
    for section, values in sections.items():
        data[section] = (
            {**data[section], **values}
            if isinstance(values, dict) and isinstance(data.get(section), dict)
            else values
        )
    return TrainConfig.load(None, data)


@pytest.mark.slow
@pytest.mark.ray
def test_two_workers_with_staleness_one_stay_in_bound_and_learn(
    tiny_model, tmp_path, plugin_env, local_ray, caplog
):
    with caplog.at_level(logging.INFO, logger="genesys.train.sources.asynchronous"):
        result = train(
            ray_config(
                tiny_model, tmp_path / "run", digit_tasks(tmp_path / "tasks.jsonl"), staleness=1, steps=30
            )
        )
    messages = [record.getMessage() for record in caplog.records]
    assert any(
        m.startswith("step 1: waiting for rollouts") for m in messages
    )  # the actors were still starting
    assert sum("staleness histogram" in m for m in messages) == 30
    metrics = result.metrics
    assert [m["step"] for m in metrics] == list(range(1, 31))
    for m in metrics:
        assert m["staleness_max"] <= 1 and 0 <= m["staleness_mean"] <= 1
        assert sum(m["staleness_hist"].values()) == m["groups_kept"] == 4
        assert set(m["staleness_hist"]) <= {"0", "1"}
        assert m["trainer_wait_s"] >= 0
    assert any(m["staleness_max"] == 1 for m in metrics)  # generation did run ahead of the trainer
    draws = [d for m in metrics for d in m["draws"]]
    assert len(draws) == len(set(draws)) == 30 * 4  # no group trained twice
    # The newest broadcast that every worker has loaded; on a busy machine the first completes some
    # steps after it was published, so only the run as a whole is sure to have one.
    loads = [m["weights_load_s"] for m in metrics if m["weights_load_s"] is not None]
    assert loads and all(seconds >= 0 for seconds in loads)
    rewards = [m["reward_mean"] for m in metrics]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.2, rewards


@pytest.mark.slow
@pytest.mark.ray
def test_staleness_zero_on_ray_trains_on_policy(tiny_model, tmp_path, plugin_env, local_ray):
    result = train(
        ray_config(tiny_model, tmp_path / "run", digit_tasks(tmp_path / "tasks.jsonl"), staleness=0, steps=4)
    )
    assert all(m["staleness_max"] == 0 for m in result.metrics)
    assert (
        result.metrics[0]["logprob_mismatch"] <= 1e-4
    )  # the first batch comes from the trainer's own weights


@pytest.mark.slow
@pytest.mark.ray
def test_rollout_workers_play_environment_tasks(tiny_model, tmp_path, plugin_env, local_ray):
    """A task of an environment's type is played on the rollout workers, its trajectory's tokens
    trained on from the trainer's own weights."""
    tasks = digit_tasks(tmp_path / "tasks.jsonl", task_type=TURNS_TASK_TYPE)
    result = train(
        ray_config(tiny_model, tmp_path / "run", tasks, staleness=0, steps=2, sampling={"max_tokens": 8})
    )
    first = result.metrics[0]
    assert first["rollout_errors"] == 0 and first["groups_kept"] == 4
    assert first["logprob_mismatch"] <= 1e-4 and first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert (
        2 * 32 <= first["tokens"] <= 2 * 8 * 32
    )  # two turns of every rollout, the environment's tokens not counted


def _kill_when(metrics: Path, steps: int, name_suffix: str, killed: dict[str, Any]) -> None:
    """SIGKILL the rollout actor whose name ends in `name_suffix` once `steps` steps are logged."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            break
        time.sleep(0.05)
    names = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].endswith(name_suffix)
    ]
    pid = ray.get(ray.get_actor(names[0], namespace=NAMESPACE).pid.remote())
    os.kill(pid, signal.SIGKILL)
    killed["pid"] = pid


@pytest.mark.slow
@pytest.mark.ray
def test_a_rollout_worker_killed_mid_run_is_restarted_and_nothing_is_trained_twice(
    tiny_model, tmp_path, plugin_env, local_ray, caplog
):
    out = tmp_path / "run"
    killed: dict[str, Any] = {}
    killer = threading.Thread(target=_kill_when, args=(out / "metrics.jsonl", 3, "-rollout-0", killed))
    killer.start()
    with caplog.at_level(logging.WARNING, logger="genesys.cluster.pool"):
        result = train(
            ray_config(tiny_model, out, digit_tasks(tmp_path / "tasks.jsonl"), staleness=1, steps=12)
        )
    killer.join()
    assert "pid" in killed
    metrics = result.metrics
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert any("rollout worker 0 was restarted by Ray" in record.getMessage() for record in caplog.records)
    assert sum(m["worker_restarts"] for m in metrics) == 1
    # Whether requests were in flight when the kill landed (and so were resent) is timing: the kill can
    # land while the worker loads weights. Resending requests of a killed actor is covered by the generation
    # actor tests of `genesys generate` below.
    draws = [d for m in metrics for d in m["draws"]]
    assert len(draws) == len(set(draws)) == sum(m["groups_kept"] for m in metrics) == 12 * 4
    assert all(m["staleness_max"] <= 1 for m in metrics)


def _verify_inputs(path: Path, count: int) -> Path:
    kinds = [("echo", "yes"), ("echo", "no"), ("boom", "x"), ("odd_details", "x"), ("crash", "x")]
    rows = []
    for i in range(count):
        task_type, completion = kinds[i % len(kinds)]
        row = rollout(task_type, completion, expected="yes")
        row["problem_id"] = f"p{i}"
        rows.append(row)
    return write_jsonl(path, rows)


def _comparable(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rows by response_id, without the verifying process's pid (the only field that may differ)."""
    out = {}
    for row in rows:
        info = row.get("verification_result_info")
        if isinstance(info, dict):
            info.pop("pid", None)
        out[row["response_id"]] = row
    return out


@pytest.mark.slow
@pytest.mark.ray
def test_ray_verify_on_two_actors_equals_the_local_result_row_for_row(tmp_path, plugin_env, local_ray):
    from genesys.config import ClusterConfig, VerifyConfig
    from genesys.verification.api import verify_files

    inputs = _verify_inputs(tmp_path / "in.jsonl", 150)
    local = verify_files(
        [str(inputs)], tmp_path / "local.jsonl", config=VerifyConfig(workers=1, progress=False)
    )
    spread = verify_files(
        [str(inputs)],
        tmp_path / "ray.jsonl",
        config=VerifyConfig(
            workers=1, progress=False, cluster=ClusterConfig(backend="ray", verifier_workers=2)
        ),
    )
    assert spread.verified == local.verified == 150
    assert {t: vars(s) for t, s in spread.stats.items()} == {t: vars(s) for t, s in local.stats.items()}
    expected, found = (
        _comparable(read_jsonl(tmp_path / "local.jsonl")),
        _comparable(read_jsonl(tmp_path / "ray.jsonl")),
    )
    assert len(found) == 150 and found == expected


@pytest.mark.slow
@pytest.mark.ray
def test_a_verifier_actor_killed_mid_chunk_is_restarted_by_ray_and_every_row_is_verified(
    plugin_env, local_ray
):
    from genesys.config import ClusterConfig, VerifyConfig
    from genesys.verification.ray_pool import RayVerificationPool

    rows = [{**rollout("slow", "x", sleep=0.05), "problem_id": f"p{i}"} for i in range(40)]
    with RayVerificationPool(
        VerifyConfig(workers=1, progress=False, cluster=ClusterConfig(backend="ray", verifier_workers=2)),
        chunk_rows=10,
    ) as pool:
        actors = list(pool.actors)
        pid = ray.get(actors[0].pid.remote())  # asked first: the actor answers one call at a time
        for index, row in enumerate(rows):
            pool.submit(index, row)
        pool.poll(0)  # sends the chunks: two of 0.5 s to each actor
        os.kill(pid, signal.SIGKILL)
        verified = dict(pool.drain())
        # Ray restarted the same actor (our code starts none) and sent it its two chunks again.
        assert [a._actor_id for a in pool.actors] == [a._actor_id for a in actors]
        assert ray.get(actors[0].restarted.remote()) and ray.get(actors[0].pid.remote()) != pid
        assert not ray.get(actors[1].restarted.remote())
        assert pool.restarts == 1
    assert sorted(verified) == list(range(40))
    assert all(row["score"] == 1.0 for row in verified.values())


@pytest.mark.slow
@pytest.mark.ray
def test_a_killed_trainer_resumes_from_its_checkpoint_with_new_workers(tiny_model, tmp_path, plugin_env):
    """SIGKILL `genesys train` on Ray after its step-2 checkpoint; the same command (starting its own
    Ray instance) finishes the run, every step once, no draw trained twice."""
    out, tasks = tmp_path / "run", digit_tasks(tmp_path / "tasks.jsonl")
    command = [
        GENESYS,
        *train_arguments(tiny_model, out, tasks, 6, 32, "--rollout.prompts-per-step", "4"),
        *("--async.max-staleness", "1", "--cluster.backend", "ray"),
    ]
    env = {**plugin_env, "OMP_NUM_THREADS": "1"}
    metrics = out / "metrics.jsonl"
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert first.poll() is None and time.monotonic() < deadline, (
                "the run ended or stalled before it could be killed"
            )
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait()
    assert (out / "checkpoints" / "step-000002").is_dir() and not (out / "final").exists()
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    records = read_jsonl(metrics)
    assert [m["step"] for m in records] == list(range(1, 7))
    draws = [d for m in records for d in m["draws"]]
    assert len(draws) == len(set(draws)) == 6 * 4
    assert all(m["staleness_max"] <= 1 for m in records)
    assert (out / "final" / "model.safetensors").is_file()


def test_groups_older_than_the_bound_are_dropped_counted_and_their_place_freed(tmp_path):
    from genesys.train.sources.asynchronous import AsyncRollouts, _Group

    config = TrainConfig.load(
        None,
        {
            "model": "m",
            "output_dir": str(tmp_path),
            "data": {"tasks": ["t"]},
            "sampling": {"n": 8},
            "async": {"max_staleness": 1},
            "cluster": {"backend": "ray"},
        },
    )
    rollouts = AsyncRollouts(config, [{"prompt": "p"}], "m", ray)
    rollouts.taken = 5  # the trainer is about to take step 6: policy steps 4 and 5 are within the bound
    rollouts.ready = [
        _Group(position, version, [], 0) for position, version in ((0, 3), (1, 4), (2, 5), (3, 2))
    ]
    rollouts.live = {0: 0, 1: 0, 2: 0, 3: 0}
    rollouts._drop_stale()
    assert [group.version for group in rollouts.ready] == [4, 5]
    assert rollouts.counts.stale_dropped == 2
    assert sorted(rollouts.live) == [1, 2]  # the dropped draws no longer hold generation budget


def test_weights_whose_digest_differs_are_refused_naming_the_tensor():
    from genesys.cluster.weights import host_weights, tensor_digest, verified_weights

    parameters = [
        ("a", torch.ones(3)),
        ("b", torch.zeros(2, 2, dtype=torch.bfloat16)),
        ("c", torch.tensor(1.5)),
    ]
    weights, digests = host_weights(parameters)
    assert verified_weights(weights, digests, 1) is weights
    damaged = {**weights, "b": weights["b"].clone()}
    damaged["b"][0, 0] = 1.0
    with pytest.raises(ValueError, match="weights version 7: tensor 'b' arrived with digest"):
        verified_weights(damaged, digests, 7)
    with pytest.raises(ValueError, match="without the tensors published"):
        verified_weights({"a": weights["a"]}, digests, 7)
    assert tensor_digest("a", weights["a"]) != tensor_digest("b", weights["a"])  # names count, not only bytes
    assert tensor_digest("a", torch.zeros(4)) != tensor_digest("a", torch.zeros(2, 2))  # and shapes


def test_published_weights_are_in_the_engines_dtype_and_a_cpu_tensor_in_it_is_not_copied():
    from genesys.cluster.weights import host_weights

    parameter = torch.nn.Parameter(torch.randn(4, 3))
    same, _ = host_weights([("w", parameter)])
    assert same["w"].data_ptr() == parameter.data_ptr() and not same["w"].requires_grad
    cast, digests = host_weights([("w", parameter)], torch.bfloat16)
    assert cast["w"].dtype == torch.bfloat16 and torch.equal(cast["w"], parameter.detach().bfloat16())
    assert digests["w"] != host_weights([("w", parameter)])[1]["w"]


def _generate_config(
    model: str,
    tasks: Path,
    output: Path,
    backend: str,
    cluster: dict[str, Any] | None = None,
    **sampling: Any,
) -> Any:
    from genesys.config import ClusterConfig, GenerateConfig, SamplingConfig, VerifyConfig

    cluster_config = ClusterConfig(**(cluster or {}))
    return GenerateConfig(
        tasks=[str(tasks)],
        model=model,
        output=output,
        backend=backend,
        sampling=SamplingConfig(**sampling),
        verify=VerifyConfig(workers=1, progress=False, cluster=cluster_config),
        progress=False,
        cluster=cluster_config,
    )


@pytest.mark.slow
@pytest.mark.ray
def test_ray_generate_on_two_actors_equals_the_local_run_row_for_row(tmp_path, plugin_env, local_ray):
    from genesys.generate.runner import run_generation

    tasks = digit_tasks(tmp_path / "tasks.jsonl", count=30)
    run_generation(_generate_config("m", tasks, tmp_path / "local.jsonl", "scripted", n=3, max_tokens=20))
    summary = run_generation(
        _generate_config(
            "m",
            tasks,
            tmp_path / "ray.jsonl",
            "scripted",
            {"backend": "ray", "rollout_workers": 2},
            n=3,
            max_tokens=20,
        )
    )
    assert summary.generated == 90

    def by_id(path: Path) -> dict[str, dict[str, Any]]:
        return {
            row["response_id"]: {k: v for k, v in row.items() if k != "machine_info"}
            for row in read_jsonl(path)
        }

    assert by_id(tmp_path / "ray.jsonl") == by_id(tmp_path / "local.jsonl")
    assert all(row["machine_info"]["ray_actors"] == 2 for row in read_jsonl(tmp_path / "ray.jsonl"))


@pytest.mark.slow
@pytest.mark.ray
def test_ray_generate_plays_environment_tasks_on_the_actors_with_token_trajectories(
    tiny_model, tmp_path, plugin_env, local_ray
):
    """... with the proofs of every model turn, which validate."""
    from dataclasses import replace

    pytest.importorskip("toploc")
    from genesys.generate.runner import run_generation
    from genesys.testing.tampering import TINY_PROOFS, validate_tiny

    tasks = digit_tasks(tmp_path / "tasks.jsonl", count=6, task_type=TURNS_TASK_TYPE)
    output = tmp_path / "ray.jsonl"
    config = _generate_config(
        tiny_model, tasks, output, "transformers", {"backend": "ray", "rollout_workers": 2}, n=2, max_tokens=6
    )
    assert run_generation(replace(config, proofs=TINY_PROOFS)).generated == 12
    validated = validate_tiny(tiny_model, output, tmp_path / "validated.jsonl")
    assert all(row["toploc_valid"] and row["sampling_proven"] for row in validated)
    rows = read_jsonl(output)
    assert len(rows) == 12 and all(row["machine_info"]["ray_actors"] == 2 for row in rows)
    for row in rows:
        assert row["error"] is None and row["turns"] == 2 and row["finish_reason"] == "done"
        assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]
        mask = row["completion_mask"]
        assert len(mask) == len(row["completion_ids"]) == len(row["completion_logprobs"])
        assert mask[0] == 1 and 0 in mask and 2 <= sum(mask) <= 12


@pytest.mark.slow
@pytest.mark.ray
def test_ray_generate_gets_every_request_of_an_actor_killed_before_the_run(
    tiny_model, tmp_path, plugin_env, local_ray
):
    from genesys.config import ClusterConfig, PromptStyle
    from genesys.generate.ray_backend import RayBackend
    from genesys.generate.runner import run_generation

    tasks = digit_tasks(tmp_path / "tasks.jsonl", count=48)
    cluster = {"backend": "ray", "rollout_workers": 2}
    config = _generate_config(
        tiny_model, tasks, tmp_path / "out.jsonl", "transformers", cluster, n=4, max_tokens=16
    )
    backend = RayBackend(
        "transformers",
        tiny_model,
        PromptStyle(),
        {"batch_size": 8},
        ClusterConfig(**cluster),
        chunk_requests=4,
    )
    os.kill(
        ray.get(backend.actors[0].pid.remote()), signal.SIGKILL
    )  # the chunks sent to it while it restarts are sent again by Ray
    try:
        summary = run_generation(config, backend=backend)
        assert ray.get(backend.actors[0].restarted.remote())
    finally:
        backend.close()
    assert backend.restarts == 1
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert summary.generated == len(rows) == 48 * 4
    assert len({row["response_id"] for row in rows}) == 48 * 4


@pytest.mark.slow
@pytest.mark.ray
def test_a_generation_actor_killed_mid_run_is_restarted_by_ray_and_the_run_writes_every_row(
    tmp_path, plugin_env, local_ray
):
    """SIGKILL a generation actor while it holds chunks: Ray restarts that same actor (genesys starts
    no new one) and sends it the chunks again; the run writes every row once."""
    from genesys.config import ClusterConfig, PromptStyle
    from genesys.generate.ray_backend import RayBackend
    from genesys.generate.runner import run_generation

    class KillAfterFirstResult(RayBackend):
        pid = 0  # actor 0's, asked before the run (an actor answers one call at a time)
        killed = False

        async def generate(self, requests):
            async for result in super().generate(requests):
                if not self.killed:  # actor 0 holds a chunk still (two each were sent, 0.2 s per chunk)
                    os.kill(self.pid, signal.SIGKILL)
                    self.killed = True
                yield result

    tasks = digit_tasks(tmp_path / "tasks.jsonl", count=40)
    cluster = {"backend": "ray", "rollout_workers": 2}
    config = _generate_config("m", tasks, tmp_path / "out.jsonl", "scripted", cluster, n=2, max_tokens=20)
    backend = KillAfterFirstResult(
        "scripted", "m", PromptStyle(), {"delay": 0.05}, ClusterConfig(**cluster), chunk_requests=4
    )
    actors = [actor._actor_id for actor in backend.actors]
    backend.pid = ray.get(backend.actors[0].pid.remote())
    try:
        summary = run_generation(config, backend=backend)
        assert [actor._actor_id for actor in backend.actors] == actors
        assert ray.get(backend.actors[0].restarted.remote())
        assert ray.get(backend.actors[0].pid.remote()) != backend.pid
        assert not ray.get(backend.actors[1].restarted.remote())
    finally:
        backend.close()
    assert backend.killed and backend.restarts == 1
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert summary.generated == len(rows) == 40 * 2
    assert len({row["response_id"] for row in rows}) == 40 * 2
