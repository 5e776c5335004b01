"""The `arithmetic` task set: exact gold answers, worked solutions the math verifier accepts, and
held-out problems that no training set contains, whatever the seeds and counts."""

from __future__ import annotations

import pytest

from genesys.config import VerifyConfig
from genesys.errors import InputError
from genesys.tasks.arithmetic import arithmetic_tasks, evaluate, split_of, worked_solution
from genesys.tasks.sources import load_source
from genesys.verification.api import verify_rollouts


def _problem(row: dict) -> tuple[int, str, int]:
    text = row["in_source_id"]
    for op in "+-*":
        left, sep, right = text[1:].partition(op)
        if sep:
            return int(text[0] + left), op, int(right)
    raise AssertionError(text)


def test_gold_answers_are_the_exact_results():
    rows = arithmetic_tasks(digits=3, ops="+-*", count=300, seed=4)
    for row in rows:
        a, op, b = _problem(row)
        assert row["prompt"].endswith(f"Compute {a} {op} {b}.")
        assert len(str(a)) == len(str(b)) == 3
        assert row["verification_info"]["ground_truth"] == str({"+": a + b, "-": a - b, "*": a * b}[op])
        assert row["task_type"] == "verifiable_math"
    assert {_problem(row)[1] for row in rows} == set("+-*")
    assert any(int(row["verification_info"]["ground_truth"]) < 0 for row in rows)


def test_worked_solutions_derive_the_answer_digit_by_digit():
    assert worked_solution(47, "+", 38) == "7+8+0=15\n4+3+1=8\n47+38=85\n\\boxed{85}"
    assert worked_solution(23, "-", 58) == "23-58=-(58-23)\n8-3-0=5\n5-2-0=3\n23-58=-35\n\\boxed{-35}"
    assert worked_solution(86, "-", 58) == "16-8-0=8\n8-5-1=2\n86-58=28\n\\boxed{28}"
    assert worked_solution(12, "*", 34).splitlines()[:3] == ["12*4=48", "12*30=360", "48+360=408"]


def test_the_math_verifier_scores_every_worked_solution_right_and_a_wrong_answer_wrong():
    rows = arithmetic_tasks(digits=2, ops="+-*", count=60, seed=1)
    rollouts = [{**row, "llm_response": row["gold_standard_solution"]} for row in rows]
    wrong = [
        {**row, "llm_response": f"\\boxed{{{int(row['verification_info']['ground_truth']) + 1}}}"}
        for row in rows
    ]
    verified = verify_rollouts(rollouts + wrong, config=VerifyConfig(workers=1, progress=False))
    assert [row["score"] for row in verified] == [1.0] * len(rows) + [0.0] * len(rows)


def test_held_out_problems_are_never_in_a_training_set():
    heldout = {row["problem_id"] for row in arithmetic_tasks(count=400, split="heldout", seed=0)}
    assert len(heldout) == 400
    for seed in range(4):
        train = {row["problem_id"] for row in arithmetic_tasks(count=3000, split="train", seed=seed)}
        assert not heldout & train
    # The split is a property of the problem: every problem of a split says so.
    assert all(split_of(*_problem(row)) == "heldout" for row in arithmetic_tasks(count=50, split="heldout"))
    # About one problem in ten is held out.
    every = [split_of(a, "+", b) for a in range(100) for b in range(100)]
    assert 0.07 < every.count("heldout") / len(every) < 0.13


def test_the_same_arguments_give_the_same_tasks_and_the_seed_changes_them():
    assert arithmetic_tasks(count=20, seed=5) == arithmetic_tasks(count=20, seed=5)
    assert arithmetic_tasks(count=20, seed=5) != arithmetic_tasks(count=20, seed=6)
    assert len({row["problem_id"] for row in arithmetic_tasks(count=2000)}) == 2000


def test_the_task_set_is_offered_by_name_and_bad_options_are_named():
    source = load_source("arithmetic:digits=2,ops=+,count=10,seed=2,split=heldout")
    assert len(source) == 10 and all(row["metadata"]["split"] == "heldout" for row in source.rows)
    with pytest.raises(InputError, match="ops must be made of"):
        load_source("arithmetic:ops=/")
    with pytest.raises(InputError, match="too many distinct heldout problems"):
        load_source("arithmetic:digits=1,count=500,split=heldout")
    with pytest.raises(InputError, match="split must be one of"):
        load_source("arithmetic:split=test")
    with pytest.raises(ValueError, match="unknown operator"):
        evaluate(1, "/", 2)
