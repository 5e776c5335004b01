"""The `pipeline` backend: the ring's transport, greedy and seeded output identical to the unsplit
model, the generate command's rows, resume and verification, stages started by address, a stage
that dies, and TOPLOC proofs of the last stage validated like any rows."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from genesys.config import PromptStyle, SamplingConfig
from genesys.generate.backend import GenerationRequest, iterate
from genesys.generate.hf import TransformersBackend
from genesys.inference.backend import PipelineBackend
from genesys.inference.transport import Closed, Inbox, Link, Message, StageError, encode, read_message


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


def _outputs(backend: Any, requests: list[GenerationRequest]) -> dict[str, list[tuple]]:
    try:
        return {
            result.request.key: [
                (c.completion_ids, c.logprobs, c.finish_reason, c.text) for c in result.completions
            ]
            for result in iterate(backend.generate(requests))
        }
    finally:
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


# --- transport -------------------------------------------------------------------------------------


def test_messages_keep_header_and_tensors_of_every_dtype():
    a, b = socket.socketpair()
    tensors = [
        torch.randn(2, 3).to(torch.bfloat16),
        torch.arange(4),
        torch.ones(2, 0),
        torch.tensor([True, False]),
    ]
    a.sendall(encode(Message({"type": "step", "mb": 3}, tensors)))
    got = read_message(b)
    assert got.header == {"type": "step", "mb": 3}
    for sent, received in zip(tensors, got.tensors):
        assert received.dtype == sent.dtype and torch.equal(received, sent)


def test_a_malformed_or_pickled_message_closes_the_inbox_naming_the_peer():
    a, b = socket.socketpair()
    inbox = Inbox(b, "stage 2")
    header = b'{"type": "step", "tensors": [{"dtype": "object", "shape": [1]}]}'
    a.sendall(len(header).to_bytes(4, "big") + header)
    closed = inbox.get(timeout=30)
    assert isinstance(closed, Closed) and closed.peer == "stage 2" and "malformed" in closed.reason


def test_a_link_delivers_no_sooner_than_its_latency_and_in_order():
    a, b = socket.socketpair()
    link, inbox = Link(a, "stage 1", latency_s=0.2), Inbox(b, "stage 0")
    sent = time.monotonic()
    for k in range(3):
        link.send(Message({"type": "step", "mb": k}))
    first = inbox.get(timeout=30)
    assert time.monotonic() - sent >= 0.2
    assert [first.header["mb"], inbox.get(timeout=30).header["mb"], inbox.get(timeout=30).header["mb"]] == [
        0,
        1,
        2,
    ]
    link.close()
    assert isinstance(inbox.get(timeout=30), Closed)


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
    for temperature in (0.0, 1.0):
        backend = PipelineBackend(
            four_layers, PromptStyle(), stages=stages, batch_size=4, micro_batches=micro_batches, latency_ms=2
        )
        assert_same(_outputs(backend, _requests(temperature)), unsplit[temperature])


@pytest.mark.distributed
def test_stages_started_by_address_form_the_ring(four_layers, unsplit):
    processes = [
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
            text=True,
        )
        for _ in range(2)
    ]
    try:
        peers = [p.stdout.readline().removeprefix("listening on ").strip() for p in processes]
        backend = PipelineBackend(four_layers, PromptStyle(), stages=3, batch_size=4, peers=peers)
        assert_same(_outputs(backend, _requests(0.0)), unsplit[0.0])
        assert [p.wait(timeout=60) for p in processes] == [0, 0]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


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
def test_proofs_of_the_last_stage_validate_like_any_rows_and_a_swapped_token_does_not(
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
    assert rows and all(row["toploc_proofs"] for row in rows)
    from conftest import write_jsonl

    tampered = swap_token(rows[0], backend.tokenizer)
    inputs = write_jsonl(tmp_path / "to-validate.jsonl", [*rows, {**tampered, "response_id": "tampered"}])
    config = ValidateCommand(
        inputs=[str(inputs)],
        model=four_layers,
        output=str(tmp_path / "validated.jsonl"),
        backend="transformers",
        progress=False,
        # the pipeline's last stage draws with the usual sampler: TOPLOC proofs, no sampling proofs
        proofs=dataclasses.replace(TINY_PROOF_POLICY, require_sampling=False),
        thresholds=TINY_THRESHOLDS,
    )
    validate_files(config)
    verdicts = {row["response_id"]: row for row in read_rows(tmp_path / "validated.jsonl")}
    assert verdicts.pop("tampered")["toploc_valid"] is False
    assert all(row["toploc_valid"] is True for row in verdicts.values()), [
        row["toploc_reason"] for row in verdicts.values()
    ]
