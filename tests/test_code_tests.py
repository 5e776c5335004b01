"""Reading assert, pytest and checker tests from verification_info (no sandbox needed), and the
value encoding the sandbox's judge and the program's process speak."""

from __future__ import annotations

import json

import pytest

from genesys.sandbox import runner
from genesys.verifiers.code_tests import TaskDataError, parse_checker, parse_tests

PYTEST_MODULE = """
import pytest
from solution import f

def helper():
    pass

def test_plain():
    assert f(1) == 1

@pytest.mark.parametrize(("x", "y"), [(1, 1)])
def test_table(x, y):
    assert f(x) == y

class TestGroup:
    def setup_method(self, method):
        pass

    def test_method(self):
        assert f(2) == 2

class TestWithInit:
    def __init__(self):
        pass

    def test_not_collected(self):
        pass
"""


def test_assert_tests_reach_the_sandbox_as_written() -> None:
    code = "def check(candidate):\n    assert candidate(1) == 2\ncheck(f)"
    language, tests = parse_tests({"test_cases": [{"type": "assert", "code": code}]})
    assert language == "python"
    assert [test.to_sandbox() for test in tests] == [{"type": "assert", "code": code}]


def test_pytest_modules_become_one_test_per_test_function() -> None:
    _, tests = parse_tests({"test_cases": [{"type": "pytest", "code": PYTEST_MODULE}]})
    assert [test.name for test in tests] == ["test_plain", "test_table", "TestGroup::test_method"]
    assert tests[2].to_sandbox() == {
        "type": "pytest",
        "code": PYTEST_MODULE,
        "name": "TestGroup::test_method",
    }


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ({"type": "assert"}, r"test_cases\[0\]\.code is missing"),
        ({"type": "assert", "code": "assert f(1) ==\n"}, r"test_cases\[0\]\.code is not valid Python"),
        ({"type": "pytest", "code": "def helper():\n    pass\n"}, "defines no test_ functions"),
        (
            {"type": "pytest", "code": "def test_x(tmp_path):\n    pass\n"},
            r"test_x takes tmp_path: neither a parametrize argument nor a fixture of the module",
        ),
        (
            {
                "type": "pytest",
                "code": "import pytest\n@pytest.fixture(params=[1])\ndef n(request):\n    pass\n"
                "def test_x(n):\n    pass\n",
            },
            "fixture n has params",
        ),
        (
            {
                "type": "pytest",
                "code": "import pytest\n@pytest.fixture\ndef n(tmp_path):\n    pass\n"
                "def test_x(n):\n    pass\n",
            },
            "fixture n takes tmp_path, which are not fixtures of the module",
        ),
        ({"type": "pytest", "code": "async def test_x():\n    pass\n"}, "test_x is async"),
    ],
)
def test_bad_judged_tests_name_the_field(case: dict, message: str) -> None:
    with pytest.raises(TaskDataError, match=message):
        parse_tests({"test_cases": [case]})


def test_checked_tests_carry_their_output_into_the_sandbox() -> None:
    info = {"test_cases": [{"input": "3\n", "output": "1 2 3\n"}]}
    assert "output" not in parse_tests(info)[1][0].to_sandbox()
    info["checker"] = json.dumps({"language": "C++", "source": "int main() { return 0; }"})
    assert parse_tests(info)[1][0].to_sandbox()["output"] == "1 2 3\n"
    checker = parse_checker(info)
    assert checker is not None and checker.language == "cpp"


@pytest.mark.parametrize(
    ("checker", "field"),
    [
        ({"language": "rust", "source": "fn main() {}"}, "checker.language"),
        ({"language": "python"}, "checker.source"),
        ("[1, 2]", "checker must be an object"),
    ],
)
def test_bad_checkers_name_the_field(checker: object, field: str) -> None:
    with pytest.raises(TaskDataError, match=field):
        parse_checker({"checker": checker})


def test_the_taco_convention_unwraps_one_element_output_lists() -> None:
    cases = [{"fn_name": "f", "input": [1], "output": [3]}, {"fn_name": "f", "input": [1], "output": [3, 4]}]
    assert [t.expected for t in parse_tests({"test_cases": cases})[1]] == [[3], [3, 4]]
    assert [t.expected for t in parse_tests({"test_cases": cases}, source="TACO")[1]] == [3, [3, 4]]
    flagged = {"test_cases": cases, "output_convention": "taco"}
    assert parse_tests(flagged, source="apps")[1][0].expected == 3
    assert parse_tests({**flagged, "output_convention": "plain"}, source="taco")[1][0].expected == [3]
    with pytest.raises(TaskDataError, match="verification_info.output_convention"):
        parse_tests({**flagged, "output_convention": "apps"})


VALUES = [
    None,
    True,
    3,
    -(10**5000),
    2.5,
    float("inf"),
    "text",
    [1, (2, 3)],
    {(1, 2): {"a": [b"\x00"]}},
    {1, 2},
    frozenset({"x"}),
    bytearray(b"ab"),
    1 + 2j,
]


@pytest.mark.parametrize("value", VALUES, ids=lambda value: type(value).__name__)
def test_plain_values_cross_exactly(value: object) -> None:
    def refuse(other: object) -> object:
        raise AssertionError(f"{other!r} is plain data")

    text = json.dumps(runner.encode_value(value, refuse))
    decoded = json.loads(text, object_hook=runner.value_hook(refuse, runner._rebuild_stdlib, refuse))
    assert decoded == value and type(decoded) is type(value)


def test_other_objects_cross_as_handles_that_are_never_compared() -> None:
    class Anything:
        def __eq__(self, other: object) -> bool:
            return True

    class Int(int):
        pass

    handles: list[object] = []

    def handle(value: object) -> dict:
        handles.append(value)
        return {"r": len(handles) - 1, "k": type(value).__name__, "c": callable(value)}

    encoded = runner.encode_value([Anything(), Int(3)], handle)
    assert [type(item) for item in handles] == [Anything, Int]  # an int subclass is not plain data
    link = runner.Link(channel=None, pid=0)
    remote = json.loads(json.dumps(encoded), object_hook=link.hook)[0]
    for compare in (lambda: remote == 5, lambda: remote != 5, lambda: remote == remote, lambda: remote < 1):
        with pytest.raises(TypeError, match="compare plain data"):
            compare()
    # Tagged as comparing by identity (its class keeps object's __eq__): equal to itself alone.
    same, other = (link.hook({"r": index, "k": "Node", "c": False, "q": "i"}) for index in (7, 8))
    assert same == link.hook({"r": 7, "k": "Node", "c": False, "q": "i"}) and same != other and same != 5
    # Whatever the program claims of how its objects compare, none of them equals plain data.
    for claim in ("i", "f"):
        claimed = link.hook({"r": 9 if claim == "i" else 10, "k": "Anything", "c": False, "q": claim})
        assert claimed != 5 and not claimed == 5 and claimed != [1] and not [1] == claimed


def test_the_judge_lends_nothing_that_reaches_into_objects_or_runs_code() -> None:
    import builtins
    import math

    refused = [getattr(builtins, name) for name in sorted(runner.UNLENDABLE) if hasattr(builtins, name)]
    assert len(refused) >= 20 and not any(runner.lendable(value) for value in refused)
    assert not any(
        runner.lendable(value) for value in (json.loads, object.__subclasses__, vars, runner.lendable)
    )
    lent = (len, sorted, str.lower, "abc".startswith, int, map(abs, [1]), math.sqrt, iter([1]))
    assert all(runner.lendable(value) for value in lent)


def test_a_stand_in_is_never_more_than_an_exception_the_program_could_raise() -> None:
    link = runner.Link(channel=None, pid=0)
    for claimed in ("KeyboardInterrupt", "SystemExit", "GeneratorExit", "BaseException", "no such", None):
        stand_in = link.hook({"r": 1 + len(link.remotes), "k": "Sneaky", "c": True, "e": [claimed, None]})
        assert issubclass(stand_in, Exception) and stand_in.__name__ == "Sneaky"
    parent = link.hook({"r": 100, "k": "Base", "c": True, "e": ["ValueError", None]})
    child = json.loads(
        json.dumps({"r": 101, "k": "Child", "c": True, "e": ["ValueError", {"r": 100}]}),
        object_hook=link.hook,
    )
    assert issubclass(child, parent) and issubclass(parent, ValueError)
