"""The one task preparation of `genesys generate` and `genesys train` (`genesys.tasks.prepare`)."""

from __future__ import annotations

import json

import pytest
from conftest import write_jsonl

from genesys.config import RewardConfig, VerifyConfig
from genesys.data.identity import task_key
from genesys.errors import InputError
from genesys.tasks.prepare import prepare_tasks, select_tasks


def task(problem_id: str, prompt: str = "say yes", **fields: object) -> dict[str, object]:
    return {
        "problem_id": problem_id,
        "task_type": "echo",
        "prompt": prompt,
        "verification_info": json.dumps({"expected": "yes"}),
        **fields,
    }


def test_rows_are_checked_parsed_and_keyed_in_order():
    selected = [("a.jsonl", 0, task("p0")), ("a.jsonl", 1, task("p1", metadata='{"level": 3}'))]
    prepared = prepare_tasks(selected)
    assert [t.row["problem_id"] for t in prepared.tasks] == ["p0", "p1"]
    assert prepared.tasks[1].row["verification_info"] == {"expected": "yes"}  # parsed from JSON
    assert prepared.tasks[1].row["metadata"] == {"level": 3}
    assert [t.key for t in prepared.tasks] == [task_key(row) for _, _, row in selected]
    assert (prepared.tasks[1].spec, prepared.tasks[1].index) == ("a.jsonl", 1)


def test_repeats_are_dropped_and_counted_only_when_asked():
    selected = [("a", 0, task("p")), ("b", 0, task("p")), ("a", 1, task("q"))]
    assert len(prepare_tasks(selected).tasks) == 3  # training keeps each draw of the mix
    deduped = prepare_tasks(selected, dedupe=True)
    assert [(t.spec, t.row["problem_id"]) for t in deduped.tasks] == [("a", "p"), ("a", "q")]
    assert deduped.duplicates == 1


def test_errors_name_the_task():
    with pytest.raises(InputError, match=r"task 4 of 'x.jsonl': field 'prompt' is missing or empty"):
        prepare_tasks([("x.jsonl", 4, task("p", prompt=""))])
    with pytest.raises(InputError, match=r"task 2 of 'x.jsonl': .*verification_info"):
        prepare_tasks([("x.jsonl", 2, task("p", verification_info="{not json"))])


def test_a_reward_the_tasks_cannot_be_given_is_refused_by_task():
    with pytest.raises(InputError, match=r"task 0 of 'x': reward \(.*exact.*\): .*target"):
        prepare_tasks([("x", 0, task("p"))], reward=RewardConfig("exact"))
    assert prepare_tasks([("x", 0, task("p", target_length=8))], reward=RewardConfig("exact")).tasks


def test_task_types_no_verifier_serves_are_refused_unless_skipped(plugin_env):
    selected = [("x", 0, task("p")), ("x", 1, task("q", task_type="no_such_type"))]
    with pytest.raises(InputError, match="no_such_type"):
        prepare_tasks(selected, verify=VerifyConfig(progress=False))
    kept = prepare_tasks(selected, verify=VerifyConfig(progress=False, skip_unknown=True))
    assert len(kept.tasks) == 2


def test_select_tasks_loads_and_mixes_the_sources(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [task(f"a{i}") for i in range(4)])
    second = write_jsonl(tmp_path / "b.jsonl", [task(f"b{i}") for i in range(4)])
    selected = select_tasks([str(first), str(second)], mix=[3, 1], max_tasks=4, seed=1)
    assert sorted(row["problem_id"][0] for _, _, row in selected) == ["a", "a", "a", "b"]
    assert select_tasks([str(first), str(second)], mix=[3, 1], max_tasks=4, seed=1) == selected
