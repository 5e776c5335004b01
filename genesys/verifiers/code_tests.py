"""Reading the tests of a `verifiable_code` task from its `verification_info`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from genesys.verifiers.code_extract import normalize_language

TEST_TYPES = ("stdin_stdout", "function_call")


class TaskDataError(ValueError):
    """verification_info that cannot be used; the message names the field."""


@dataclass
class CodeTest:
    """One test: what goes into the sandbox (`to_sandbox`) and what the output must be."""

    type: str
    input: Any
    expected: Any
    fn_name: str | None = None

    def to_sandbox(self) -> dict[str, Any]:
        test: dict[str, Any] = {"type": self.type, "input": self.input}
        if self.fn_name:
            test["fn_name"] = self.fn_name
        return test


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


def parse_tests(info: dict[str, Any]) -> tuple[str, list[CodeTest]]:
    """The language and tests of a task; raises TaskDataError naming the bad field."""
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
    tests = []
    for index, case in enumerate(cases):
        where = f"verification_info.test_cases[{index}]"
        if not isinstance(case, dict):
            raise TaskDataError(f"{where} must be an object, got {type(case).__name__}")
        fn_name = case.get("fn_name") or info.get("fn_name")
        kind = case.get("type") or ("function_call" if fn_name else "stdin_stdout")
        if kind not in TEST_TYPES:
            raise TaskDataError(f"{where}.type {kind!r} is not one of {', '.join(TEST_TYPES)}")
        if "output" not in case:
            raise TaskDataError(f"{where}.output is missing")
        if kind == "stdin_stdout":
            tests.append(
                CodeTest(
                    kind,
                    _text(case.get("input", ""), f"{where}.input"),
                    _text(case["output"], f"{where}.output"),
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
        tests.append(CodeTest(kind, args, expected, fn_name))
    return language, tests
