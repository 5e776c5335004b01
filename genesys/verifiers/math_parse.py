"""Turning an answer string (LaTeX or plain text) into a value that can be compared.

Numbers, expressions, equations, sets, intervals and matrices are parsed with math-verify's LaTeX
parser (latex2sympy), with its own timeouts switched off: the engine's killable worker is the
deadline. Cheap guards refuse answers whose parsing would blow up (too long, too deeply nested),
and values whose exact evaluation would (power towers, giant factorials) are marked `too_costly`
so they are only ever compared as written. Words and multiple-choice letters are kept as text.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import mpmath
import sympy
from math_verify import LatexExtractionConfig
from math_verify import parse as mv_parse

from genesys.verifiers.math_extract import strip_delimiters

MAX_ANSWER_CHARS = 1000
MAX_NESTING = 10  # the LaTeX grammar gets exponentially slow on deeply nested groups
MAX_RESULT_DIGITS = 100_000
MAX_FACTORIAL_ARG = 20_000
MAX_TREE_NODES = 5_000

KIND_EXPR = "expr"
KIND_TEXT = "text"
KIND_CHOICE = "choice"

_LATEX_CONFIG = LatexExtractionConfig()
_SPACING = re.compile(r"(?<!\\)\\[,;:!> ]|\\q?quad\b|~|\\displaystyle|\\left\b|\\right\b|\\middle\b")
_STYLED_MATH = re.compile(r"\\(?:mathbf|textbf|boldsymbol|bm|mathrm|textrm|text|mathit|textit)\s*\{([^{}a-zA-Z]*)\}")
_SYMBOLS = {
    "−": "-", "×": "\\times ", "÷": "\\div ", "·": "\\cdot ", "π": "\\pi ", "∞": "\\infty ", "√": "\\sqrt ",
    "≤": "\\le ", "≥": "\\ge ", "≠": "\\ne ", "∅": "\\emptyset ", "\\varnothing": "\\emptyset ",
    "\\langle": "(", "\\rangle": ")",
}
_PERCENT = re.compile(r"^(.*?)\s*(?:\\%|%|\\text\{\s*\\?%\s*\}|\\?\s*percent)$", re.IGNORECASE | re.DOTALL)
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b|\^\s*\{\s*\\text\{\s*o\s*\}\s*\}")
_SCIENTIFIC = re.compile(r"(?<![\w\\.])(\d+(?:\.\d+)?)[eE]([+-]?\d+)\b")
_THOUSANDS_BRACED = re.compile(r"(?<=\d)\{,\}(?=\d{3})")
_CHOICE = re.compile(r"^\(?([A-E])\)?$")
_LABELED_CHOICE = re.compile(r"^\\(?:text|textbf|mathrm)\s*\{\s*\(([A-E])\)\s*\}|^\(([A-E])\)(?=\s)")
_TEXT_WRAPPED = re.compile(r"^\\(?:text|textbf|mathrm|textit|mbox)\s*\{([^{}]*)\}$")
_WORDS = re.compile(r"^[A-Za-z][A-Za-z '\-]*[A-Za-z]$")
_INTEGER = re.compile(r"^-?(?:\d{1,3}(?:,\d{3})+|\d+)$")
_SIMPLE_FRACTION = re.compile(r"^(-)?\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}$")
_LONE_DECIMAL = re.compile(r"^-?(\d*)\.(\d+)$")
_ALTERNATIVE_WORD = re.compile(r"\\(?:text|mathrm|textbf)\s*\{\s*(or|and)\s*\}")
_ALTERNATIVE_SPLIT = re.compile(r"\s+(?:or|and)\s+|\\lor\b|\\vee\b", re.IGNORECASE)
_REPEATING = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\overline\s*\{(\d+)\}")
_NUMBER_WORDS = {
    word: str(value)
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}
_PLACEHOLDERS = frozenset({"?", "...", "\\ldots", "\\cdots", "\\dots", "_", "\\_", "answer", "blank", "n/a", "none"})


class AnswerTooComplex(ValueError):
    """An answer too long or too deeply nested to parse in reasonable time."""


@dataclass(frozen=True)
class ParsedAnswer:
    """An answer ready to compare.

    `kind` is `expr` (a sympy `value`), `text` (words, compared case-insensitively) or `choice` (a
    multiple-choice letter). `too_costly` says why the value may only be compared as written (a power
    tower is never evaluated). `percent` marks a trailing percent sign (the value is the number before
    it). `decimal` holds (significant digits, decimal places) when the answer is one written-out
    decimal number, so approximations can be judged by the precision actually given.
    """

    source: str
    kind: str
    value: object = None
    text: str = ""
    percent: bool = False
    decimal: tuple[int, int] | None = None
    too_costly: str | None = None

    def describe(self) -> str:
        """The parsed form, as a short string for verdict details."""
        if self.kind != KIND_EXPR:
            return f"{self.kind}:{self.text}"
        rendered = _safe_str(self.value)
        return f"{rendered}%" if self.percent else rendered


def _safe_str(value: object) -> str:
    try:
        text = str(value)
    except Exception:  # printing a pathological sympy tree may fail; the details are only informative
        return "<unprintable>"
    return text if len(text) <= 300 else text[:300] + "..."


def _quiet_math_verify() -> None:
    """Silence math-verify's warning that its own timeouts are off (the engine enforces deadlines)."""
    for name in ("math_verify", "math_verify.parser", "math_verify.grader", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)


_quiet_math_verify()  # deadlines come from the engine, so math-verify runs with its timeouts off


def normalize(text: str) -> str:
    """Light LaTeX clean-up that math-verify's own normalization does not cover."""
    text = strip_delimiters(text)
    for symbol, latex in _SYMBOLS.items():
        text = text.replace(symbol, latex)
    text = _SPACING.sub(" ", text)
    text = _STYLED_MATH.sub(r"\1", text)
    text = _THOUSANDS_BRACED.sub("", text)
    text = _DEGREES.sub("", text)
    text = _SCIENTIFIC.sub(lambda m: f"{m.group(1)}\\times 10^{{{m.group(2)}}}", text)
    text = _REPEATING.sub(_repeating_as_fraction, text)
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"(?<!\\)[.;]$", "", text).strip()


def _repeating_as_fraction(match: re.Match[str]) -> str:
    """`0.1\\overline{6}` -> `\\frac{1}{6}` (a repeating decimal is an exact rational)."""
    integer, fixed, period = match.group(1) or "0", match.group(2), match.group(3)
    scale = 10 ** len(fixed)
    value = Fraction(int(integer + fixed), scale) + Fraction(int(period), scale * (10 ** len(period) - 1))
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def split_alternatives(text: str) -> list[str]:
    """The distinct parts of an answer joined by "or"/"and" ("5 or 6" -> ["5", "6"], "2 and 2" ->
    ["2"]); one part when none."""
    text = _ALTERNATIVE_WORD.sub(lambda m: f" {m.group(1)} ", strip_delimiters(text))
    parts = dict.fromkeys(" ".join(part.split()) for part in _ALTERNATIVE_SPLIT.split(text))
    return [part for part in parts if part] or [text]


def is_placeholder(text: str) -> bool:
    """Whether an answer is a placeholder rather than a value (`?`, `\\ldots`, `\\text{answer}`)."""
    inner = _TEXT_WRAPPED.match(text.strip())
    core = (inner.group(1) if inner else text).strip().lower()
    return core in _PLACEHOLDERS


def _text_form(text: str) -> str | None:
    """The words of a text answer (`\\text{yes}`, `Monday`), or None when it looks like math."""
    inner = _TEXT_WRAPPED.match(text)
    candidate = inner.group(1).strip() if inner else text
    if _WORDS.match(candidate) and sum(c.isalpha() for c in candidate) >= (2 if inner else 3):
        return " ".join(candidate.lower().split())
    return None


def _choice_form(text: str) -> str | None:
    """The letter of a multiple-choice answer: `B`, `(B)`, `\\text{(B)}`, or `(B) 15` with the option's value."""
    inner = _TEXT_WRAPPED.match(text)
    match = _CHOICE.match((inner.group(1) if inner else text).strip())
    if match:
        return match.group(1)
    labeled = _LABELED_CHOICE.match(text)
    return (labeled.group(1) or labeled.group(2)) if labeled else None


def check_nesting(text: str) -> None:
    """Raise AnswerTooComplex for answers too long or too deeply nested to parse quickly."""
    if len(text) > MAX_ANSWER_CHARS:
        raise AnswerTooComplex(f"answer has {len(text)} characters (limit {MAX_ANSWER_CHARS})")
    depth = deepest = 0
    for char in text:
        if char in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")}]":
            depth = max(0, depth - 1)
    if deepest > MAX_NESTING:
        raise AnswerTooComplex(f"answer nests {deepest} levels deep (limit {MAX_NESTING})")


def evaluation_cost_problem(value: object) -> str | None:
    """Why evaluating `value` exactly would be too costly (a power tower, a giant factorial, an
    enormous tree), or None when it is cheap enough."""
    if not isinstance(value, sympy.Basic):
        return None
    nodes = 0
    for node in sympy.preorder_traversal(value):
        nodes += 1
        if nodes > MAX_TREE_NODES:
            return f"expression has more than {MAX_TREE_NODES} nodes"
        if isinstance(node, sympy.Pow) and node.base.is_number and node.exp.is_number:
            log_digits = _log10_power_digits(node)
            if log_digits > math.log10(MAX_RESULT_DIGITS):
                return f"power with about 10^{log_digits:.3g} digits (limit {MAX_RESULT_DIGITS})"
        elif isinstance(node, (sympy.factorial, sympy.factorial2, sympy.subfactorial)) and node.args[0].is_number:
            if _log10_abs(node.args[0]) > math.log10(MAX_FACTORIAL_ARG):
                return f"factorial of a number above {MAX_FACTORIAL_ARG}"
    return None


def _log10_abs(value: sympy.Basic) -> float:
    """log10 of |value| without overflowing floats (-inf for zero, inf when it cannot be evaluated)."""
    try:
        magnitude = abs(sympy.N(value, 15)._to_mpmath(60))
        return -math.inf if magnitude == 0 else float(mpmath.log10(magnitude))
    except (TypeError, ValueError, AttributeError, OverflowError):
        return math.inf


def _log10_power_digits(power: sympy.Pow) -> float:
    """log10 of the number of digits of an integer-like power base**exp."""
    log_base = _log10_abs(power.base)
    if log_base == -math.inf or abs(log_base) < 1e-12:
        return -math.inf
    return _log10_abs(power.exp) + math.log10(abs(log_base))


@lru_cache(maxsize=4096)
def parse_answer(text: str) -> ParsedAnswer:
    """Parse one answer. Raises AnswerTooComplex for pathological inputs and ValueError when the
    answer is neither math nor text."""
    source = text
    text = normalize(text)
    if not text:
        raise ValueError("empty answer")
    wrapped = _TEXT_WRAPPED.match(text)
    text = _NUMBER_WORDS.get((wrapped.group(1) if wrapped else text).strip().lower(), text)
    choice = _choice_form(text)
    if choice is not None:
        return ParsedAnswer(source, KIND_CHOICE, text=choice)
    words = _text_form(text)
    if words is not None:
        return ParsedAnswer(source, KIND_TEXT, text=words)
    percent = _PERCENT.match(text)
    is_percent = bool(percent and percent.group(1).strip())
    if is_percent:
        text = percent.group(1).strip()
    decimal = _LONE_DECIMAL.match(text)
    check_nesting(text)
    value = _simple_number(text)
    if value is None:
        value = _parse_latex(text)
    return ParsedAnswer(
        source,
        KIND_EXPR,
        value=value,
        text=text,
        percent=is_percent,
        decimal=_decimal_precision(decimal) if decimal else None,
        too_costly=evaluation_cost_problem(value),
    )


def _parse_latex(text: str) -> sympy.Basic:
    """Parse with math-verify (its LaTeX normalization, then latex2sympy), its timeouts off."""
    parsed = mv_parse("\\boxed{" + text + "}", extraction_config=[_LATEX_CONFIG], fallback_mode="no_fallback", parsing_timeout=None)
    if not parsed:
        raise ValueError(f"cannot parse {text!r}")
    return parsed[0]


def _simple_number(text: str) -> sympy.Basic | None:
    """Plain integers, decimals and `\\frac{a}{b}` without the LaTeX grammar (the common case, and
    the grammar is slow); None for anything else."""
    if _INTEGER.match(text):
        return sympy.Integer(text.replace(",", ""))
    if _LONE_DECIMAL.match(text):
        return sympy.Float(text, max(15, len(text)))
    fraction = _SIMPLE_FRACTION.match(text)
    if fraction and int(fraction.group(3)) != 0:
        sign = -1 if fraction.group(1) else 1
        return sympy.Rational(sign * int(fraction.group(2)), int(fraction.group(3)))
    return None


def _decimal_precision(match: re.Match[str]) -> tuple[int, int]:
    integer, fraction = match.group(1), match.group(2)
    digits = (integer + fraction).lstrip("0")
    return len(digits), len(fraction)
