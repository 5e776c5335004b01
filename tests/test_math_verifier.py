"""The verifiable_math plugin: registration, the engine, the CLI, the TRL adapter, the labeled set."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GENESYS, REPO, write_jsonl

from genesys.config import VerifyConfig
from genesys.plugins import verifier_entries
from genesys.verification.api import verify_rollouts
from genesys.verifiers.math import MathVerifier, math_verify_reward
from genesys.verifiers.math_grade import grade

LABELED = REPO / "benchmarks" / "data" / "math_labeled.jsonl"


def math_row(gold: str, completion: str, response_id: str) -> dict:
    return {
        "problem_id": f"p-{gold}",
        "source": "tests",
        "task_type": "verifiable_math",
        "prompt": "Compute.",
        "verification_info": json.dumps({"ground_truth": gold}),
        "metadata": "{}",
        "llm_response": completion,
        "response_id": response_id,
    }


def test_registered_through_the_entry_point() -> None:
    assert verifier_entries()["verifiable_math"].cls is MathVerifier


def test_loading_the_plugin_does_not_import_sympy() -> None:
    code = "import sys, genesys.verifiers.math; print('sympy' in sys.modules, 'math_verify' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_missing_ground_truth_is_an_error() -> None:
    from genesys.schema import Rollout

    verifier = MathVerifier()
    verifier.setup()
    verdict = verifier.verify(
        Rollout.from_row({**math_row("5", r"\boxed{5}", "r"), "verification_info": "{}"})
    )
    assert verdict.score is None and verdict.error.startswith("invalid_ground_truth")


def test_a_pathological_row_costs_at_most_the_timeout_and_the_run_goes_on() -> None:
    # Within the parse guards, yet slow for the LaTeX grammar (seconds): many differently nested groups.
    slow = r"\boxed{" + "+".join(_nested(random.Random(seed)) for seed in range(12)) + "}"
    rows = [
        math_row("5", r"So $\boxed{5}$.", "a"),
        math_row("5", slow, "slow"),
        math_row(r"\frac{1}{2}", r"$\boxed{0.5}$", "b"),
    ]
    started = time.perf_counter()
    out = verify_rollouts(rows, config=VerifyConfig(workers=1, timeout=0.5, progress=False))
    elapsed = time.perf_counter() - started
    assert [r["score"] for r in out] == [1.0, None, 1.0]
    assert out[1]["error"].startswith("timeout")
    assert elapsed < 30  # one timeout and a worker restart, not the slow parse itself


def _nested(rnd: random.Random, depth: int = 10) -> str:
    text = "x"
    for _ in range(depth):
        text = rnd.choice(["({}+1)", "[{}-1]", "{{{}}}"]).format(text)
    return text


def test_genesys_verify_cli_scores_math_rollouts(tmp_path: Path) -> None:
    rows = [
        math_row("42", "We count 42 pairs.\n\n$\\boxed{42}$", "r1"),
        math_row("42", "I think \\boxed{41} or \\boxed{42}", "r2"),
        math_row("(1, 2]", "$x \\in \\boxed{(1,2]}$", "r3"),
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    subprocess.run(
        [GENESYS, "verify", str(source), "-o", str(out), "--no-progress", "--workers", "1"],
        check=True,
        cwd=REPO,
    )
    verified = {r["response_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert verified["r1"]["score"] == 1.0
    assert verified["r2"]["score"] == 0.0
    info = verified["r2"]["verification_result_info"]
    info = json.loads(info) if isinstance(info, str) else info
    assert info["reason"] == "hedging"
    assert verified["r3"]["score"] == 1.0


def test_trl_reward_adapter_takes_strings_and_chat_messages() -> None:
    completions = [r"\boxed{5}", [{"role": "assistant", "content": r"\boxed{6}"}], "no answer here"]
    assert math_verify_reward(["p"] * 3, completions, ground_truth=["5", "6", "7"]) == [1.0, 1.0, 0.0]
    assert math_verify_reward(["p"], [r"\boxed{5}"], solution=["$5$"]) == [1.0]
    info = [json.dumps({"ground_truth": "5"})]
    assert math_verify_reward(["p"], [r"\boxed{5}"], verification_info=info) == [1.0]


def test_trl_reward_adapter_reports_unusable_golds_and_bad_calls() -> None:
    assert math_verify_reward(["p"], [r"\boxed{5}"], ground_truth=[""]) == [None]
    with pytest.raises(TypeError, match="gold column"):
        math_verify_reward(["p"], [r"\boxed{5}"])
    with pytest.raises(ValueError, match="2 completions but 1 golds"):
        math_verify_reward(["p", "q"], ["a", "b"], ground_truth=["5"])


@pytest.mark.parametrize("answer_format", ["boxed", "lenient"])
def test_labeled_set_has_no_false_positives(answer_format: str) -> None:
    rows = [json.loads(line) for line in LABELED.read_text().splitlines() if line.strip()]
    assert len(rows) >= 150 and sum(not r["expected"] for r in rows) >= 40
    accepted = {r["id"]: grade(r["gold"], r["completion"], answer_format).score == 1.0 for r in rows}
    false_positives = [r["id"] for r in rows if accepted[r["id"]] and not r["expected"]]
    false_negatives = [r["id"] for r in rows if r["expected"] and not accepted[r["id"]]]
    assert false_positives == []
    if answer_format == "lenient":
        assert len(false_negatives) <= 2, false_negatives


def _policy_row(completion: str, response_id: str, **info: str) -> dict:
    return {
        **math_row("5", completion, response_id),
        "verification_info": json.dumps({"ground_truth": "5", **info}),
    }


def test_the_default_policy_pays_nothing_for_noise_and_rows_or_options_choose_lenient() -> None:
    noise = ["blah is 5 blah", "Numbers: 3, 9, 5"]
    rows = [_policy_row(text, f"n{i}") for i, text in enumerate(noise)]
    rows += [_policy_row(text, f"l{i}", answer_format="lenient") for i, text in enumerate(noise)]
    rows += [_policy_row("\\boxed{5}", "boxed"), _policy_row("Answer: 5", "line")]
    out = {r["response_id"]: r for r in verify_rollouts(rows, config=VerifyConfig(workers=1, progress=False))}
    assert [out[f"n{i}"]["score"] for i in range(2)] == [0.0, 0.0]
    assert out["n0"]["verification_result_info"]["reason"] == "no_answer"
    assert out["n0"]["verification_result_info"]["answer_format"] == "boxed"
    assert [out[f"l{i}"]["score"] for i in range(2)] == [1.0, 1.0]
    assert out["boxed"]["score"] == out["line"]["score"] == 1.0
    # The run's option is the policy of rows that name none; a row's own policy wins over it.
    config = VerifyConfig(workers=1, progress=False, options={"answer_format": "lenient"})
    rows = [_policy_row("blah is 5 blah", "run"), _policy_row("blah is 5 blah", "row", answer_format="boxed")]
    out = {r["response_id"]: r["score"] for r in verify_rollouts(rows, config=config)}
    assert out == {"run": 1.0, "row": 0.0}


def test_an_unknown_policy_is_an_error_naming_the_field_or_the_option() -> None:
    from genesys.errors import InputError

    out = verify_rollouts(
        [_policy_row("\\boxed{5}", "r", answer_format="strict")],
        config=VerifyConfig(workers=1, progress=False),
    )
    assert out[0]["score"] is None and "verification_info.answer_format is 'strict'" in out[0]["error"]
    with pytest.raises(InputError, match="answer_format"):
        verify_rollouts(
            [], config=VerifyConfig(workers=1, progress=False, options={"answer_format": "strict"})
        )


def test_a_costly_wrong_answer_is_scored_zero_by_the_engine_not_recorded_as_an_error() -> None:
    gcd_terms = "+".join([r"\gcd(p^{99999}, q^{99999})"] * 29)
    rows = [
        math_row("5", rf"\boxed{{{gcd_terms}}}", "gcd"),
        math_row("e", r"\boxed{(1+10^{-30})^{10^{30}}}", "power"),
        math_row("5", r"\boxed{5}", "right"),
    ]
    # A generous deadline and a small budget: the verdict comes from the budget even on a busy machine.
    config = VerifyConfig(workers=1, timeout=120, progress=False, options={"cpu_budget": 0.5})
    out = {r["response_id"]: r for r in verify_rollouts(rows, config=config)}
    for key in ("gcd", "power"):
        assert (out[key]["score"], out[key]["error"]) == (0.0, None), out[key]
        assert out[key]["verification_result_info"]["reason"] == "too_complex"
        assert out[key]["verification_result_info"]["why"]
    assert out["right"]["score"] == 1.0


def test_trl_reward_adapter_takes_a_policy_for_all_or_per_row() -> None:
    noise = ["blah is 5 blah", "\\boxed{5}"]
    assert math_verify_reward(["p"] * 2, noise, ground_truth=["5", "5"]) == [0.0, 1.0]
    assert math_verify_reward(["p"] * 2, noise, ground_truth=["5", "5"], answer_format="lenient") == [
        1.0,
        1.0,
    ]
    assert math_verify_reward(["p"] * 2, noise, ground_truth=["5"] * 2, answer_format=["lenient", None]) == [
        1.0,
        1.0,
    ]
    info = [json.dumps({"ground_truth": "5", "answer_format": "lenient"}), {"ground_truth": "5"}]
    assert math_verify_reward(["p"] * 2, noise, verification_info=info) == [1.0, 1.0]
    with pytest.raises(ValueError, match="answer_format of completion 0 is 'strict'"):
        math_verify_reward(["p"], noise[:1], ground_truth=["5"], answer_format="strict")
