"""Schema parsing of GENESYS rows and the rollout reader/writer."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from genesys.data.identity import derive_response_id
from genesys.data.inputs import resolve_inputs
from genesys.data.io import BufferedWriter, RolloutWriter, iter_rows
from genesys.errors import InputError
from genesys.schema import Rollout, SchemaError, Task, Verdict

GENESYS_ROW = {
    "problem_id": "SYNTHETIC-1-math-00042",
    "source": "numina_math",
    "task_type": "verifiable_math",
    "in_source_id": "cn_k12_123",
    "prompt": "What is 1/2 + 1/3?",
    "gold_standard_solution": "5/6",
    "verification_info": '{"ground_truth": "\\\\frac{5}{6}"}',
    "metadata": '{"difficulty": 2}',
    "llm_response": "<think>...</think> The answer is \\boxed{\\frac{5}{6}}",
    "response_id": "vfm_1",
    "model_name": "some/model",
    "generation_config": '{"temperature": 0.7}',
    "machine_info": "{}",
    "extra_col": [1, 2],
}


def test_genesys_rows_read_without_conversion():
    rollout = Rollout.from_row(GENESYS_ROW)
    assert rollout.verification_info == {"ground_truth": "\\frac{5}{6}"}
    assert rollout.metadata == {"difficulty": 2}
    assert rollout.completion.endswith("\\boxed{\\frac{5}{6}}")
    assert rollout.generation_config == {"temperature": 0.7}
    assert rollout.extra == {"extra_col": [1, 2]}
    task = Task.from_row({**GENESYS_ROW, "verification_info": {"ground_truth": "1"}})
    assert (
        task.verification_info == {"ground_truth": "1"}
        and task.to_row()["problem_id"] == "SYNTHETIC-1-math-00042"
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"verification_info": "{oops"}, "verification_info"),
        ({"metadata": "[1]"}, "metadata"),
        ({"task_type": None}, "task_type"),
    ],
)
def test_schema_errors_name_the_field(change, field):
    with pytest.raises(SchemaError, match=field):
        Rollout.from_row({**GENESYS_ROW, **change})


def test_verdict_scores_are_bounded():
    assert Verdict(score=1).score == 1.0
    assert Verdict.failed("timeout: x").score is None
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError):
            Verdict(score=bad)


def test_derived_ids_are_stable_and_content_based():
    assert derive_response_id(GENESYS_ROW) == derive_response_id(dict(GENESYS_ROW))
    assert derive_response_id(GENESYS_ROW) != derive_response_id({**GENESYS_ROW, "llm_response": "other"})


def test_jsonl_writer_cuts_a_torn_last_line_and_reports_keys(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"response_id": "a"}\n{"response_id": "b"}\n{"response_id": "c", "sco')
    writer = RolloutWriter(path)
    assert writer.existing_keys() == {"a", "b"}
    writer.write([{"response_id": "c"}])
    assert [json.loads(line)["response_id"] for line in path.read_text().splitlines()] == ["a", "b", "c"]


def test_parquet_shards_keep_types_stable_and_dicts_as_json(tmp_path: Path):
    writer = RolloutWriter(tmp_path / "shards")
    writer.write(
        [
            {
                "response_id": "a",
                "score": None,
                "error": None,
                "verification_result_info": {"k": 1},
                "completion_ids": [1, 2],
            }
        ]
    )
    writer.write(
        [
            {
                "response_id": "b",
                "score": 1.0,
                "error": "x",
                "verification_result_info": {},
                "completion_ids": None,
            }
        ]
    )
    shards = sorted((tmp_path / "shards").glob("*.parquet"))
    assert len(shards) == 2
    schemas = {str(pq.read_schema(s)) for s in shards}
    assert len(schemas) == 1  # same types in every shard, so readers can concatenate them
    assert writer.existing_keys() == {"a", "b"}
    first = pq.read_table(shards[0]).to_pylist()[0]
    assert json.loads(first["verification_result_info"]) == {"k": 1}


def test_reading_parquet_dirs_and_saved_datasets_with_locations(tmp_path: Path):
    from datasets import Dataset

    Dataset.from_list(
        [{"task_type": "echo", "prompt": "a"}, {"task_type": "echo", "prompt": "b"}]
    ).save_to_disk(str(tmp_path / "saved"))
    records = list(iter_rows(resolve_inputs([str(tmp_path / "saved")])))
    assert [r.row["prompt"] for r in records] == ["a", "b"]
    assert records[1].location.endswith("saved#1")


def test_unsupported_and_missing_inputs_are_input_errors(tmp_path: Path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(InputError, match="unsupported"):
        resolve_inputs([str(tmp_path / "x.csv")])
    with pytest.raises(InputError, match="matches no file"):
        resolve_inputs([str(tmp_path / "*.jsonl")])


def test_a_crash_during_the_parquet_merge_clean_up_does_not_duplicate_rows(tmp_path: Path):
    writer = RolloutWriter(tmp_path / "out.parquet")
    writer.write([{"response_id": "a"}, {"response_id": "b"}])
    parts = tmp_path / "out.parquet.parts"
    kept_part = next(parts.glob("*.parquet")).read_bytes()
    writer.close()
    parts.mkdir()  # as if the process died after replacing the file, before removing its parts
    (parts / "part-1.parquet").write_bytes(kept_part)
    again = RolloutWriter(tmp_path / "out.parquet")
    assert again.existing_keys() == {"a", "b"}
    again.write([{"response_id": "c"}])
    again.close()
    assert sorted(pq.read_table(tmp_path / "out.parquet").column("response_id").to_pylist()) == [
        "a",
        "b",
        "c",
    ]


def test_mixed_and_null_columns_keep_values_and_merge(tmp_path: Path):
    writer = RolloutWriter(tmp_path / "out.parquet")
    writer.write(
        [
            {"response_id": "a", "in_source_id": 17, "rating": 3},
            {"response_id": "b", "in_source_id": "abc", "rating": 4},
        ]
    )
    writer.write([{"response_id": "c", "in_source_id": None, "rating": None}])
    writer.close()
    rows = {r["response_id"]: r for r in pq.read_table(tmp_path / "out.parquet").to_pylist()}
    assert rows["a"]["in_source_id"] == "17" and rows["b"]["in_source_id"] == "abc"  # strings stay unquoted
    assert rows["a"]["rating"] == 3 and rows["c"]["rating"] is None


def test_a_broken_line_in_a_jsonl_output_is_named_on_resume(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"response_id": "a"}\nnot json\n{"response_id": "b"}\n')
    with pytest.raises(InputError, match=r"out.jsonl:2"):
        RolloutWriter(path).existing_keys()


def test_buffered_writer_writes_units_by_size_and_age_and_the_rest_on_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import genesys.data.io

    now = [100.0]
    monkeypatch.setattr(genesys.data.io.time, "monotonic", lambda: now[0])
    shards = tmp_path / "shards"  # one parquet shard per unit written

    def units() -> list[list[str]]:
        return [pq.read_table(p).column("response_id").to_pylist() for p in sorted(shards.glob("*.parquet"))]

    with pytest.raises(KeyboardInterrupt):
        with BufferedWriter(RolloutWriter(shards), max_rows=3, max_seconds=2.0) as out:
            out.add([{"response_id": "a"}, {"response_id": "b"}])
            assert units() == []
            out.add([{"response_id": "c"}, {"response_id": "d"}])
            assert units() == [["a", "b", "c", "d"]]
            now[0] += 1.0
            out.add([{"response_id": "e"}])
            assert len(units()) == 1  # neither full nor old
            now[0] += 1.5
            out.add([])
            assert units()[1:] == [["e"]]  # 2.5 s since the last write
            now[0] += 10.0
            out.add([])
            assert len(units()) == 2  # nothing gathered, nothing written
            out.add([{"response_id": "f"}])
            assert units()[2:] == [["f"]]  # the first row after a long pause goes out at once
            out.add([{"response_id": "g"}])
            assert len(units()) == 3
            raise KeyboardInterrupt
    assert units()[3:] == [["g"]]  # what was handed over is written on the way out
