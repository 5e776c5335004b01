"""`--require-proofs` counts only what the trusted side can check: rows `genesys validate --tasks`
marked valid and attested under the trust key (then scored and attested again by `genesys verify`).
A flag in a row (`toploc_valid: true`, or the string "true"), a row changed after it was attested
(a token, a score, the gold) and rows attested under another key are refused, through the real
`genesys` command line of filter and train."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("toploc", reason="toploc is not installed: build it with `make install`")

import orjson  # noqa: E402
from conftest import GENESYS, read_jsonl, write_jsonl  # noqa: E402

from genesys.config import ExpectedSampling, ValidateCommand, ValidateData  # noqa: E402
from genesys.data.attestation import ATTESTATION_COLUMN, TrustKey  # noqa: E402
from genesys.errors import InputError  # noqa: E402
from genesys.proofs.validate import validate_files  # noqa: E402
from genesys.testing.tampering import TINY_PROOF_POLICY, TINY_PROOFS, TINY_THRESHOLDS, generate  # noqa: E402

TASKS = [
    {
        "problem_id": f"e{i}",
        "source": "trust-tests",
        "task_type": "echo",
        "prompt": f"Repeat {i}.",
        "verification_info": {"expected": str(i)},
    }
    for i in range(3)
]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("require")


@pytest.fixture(scope="module")
def tasks(work: Path) -> Path:
    return write_jsonl(work / "tasks.jsonl", TASKS)


@pytest.fixture(scope="module")
def verified(tiny_model: str, tasks: Path, work: Path) -> Path:
    """Honest rows: generated with proofs, validated against the trusted tasks, verified by the CLI."""
    generate(tiny_model, tasks, work / "rollouts.jsonl", TINY_PROOFS, n=2, max_tokens=12)
    validate_files(
        ValidateCommand(
            inputs=[str(work / "rollouts.jsonl")],
            model=tiny_model,
            output=str(work / "validated.jsonl"),
            backend="transformers",
            progress=False,
            data=ValidateData(tasks=[str(tasks)]),
            proofs=TINY_PROOF_POLICY,
            thresholds=TINY_THRESHOLDS,
            expect=ExpectedSampling(max_tokens=12),
        )
    )
    env = _plugin_env()
    output = work / "verified.jsonl"
    done = subprocess.run(
        [
            GENESYS,
            "verify",
            str(work / "validated.jsonl"),
            "-o",
            str(output),
            "--workers",
            "1",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(output)
    assert len(rows) == 6 and all(row["toploc_valid"] is True and row["score"] == 0.0 for row in rows)
    return output


def _plugin_env() -> dict[str, str]:
    support = str(Path(__file__).parent / "support")
    return os.environ | {
        "GENESYS_PLUGINS": "genesys_testplugins",
        "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")]),
    }


def other_key(work: Path) -> Path:
    path = work / "other.key"
    if not path.exists():
        TrustKey.load(path, create=True)
    return path


def flag_only(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != ATTESTATION_COLUMN} | {"toploc_valid": True}


def flag_as_text(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != ATTESTATION_COLUMN} | {"toploc_valid": "true"}


def changed_token(row: dict[str, Any]) -> dict[str, Any]:
    return row | {"completion_ids": [*row["completion_ids"][:-1], (row["completion_ids"][-1] + 1) % 100]}


def changed_score(row: dict[str, Any]) -> dict[str, Any]:
    return row | {"score": 1.0, "reward": 1.0}


def changed_gold(row: dict[str, Any]) -> dict[str, Any]:
    return row | {"verification_info": {"expected": row["llm_response"]}}


TAMPERINGS = {
    "flag only": (flag_only, "no attestation"),
    "flag as text": (flag_as_text, "no attestation"),
    "a token": (changed_token, "changed after it was attested"),
    "the score": (changed_score, "changed after it was attested"),
    "the gold": (changed_gold, "changed after it was attested"),
}


def with_first_row(verified: Path, path: Path, tamper: Any) -> Path:
    rows = read_jsonl(verified)
    return write_jsonl(path, [tamper(copy.deepcopy(rows[0])), *rows[1:]])


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = _plugin_env() | {"COLUMNS": "400"}  # one line per message, whatever its length
    return subprocess.run([GENESYS, *args], capture_output=True, text=True, env=env, timeout=600)


def test_attested_rows_are_counted_by_filter(verified: Path, tasks: Path, tmp_path: Path) -> None:
    output = tmp_path / "kept.jsonl"
    done = run("filter", str(verified), "-o", str(output), "--require-proofs", "--tasks", str(tasks))
    assert done.returncode == 0, done.stderr
    assert "0 rollouts not proven dropped; 3 tasks" in done.stderr
    assert sorted(row["problem_id"] for row in read_jsonl(output)) == ["e0", "e1", "e2"]


@pytest.mark.parametrize("name", TAMPERINGS)
def test_filter_refuses_flag_only_and_tampered_rows(name: str, verified: Path, tmp_path: Path) -> None:
    tamper, reason = TAMPERINGS[name]
    source = with_first_row(verified, tmp_path / "rows.jsonl", tamper)
    done = run("filter", str(source), "-o", str(tmp_path / "kept.jsonl"), "--require-proofs")
    assert done.returncode == 0, done.stderr
    assert "1 rollouts not proven dropped" in done.stderr, done.stderr
    assert f"{source}:1" in done.stderr and reason in done.stderr


def test_a_signed_valid_row_whose_sampling_is_not_proven_does_not_count(verified: Path) -> None:
    """Validated with --allow-unsampled (or generated without sampling proofs), a row is signed and
    valid but its completion may be one the model never sampled: --require-proofs refuses it."""
    from genesys.proofs.requirement import ProofRequirement

    requirement = ProofRequirement.load(None, None)
    row = read_jsonl(verified)[0]
    assert row["sampling_proven"] is True and requirement.problem(row) is None
    unproven = row | {"sampling_proven": None}
    unproven[ATTESTATION_COLUMN] = requirement.key.sign(unproven)
    assert requirement.key.problem(unproven) is None  # the signature holds; the sampling does not
    assert "sampling is not proven" in requirement.problem(unproven)


def test_filter_refuses_rows_attested_under_another_key_and_a_missing_key(
    verified: Path, work: Path, tmp_path: Path
) -> None:
    other = other_key(work)
    done = run(
        "filter",
        str(verified),
        "-o",
        str(tmp_path / "kept.jsonl"),
        "--require-proofs",
        "--trust-key",
        str(other),
    )
    assert done.returncode == 0, done.stderr
    assert "6 rollouts not proven dropped" in done.stderr and "another trust key" in done.stderr
    missing = run(
        "filter",
        str(verified),
        "-o",
        str(tmp_path / "k.jsonl"),
        "--require-proofs",
        "--trust-key",
        str(tmp_path / "none.key"),
    )
    assert missing.returncode == 2 and "no trust key at" in missing.stderr


def test_filter_with_tasks_refuses_rows_of_other_tasks(verified: Path, tmp_path: Path) -> None:
    some = write_jsonl(tmp_path / "some.jsonl", TASKS[:1])
    done = run(
        "filter", str(verified), "-o", str(tmp_path / "kept.jsonl"), "--require-proofs", "--tasks", str(some)
    )
    assert done.returncode == 0, done.stderr
    assert (
        "4 rollouts not proven dropped; 1 tasks" in done.stderr
        and "not in the trusted task set" in done.stderr
    )


def test_verify_attests_scored_rows_again_and_drops_broken_attestations(
    verified: Path, work: Path, tmp_path: Path
) -> None:
    from genesys.proofs.requirement import ProofRequirement

    rows = read_jsonl(verified)
    requirement = ProofRequirement.load(None, None)
    assert all(requirement.problem(row) is None for row in rows)
    validated = read_jsonl(work / "validated.jsonl")
    source = write_jsonl(tmp_path / "validated.jsonl", [changed_gold(validated[0]), *validated[1:]])
    output = tmp_path / "verified.jsonl"
    done = run("verify", str(source), "-o", str(output), "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert (
        "attested again under the trust key: 5 rows" in done.stderr
        and "1 rows carried an attestation" in done.stderr
    )
    again = read_jsonl(output)
    assert [requirement.problem(row) is None for row in again] == [False, True, True, True, True, True]
    assert again[0][ATTESTATION_COLUMN] is None
    refused = run(
        "verify", str(source), "-o", str(tmp_path / "v2.jsonl"), "--trust-key", str(tmp_path / "none.key")
    )
    assert refused.returncode == 2 and "no trust key at" in refused.stderr


def _train(
    rollouts: Path, tasks: Path, out: Path, model: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    toml = out.with_suffix(".toml")
    toml.write_text(
        f'model = "{model}"\noutput_dir = "{out}"\n[data]\nrollouts = ["{rollouts}"]\n'
        "[rollout]\nfilter_groups = false\nprompts_per_step = 2\n[optim]\nsteps = 1\n"
        "[sampling]\nmax_tokens = 12\n"
    )
    return run("train", str(toml), "--require-proofs", "--tasks", str(tasks), "--no-progress", *extra)


@pytest.mark.slow
def test_train_learns_from_attested_rows_and_refuses_flags_tampering_and_another_key(
    verified: Path, tasks: Path, work: Path, tiny_model: str, tmp_path: Path
) -> None:
    done = _train(verified, tasks, tmp_path / "good", tiny_model)
    assert done.returncode == 0, done.stderr
    assert "trained 1 steps" in done.stdout
    rows = read_jsonl(verified)
    flags = write_jsonl(tmp_path / "flags.jsonl", [flag_only(rows[0]), *map(flag_as_text, rows[1:])])
    refused = _train(flags, tasks, tmp_path / "flags", tiny_model)
    assert (
        refused.returncode == 2 and "no rollouts that data.require_proofs counts (6 dropped" in refused.stderr
    )
    tampered = write_jsonl(tmp_path / "tampered.jsonl", [changed_score(row) for row in rows])
    refused = _train(tampered, tasks, tmp_path / "tampered", tiny_model)
    assert refused.returncode == 2 and "changed after it was attested" in refused.stderr
    refused = _train(verified, tasks, tmp_path / "other", tiny_model, "--trust-key", str(other_key(work)))
    assert refused.returncode == 2 and "another trust key" in refused.stderr


def test_train_reads_trusted_tasks_only_beside_require_proofs(tiny_model: str, tmp_path: Path) -> None:
    from genesys.train import TrainConfig

    with pytest.raises(InputError, match="both only with data.require_proofs"):
        TrainConfig.load(
            overrides={
                "model": tiny_model,
                "output_dir": str(tmp_path),
                "data": {"tasks": ["t"], "rollouts": ["r"]},
            }
        )


def test_attestations_read_the_same_from_parquet(verified: Path, tmp_path: Path) -> None:
    import polars as pl

    from genesys.data.inputs import resolve_inputs
    from genesys.data.io import iter_rows, rows_to_table

    rows = read_jsonl(verified)
    import pyarrow.parquet as pq

    pq.write_table(rows_to_table(rows), tmp_path / "rows.parquet")
    key = TrustKey.load(None)
    back = [record.row for record in iter_rows(resolve_inputs([str(tmp_path / "rows.parquet")]))]
    assert [key.problem(row) for row in back] == [None] * len(rows)
    assert isinstance(back[0]["verification_info"], str)  # JSON text in parquet, a dict in jsonl
    assert pl.read_parquet(tmp_path / "rows.parquet").height == len(rows)
    assert orjson.loads(back[0]["verification_info"]) == rows[0]["verification_info"]
