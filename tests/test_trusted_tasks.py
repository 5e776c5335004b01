"""`genesys validate --tasks`: what an untrusted worker may not choose (prompt, gold, task type,
metadata, sampling settings) comes from the trusted task set, never from its row. Hostile rows: a
forged gold, an unknown task, a swapped prompt, forged sampling settings, a repeated sample."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("toploc", reason="toploc is not installed: build it with `make install`")

import orjson  # noqa: E402

from genesys.config import ExpectedSampling, ValidateCommand, ValidateData  # noqa: E402
from genesys.data.attestation import ATTESTATION_COLUMN, TrustKey  # noqa: E402
from genesys.data.identity import task_key  # noqa: E402
from genesys.proofs.validate import validate_files  # noqa: E402
from genesys.testing.tampering import (  # noqa: E402
    TINY_PROOF_POLICY,
    TINY_PROOFS,
    TINY_THRESHOLDS,
    generate,
    read_rows,
)

TASKS = [
    {
        "problem_id": f"e{i}",
        "source": "trust-tests",
        "task_type": "echo",
        "prompt": f"Say the number {i * 7}, nothing else.",
        "verification_info": {"expected": str(i * 7)},
        "metadata": {"difficulty": i},
    }
    for i in range(4)
]


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trusted")


@pytest.fixture(scope="module")
def tasks(work: Path) -> Path:
    return write(work / "tasks.jsonl", TASKS)


@pytest.fixture(scope="module")
def honest(tiny_model: str, tasks: Path, work: Path) -> list[dict[str, Any]]:
    """4 tasks x 2 samples with proofs, as an honest worker hands them in."""
    return generate(tiny_model, tasks, work / "honest.jsonl", TINY_PROOFS, max_tokens=16)


def validate(
    model: str, rows: list[dict[str, Any]], work: Path, name: str, trusted: Path | None, **settings: Any
) -> list[dict[str, Any]]:
    output = work / f"{name}-validated.jsonl"
    data = settings.pop("data", {})
    settings.setdefault("expect", ExpectedSampling(max_tokens=16))  # what `honest` was generated with
    validate_files(
        ValidateCommand(
            inputs=[str(write(work / f"{name}.jsonl", rows))],
            model=model,
            output=str(output),
            backend="transformers",
            progress=False,
            data=ValidateData(tasks=[str(trusted)] if trusted else None, **data),
            proofs=TINY_PROOF_POLICY,
            thresholds=TINY_THRESHOLDS,
            **settings,
        )
    )
    return read_rows(output)


def task_of(row: dict[str, Any]) -> dict[str, Any]:
    return next(task for task in TASKS if task["problem_id"] == row["problem_id"])


def by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["response_id"]: row for row in rows}


def test_honest_rows_bound_to_their_trusted_tasks_are_valid_and_attested(
    honest: list[dict[str, Any]], tiny_model: str, tasks: Path, work: Path, trust_key_file: Path
) -> None:
    validated = validate(tiny_model, honest, work, "honest", tasks)
    assert [row["toploc_valid"] for row in validated] == [True] * len(honest), [
        row["toploc_reason"] for row in validated
    ]
    key = TrustKey.load(trust_key_file)
    for row in validated:
        assert row["trusted_task"] is True and row["sampling_proven"] is True
        assert key.problem(row) is None
        assert row["generation_config"]["temperature"] == 1.0


def test_a_forged_gold_is_invalid_and_the_row_carries_the_trusted_gold(
    honest: list[dict[str, Any]], tiny_model: str, tasks: Path, work: Path, plugin_env: dict[str, str]
) -> None:
    from genesys.verification.api import verify_rollouts

    forged = copy.deepcopy(honest[0])
    forged["verification_info"] = orjson.dumps({"expected": forged["llm_response"]}).decode()
    forged.update(score=1.0, reward=1.0)  # and a verdict of its own
    # Without the trusted task set (the old behaviour) the forged row validates and scores 1.0.
    (unbound,) = validate(tiny_model, [forged], work, "forged-unbound", None)
    assert unbound["toploc_valid"] is True and unbound["trusted_task"] is False
    assert verify_rollouts([copy.deepcopy(unbound)])[0]["score"] == 1.0
    (row,) = validate(tiny_model, [forged], work, "forged", tasks)
    assert row["toploc_valid"] is False and "task" in row["toploc_problems"]
    assert "verification_info differs from its trusted task's" in row["toploc_reason"]
    assert (
        row["verification_info"] == task_of(honest[0])["verification_info"]
    )  # the trusted gold, not the worker's
    assert "score" not in row and "reward" not in row  # the worker's verdict is dropped
    assert verify_rollouts([row])[0]["score"] == 0.0  # scored against the trusted gold


def test_a_forged_gold_under_its_own_task_key_names_no_trusted_task(
    honest: list[dict[str, Any]], tiny_model: str, tasks: Path, work: Path
) -> None:
    forged = copy.deepcopy(honest[0])
    forged["verification_info"] = {"expected": forged["llm_response"]}
    forged["response_id"] = f"{task_key(forged)}-0"  # self-consistent: the key of the forged task
    (row,) = validate(tiny_model, [forged], work, "forged-key", tasks)
    assert row["toploc_valid"] is False and row["trusted_task"] is False
    assert "is not in the trusted task set" in row["toploc_reason"]


def test_rows_of_unknown_tasks_or_without_a_task_id_are_invalid(
    honest: list[dict[str, Any]], tiny_model: str, work: Path
) -> None:
    only_first = write(work / "first-task.jsonl", [task_of(honest[0])])
    anonymous = copy.deepcopy(honest[1]) | {"response_id": "my-own-id"}
    rows = by_id(validate(tiny_model, [*honest[:4], anonymous], work, "unknown", only_first))
    first_key = honest[0]["response_id"].split("-")[0]
    for rid, row in rows.items():
        if rid.startswith(first_key):
            assert row["toploc_valid"] is True, row["toploc_reason"]
        else:
            assert row["toploc_valid"] is False and row["toploc_problems"] == ["task"]
    assert "is not in the trusted task set" in rows[honest[2]["response_id"]]["toploc_reason"]
    assert "names no task" in rows["my-own-id"]["toploc_reason"]


def test_a_swapped_prompt_is_invalid(
    honest: list[dict[str, Any]], tiny_model: str, tasks: Path, work: Path
) -> None:
    # The text of another task's prompt in the row: the worker's copy differs from the trusted one.
    other = next(row for row in honest if row["problem_id"] != honest[0]["problem_id"])
    text = copy.deepcopy(honest[0]) | {"prompt": other["prompt"]}
    # Another task's answer handed in as this task's sample: the prompt tokens are not this task's.
    claimed = copy.deepcopy(other) | {k: honest[0][k] for k in ("response_id", "problem_id", "prompt")}
    claimed |= {"verification_info": honest[0]["verification_info"], "metadata": honest[0]["metadata"]}
    rows = [
        *validate(tiny_model, [text], work, "swapped-text", tasks),
        *validate(tiny_model, [claimed], work, "swapped-answer", tasks),
    ]
    assert "prompt differs from its trusted task's" in rows[0]["toploc_reason"]
    assert rows[0]["prompt"] == honest[0]["prompt"]
    assert rows[1]["toploc_problems"] == ["task"], rows[1]["toploc_reason"]
    assert "prompt_ids are not the trusted task's prompt" in rows[1]["toploc_reason"]
    assert [row["toploc_valid"] for row in rows] == [False, False]


def test_prompts_are_rendered_with_the_trusted_settings(
    honest: list[dict[str, Any]], tiny_model: str, tasks: Path, work: Path
) -> None:
    rows = validate(tiny_model, honest[:2], work, "system", tasks, data={"system_prompt": "Be brief."})
    assert all("prompt_ids are not the trusted task's prompt" in row["toploc_reason"] for row in rows)


def test_forged_sampling_settings_are_invalid_and_replaced_by_the_trusted_ones(
    honest: list[dict[str, Any]], tiny_model: str, tasks: Path, work: Path
) -> None:
    cooler = copy.deepcopy(honest[0])
    cooler["generation_config"] = cooler["generation_config"] | {"temperature": 0.5}
    longer = copy.deepcopy(honest[1])
    longer["generation_config"] = longer["generation_config"] | {"max_tokens": 4096}
    rows = validate(tiny_model, [cooler, longer], work, "sampling", tasks)
    assert "temperature 0.5, expected 1.0" in rows[0]["toploc_reason"]
    assert "max_tokens 4096, expected 16" in rows[1]["toploc_reason"]
    for row in rows:
        assert row["toploc_valid"] is False and "sampling" in row["toploc_problems"]
        assert (row["generation_config"]["temperature"], row["generation_config"]["max_tokens"]) == (1.0, 16)
    # Unset [expect] settings are generate's defaults, not the worker's: max_tokens 1024 here.
    (row,) = validate(tiny_model, honest[:1], work, "sampling-defaults", tasks, expect=ExpectedSampling())
    assert row["generation_config"]["max_tokens"] == 1024
    assert row["toploc_valid"] is (honest[0]["finish_reason"] == "stop"), row["toploc_reason"]


def test_a_repeated_sample_and_worker_made_trust_columns_do_not_count(
    honest: list[dict[str, Any]], tiny_model: str, tasks: Path, work: Path
) -> None:
    # a row without a sampling proof claiming to be proven, bound and attested
    unsampled = {name: value for name, value in copy.deepcopy(honest[0]).items() if name != "sampling_proof"}
    claims = unsampled | {"trusted_task": True, "sampling_proven": True, ATTESTATION_COLUMN: "v1:x:y"}
    rows = validate(tiny_model, [claims, copy.deepcopy(honest[0])], work, "repeated", tasks)
    assert rows[0]["toploc_valid"] is False and rows[0]["sampling_proven"] is None
    assert "sampling_proof" in rows[0]["toploc_reason"]
    assert rows[0][ATTESTATION_COLUMN] != "v1:x:y"
    assert rows[1]["toploc_valid"] is False and "repeats the response_id" in rows[1]["toploc_reason"]
    (unbound,) = validate(tiny_model, [claims], work, "claims-unbound", None)
    assert unbound["trusted_task"] is False and unbound["sampling_proven"] is None
