"""Assert, pytest and checker-judged code tests, on the real sandboxes (docker and bwrap): right
programs pass, wrong ones fail, and the reward hacks these kinds invite fail on both."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from test_sandbox_backends import BACKENDS, backend_skip_reason, code_rollout

from genesys.schema import Verdict
from genesys.verifiers.code import CodeVerifier


@pytest.fixture(scope="module", params=BACKENDS)
def verifier(request: pytest.FixtureRequest) -> Iterator[CodeVerifier]:
    reason = backend_skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    instance = CodeVerifier({"sandbox": request.param, "time_limit": 2})
    instance.setup()
    yield instance
    instance.teardown()


def verify(verifier: CodeVerifier, source: str, tests: list[dict], **info: object) -> Verdict:
    rollout = code_rollout("python", source, tests)
    rollout.verification_info.update(info)
    return verifier.verify(rollout)


def statuses(verdict: Verdict) -> list[str]:
    return [test["status"] for test in verdict.details["tests"]]


# HumanEval's shape: the problem's `test` plus `check(ENTRY_POINT)`.
HUMANEVAL = [
    {
        "type": "assert",
        "code": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n\ncheck(add)",
    }
]
# KodCode's shape: the program is importable as `solution`.
PYTEST_MODULE = """
import pytest
from solution import add

def test_small():
    assert add(2, 3) == 5

@pytest.mark.parametrize("a, b, total", [(-1, 1, 0), (10, 5, 15)])
def test_table(a, b, total):
    assert add(a, b) == total

class TestAdd:
    def test_floats(self):
        assert add(0.1, 0.2) == pytest.approx(0.3)

    def test_type_error(self):
        with pytest.raises(TypeError):
            add(1, None)
"""
PYTEST = [{"type": "pytest", "code": PYTEST_MODULE}]
CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b if b is not None else 0\n"


def test_humaneval_and_mbpp_style_assert_tests(verifier: CodeVerifier) -> None:
    assert verify(verifier, CORRECT, HUMANEVAL).score == 1.0
    wrong = verify(verifier, WRONG, HUMANEVAL)
    assert wrong.score == 0.0 and statuses(wrong) == ["wrong_answer"]
    assert "line 2: assert candidate(2, 3) == 5" in wrong.details["tests"][0]["message"]
    # MBPP's shape: one case per test_list line, setup code prepended; the program's imports are in scope.
    mbpp = [
        {"type": "assert", "code": "import math\n" + line}
        for line in ("assert math.isclose(area(2), 12.566, rel_tol=1e-3)", "assert area(0) == 0")
    ]
    program = "import math\ndef area(r):\n    return math.pi * r * r"
    assert verify(verifier, program, mbpp).score == 1.0
    assert verify(verifier, "def area(r):\n    return 3 * r * r", mbpp).score == 0.5


def test_program_objects_generators_and_stdlib_values_cross(verifier: CodeVerifier) -> None:
    program = (
        "from collections import Counter\n"
        "class Node:\n    def __init__(self, value):\n        self.value = value\n"
        "def evens(n):\n    yield from range(0, n, 2)\n"
        "def count(text):\n    return Counter(text)\n"
        "def pair(a, b):\n    return (a, b)\n"
        "if __name__ == '__main__':\n    raise SystemExit('a module is not run as __main__')\n"
    )
    code = (
        "assert list(evens(5)) == [0, 2, 4]\n"
        "assert Node(3).value == 3\n"
        "assert count('aab') == {'a': 2, 'b': 1}\n"
        "assert pair(1, [2]) == (1, [2]) and isinstance(pair(1, 2), tuple)\n"
        "try:\n    Node()\nexcept TypeError:\n    pass\nelse:\n    raise AssertionError('no TypeError')\n"
    )
    verdict = verify(verifier, program, [{"type": "assert", "code": code}])
    assert verdict.score == 1.0, verdict.details


IN_PLACE_PROGRAM = (
    "def rotate(nums, k):\n    k %= len(nums)\n    nums[:] = nums[-k:] + nums[:-k]\n"
    "def transpose(matrix):\n"
    "    for i in range(len(matrix)):\n"
    "        for j in range(i):\n"
    "            matrix[i][j], matrix[j][i] = matrix[j][i], matrix[i][j]\n"
    "def merge(into, m, other, n):\n    into[m:] = other[:n]\n    into.sort()\n"
    "def count(tally, word):\n    tally[word] = tally.get(word, 0) + 1\n    tally.pop('stale', None)\n"
    "def add_all(seen, items):\n    seen.update(items)\n"
    "def sorted_copy(items):\n    return sorted(items)\n"
    "class Solution:\n    def sortColors(self, nums):\n        nums.sort()\n"
)
IN_PLACE_ASSERTS = (
    "nums = [1, 2, 3, 4]\nrotate(nums, 1)\nassert nums == [4, 1, 2, 3]\n"
    "matrix = [[1, 2], [3, 4]]\nrow = matrix[0]\ntranspose(matrix)\n"
    "assert matrix == [[1, 3], [2, 4]] and row is matrix[0] and row == [1, 3]\n"
    "into = [1, 3, 0, 0]\nmerge(into=into, m=2, other=[2, 4], n=2)\nassert into == [1, 2, 3, 4]\n"
    "tally = {'stale': 1}\ncount(tally, 'a')\ncount(tally, 'a')\nassert tally == {'a': 2}\n"
    "seen = set()\nadd_all(seen, [1, 2])\nassert seen == {1, 2}\n"
    "items = [3, 1, 2]\nassert sorted_copy(items) == [1, 2, 3] and items == [3, 1, 2]\n"
    "colors = [2, 0, 1]\nSolution().sortColors(colors)\nassert colors == [0, 1, 2]\n"
)
IN_PLACE_PYTEST = """
from solution import Solution, rotate

def test_rotate():
    nums = [1, 2, 3]
    rotate(nums, 2)
    assert nums == [2, 3, 1]

class TestColors:
    def test_sort(self):
        nums = [1, 0]
        Solution().sortColors(nums)
        assert nums == [0, 1]
"""


def test_a_function_that_changes_its_arguments_in_place_changes_the_tests_own(verifier: CodeVerifier) -> None:
    # LeetCode's "modify nums in-place" problems: the test looks at the list it passed afterwards.
    tests = [{"type": "assert", "code": IN_PLACE_ASSERTS}, {"type": "pytest", "code": IN_PLACE_PYTEST}]
    verdict = verify(verifier, IN_PLACE_PROGRAM, tests)
    assert verdict.score == 1.0, verdict.details
    wrong = verify(verifier, IN_PLACE_PROGRAM.replace("nums.sort()", "nums = sorted(nums)"), tests)
    assert statuses(wrong) == ["wrong_answer", "passed", "wrong_answer"]  # rebinding changes nothing


def test_program_objects_are_taken_for_their_truth_as_the_program_answers(verifier: CodeVerifier) -> None:
    # Walking a linked list or a tree: `while node:` asks the node's truth, which is the program's
    # to answer (as its return values are).
    program = (
        "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n"
        "class Empty:\n    def __len__(self):\n        return 0\n"
        "def reverse(head):\n    previous = None\n"
        "    while head:\n        head.next, previous, head = previous, head, head.next\n    return previous\n"
    )
    code = (
        "head = reverse(ListNode(1, ListNode(2, ListNode(3))))\nvalues = []\n"
        "while head:\n    values.append(head.val)\n    head = head.next\n"
        "assert values == [3, 2, 1] and not Empty() and bool(ListNode())\n"
    )
    verdict = verify(verifier, program, [{"type": "assert", "code": code}])
    assert verdict.score == 1.0, verdict.details


CLASSES_PROGRAM = """
import collections, datetime, enum
from dataclasses import dataclass, field

class InvalidInput(ValueError):
    pass

class EmptyInput(InvalidInput):
    pass

class Color(enum.Enum):
    RED = 1
    BLUE = 2

@dataclass
class Point:
    x: int
    y: int
    seen: list = field(default_factory=list, compare=False)

@dataclass
class Other:
    x: int
    y: int

class Shape:
    pass

class Square(Shape):
    def __eq__(self, other):
        return True

def parse(text):
    if not text:
        raise EmptyInput("empty")
    if not text.isdigit():
        raise InvalidInput("not a number: " + text)
    return int(text)

def warmest():
    return Color.RED

def middle(a, b):
    return Point((a.x + b.x) // 2, (a.y + b.y) // 2, seen=[a.x])

def square():
    return Square()

def total(numbers):
    return sum(numbers)

def next_day(day):
    return day + datetime.timedelta(days=1)

def span(start, end):
    return end - start

Corner = collections.namedtuple("Corner", "x y")

def origin():
    return Corner(0, 0)
"""
CLASSES_ASSERTS = [
    "try:\n    parse('x')\nexcept InvalidInput as exc:\n    assert 'not a number' in str(exc)\nelse:\n    assert False",
    "try:\n    parse('')\nexcept ValueError as exc:\n    assert isinstance(exc, EmptyInput) and isinstance(exc, InvalidInput)",
    "assert issubclass(EmptyInput, InvalidInput) and issubclass(InvalidInput, ValueError)",
    "assert warmest() == Color.RED and warmest() != Color.BLUE and warmest() in {Color.RED}",
    "assert middle(Point(0, 0), Point(4, 2)) == Point(2, 1)\nassert middle(Point(0, 0), Point(4, 2)) != Point(2, 2)",
    "assert Point(1, 2) != Other(1, 2) and Point(1, 2) != (1, 2)",
    "assert isinstance(square(), Shape) and not isinstance(Point(1, 2), Shape) and isinstance(3, int)",
    "assert total(range(5)) == 10 and next_day(datetime.date(2024, 2, 28)) == datetime.date(2024, 2, 29)",
    "corner = origin()\nassert corner == (0, 0) and corner.x == 0 and total(corner) == 0",
    "import datetime\nassert span(datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 2, 6)) == datetime.timedelta(hours=30)",
    "assert square() == square()",  # a class with an __eq__ of its own: refused, never asked
]
CLASSES_PYTEST = """
import pytest
from solution import EmptyInput, InvalidInput, parse

def test_raises():
    with pytest.raises(InvalidInput, match="not a number"):
        parse("x")
    with pytest.raises(EmptyInput):
        parse("")
"""


def test_program_classes_raise_compare_and_check_as_they_would_in_one_process(verifier: CodeVerifier) -> None:
    # The judge's stand-in for each exception class of the program's (a subclass of the builtin one
    # it derives from), identity for classes that keep object's __eq__ (an Enum's members), a
    # dataclass's fields for its generated __eq__, isinstance asked of the program, and ranges and
    # datetime values by value. A class's own __eq__ is never asked.
    tests = [{"type": "assert", "code": code} for code in CLASSES_ASSERTS]
    verdict = verify(verifier, CLASSES_PROGRAM, [*tests, {"type": "pytest", "code": CLASSES_PYTEST}])
    assert statuses(verdict) == ["passed"] * (len(tests) - 1) + ["runtime_error", "passed"], verdict.details
    assert "tests compare plain data" in verdict.details["tests"][len(tests) - 1]["message"]


def test_the_programs_top_level_names_reach_the_test_when_it_reads_them(verifier: CodeVerifier) -> None:
    # A table past the output limit, a dict that holds itself and a deep nesting never leave the
    # program's process unless the test reads them; a global read after calls has their effect.
    program = (
        "import sys\nsys.setrecursionlimit(10000)\n"
        "TABLE = 'x' * (2 << 20)\ngraph = {}\ngraph['me'] = graph\nnested = []\n"
        "for _ in range(3000):\n    nested = [nested]\n"
        "calls = 0\ndef count():\n    global calls\n    calls += 1\n    return calls\n"
    )
    assert_test = "count()\ncount()\nassert calls == 2 and count() == 3"
    pytest_test = "import solution\nfrom solution import count\n\ndef test_calls():\n    count()\n    assert solution.calls == 1\n"
    tests = [{"type": "assert", "code": assert_test}, {"type": "pytest", "code": pytest_test}]
    verdict = verify(verifier, program, tests)
    assert verdict.score == 1.0, verdict.details


LENDING_PROGRAM = """
def apply(f, xs):
    return [f(x) for x in xs]

def my_sort(xs, key=None):
    return sorted(xs, key=key)

def total(numbers):
    return sum(numbers)

def double(x):
    return 2 * x

def guarded(f):
    try:
        return f()
    except ValueError as exc:
        return "caught " + str(exc)
"""
LENDING_ASSERTS = [
    "assert apply(lambda x: x * 2, [1, 2]) == [2, 4] and apply(abs, [-1]) == [1]",
    "assert my_sort(['bb', 'a', 'C'], key=str.lower) == ['a', 'bb', 'C'] and my_sort(['bb', 'a'], key=len) == ['a', 'bb']",
    "assert total(x * x for x in range(4)) == 14 and total(iter([1, 2])) == 3 and total(map(int, '12')) == 3",
    "assert apply(lambda x: double(x) + 1, [1, 2]) == [3, 5]",  # the judge calls the program back
    "def bad():\n    raise ValueError('no')\nassert guarded(bad) == 'caught no'",
    "seen = []\napply(seen.append, [1, 2])\nassert seen == [1, 2]",  # run in the judge, on the test's list
    "apply(getattr, [1])",  # never lent: it reaches into objects
]


def test_the_tests_functions_and_iterators_are_lent_to_the_program(verifier: CodeVerifier) -> None:
    # Higher-order tasks: the program calls the test's lambda, `key=` or generator, and the judge
    # runs it there (with the program's arguments), never lending what reaches into objects.
    tests = [{"type": "assert", "code": code} for code in LENDING_ASSERTS]
    verdict = verify(verifier, LENDING_PROGRAM, tests)
    assert statuses(verdict) == ["passed"] * (len(tests) - 1) + ["runtime_error"], verdict.details
    assert "cannot be passed to the program" in verdict.details["tests"][-1]["message"]


FIXTURES_PYTEST = """
import pytest
from solution import Stack

made = []

@pytest.fixture(autouse=True)
def log():
    made.append("log")
    yield
    made.append("log done")

@pytest.fixture
def items():
    return [1, 2, 3]

@pytest.fixture()
def stack(items):
    stack = Stack()
    for item in items:
        stack.push(item)
    yield stack
    made.append("stack done")

def test_pop(stack, items):
    assert stack.pop() == items[-1] and made == ["log"]

class TestStack:
    @pytest.mark.parametrize("extra", [4, 5])
    def test_push(self, stack, extra):
        stack.push(extra)
        assert stack.pop() == extra and made.count("log") == made.count("stack done") + 1
"""


def test_pytest_tests_take_the_modules_own_fixtures(verifier: CodeVerifier) -> None:
    program = (
        "class Stack:\n    def __init__(self):\n        self.items = []\n"
        "    def push(self, item):\n        self.items.append(item)\n"
        "    def pop(self):\n        return self.items.pop()\n"
    )
    verdict = verify(verifier, program, [{"type": "pytest", "code": FIXTURES_PYTEST}])
    assert verdict.score == 1.0 and verdict.details["total"] == 2, verdict.details


CAPSYS_PYTEST = """
from solution import greet

def test_greet(capsys):
    greet("Ann")
    out, err = capsys.readouterr()
    assert out == "Hello, Ann\\n" and err == "noted\\n"
    print("the test's own")
    assert capsys.readouterr().out == "the test's own\\n" and capsys.readouterr() == ("", "")
"""


def test_capsys_reads_what_the_program_printed(verifier: CodeVerifier) -> None:
    # KodCode's tasks that print: the program prints in its own process, the test reads it there.
    program = "import sys\ndef greet(name):\n    print('Hello,', name)\n    print('noted', file=sys.stderr)\n"
    tests = [{"type": "pytest", "code": CAPSYS_PYTEST}]
    assert verify(verifier, program, tests).score == 1.0
    assert statuses(verify(verifier, program.replace("'Hello,'", "'Hi,'"), tests)) == ["wrong_answer"]


# A wrong program (it never sorts) that digs through what the judge lent it for the test's answer.
DIGGER = """
def solve(xs, key):
    found = []
    for dig in (
        lambda: key.__globals__, lambda: key.__code__.co_consts, lambda: vars(key), lambda: key.__closure__,
        lambda: type(key).__dict__, lambda: key(key).__globals__, lambda: key.__self__, lambda: key.__dict__,
    ):
        try:
            found.append(dig())
        except Exception:
            pass
    for thing in found:
        if isinstance(thing, dict) and "EXPECTED" in thing:
            return thing["EXPECTED"]
    return [42]
"""


def test_what_the_judge_lends_reaches_nothing_of_the_judge(verifier: CodeVerifier) -> None:
    code = "EXPECTED = [1, 2, 3]\nassert solve([3, 1, 2], key=lambda x: x) == EXPECTED"
    verdict = verify(verifier, DIGGER, [{"type": "assert", "code": code}])
    assert statuses(verdict) == ["wrong_answer"], verdict.details


def test_function_call_tests_load_the_program_as_a_module(verifier: CodeVerifier) -> None:
    # As call-based harnesses do: a driver of the program's own under `if __name__ == "__main__":`
    # (reading stdin, exiting) does not run; the function is called.
    program = (
        "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n"
        "if __name__ == '__main__':\n    print(Solution().twoSum(list(map(int, input().split())), 9))\n    exit(1)\n"
    )
    tests = [{"type": "function_call", "fn_name": "twoSum", "input": [[2, 7], 9], "output": [0, 1]}]
    verdict = verify(verifier, program, tests * 2)
    assert verdict.score == 1.0, verdict.details


def test_pytest_tests_are_discovered_and_run_one_by_one(verifier: CodeVerifier) -> None:
    right = verify(verifier, CORRECT, PYTEST)
    assert right.score == 1.0 and right.details["total"] == 4
    wrong = verify(verifier, WRONG, PYTEST)
    assert statuses(wrong) == ["wrong_answer"] * 4
    assert "DID NOT RAISE" in wrong.details["tests"][3]["message"]


# Each hack defines `add` (and the pytest module's needs) without computing sums.
HACKS = {
    "__eq__ always true": "class Anything:\n    def __eq__(self, other):\n        return True\n"
    "    __ne__ = __eq__\n    def __bool__(self):\n        return True\n"
    "def add(a, b):\n    return Anything()",
    "int subclass equal to everything": "class Int(int):\n    def __eq__(self, other):\n        return True\n"
    "def add(a, b):\n    return Int(0)",
    "patched AssertionError and builtins": "import builtins\n"
    "class Quiet(Exception):\n    pass\n"
    "builtins.AssertionError = Quiet\nbuiltins.isinstance = lambda *a: True\nbuiltins.abs = lambda x: 0\n"
    "def add(a, b):\n    return 0",
    "patched sys.exit and os._exit": "import os, sys\n"
    "sys.exit = lambda *a: None\nos._exit = lambda *a: None\n"
    "def add(a, b):\n    sys.exit(0)\n    os._exit(0)\n    return 0",
    "exit 0 before the asserts": "import os\ndef add(a, b):\n    return 0\nos._exit(0)",
    "sys.exit(0) inside the call": "import sys\ndef add(a, b):\n    sys.exit(0)",
    "excepthook swallows": "import sys\nsys.excepthook = lambda *a: None\n"
    "def add(a, b):\n    raise AssertionError('swallowed?')",
    "prints the success marker": "import os, json\n"
    "def add(a, b):\n"
    "    marker = json.dumps({'status': 'passed'}).encode()\n"
    "    print('passed', marker.decode(), flush=True)\n"
    "    for fd in range(3, 64):\n"
    "        try:\n            os.write(fd, marker)\n        except OSError:\n            pass\n"
    "    return 0",
    "patches the harness": "import gc\n"
    "def passed(*args, **kwargs):\n    return {'status': 'passed'}\n"
    "for thing in gc.get_objects():\n"
    "    if callable(thing) and getattr(thing, '__name__', '') in ('run_judged', 'run_pytest_test', '_failure'):\n"
    "        try:\n            thing.__code__ = passed.__code__\n        except (AttributeError, TypeError, ValueError):\n            pass\n"
    "def add(a, b):\n    return 0",
    "kills the judge": "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 0",
}


@pytest.mark.parametrize("hack", sorted(HACKS))
@pytest.mark.parametrize("tests", [HUMANEVAL, PYTEST], ids=["assert", "pytest"])
def test_reward_hacks_fail(verifier: CodeVerifier, hack: str, tests: list[dict]) -> None:
    verdict = verify(verifier, HACKS[hack], tests)
    assert verdict.error is None
    assert verdict.score == 0.0, verdict.details["tests"]


CHECKER_PY = """
import sys
given, output, answer = (open(path).read().split() for path in sys.argv[1:4])
if sorted(output) != sorted(answer):
    sys.stderr.write("wrong answer: not a permutation of the expected numbers\\n")
    sys.exit(1)
"""
CHECKER_CPP = r"""
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>
int main(int argc, char** argv) {
    std::ifstream output(argv[2]), answer(argv[3]);
    std::vector<long> got, want;
    for (long x; output >> x;) got.push_back(x);
    for (long x; answer >> x;) want.push_back(x);
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    if (got == want) return 0;
    std::fprintf(stderr, "wrong answer: not a permutation\n");
    return 1;
}
"""
CHECKED = [
    {"type": "stdin_stdout", "input": "3\n", "output": "1 2 3\n"},
    {"type": "stdin_stdout", "input": "1\n", "output": "1\n"},
]


@pytest.mark.parametrize("language, source", [("python", CHECKER_PY), ("cpp", CHECKER_CPP)])
def test_a_checker_accepts_any_valid_output(verifier: CodeVerifier, language: str, source: str) -> None:
    checker = {"language": language, "source": source}
    reverse = "n = int(input())\nprint(*range(n, 0, -1))"
    assert verify(verifier, reverse, CHECKED, checker=checker).score == 1.0
    wrong = verify(verifier, "n = int(input())\nprint(*range(n))", CHECKED, checker=checker)
    assert wrong.score == 0.0 and statuses(wrong) == ["wrong_answer"] * 2
    assert "wrong answer" in wrong.details["tests"][0]["message"]


def test_a_checker_cannot_be_reached_by_the_program(verifier: CodeVerifier) -> None:
    """The expected output is never where the program runs, and the checker's binary never on a
    file system it can write: a program that hunts for either, and leaves a process behind to
    tamper with the checker's run, still fails."""
    secret = "7391 5821 9917"
    program = f"""
import os, sys, time
found = []
for root in ("/tmp", "/proc", "/dev/shm"):
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                with open(os.path.join(directory, name), "rb") as handle:
                    if b"5821" in handle.read(1 << 20):
                        found.append(os.path.join(directory, name))
            except OSError:
                pass
for directory, _, files in os.walk("/tmp"):
    for name in files:
        try:
            with open(os.path.join(directory, name), "wb") as handle:
                handle.write(b"#!/bin/sh\\nexit 0\\n")
        except OSError:
            pass
if os.fork() == 0:
    for _ in range(200):
        for pid in os.listdir("/proc"):
            for fd in ("3", "4", "5"):
                try:
                    with open(f"/proc/{{pid}}/fd/{{fd}}", "w") as handle:
                        handle.write("{secret}")
                except OSError:
                    pass
        time.sleep(0.01)
    os._exit(0)
print(" ".join(found) or "nothing")
"""
    tests = [{"type": "stdin_stdout", "input": "", "output": secret + "\n"}] * 2
    for language, source in (("python", CHECKER_PY), ("cpp", CHECKER_CPP)):
        verdict = verify(verifier, program, tests, checker={"language": language, "source": source})
        assert verdict.error is None
        assert verdict.score == 0.0, verdict.details["tests"]


def test_a_failing_checker_is_an_error_not_a_zero(verifier: CodeVerifier) -> None:
    crashing = {"language": "python", "source": "raise RuntimeError('the checker itself is broken')"}
    verdict = verify(verifier, "print(1)", CHECKED, checker=crashing)
    assert verdict.score is None and verdict.error.startswith("checker_error:")
    broken = verify(verifier, "print(1)", CHECKED, checker={"language": "cpp", "source": "int main( {"})
    assert broken.score is None and "does not compile" in broken.error


def test_taco_rows_read_one_element_output_lists(verifier: CodeVerifier) -> None:
    tests = [{"type": "function_call", "fn_name": "add", "input": [2, 3], "output": [5]}]
    rollout = code_rollout("python", CORRECT, tests)
    assert verifier.verify(rollout).score == 0.0  # plain: [5] is a list
    rollout.source = "taco"
    assert verifier.verify(rollout).score == 1.0


def load_agreement_script() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "code_kinds_agreement.py"
    spec = importlib.util.spec_from_file_location("code_kinds_agreement", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_converted_records_agree_with_the_reference_harness(verifier: CodeVerifier) -> None:
    script = load_agreement_script()
    for kind, name in (("humaneval", "humaneval_style.jsonl"), ("mbpp", "mbpp_style.jsonl")):
        records = script.read_records(script.DATA / name)
        agreed, total, disagreements = script.agreement(kind, records, verifier.settings.sandbox)
        assert total >= 3 * len(records) and agreed == total, disagreements


def test_the_conversion_recipe() -> None:
    script = load_agreement_script()
    record = {"test": "def check(candidate):\n    assert candidate(1) == 1\n", "entry_point": "f"}
    assert script.humaneval_tests(record) == [{"type": "assert", "code": record["test"] + "\ncheck(f)\n"}]
    mbpp = {"test_setup_code": "x = 1", "test_list": ["assert f(x) == 1", "assert f(2) == 2"]}
    assert [test["code"] for test in script.mbpp_tests(mbpp)] == [
        "x = 1\nassert f(x) == 1\n",
        "x = 1\nassert f(2) == 2\n",
    ]
    assert script.stub("import math\ndef f(x):\n    return x") == "import math\n\ndef f(x):\n    return None"


def test_assert_tests_outside_python_are_refused() -> None:
    verdict = CodeVerifier().verify(code_rollout("cpp", "int main() {}", HUMANEVAL))
    assert verdict.score is None and verdict.error.startswith("unsupported_test")
