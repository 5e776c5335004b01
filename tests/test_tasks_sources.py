"""Task sources: files, saved datasets, hub loading, plugin task sets, mixing, Countdown generation."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import genesys
from genesys.errors import InputError
from genesys.tasks import task_sets
from genesys.tasks.mix import mix_tasks
from genesys.tasks.sources import TaskSource, load_source, parse_spec


def _task(i: int, source: str = "local") -> dict:
    return {
        "problem_id": f"{source}-{i}",
        "source": source,
        "task_type": "verifiable_math",
        "prompt": f"What is {i} + {i}?",
        "verification_info": json.dumps({"ground_truth": str(2 * i)}),
        "metadata": {},
    }


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parse_spec_reads_typed_options():
    assert parse_spec("countdown:count=5,seed=2,name=x") == (
        "countdown",
        {"count": 5, "seed": 2, "name": "x"},
    )
    assert parse_spec("math-samples") == ("math-samples", {})
    with pytest.raises(InputError, match="key=value"):
        parse_spec("countdown:count")


def test_local_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_task(i) for i in range(5)]
    jsonl = load_source(str(_write_jsonl(tmp_path / "t.jsonl", rows)))
    assert [r["problem_id"] for r in jsonl.rows] == [f"local-{i}" for i in range(5)]
    pq.write_table(pa.Table.from_pylist([{**r, "metadata": "{}"} for r in rows]), tmp_path / "t.parquet")
    parquet = load_source(str(tmp_path / "t.parquet"))
    assert len(parquet) == 5 and parquet.rows[3]["prompt"] == "What is 3 + 3?"


def test_unreadable_row_names_its_location(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_task(0)) + "\n{not json\n")
    with pytest.raises(InputError, match=r"bad\.jsonl:2"):
        load_source(str(path))


def test_dataset_saved_to_disk(tmp_path):
    import datasets

    datasets.Dataset.from_list([{**_task(i), "metadata": "{}"} for i in range(4)]).save_to_disk(
        str(tmp_path / "saved")
    )
    source = load_source(str(tmp_path / "saved"))
    assert sorted(r["problem_id"] for r in source.rows) == [f"local-{i}" for i in range(4)]


def test_hub_spec_goes_through_load_dataset(tmp_path):
    data_dir = tmp_path / "hub-like"
    data_dir.mkdir()
    _write_jsonl(data_dir / "train.jsonl", [_task(i) for i in range(3)])
    _write_jsonl(data_dir / "test.jsonl", [_task(i, "held-out") for i in range(2)])
    train = load_source(f"hf:{data_dir}")
    assert len(train) == 3 and train.rows[0]["source"] == "local"
    test = load_source(f"hf:{data_dir}:split=test")
    assert [r["source"] for r in test.rows] == ["held-out", "held-out"]
    with pytest.raises(InputError, match="cannot load dataset"):
        load_source(f"hf:{tmp_path / 'missing-dataset'}")


def test_builtin_task_sets_are_valid_genesys_tasks():
    for name, task_type in (("math-samples", "verifiable_math"), ("code-samples", "verifiable_code")):
        rows = load_source(name).rows
        assert len(rows) >= 10
        for row in rows:
            task = genesys.Task.from_row(row)
            assert task.task_type == task_type and task.prompt and task.verification_info
    code = load_source("code-samples").rows
    assert all(
        case["type"] in ("stdin_stdout", "function_call")
        for r in code
        for case in r["verification_info"]["test_cases"]
    )


def test_unknown_spec_lists_what_exists():
    with pytest.raises(InputError, match="math-samples"):
        load_source("no-such-tasks")
    with pytest.raises(InputError, match="bad options"):
        load_source("countdown:colour=red")


def test_countdown_generator_is_registered_and_solvable():
    from genesys_countdown import Countdown

    assert "countdown" in task_sets()
    rows = load_source("countdown:count=50,numbers=3,max_number=20,seed=7").rows
    assert len(rows) == 50 and rows == load_source("countdown:count=50,numbers=3,max_number=20,seed=7").rows
    assert rows != load_source("countdown:count=50,numbers=3,max_number=20,seed=8").rows
    verifier = Countdown()
    for row in rows:
        assert len(row["verification_info"]["numbers"]) == 3
        assert all(1 <= n <= 20 for n in row["verification_info"]["numbers"])
        gold = genesys.Rollout.from_row({**row, "llm_response": row["gold_standard_solution"]})
        assert verifier.verify(gold).score == 1.0


def _sources(*sizes: int) -> list[TaskSource]:
    return [TaskSource(f"s{k}", [_task(i, f"s{k}") for i in range(size)]) for k, size in enumerate(sizes)]


def test_mix_by_ratios_is_seeded_and_proportional():
    picked = mix_tasks(_sources(100, 100), ratios=[3, 1], max_tasks=40, seed=1)
    counts = Counter(spec for spec, _, _ in picked)
    assert counts == {"s0": 30, "s1": 10}
    assert len({(spec, i) for spec, i, _ in picked}) == 40  # no task twice
    assert picked == mix_tasks(_sources(100, 100), ratios=[3, 1], max_tasks=40, seed=1)
    assert picked != mix_tasks(_sources(100, 100), ratios=[3, 1], max_tasks=40, seed=2)
    order = [spec for spec, _, _ in picked]
    assert order != sorted(order)  # shuffled together, not source after source


def test_mix_without_max_tasks_uses_what_the_smallest_source_allows():
    counts = Counter(spec for spec, _, _ in mix_tasks(_sources(10, 100), ratios=[1, 1], seed=0))
    assert counts == {"s0": 10, "s1": 10}


def test_mix_errors_name_the_problem():
    with pytest.raises(InputError, match="2 ratios for 3"):
        mix_tasks(_sources(5, 5, 5), ratios=[1, 1])
    with pytest.raises(InputError, match="holds only 5"):
        mix_tasks(_sources(5, 50), ratios=[1, 1], max_tasks=20)
    with pytest.raises(InputError, match="> 0"):
        mix_tasks(_sources(5, 5), ratios=[1, 0])


def test_without_ratios_one_source_keeps_order_and_several_are_shuffled():
    single = mix_tasks(_sources(20), max_tasks=5)
    assert [i for _, i, _ in single] == [0, 1, 2, 3, 4]
    both = mix_tasks(_sources(20, 20), seed=3)
    assert len(both) == 40 and [s for s, _, _ in both] != ["s0"] * 20 + ["s1"] * 20


def test_tasks_command_lists_the_task_sets():
    import subprocess
    import sys

    result = subprocess.run(
        [str(Path(sys.executable).with_name("genesys")), "tasks"],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": ""},
    )
    assert result.returncode == 0, result.stderr
    for name in ("math-samples", "code-samples", "countdown"):
        assert name in result.stdout
