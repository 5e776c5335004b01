"""Task identity: stable task keys and response ids, and the filter's grouping in Python and polars alike."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from conftest import write_jsonl

from genesys.analysis.filtering import task_pass_rates
from genesys.data.frames import scan_rollouts
from genesys.data.identity import derive_response_id, group_key, group_key_columns, response_id, task_key
from genesys.data.inputs import resolve_inputs
from genesys.errors import InputError

TASK = {
    "problem_id": "p-7",
    "source": "numina",
    "task_type": "verifiable_math",
    "prompt": "What is 1/2 + 1/3? \u00e9",
    "verification_info": {"ground_truth": "5/6", "b": [1, {"z": 1, "a": 2}]},
    "llm_response": "\\boxed{5/6}",
}


def test_keys_already_written_in_outputs_never_change():
    # Values written by earlier versions: generate resumes by `<task key>-<sample>`, verify by derived ids.
    assert task_key(TASK) == "4e2b37a1c3ba0b410c80"
    assert response_id(task_key(TASK), 3) == "4e2b37a1c3ba0b410c80-3"
    assert derive_response_id(TASK) == "derived-499b3d83c656970253827822"
    assert task_key({"prompt": "q", "task_type": "t"}) == "7d34c230773c5d355b4f"
    assert derive_response_id({"prompt": "q", "task_type": "t"}) == "derived-4abe79c00481d5696cd3a16e"


def test_task_key_follows_what_defines_the_task():
    reordered = {**TASK, "verification_info": {"b": [1, {"a": 2, "z": 1}], "ground_truth": "5/6"}}
    assert task_key(reordered) == task_key(TASK)
    assert task_key({**TASK, "llm_response": "other", "metadata": {"x": 1}}) == task_key(TASK)
    for name, value in [
        ("source", "other"),
        ("problem_id", "p-8"),
        ("task_type", "x"),
        ("prompt", "p"),
        ("verification_info", {}),
    ]:
        assert task_key({**TASK, name: value}) != task_key(TASK), name


def test_group_key_is_the_problem_id_else_the_prompt():
    assert group_key({"problem_id": 7, "prompt": "q"}) == ("7", None)
    assert group_key({"problem_id": None, "prompt": "q"}) == (None, "q") == group_key({"prompt": "q"})
    assert group_key({"problem_id": "q"}) != group_key({"prompt": "q"})
    with pytest.raises(InputError, match="neither 'problem_id' nor 'prompt'"):
        group_key({"score": 1.0})


ROWS = [
    {"problem_id": "a", "prompt": "first", "score": 1.0},
    {"problem_id": None, "prompt": "first", "score": 0.0},
    {"problem_id": "a", "prompt": "changed wording", "score": 0.0},
    {"problem_id": 12, "prompt": None, "score": None},
    {"problem_id": None, "prompt": "a", "score": 0.5},
    {"problem_id": None, "prompt": "first", "score": 1.0},
]


@pytest.mark.parametrize("file_format", ["jsonl", "parquet"])
def test_polars_group_key_agrees_with_the_python_one(tmp_path: Path, file_format: str):
    path = tmp_path / f"rows.{file_format}"
    if file_format == "jsonl":
        write_jsonl(path, ROWS)
    else:  # one type per parquet column
        pl.DataFrame(
            [
                {**row, "problem_id": None if row["problem_id"] is None else str(row["problem_id"])}
                for row in ROWS
            ]
        ).write_parquet(path)
    frame = scan_rollouts(resolve_inputs([str(path)]))
    in_polars = frame.select(group_key_columns(frame.collect_schema().names())).collect().rows()
    assert in_polars == [group_key(row) for row in ROWS]


def test_polars_group_key_without_a_problem_id_column(tmp_path: Path):
    rows = [{"prompt": p} for p in ("x", "y", "x")]
    frame = scan_rollouts(resolve_inputs([str(write_jsonl(tmp_path / "rows.jsonl", rows))]))
    assert frame.select(group_key_columns(["prompt"])).collect().rows() == [group_key(row) for row in rows]
    with pytest.raises(InputError, match="neither 'problem_id' nor 'prompt'"):
        group_key_columns(["score"])


def test_pass_rates_group_as_group_key_does(tmp_path: Path):
    frame = scan_rollouts(resolve_inputs([str(write_jsonl(tmp_path / "rows.jsonl", ROWS))]))
    tasks = task_pass_rates(frame).collect()
    sizes = Counter(group_key(row) for row in ROWS)
    assert tasks.height == len(sizes)
    assert [n + e for n, e in zip(tasks["n_samples"], tasks["n_errors"])] == list(sizes.values())
    assert tasks["prompt"][0] == "first"  # a task keeps its first row's columns
