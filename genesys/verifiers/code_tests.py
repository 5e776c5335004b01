"""Reading the tests of a `verifiable_code` task from its `verification_info`.

Test kinds (`TEST_TYPES`): `stdin_stdout` (input text in, output text expected), `function_call`
(`fn_name`, arguments, expected return value), `assert` (Python run in the program's namespace;
passes when it raises nothing) and `pytest` (a test module whose `test_*` functions and `Test*`
classes' `test_*` methods are each one test). `checker` (optional) judges stdin_stdout tests
instead of the output comparison.

`output_convention` (optional): `plain` (the default) or `taco`, TACO's convention that a
function_call test's `output` is a one-element list holding the return value (`[3]` for a function
returning 3); rows whose `source` names TACO default to `taco`.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

from genesys.verifiers.code_extract import normalize_language

TEST_TYPES = ("stdin_stdout", "function_call", "assert", "pytest")
JUDGED_TYPES = ("assert", "pytest")  # run by the sandbox's judge, python only: no expected output
OUTPUT_CONVENTIONS = ("plain", "taco")
CHECKER_LANGUAGES = ("python", "cpp")


class TaskDataError(ValueError):
    """verification_info that cannot be used; the message names the field."""


@dataclass
class CodeTest:
    """One test: what goes into the sandbox (`to_sandbox`) and what the output must be.

    `input` is the stdin text, the call's arguments, or the code of an assert or pytest test;
    `name` is the pytest test ("test_x" or "TestClass::test_x"). `checked`: a checker judges the
    output, so the expected output goes into the sandbox with the test."""

    type: str
    input: Any
    expected: Any
    fn_name: str | None = None
    name: str | None = None
    checked: bool = False

    def to_sandbox(self) -> dict[str, Any]:
        if self.type in JUDGED_TYPES:
            test = {"type": self.type, "code": self.input}
            return test if self.name is None else {**test, "name": self.name}
        test: dict[str, Any] = {"type": self.type, "input": self.input}
        if self.fn_name:
            test["fn_name"] = self.fn_name
        if self.checked:
            test["output"] = self.expected
        return test


@dataclass(frozen=True)
class Checker:
    """A task's checker program: `language` (python or cpp) and `source`."""

    language: str
    source: str


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value) + "\n"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise TaskDataError(f"{where} must be a string, got {type(value).__name__}")


def _call_args(value: Any, where: str) -> tuple[list[Any], bool]:
    """Arguments of a call, and whether they came serialised as text."""
    if isinstance(value, list):
        return value, False
    if isinstance(value, dict):
        return [value], False
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
            return (decoded if isinstance(decoded, list) else [decoded]), True
        except json.JSONDecodeError:
            pass
        try:  # one JSON value per line, LeetCode style
            return [json.loads(line) for line in value.splitlines() if line.strip()], True
        except json.JSONDecodeError:
            raise TaskDataError(f"{where} is neither a list of arguments nor JSON text") from None
    return [value], False


def output_convention(info: dict[str, Any], source: str | None = None) -> str:
    """The row's `output_convention`; unset: `taco` when its `source` names TACO, else `plain`."""
    convention = info.get("output_convention")
    if convention is None:
        return "taco" if source and "taco" in source.lower() else "plain"
    if convention not in OUTPUT_CONVENTIONS:
        raise TaskDataError(
            f"verification_info.output_convention {convention!r} is not one of {', '.join(OUTPUT_CONVENTIONS)}"
        )
    return convention


def parse_checker(info: dict[str, Any]) -> Checker | None:
    """The task's checker (`verification_info.checker`), or None; raises TaskDataError naming the field."""
    checker = info.get("checker")
    if checker is None:
        return None
    if isinstance(checker, str):
        try:
            checker = json.loads(checker)
        except json.JSONDecodeError:
            raise TaskDataError("verification_info.checker is a string but not JSON") from None
    if not isinstance(checker, dict):
        raise TaskDataError(f"verification_info.checker must be an object, got {type(checker).__name__}")
    language = normalize_language(str(checker.get("language", "")))
    if language not in CHECKER_LANGUAGES:
        raise TaskDataError(
            f"verification_info.checker.language {checker.get('language')!r} is not one of {', '.join(CHECKER_LANGUAGES)}"
        )
    source = checker.get("source")
    if not isinstance(source, str) or not source.strip():
        raise TaskDataError("verification_info.checker.source is missing or empty")
    return Checker(language, source)


def parse_tests(info: dict[str, Any], source: str | None = None) -> tuple[str, list[CodeTest]]:
    """The language and tests of a task (`source`: the row's, for the output convention); raises
    TaskDataError naming the bad field."""
    raw_language = info.get("language", "python")
    language = normalize_language(str(raw_language)) if raw_language else None
    if language is None:
        raise TaskDataError(
            f"verification_info.language {raw_language!r} is not one of python, cpp, rust, javascript"
        )
    cases = info.get("test_cases")
    if isinstance(cases, str):
        try:
            cases = json.loads(cases)
        except json.JSONDecodeError:
            raise TaskDataError("verification_info.test_cases is a string but not JSON") from None
    if not isinstance(cases, list) or not cases:
        raise TaskDataError("verification_info.test_cases is missing or empty")
    convention = output_convention(info, source)
    checked = parse_checker(info) is not None
    tests = []
    for index, case in enumerate(cases):
        where = f"verification_info.test_cases[{index}]"
        if not isinstance(case, dict):
            raise TaskDataError(f"{where} must be an object, got {type(case).__name__}")
        fn_name = case.get("fn_name") or info.get("fn_name")
        kind = case.get("type") or ("function_call" if fn_name else "stdin_stdout")
        if kind not in TEST_TYPES:
            raise TaskDataError(f"{where}.type {kind!r} is not one of {', '.join(TEST_TYPES)}")
        if kind in JUDGED_TYPES:
            tests.extend(_judged_tests(kind, case, where))
            continue
        if "output" not in case:
            raise TaskDataError(f"{where}.output is missing")
        if kind == "stdin_stdout":
            tests.append(
                CodeTest(
                    kind,
                    _text(case.get("input", ""), f"{where}.input"),
                    _text(case["output"], f"{where}.output"),
                    checked=checked,
                )
            )
            continue
        if not fn_name or not isinstance(fn_name, str):
            raise TaskDataError(f"{where}.fn_name is missing for a function_call test")
        args, serialised = _call_args(case.get("input", []), f"{where}.input")
        expected = case["output"]
        if serialised and isinstance(expected, str):
            try:
                expected = json.loads(expected)
            except json.JSONDecodeError:
                pass
        if convention == "taco" and isinstance(expected, list) and len(expected) == 1:
            expected = expected[0]
        tests.append(CodeTest(kind, args, expected, fn_name))
    return language, tests


def _judged_tests(kind: str, case: dict[str, Any], where: str) -> list[CodeTest]:
    code = case.get("code")
    if not isinstance(code, str) or not code.strip():
        raise TaskDataError(f"{where}.code is missing or empty for an {kind} test")
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise TaskDataError(f"{where}.code is not valid Python: {exc.msg} (line {exc.lineno})") from None
    if kind == "assert":
        return [CodeTest(kind, code, None)]
    names = pytest_names(tree, f"{where}.code")
    if not names:
        raise TaskDataError(f"{where}.code defines no test_ functions or Test classes with test_ methods")
    return [CodeTest(kind, code, None, name=name) for name in names]


def pytest_names(tree: ast.Module, where: str) -> list[str]:
    """The tests of a pytest-style module: top-level `test_*` functions, and `test_*` methods of
    top-level `Test*` classes that have no `__init__`. A test may take the arguments its
    `parametrize` marks give it, the module's own fixtures and pytest's capsys (not its other
    built-in fixtures, such as tmp_path or monkeypatch)."""
    names = []
    fixtures = _fixtures(tree, where)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            _check_test_function(node, f"{where}: {node.name}", skip=0, fixtures=fixtures)
            names.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            methods = [
                item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            if any(method.name == "__init__" for method in methods):
                continue  # pytest collects no class with an __init__
            for method in methods:
                if method.name.startswith("test"):
                    _check_test_function(
                        method, f"{where}: {node.name}.{method.name}", skip=1, fixtures=fixtures
                    )
                    names.append(f"{node.name}::{method.name}")
    return names


def _parametrized_names(node: ast.expr) -> list[str]:
    """The argument names of a `parametrize` mark: "a, b" or ("a", "b")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [part.strip() for part in node.value.split(",")]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [
            item.value for item in node.elts if isinstance(item, ast.Constant) and isinstance(item.value, str)
        ]
    return []


BUILT_IN_FIXTURES = frozenset({"capsys"})  # pytest's own fixtures the judge provides


def _fixtures(tree: ast.Module, where: str) -> set[str]:
    """The names of the module's top-level `@pytest.fixture` functions, each checked: no `params`,
    and arguments that are fixtures of the module."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                target = call.func if call else decorator
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
                if name == "fixture":
                    if call is not None and any(keyword.arg == "params" for keyword in call.keywords):
                        raise TaskDataError(
                            f"{where}: fixture {node.name} has params, which are not supported"
                        )
                    found[node.name] = node
    for name, node in found.items():
        arguments = [arg.arg for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        unknown = [
            argument for argument in arguments if argument not in found and argument not in BUILT_IN_FIXTURES
        ]
        if unknown:
            raise TaskDataError(
                f"{where}: fixture {name} takes {', '.join(unknown)}, which are not fixtures of the module"
            )
    return set(found)


def _check_test_function(
    node: ast.FunctionDef | ast.AsyncFunctionDef, where: str, skip: int, fixtures: set[str]
) -> None:
    if isinstance(node, ast.AsyncFunctionDef):
        raise TaskDataError(f"{where} is async, which needs a pytest plugin")
    parametrized = set()
    for decorator in node.decorator_list:
        if (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "parametrize"
            and decorator.args
        ):
            parametrized.update(_parametrized_names(decorator.args[0]))
    arguments = [arg.arg for arg in node.args.posonlyargs + node.args.args][skip:]
    unknown = [name for name in arguments if name not in parametrized | fixtures | BUILT_IN_FIXTURES]
    if unknown:
        raise TaskDataError(
            f"{where} takes {', '.join(unknown)}: neither a parametrize argument nor a fixture of the"
            " module (of pytest's built-in fixtures, only capsys is supported)"
        )
