"""Judging a program's output against the expected one.

Text: line by line; trailing whitespace on a line and blank lines at the very end are ignored;
nothing is case-folded or truncated, so a missing or extra line fails. Two tokens that both read as
numbers are equal when the expected one is an integer and the actual one has exactly its value
(`123456789.0` and `1.23456789e8` match `123456789`, `123456790.0` does not: a tolerance would let a
wrong large integer pass), or else within a relative or absolute tolerance of 1e-6; every other
token must match exactly, and so must the whitespace between tokens. A token whose integer part has
a leading zero (`0042`, `00000101`, `-07`) is a digit string, not a number: it must match exactly.
Values (function_call results): JSON values compared structurally, numbers as above (an integer
expected value needs a returned number of exactly its value), booleans only with booleans.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

TOLERANCE = 1e-6
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_SPLIT = re.compile(r"(\s+)")
_LEADING_ZERO = re.compile(r"[+-]?0\d")  # `0042`: a digit string (an id, a binary number), not 42


def _as_number(token: str) -> int | Decimal | None:
    """The exact value of a numeric token, or None when it is not one."""
    if len(token) > 1000 or _LEADING_ZERO.match(token):  # compared as text
        return None
    if _INTEGER.fullmatch(token):
        return int(token)
    return Decimal(token) if _NUMBER.fullmatch(token) else None


def _numbers_close(actual: int | float | Decimal, expected: int | float | Decimal) -> bool:
    """An integer expected value needs an actual one of exactly its value; others get the tolerance."""
    if isinstance(expected, int):
        return actual == expected  # exact, whatever the type of `actual`
    try:
        return math.isclose(float(actual), float(expected), rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    except OverflowError:  # an integer too large for a float: only its exact value matches
        return actual == expected


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _lines_match(actual: str, expected: str) -> bool:
    if actual == expected:
        return True
    a_parts, e_parts = _SPLIT.split(actual), _SPLIT.split(expected)
    if len(a_parts) != len(e_parts):
        return False
    for index, (a, e) in enumerate(zip(a_parts, e_parts)):
        if a == e:
            continue
        if index % 2:  # a separator: whitespace must match exactly
            return False
        a_num, e_num = _as_number(a), _as_number(e)
        if a_num is None or e_num is None or not _numbers_close(a_num, e_num):
            return False
    return True


def compare_output(actual: str, expected: str) -> str | None:
    """None when `actual` matches `expected`; otherwise a short description of the first difference."""
    a_lines, e_lines = _lines(actual), _lines(expected)
    for number, (a, e) in enumerate(zip(a_lines, e_lines), start=1):
        if not _lines_match(a, e):
            return f"line {number}: expected {_clip(e)!s}, got {_clip(a)!s}"
    if len(a_lines) != len(e_lines):
        return f"expected {len(e_lines)} lines, got {len(a_lines)}"
    return None


def values_match(actual: Any, expected: Any) -> bool:
    """Structural equality of JSON values with numeric tolerance; True never equals 1."""
    if isinstance(actual, bool) or isinstance(expected, bool):
        return isinstance(actual, bool) and isinstance(expected, bool) and actual == expected
    if isinstance(actual, (int, float)) and isinstance(expected, (int, float)):
        return _numbers_close(actual, expected)
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(values_match(a, e) for a, e in zip(actual, expected))
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(values_match(actual[k], expected[k]) for k in actual)
    return type(actual) is type(expected) and actual == expected


def _clip(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
