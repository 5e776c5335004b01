"""Offline pass-rate filtering: the kept set on rollouts with known pass rates, formats, errors, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import GENESYS, read_jsonl, write_jsonl

from genesys.analysis.filtering import PassRateFilter, filter_tasks
from genesys.errors import InputError

# problem_id -> scores of its rollouts (None: verification failed)
KNOWN = {
    "t0": [0.0] * 10,  # pass rate 0.0
    "t1": [1.0] + [0.0] * 9,  # 0.1, on the lower bound
    "t2": [1.0] * 3 + [0.0] * 7,  # 0.3
    "t3": [1.0] * 5 + [0.0] * 5 + [None, None],  # 0.5 over 10 scored, 2 errors
    "t4": [1.0] * 9 + [0.0],  # 0.9, on the upper bound
    "t5": [1.0] * 10,  # 1.0
    "t6": [None] * 4,  # never scored
}


def rollouts(scores_by_task: dict[str, list[float | None]] = KNOWN) -> list[dict]:
    rows = []
    for index, (problem_id, scores) in enumerate(scores_by_task.items()):
        for k, score in enumerate(scores):
            rows.append(
                {
                    "problem_id": problem_id,
                    "source": "math" if index % 2 else "code",
                    "task_type": "verifiable_math",
                    "in_source_id": f"src-{problem_id}",
                    "prompt": f"prompt of {problem_id}",
                    "gold_standard_solution": None,
                    "verification_info": {
                        "ground_truth": problem_id,
                        "tests": [{"input": [1, "a"], "output": index}],
                    },
                    "metadata": {"difficulty": index},
                    "llm_response": f"answer {k}",
                    "response_id": f"{problem_id}-{k}",
                    "completion_ids": [k, k + 1],
                    "target_length": 1000 + k,
                    "score": score,
                    "reward": score,
                    "verification_result_info": {"k": k},
                    "error": None if score is not None else "timeout: 10s",
                }
            )
    return rows


def filter_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`genesys filter ARGS` as a user runs it."""
    return subprocess.run([GENESYS, "filter", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def run_filter(
    tmp_path: Path, rows: list[dict], output: str = "kept.jsonl", requirement: object = None, **bounds
) -> tuple[list[dict], object]:
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    summary = filter_tasks(
        [str(inputs)], tmp_path / output, PassRateFilter(**bounds), requirement, overwrite=True
    )
    return read_jsonl(tmp_path / output) if output.endswith(".jsonl") else pl.read_parquet(
        tmp_path / output
    ).to_dicts(), summary


def test_keeps_exactly_the_tasks_within_inclusive_bounds(tmp_path: Path):
    kept, summary = run_filter(tmp_path, rollouts(), min_pass_rate=0.1, max_pass_rate=0.9)
    assert [(t["problem_id"], t["pass_rate"], t["n_samples"], t["n_errors"]) for t in kept] == [
        ("t1", pytest.approx(0.1), 10, 0),
        ("t2", pytest.approx(0.3), 10, 0),
        ("t3", pytest.approx(0.5), 10, 2),
        ("t4", pytest.approx(0.9), 10, 0),
    ]
    assert (summary.tasks, summary.kept, summary.too_hard, summary.too_easy, summary.unscored) == (
        7,
        4,
        1,
        1,
        1,
    )
    assert (summary.rollouts, summary.errors) == (66, 6)


def test_output_rows_are_tasks_without_completion_columns(tmp_path: Path):
    kept, _ = run_filter(tmp_path, rollouts(), min_pass_rate=0.3, max_pass_rate=0.3)
    assert len(kept) == 1
    assert kept[0] == {
        "problem_id": "t2",
        "source": "code",
        "task_type": "verifiable_math",
        "in_source_id": "src-t2",
        "prompt": "prompt of t2",
        "gold_standard_solution": None,
        "verification_info": {"ground_truth": "t2", "tests": [{"input": [1, "a"], "output": 2}]},
        "metadata": {"difficulty": 2},
        "pass_rate": pytest.approx(0.3),
        "n_samples": 10,
        "n_errors": 0,
    }


def test_parquet_output_holds_dict_columns_as_json_strings(tmp_path: Path):
    kept, _ = run_filter(tmp_path, rollouts(), output="kept.parquet", min_pass_rate=0.9, max_pass_rate=1.0)
    assert [t["problem_id"] for t in kept] == ["t4", "t5"]
    assert json.loads(kept[0]["verification_info"]) == {
        "ground_truth": "t4",
        "tests": [{"input": [1, "a"], "output": 4}],
    }


def test_parquet_shards_and_jsonl_inputs_combine(tmp_path: Path):
    rows = rollouts()
    shards = tmp_path / "shards"
    shards.mkdir()
    as_strings = [
        {
            **r,
            "verification_info": json.dumps(r["verification_info"]),
            "metadata": json.dumps(r["metadata"]),
            "verification_result_info": json.dumps(r["verification_result_info"]),
        }
        for r in rows
    ]
    pl.DataFrame(as_strings[:20]).write_parquet(shards / "part-0.parquet")
    pl.DataFrame(as_strings[20:40]).write_parquet(shards / "part-1.parquet")
    tail = write_jsonl(tmp_path / "tail.jsonl", rows[40:])
    filter_tasks([str(shards), str(tail)], tmp_path / "kept.jsonl", PassRateFilter(0.1, 0.9))
    kept = read_jsonl(tmp_path / "kept.jsonl")
    assert [(t["problem_id"], t["n_samples"], t["n_errors"]) for t in kept] == [
        ("t1", 10, 0),
        ("t2", 10, 0),
        ("t3", 10, 2),
        ("t4", 10, 0),
    ]
    assert kept[2]["verification_info"] == rows[30]["verification_info"]  # t3, read from a parquet shard


def test_correct_metric_counts_only_full_scores(tmp_path: Path):
    partial = {"half": [0.5] * 4, "mixed": [1.0, 0.5, 0.5, 0.0]}
    by_score, _ = run_filter(tmp_path, rollouts(partial), min_pass_rate=0.0, max_pass_rate=1.0)
    by_correct, _ = run_filter(
        tmp_path, rollouts(partial), min_pass_rate=0.0, max_pass_rate=1.0, metric="correct"
    )
    assert [t["pass_rate"] for t in by_score] == [0.5, 0.5]
    assert [t["pass_rate"] for t in by_correct] == [0.0, 0.25]


def test_prompt_identifies_tasks_without_problem_id(tmp_path: Path):
    rows = rollouts({"a": [1.0, 0.0], "b": [1.0, 1.0, 1.0, 0.0]})
    for r in rows:
        r["problem_id"] = None
    kept, summary = run_filter(tmp_path, rows, min_pass_rate=0.0, max_pass_rate=1.0)
    assert [(t["prompt"], t["pass_rate"], t["n_samples"]) for t in kept] == [
        ("prompt of a", 0.5, 2),
        ("prompt of b", 0.75, 4),
    ]
    no_column = [{k: v for k, v in r.items() if k != "problem_id"} for r in rows]
    kept, _ = run_filter(tmp_path, no_column, min_pass_rate=0.6, max_pass_rate=1.0)
    assert [t["prompt"] for t in kept] == ["prompt of b"]


def test_pass_rate_column_filters_a_task_set(tmp_path: Path):
    tasks = [
        {"problem_id": f"p{i}", "prompt": "q", "solve_rate": rate}
        for i, rate in enumerate([0.0, 0.25, 0.5, None, 1.0])
    ]
    inputs = write_jsonl(tmp_path / "tasks.jsonl", tasks)
    summary = filter_tasks(
        [str(inputs)], tmp_path / "kept.jsonl", PassRateFilter(0.25, 0.5, pass_rate_column="solve_rate")
    )
    assert read_jsonl(tmp_path / "kept.jsonl") == tasks[1:3]
    assert (
        summary.tasks,
        summary.kept,
        summary.too_hard,
        summary.too_easy,
        summary.unscored,
        summary.rollouts,
    ) == (5, 2, 1, 1, 1, None)


@pytest.mark.parametrize(
    ("rows", "config", "message"),
    [
        ([{"problem_id": "a", "prompt": "x"}], PassRateFilter(), "no 'score' column"),
        ([{"score": 1.0}], PassRateFilter(), "neither 'problem_id' nor 'prompt'"),
        (
            [{"problem_id": "a", "rate": 0.5}],
            PassRateFilter(pass_rate_column="solve"),
            "'solve' is not a column",
        ),
        ([{"problem_id": "a", "rate": "high"}], PassRateFilter(pass_rate_column="rate"), "must be numeric"),
    ],
)
def test_unusable_input_is_an_input_error(tmp_path: Path, rows, config, message):
    inputs = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(InputError, match=message):
        filter_tasks([str(inputs)], tmp_path / "out.jsonl", config)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("high", 'rollouts.jsonl:3: score "high" is not a number'),
        (True, "rollouts.jsonl:3: score true is not a number"),
        (
            1.5,
            "1 rollout(s) have a score outside 0..1; the first: {dir}/rollouts.jsonl:3: score 1.5 is outside 0..1",
        ),
        (-0.5, "the first: {dir}/rollouts.jsonl:3: score -0.5 is outside 0..1"),
    ],
)
def test_a_bad_score_is_refused_naming_its_file_and_line(tmp_path: Path, bad, message):
    rows = rollouts({"a": [1.0, 0.0, 0.0], "b": [1.0]})
    rows[2]["score"] = bad
    with pytest.raises(InputError) as caught:
        run_filter(tmp_path, rows)
    assert message.format(dir=tmp_path) in str(caught.value)
    assert not (tmp_path / "kept.jsonl").exists()


def test_a_bad_score_in_a_parquet_shard_is_named_by_row(tmp_path: Path):
    shards = tmp_path / "shards"
    shards.mkdir()
    pl.DataFrame({"problem_id": ["a", "a"], "score": [1.0, 0.25]}).write_parquet(shards / "part-0.parquet")
    pl.DataFrame({"problem_id": ["b", "b"], "score": [0.0, 2.0]}).write_parquet(shards / "part-1.parquet")
    with pytest.raises(InputError, match=r"part-1\.parquet#1: score 2\.0 is outside 0\.\.1"):
        filter_tasks([str(shards)], tmp_path / "kept.jsonl")


def test_cli_names_the_line_of_a_score_that_is_not_a_number(tmp_path: Path):
    rows = rollouts()
    rows[4]["score"] = "0.5"
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    done = filter_cli(str(inputs), "-o", str(tmp_path / "kept.jsonl"))
    assert done.returncode == 2
    assert (
        f'{inputs}:5: score "0.5" is not a number' in done.stderr
        and len(done.stderr.strip().splitlines()) == 1
    )


def test_bad_bounds_and_metric_are_refused():
    with pytest.raises(ValueError, match="0 <= min <= max <= 1"):
        PassRateFilter(0.8, 0.2)
    with pytest.raises(ValueError, match="metric"):
        PassRateFilter(metric="reward")


def test_cli_filters_and_reports_counts(tmp_path: Path):
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rollouts())
    output = tmp_path / "kept.parquet"
    done = filter_cli(str(inputs), "-o", str(output), "--min-pass-rate", "0.2", "--max-pass-rate", "0.6")
    assert done.returncode == 0, done.stderr
    assert pl.read_parquet(output)["problem_id"].to_list() == ["t2", "t3"]
    assert "kept 2" in done.stderr and "6 with verification errors" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-pass-rate", "0.9", "--max-pass-rate", "0.1"], "0 <= min <= max <= 1"),
        (["--max-pass-rate", "1.5"], "0 <= min <= max <= 1"),
        (["-o", "kept.csv"], "unknown extension '.csv'; genesys filter writes a .jsonl or .parquet file"),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(tmp_path: Path, args, message):
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rollouts())
    command = [GENESYS, "filter", str(inputs), "-o", str(tmp_path / "kept.jsonl"), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_filter_command_does_not_import_torch(tmp_path: Path):
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rollouts())
    argv = ["filter", str(inputs), "-o", str(tmp_path / "kept.jsonl")]
    code = (
        f"import sys; from genesys.cli import main; assert main({argv!r}) == 0; "
        "heavy = sorted(m for m in ('torch', 'transformers', 'datasets', 'matplotlib') if m in sys.modules); "
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_saved_hf_dataset_input(tmp_path: Path):
    from datasets import Dataset

    rows = [
        {**r, "verification_info": json.dumps(r["verification_info"]), "metadata": json.dumps(r["metadata"])}
        for r in rollouts()
    ]
    for r in rows:
        r.pop("verification_result_info")
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    summary = filter_tasks([str(tmp_path / "saved")], tmp_path / "kept.jsonl", PassRateFilter(0.1, 0.9))
    kept = read_jsonl(tmp_path / "kept.jsonl")
    assert [t["problem_id"] for t in kept] == ["t1", "t2", "t3", "t4"] and summary.errors == 6
    assert kept[0]["metadata"] == {"difficulty": 1}


def test_jsonl_column_null_in_the_first_rows_still_reads(tmp_path: Path):
    rows = [{"problem_id": f"p{i}", "score": 1, "extra": None} for i in range(150)]
    rows.append({"problem_id": "late", "score": 0.5, "extra": {"nested": [1, "b"]}})
    kept, summary = run_filter(tmp_path, rows, min_pass_rate=0.5, max_pass_rate=0.5)
    assert summary.tasks == 151
    assert [(t["problem_id"], json.loads(t["extra"])) for t in kept] == [("late", {"nested": [1, "b"]})]


def attested(rows: list[dict], valid: list[bool | None], key_path: Path) -> list[dict]:
    """`rows` as genesys validate --tasks and genesys verify write them, with `toploc_valid` as given."""
    from genesys.data.attestation import TrustKey

    key = TrustKey.load(key_path, create=True)
    for row, flag in zip(rows, valid):
        row.update(toploc_valid=flag, trusted_task=True, sampling_proven=True)
        row["attestation"] = key.sign(row)
    return rows


def test_require_proofs_counts_only_attested_valid_rollouts(tmp_path: Path):
    from genesys.proofs.requirement import ProofRequirement

    key = tmp_path / "trust.key"
    rows = rollouts({"t0": [1.0, 1.0, 0.0, 0.0], "t1": [1.0, 0.0]})
    # t0: its two failures do not count: one attested as invalid, one a flag with no attestation
    attested(rows, [True, True, False, True, True, True], key)
    rows[3].pop("attestation")
    requirement = ProofRequirement.load(str(key), None)
    kept, summary = run_filter(
        tmp_path, rows, max_pass_rate=0.9, require_proofs=True, requirement=requirement
    )
    assert [task["problem_id"] for task in kept] == ["t1"]
    assert summary.unproven == 2 and summary.rollouts == 4 and summary.too_easy == 1
    assert "genesys validate did not mark it valid" in summary.first_unproven
    unchecked, summary = run_filter(tmp_path, rows, max_pass_rate=0.9)
    assert [task["problem_id"] for task in unchecked] == ["t0", "t1"] and summary.unproven is None


def test_require_proofs_without_a_trust_key_is_an_input_error(tmp_path: Path):
    from genesys.proofs.requirement import ProofRequirement

    with pytest.raises(InputError, match="no trust key at"):
        run_filter(
            tmp_path,
            rollouts(),
            require_proofs=True,
            requirement=ProofRequirement.load(str(tmp_path / "none.key"), None),
        )


def test_cli_require_proofs_refuses_flags_and_reports_the_dropped_rollouts(tmp_path: Path):
    key = tmp_path / "trust.key"
    rows = attested(rollouts({"t0": [1.0, 0.0, 0.0, 1.0]}), [True] * 4, key)
    for row, flag in zip(rows[2:], [True, "true"]):  # a flag with no attestation, as a bool and as text
        row.pop("attestation")
        row["toploc_valid"] = flag
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    done = filter_cli(
        str(inputs), "-o", str(tmp_path / "kept.jsonl"), "--require-proofs", "--trust-key", str(key)
    )
    assert done.returncode == 0, done.stderr
    assert "2 rollouts not proven dropped" in done.stderr and "has no attestation" in done.stderr
    assert read_jsonl(tmp_path / "kept.jsonl")[0]["pass_rate"] == 0.5


def test_the_same_rollouts_in_two_inputs_count_once(tmp_path: Path):
    rows = rollouts()
    first = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    shaped = write_jsonl(tmp_path / "shaped.jsonl", rows[:20])  # the same rollouts, read a second time
    no_ids = [{**row, "response_id": None} for row in rows[:3]]  # rows without an id all count
    bare = write_jsonl(tmp_path / "bare.jsonl", no_ids)
    summary = filter_tasks(
        [str(first), str(shaped), str(bare)], tmp_path / "kept.jsonl", PassRateFilter(0.0, 1.0)
    )
    assert summary.repeats == 20
    kept = {row["problem_id"]: row for row in read_jsonl(tmp_path / "kept.jsonl")}
    assert kept["t1"]["n_samples"] == 10 and kept["t1"]["pass_rate"] == pytest.approx(0.1)
    assert kept["t0"]["n_samples"] == 13  # its 10 rollouts, and the 3 without an id
    done = filter_cli(str(first), str(shaped), "-o", str(tmp_path / "again.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "20 rollouts appear more than once" in done.stderr


def test_an_empty_result_is_said_loudly_with_the_pass_rates(tmp_path: Path):
    inputs = write_jsonl(tmp_path / "rollouts.jsonl", rollouts())
    output = tmp_path / "kept.jsonl"
    done = filter_cli(str(inputs), "-o", str(output), "--min-pass-rate", "0.6", "--max-pass-rate", "0.8")
    assert done.returncode == 0, done.stderr
    assert output.read_text() == ""
    assert "warning: no task has a pass rate in [0.6, 0.8]" in done.stderr
    bars = [line.split() for line in done.stderr.splitlines() if line.strip().startswith("[")]
    counts = [int(words[-1]) for words in bars]
    assert counts == [1, 1, 0, 1, 0, 1, 0, 0, 0, 2]  # 0.0, 0.1, 0.3, 0.5, then 0.9 and 1.0; t6 unscored
