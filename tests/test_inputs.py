"""One input resolver: every reader (rows, frames, task sources) sees the same files and refuses the same inputs alike."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import write_jsonl

from genesys.analysis.filtering import filter_tasks
from genesys.analysis.report import write_report
from genesys.data.frames import scan_rollouts
from genesys.data.inputs import InputFile, resolve_inputs
from genesys.data.io import iter_rows
from genesys.errors import InputError
from genesys.tasks.sources import load_source
from genesys.verification.api import verify_files


def _saved_dataset_dict(path: Path) -> Path:
    from datasets import Dataset, DatasetDict

    split = Dataset.from_list([{"problem_id": "a", "task_type": "echo", "prompt": "p", "score": 1.0}])
    DatasetDict({"train": split, "test": split}).save_to_disk(str(path))
    return path


def _bad_input(tmp_path: Path, case: str) -> str:
    """An input argument every reader must refuse."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.csv").write_text("a,b\n")
    if case == "dataset dict":
        return str(_saved_dataset_dict(tmp_path / "dd"))
    return str(
        tmp_path
        / {
            "missing": "nope.jsonl",
            "glob": "*.parquet",
            "unsupported": "notes.csv",
            "empty directory": "empty",
        }[case]
    )


def _error(call) -> str:
    with pytest.raises(InputError) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "does not exist"),
        ("glob", "matches no file"),
        ("unsupported", "unsupported file type"),
        ("empty directory", "holds no .parquet or .jsonl files"),
        ("dataset dict", "is a DatasetDict; name one split's directory: "),
    ],
)
def test_every_reader_refuses_a_bad_input_with_the_same_words(tmp_path: Path, case: str, expected: str):
    argument = _bad_input(tmp_path, case)
    messages = {
        "rows": _error(lambda: list(iter_rows(resolve_inputs([argument])))),
        "verify": _error(lambda: verify_files([argument], tmp_path / "out.jsonl", verifiers={})),
        "filter": _error(lambda: filter_tasks([argument], tmp_path / "kept.jsonl")),
        "report": _error(lambda: write_report([argument], tmp_path / "report")),
    }
    if case != "missing":  # a spec naming no file may still name a task set
        messages["tasks"] = _error(lambda: load_source(argument))
    assert len(set(messages.values())) == 1, messages
    assert expected in messages["rows"]
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "kept.jsonl").exists()


def test_a_dataset_dict_names_its_splits_and_a_split_reads(tmp_path: Path):
    saved = _saved_dataset_dict(tmp_path / "dd")
    message = _error(lambda: resolve_inputs([str(saved)]))
    assert str(saved / "train") in message and str(saved / "test") in message
    assert resolve_inputs([str(saved / "train")]) == [InputFile(saved / "train", "hf_dataset")]
    assert scan_rollouts(resolve_inputs([str(saved / "test")])).collect()["prompt"].to_list() == ["p"]


def test_directories_and_globs_resolve_to_the_same_files_for_rows_and_frames(tmp_path: Path):
    from datasets import Dataset

    shards = tmp_path / "shards"
    (shards / "nested").mkdir(parents=True)
    write_jsonl(shards / "b.jsonl", [{"problem_id": "b", "score": 0.0}])
    pl.DataFrame([{"problem_id": "a", "score": 1.0}]).write_parquet(shards / "a.parquet")
    write_jsonl(shards / "nested" / "c.jsonl", [{"problem_id": "c", "score": 0.5}])
    Dataset.from_list([{"problem_id": "d", "score": 0.0}]).save_to_disk(
        str(shards / "saved")
    )  # its .json files are not data
    (shards / "README.md").write_text("not data")
    files = resolve_inputs([str(shards), str(tmp_path / "shards" / "*.jsonl")])
    assert [(f.path.relative_to(shards).as_posix(), f.format) for f in files] == [
        ("a.parquet", "parquet"),
        ("b.jsonl", "jsonl"),
        ("nested/c.jsonl", "jsonl"),
        ("saved", "hf_dataset"),
        ("b.jsonl", "jsonl"),
    ]
    rows = [record.row["problem_id"] for record in iter_rows(files)]
    assert rows == scan_rollouts(files).collect()["problem_id"].to_list() == ["a", "b", "c", "d", "b"]


def test_task_sources_take_globs(tmp_path: Path):
    for name in ("x", "y"):
        write_jsonl(tmp_path / f"{name}.jsonl", [{"task_type": "echo", "prompt": name}])
    assert [row["prompt"] for row in load_source(str(tmp_path / "*.jsonl")).rows] == ["x", "y"]
    assert "matches no file" in _error(lambda: load_source(str(tmp_path / "*.parquet")))
