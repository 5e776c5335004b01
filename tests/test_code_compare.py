"""Output comparison, code extraction and test-case parsing of the code verifiers (no sandbox needed)."""

from __future__ import annotations

import json

import pytest

from genesys.schema import Rollout
from genesys.verifiers.code_compare import compare_output, values_match
from genesys.verifiers.code_extract import extract_code, normalize_language
from genesys.verifiers.code_output import CodeOutputVerifier, extract_prediction
from genesys.verifiers.code_tests import TaskDataError, parse_tests


@pytest.mark.parametrize(
    ("actual", "expected"),
    [
        ("6\n", "6"),
        ("6   \n\n\n", "6\n"),
        ("1 2 3\r\n4\n", "1 2 3\n4\n"),
        ("0.3333333\n", "0.333333333"),
        ("1e-9\n", "0.0"),  # a float gold: within tolerance
        ("YES", "YES"),
        ("a  b\n", "a  b"),
    ],
)
def test_outputs_that_match(actual: str, expected: str) -> None:
    assert compare_output(actual, expected) is None


@pytest.mark.parametrize(
    ("actual", "expected", "why"),
    [
        ("yes", "YES", "line 1"),  # never case-folded
        ("1\n2\n", "1\n2\n3\n", "expected 3 lines, got 2"),  # a missing line fails
        ("1\n2\n3\n", "1\n2\n", "expected 2 lines, got 3"),  # an extra line fails
        ("1 2", "1 2 3", "line 1"),
        ("0.34", "0.333", "line 1"),
        ("100000001", "100000000", "line 1"),  # integers compare exactly, no relative tolerance
        ("a b", "a  b", "line 1"),  # whitespace between tokens must match
        ("\n6", "6", "line 1"),  # leading blank lines count
        ("abc" * 1000 + "d", "abc" * 1000 + "e", "line 1"),  # never truncated
    ],
)
def test_outputs_that_differ(actual: str, expected: str, why: str) -> None:
    difference = compare_output(actual, expected)
    assert difference is not None and difference.startswith(why)


# An integer answer must be matched exactly by an integer-valued one: a tolerance would let a wrong
# large answer pass, printed as a float. Other numbers compare within 1e-6.
INTEGER_GOLDS = [
    ("123456789", "123456789.0", True),
    ("123456789", "123456790.0", False),
    ("123456789", "123456789.0000001", False),
    ("123456789", "1.23456789e8", True),
    ("1000000000", "1e9", True),
    ("1000000001", "1e9", False),
    ("12345678901234567890", "12345678901234567890.0", True),  # beyond float precision
    ("12345678901234567890", "12345678901234567891.0", False),
    ("12345678901234567890", "1.2345678901234567e19", False),
    ("0", "-0", True),
    ("0", "-0.0", True),
    ("0", "1e-9", False),
    ("5", "1e999999999", False),
    ("-7", "-7.000", True),
]


@pytest.mark.parametrize(("expected", "actual", "same"), INTEGER_GOLDS)
def test_an_integer_gold_needs_an_equal_integer_valued_token(expected: str, actual: str, same: bool) -> None:
    assert (compare_output(f"{actual} x\n", f"{expected} x") is None) is same


@pytest.mark.parametrize(("expected", "actual", "same"), INTEGER_GOLDS)
def test_an_integer_gold_needs_an_equal_integer_valued_value(expected: str, actual: str, same: bool) -> None:
    gold, value = json.loads(expected), json.loads(actual.replace("1e999999999", "1e308"))
    if actual == "12345678901234567890.0":
        same = False  # as a JSON value this is the double 12345678901234567168
    assert values_match(value, gold) is same
    assert values_match([[value], {"k": value}], [[gold], {"k": gold}]) is same  # nested too


@pytest.mark.parametrize(
    ("actual", "expected"),
    [("101", "00000101"), ("101.0", "00000101"), ("42", "0042"), ("0042", "42"), ("-7", "-07"), ("5", "05")],
)
def test_digit_strings_with_leading_zeros_match_only_as_text(actual: str, expected: str) -> None:
    assert compare_output(actual, expected) is not None
    assert compare_output(expected, expected) is None


def test_float_golds_keep_their_tolerance() -> None:
    assert compare_output("123456790", "123456789.0") is None  # the gold is a float
    assert values_match(123456790, 123456789.0)
    assert values_match(0.1 + 0.2, 0.3) and compare_output("0.30000000000000004", "0.3") is None
    assert not values_match(True, 1) and not values_match(1, True) and not values_match(1.0, True)
    assert compare_output("True", "1") is not None


def test_values_match_structurally() -> None:
    assert values_match([0, 1], [0, 1])
    assert values_match({"a": [1.0000000001, "x"]}, {"a": [1.0, "x"]})
    assert values_match(0.1 + 0.2, 0.3)
    assert not values_match(True, 1)
    assert not values_match([1, 2], [1, 2, 3])
    assert not values_match("1", 1)
    assert not values_match(10**12 + 1, 10**12)
    assert not values_match(None, [])


FENCE = "```"


def test_extract_prefers_last_block_in_the_task_language() -> None:
    completion = f"{FENCE}python\nold = 1\n{FENCE}\ntext\n{FENCE}cpp\nint main(){{}}\n{FENCE}\n{FENCE}python\nnew = 2\n{FENCE}\nbye"
    assert extract_code(completion, "python") == "new = 2\n"
    assert extract_code(completion, "cpp") == "int main(){}\n"
    assert extract_code(completion, "rust") == "new = 2\n"  # no rust block: the last block of any kind


def test_extract_untagged_unclosed_and_missing_blocks() -> None:
    assert extract_code(f"{FENCE}\nprint(1)\n{FENCE}", "python") == "print(1)\n"
    assert extract_code(f"here:\n{FENCE}py\nprint(2)\n", "python") == "print(2)\n"
    assert extract_code("print(3)", "python") is None
    assert normalize_language("C++") == "cpp" and normalize_language("Python3") == "python"
    assert normalize_language("cobol") is None


def test_parse_tests_reads_both_kinds() -> None:
    language, tests = parse_tests(
        {
            "language": "Python3",
            "test_cases": json.dumps(
                [
                    {"type": "stdin_stdout", "input": "1 2", "output": "3"},
                    {"type": "function_call", "fn_name": "add", "input": [1, 2], "output": 3},
                    {"fn_name": "add", "input": "[1, 2]", "output": "3"},
                    {"fn_name": "add", "input": "1\n2", "output": 3},
                ]
            ),
        }
    )
    assert language == "python"
    assert [t.type for t in tests] == ["stdin_stdout", "function_call", "function_call", "function_call"]
    assert tests[2].input == [1, 2] and tests[2].expected == 3  # serialised input: output decoded too
    assert tests[3].input == [1, 2]
    assert tests[1].to_sandbox() == {"type": "function_call", "input": [1, 2], "fn_name": "add"}
    assert "output" not in tests[0].to_sandbox()  # expected outputs never go into the sandbox


@pytest.mark.parametrize(
    ("info", "field"),
    [
        ({"language": "cobol", "test_cases": [{"input": "", "output": ""}]}, "verification_info.language"),
        ({"language": "python"}, "verification_info.test_cases"),
        ({"test_cases": [{"input": "1"}]}, "verification_info.test_cases[0].output"),
        (
            {"test_cases": [{"type": "function_call", "input": [], "output": 1}]},
            "verification_info.test_cases[0].fn_name",
        ),
        (
            {"test_cases": [{"type": "unit", "input": "", "output": ""}]},
            "verification_info.test_cases[0].type",
        ),
    ],
)
def test_parse_tests_names_the_bad_field(info: dict, field: str) -> None:
    with pytest.raises(TaskDataError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_tests(info)


def _prediction(completion: str, truth: object) -> Rollout:
    return Rollout(
        task_type="code_output_prediction", verification_info={"ground_truth": truth}, completion=completion
    )


def test_code_output_prediction() -> None:
    verifier = CodeOutputVerifier()
    assert verifier.verify(_prediction('so: ```json\n{"output": "[1, 2]"}\n```', "[1, 2]")).score == 1.0
    assert verifier.verify(_prediction('{"output": "A"} then {"output": "B"}', "B")).score == 1.0
    assert verifier.verify(_prediction('{"output": "b"}', "B")).score == 0.0  # not case-folded
    assert verifier.verify(_prediction('{"output": 42}', "42")).score == 1.0
    assert verifier.verify(_prediction('{"output": [1, 2.0]}', [1, 2])).score == 1.0
    assert (
        verifier.verify(_prediction('{"output": [1, 2.0000000001]}', [1, 2])).score == 0.0
    )  # integers exactly
    missing = verifier.verify(_prediction("I think it prints 3", "3"))
    assert missing.score == 0.0 and missing.details["status"] == "no_output"
    bad = verifier.verify(
        Rollout(task_type="code_output_prediction", verification_info={}, completion='{"output": 1}')
    )
    assert bad.score is None and "ground_truth" in (bad.error or "")
    assert extract_prediction('{"a": {"output": 1}}') == 1


def test_function_call_tests_in_a_compiled_language_are_a_task_error() -> None:
    from genesys.verifiers.code import CodeVerifier

    rollout = Rollout(
        task_type="verifiable_code",
        verification_info={"language": "cpp", "test_cases": [{"fn_name": "f", "input": [1], "output": 1}]},
        completion="```cpp\nint f(int x) { return x; }\n```",
    )
    verdict = CodeVerifier().verify(rollout)  # refused before any sandbox is needed
    assert verdict.score is None and verdict.error.startswith("unsupported_test")
