"""The `pipeline` backend: greedy and seeded output identical to the unsplit model, the generate
command's rows, resume and verification, stages started by address (and only those that know the
ring's secret), a stage that dies or stops answering, and TOPLOC proofs of the last stage validated
like any rows. The transport's authentication: test_inference_auth.py; stage-only loading:
test_inference_shard.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from genesys.config import PromptStyle, SamplingConfig
from genesys.generate.backend import GenerationRequest, iterate
from genesys.generate.hf import TransformersBackend
from genesys.inference.auth import SECRET_ENV
from genesys.inference.backend import PipelineBackend
from genesys.inference.errors import AuthenticationError, StageError


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model with 4 layers, to split 1 to 4 ways."""
    from genesys.generate.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny4") / "model", layers=4))


def _requests(
    temperature: float, count: int = 5, n: int = 2, max_tokens: int = 16
) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            f"task{i}",
            [{"role": "user", "content": "What is " + "2 + 2, " * (i % 4) + "and 3?"}],
            list(range(n)),
            seed=11 + i,
            sampling=SamplingConfig(max_tokens=max_tokens, temperature=temperature, top_p=0.9),
        )
        for i in range(count)
    ]


def _outputs(backend: Any, requests: list[GenerationRequest], close: bool = True) -> dict[str, list[tuple]]:
    try:
        return {
            result.request.key: [
                (c.completion_ids, c.logprobs, c.finish_reason, c.text) for c in result.completions
            ]
            for result in iterate(backend.generate(requests))
        }
    finally:
        if close:
            backend.close()


def assert_same(got: dict[str, list[tuple]], expected: dict[str, list[tuple]]) -> None:
    """Token for token the same completions; logprobs equal up to float rounding (each process has its
    own number of CPU threads, so its sums may be split otherwise)."""
    assert sorted(got) == sorted(expected)
    for key, completions in expected.items():
        for (ids, logprobs, finish, text), (got_ids, got_logprobs, got_finish, got_text) in zip(
            completions, got[key]
        ):
            assert (got_ids, got_finish, got_text) == (ids, finish, text), key
            assert got_logprobs == pytest.approx(logprobs, abs=1e-4), key


@pytest.fixture(scope="module")
def unsplit(four_layers: str) -> dict[float, dict[str, list[tuple]]]:
    """The transformers backend's outputs, batches of 4, greedy and sampled."""
    return {
        t: _outputs(TransformersBackend(four_layers, PromptStyle(), batch_size=4), _requests(t))
        for t in (0.0, 1.0)
    }


# --- one stage, in this process ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_stage_is_the_transformers_backend_token_for_token(four_layers, unsplit, temperature):
    backend = PipelineBackend(four_layers, PromptStyle(), stages=1, batch_size=4, micro_batches=2)
    assert_same(_outputs(backend, _requests(temperature)), unsplit[temperature])


# --- several processes --------------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 1), (4, 3)])
def test_split_rings_give_the_unsplit_models_greedy_and_seeded_tokens(
    four_layers, unsplit, stages, micro_batches
):
    backend = PipelineBackend(
        four_layers, PromptStyle(), stages=stages, batch_size=4, micro_batches=micro_batches, latency_ms=2
    )
    try:  # one ring for both runs, as a generate job keeps its ring from batch to batch
        for temperature in (0.0, 1.0):
            assert_same(_outputs(backend, _requests(temperature), close=False), unsplit[temperature])
    finally:
        backend.close()


SECRET = "pipeline-test-secret-" + "x" * 16


def _start_stages(
    count: int, logs: Path, secret: str | None = SECRET
) -> tuple[list[subprocess.Popen], list[str]]:
    """`count` stages started by address, as on other machines; their processes and addresses. Each
    one's messages go to `logs`/stage-K.log."""
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret is not None:
        env[SECRET_ENV] = secret
    processes = []
    for index in range(1, count + 1):
        with open(logs / f"stage-{index}.log", "w") as log:
            processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "genesys.cli",
                        "pipeline-stage",
                        "--listen",
                        "127.0.0.1:0",
                        "--threads",
                        "1",
                    ],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=env,
                )
            )
    addresses = [p.stdout.readline().removeprefix("listening on ").strip() for p in processes]
    return processes, addresses


def _end(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.distributed
def test_stages_started_by_address_form_the_ring_and_refuse_whoever_lacks_the_secret(
    four_layers, unsplit, tmp_path, monkeypatch
):
    from genesys.inference.transport import Message, connect, encode, listen, seal

    processes, peers = _start_stages(2, tmp_path)
    try:
        # An intruder that reaches stage 1 sends it a setup pointing the ring at itself...
        trap = listen("127.0.0.1:0")
        trap.setblocking(False)
        host, port = peers[0].rsplit(":", 1)
        intruder = socket.create_connection((host, int(port)))
        setup = {
            "type": "setup", "model": four_layers, "stages": 2, "index": 1, "ranges": [[0, 2], [2, 4]],
            "ring": [f"127.0.0.1:{trap.getsockname()[1]}"], "latency_ms": 0, "stage_timeout_s": 60,
        }  # fmt: skip
        intruder.sendall(seal(encode(Message(setup)), b"\0" * 32, 0))
        # ... and an impostor with another secret tries the handshake: neither gets in.
        with pytest.raises(AuthenticationError, match="does not know this ring's secret"):
            connect(peers[0], b"another secret, as long as it needs to be", "stage 1")
        monkeypatch.setenv(SECRET_ENV, SECRET)
        backend = PipelineBackend(
            four_layers, PromptStyle(), stages=3, batch_size=4, peers=peers, listen="127.0.0.1:0"
        )
        assert_same(_outputs(backend, _requests(0.0)), unsplit[0.0])
        assert [p.wait(timeout=60) for p in processes] == [0, 0]
        with pytest.raises(BlockingIOError):
            trap.accept()  # stage 1 never followed the injected setup
        log = (tmp_path / "stage-1.log").read_text()
        assert "refused a connection" in log and "did not open with the pipeline handshake" in log, log
        intruder.close()
    finally:
        _end(processes)


@pytest.mark.distributed
def test_a_first_stage_with_another_secret_cannot_join_and_the_stage_keeps_listening(
    four_layers, tmp_path, monkeypatch
):
    processes, peers = _start_stages(1, tmp_path)
    try:
        monkeypatch.setenv(SECRET_ENV, "not the ring's secret, but long enough to pass")
        with pytest.raises(
            AuthenticationError, match=f"stage 1 at {peers[0]} does not know this ring's secret"
        ):
            PipelineBackend(four_layers, PromptStyle(), stages=2, peers=peers)
        assert processes[0].poll() is None  # still waiting for the real first stage
    finally:
        _end(processes)


def test_stages_on_other_machines_need_the_secret(four_layers, monkeypatch):
    from genesys.errors import InputError

    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(InputError, match=f"{SECRET_ENV} is not set"):
        PipelineBackend(four_layers, PromptStyle(), stages=2, peers=["127.0.0.1:1"])


def test_a_listen_address_that_is_not_host_port_is_an_error_naming_the_flag(four_layers):
    from genesys.errors import InputError

    with pytest.raises(InputError, match="--backend_options.listen: 'somewhere' is not HOST:PORT"):
        PipelineBackend(four_layers, PromptStyle(), stages=2, listen="somewhere")


@pytest.mark.slow
def test_a_stage_started_without_the_secret_says_so_and_exits(tmp_path):
    from conftest import GENESYS

    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    result = subprocess.run(
        [GENESYS, "pipeline-stage", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 2
    assert f"{SECRET_ENV} is not set" in result.stderr and "listening" not in result.stdout


@pytest.mark.distributed
@pytest.mark.parametrize("stopped", [1, 2])
def test_a_stage_that_stops_answering_fails_the_run_naming_it_after_the_batches_done(four_layers, stopped):
    backend = PipelineBackend(
        four_layers, PromptStyle(), stages=3, batch_size=2, latency_ms=20, stage_timeout_s=10
    )
    results = iterate(backend.generate(_requests(0.0, count=8, n=1, max_tokens=40)))
    process = backend._processes[stopped - 1]
    try:
        assert next(results).completions
        os.kill(process.pid, signal.SIGSTOP)  # alive, holding its connections, silent
        # Stage 2 notices that stage 1 stopped; stage 0 notices that stage 2 (the last) did.
        with pytest.raises(
            StageError, match=rf"stage {stopped} at 127.0.0.1:\d+ stopped answering: it sent nothing for 10 s"
        ):
            for _ in results:
                pass
    finally:
        results.close()
        backend.close()  # kills the stopped stage
    assert process.poll() is not None


@pytest.mark.distributed
def test_a_stage_that_dies_fails_the_run_naming_it_after_the_batches_done(four_layers):
    backend = PipelineBackend(four_layers, PromptStyle(), stages=3, batch_size=2, latency_ms=20)
    results = iterate(backend.generate(_requests(0.0, count=8, n=1, max_tokens=40)))
    try:
        first = next(results)
        assert first.completions
        backend._processes[1].kill()  # stage 2, the last
        with pytest.raises(StageError, match="stage 2"):
            for _ in results:
                pass
    finally:
        results.close()
        backend.close()


@pytest.mark.distributed
def test_peers_must_name_every_other_stage(four_layers):
    from genesys.errors import InputError

    with pytest.raises(InputError, match="peers names 1 stages"):
        PipelineBackend(four_layers, PromptStyle(), stages=3, peers=["127.0.0.1:1"])


@pytest.mark.distributed
def test_generate_command_writes_rows_resumes_and_verifies(four_layers, tmp_path: Path):
    from conftest import GENESYS, read_jsonl, write_jsonl

    tasks = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            {"problem_id": f"p{i}", "task_type": "verifiable_math", "prompt": f"What is {i} + {i}?",
             "verification_info": {"ground_truth": str(2 * i)}}
            for i in range(4)
        ],
    )  # fmt: skip
    output = tmp_path / "rows.jsonl"
    command = [
        GENESYS, "generate", "--tasks", str(tasks), "--model", four_layers, "-o", str(output), "-n", "2",
        "--max-tokens", "12", "--backend", "pipeline", "--backend_options.stages", "2",
        "--backend_options.latency_ms", "5", "--backend_options.micro_batches", "2", "--batch-size", "2",
        "--verify", "--no-progress", "--max-tasks", "2",
    ]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert len(read_jsonl(output)) == 4
    command[command.index("--max-tasks") + 1] = "4"
    second = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    rows = read_jsonl(output)
    assert len(rows) == 8 and len({row["response_id"] for row in rows}) == 8
    for row in rows:
        assert row["completion_ids"] and len(row["completion_logprobs"]) == len(row["completion_ids"])
        assert row["finish_reason"] in ("stop", "length")
        assert row["score"] in (0.0, 1.0)
        assert row["machine_info"]["backend"] == "pipeline"


@pytest.mark.distributed
@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_run_whose_stage_stops_or_dies_keeps_its_rows_and_resumes_with_new_stages(
    four_layers, tmp_path, how
):
    from conftest import GENESYS, read_jsonl, write_jsonl

    tasks = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            {"problem_id": f"p{i}", "task_type": "verifiable_math", "prompt": f"What is {i} + {i}?",
             "verification_info": {"ground_truth": str(2 * i)}}
            for i in range(8)
        ],
    )  # fmt: skip
    output = tmp_path / "rows.jsonl"

    def run(peers: list[str]) -> subprocess.Popen:
        command = [
            GENESYS, "generate", "--tasks", str(tasks), "--model", four_layers, "-o", str(output),
            "--max-tokens", "32", "--backend", "pipeline", "--backend_options.stages", "3",
            "--backend_options.peers", ",".join(peers), "--backend_options.latency_ms", "10",
            "--backend_options.stage_timeout_s", "10", "--batch-size", "1", "--no-progress",
        ]  # fmt: skip
        return subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, env={**os.environ, SECRET_ENV: SECRET}
        )

    processes, peers = _start_stages(2, tmp_path)
    try:
        first = run(peers)
        while not (output.exists() and output.read_text().count("\n") >= 1) and first.poll() is None:
            time.sleep(0.2)
        os.kill(processes[0].pid, signal.SIGSTOP if how == "stopped" else signal.SIGKILL)  # stage 1
        _, stderr = first.communicate(timeout=600)
    finally:
        _end(processes)
    assert first.returncode != 0
    what = "stopped answering: it sent nothing for 10 s" if how == "stopped" else "went away"
    assert f"stage 1 at {peers[0]} {what}" in stderr, stderr
    kept = read_jsonl(output)
    assert 1 <= len(kept) < 8
    processes, peers = _start_stages(2, tmp_path)  # the same command, with the stages restarted
    try:
        second = run(peers)
        _, stderr = second.communicate(timeout=600)
        assert second.returncode == 0, stderr
    finally:
        _end(processes)
    rows = read_jsonl(output)
    assert len(rows) == 8 and len({row["response_id"] for row in rows}) == 8
    assert rows[: len(kept)] == kept


@pytest.mark.distributed
def test_proofs_of_the_last_stage_and_its_sampling_validate_like_any_rows_and_a_swapped_token_does_not(
    four_layers: str, tmp_path: Path
):
    pytest.importorskip("toploc")
    from genesys.config import ValidateCommand
    from genesys.proofs.validate import validate_files
    from genesys.testing.tampering import (
        TINY_PROOF_POLICY,
        TINY_PROOFS,
        TINY_THRESHOLDS,
        generate,
        read_rows,
        swap_token,
        write_tasks,
    )

    backend = PipelineBackend(
        four_layers, PromptStyle(), stages=3, batch_size=4, micro_batches=2, latency_ms=2, proofs=TINY_PROOFS
    )
    try:
        rows = generate(
            four_layers,
            write_tasks(tmp_path / "tasks.jsonl"),
            tmp_path / "rows.jsonl",
            TINY_PROOFS,
            backend=backend,
        )
    finally:
        backend.close()
    assert rows and all(row["toploc_proofs"] and row["sampling_proof"] for row in rows)
    from conftest import write_jsonl

    tampered = swap_token(rows[0], backend.tokenizer)
    inputs = write_jsonl(tmp_path / "to-validate.jsonl", [*rows, {**tampered, "response_id": "tampered"}])
    config = ValidateCommand(
        inputs=[str(inputs)],
        model=four_layers,
        output=str(tmp_path / "validated.jsonl"),
        backend="transformers",
        progress=False,
        proofs=TINY_PROOF_POLICY,  # sampling proofs required: the last stage draws with the seeded sampler
        thresholds=TINY_THRESHOLDS,
    )
    validate_files(config)
    verdicts = {row["response_id"]: row for row in read_rows(tmp_path / "validated.jsonl")}
    assert verdicts.pop("tampered")["toploc_valid"] is False
    assert all(row["sampling_proven"] is True for row in verdicts.values())
    assert all(row["toploc_valid"] is True for row in verdicts.values()), [
        row["toploc_reason"] for row in verdicts.values()
    ]
