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

from genesys.verifiers.math_extract import GLUED_OR, strip_delimiters
from genesys.verifiers.math_spacing import JUXTAPOSED, THOUSANDS_SEPARATOR, canonical_spacing, without_spacing

MAX_ANSWER_CHARS = 1000
MAX_NESTING = 10  # the LaTeX grammar gets exponentially slow on deeply nested groups
MAX_RESULT_DIGITS = 100_000
MAX_FACTORIAL_ARG = 20_000
MAX_TREE_NODES = 5_000

KIND_EXPR = "expr"
KIND_TEXT = "text"
KIND_CHOICE = "choice"
KIND_CASES = "cases"

_LATEX_CONFIG = LatexExtractionConfig()
_SIZING = re.compile(r"\\displaystyle|\\left\b|\\right\b|\\middle\b")
_STYLED_MATH = re.compile(
    r"\\(?:mathbf|textbf|boldsymbol|bm|mathrm|textrm|text|mathit|textit)\s*\{([^{}a-zA-Z]*)\}"
)
_SYMBOLS = {
    "−": "-",
    "﹣": "-",
    "－": "-",
    "&minus;": "-",
    "×": "\\times ",
    "÷": "\\div ",
    "·": "\\cdot ",
    "π": "\\pi ",
    "∞": "\\infty ",
    "√": "\\sqrt ",
    "≤": "\\le ",
    "≥": "\\ge ",
    "≠": "\\ne ",
    "≈": "\\approx ",
    "∅": "\\emptyset ",
    "\\varnothing": "\\emptyset ",
    "\\langle": "(",
    "\\rangle": ")",
}
# Golds stored with every backslash doubled (`\\frac{1}{2}`, `-2 \\le x`): the command is meant.
_DOUBLED_COMMAND = re.compile(
    r"\\\\(?=(?:frac|dfrac|tfrac|sqrt|text|boxed|le|leq|ge|geq|lt|gt|ne|neq|cdot|times|div|pi|infty|in|cup|cap|"
    r"quad|qquad|approx|pm|mathrm|mbox|circ|left|right)(?![a-zA-Z]))"
)
# Named constants written as text: `\mathrm{e}`, `\text{i}`, `\operatorname{e}`.
_CONSTANT_WRAPPED = re.compile(r"\\(?:mathrm|text|textrm|mathit|operatorname)\s*\{\s*([ei])\s*\}")
_OPERATOR_NAME = re.compile(r"\\operatorname\s*\{\s*([a-zA-Z]+)\s*\}")
_KNOWN_OPERATORS = frozenset(
    "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp gcd lcm max min det".split()
)
# Thousands separators LaTeX writes between groups of exactly three digits: `12,\!345`, `1{,}000`,
# `1\,000`, `11,\! 111,\! 100` (see `math_spacing`). A plain comma or space is a separator only in
# a lone number.
_THOUSANDS_LATEX = re.compile(r"(?<![\d.])\d{1,3}(?:" + THOUSANDS_SEPARATOR + r"\d{3})+(?![\d])")
_LONE_NUMBER = re.compile(
    r"^([-+]?)(?:\\\$|\$|€|£|¥)?\s*([1-9]\d{0,2}(?:([, ])\d{3})(?:\3\d{3})*(?:\.\d+)?)\s*(?:\\\$|\$|€|£|¥)?$"
)
_CURRENCY = re.compile(r"^([-+]?)\s*(?:\\\$|\$|€|£|¥)\s*(?=[\d.])|(?<=\d)\s*(?:\\\$|€|£|¥)$")
# A decimal comma (`1000,99`, `2,74`, `0,111`): one comma, not a thousands group of three digits
# (except after a lone 0) and at least two decimals, so `1,5` stays the list 1, 5.
_DECIMAL_COMMA = re.compile(r"^(-?)(\d+),(\d{2,})$")
# A fraction or binomial of two digits written with spaces, as TeX allows: `\frac 1 2`.
_SPACED_DIGIT_ARGUMENTS = re.compile(r"\\([dt]?frac|binom)\s*(\d)\s*(\d)")
_MIXED_LATEX = re.compile(r"(?<![\d.}^_])(\d+)\s*\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_MIXED_PLAIN = re.compile(r"(?<![\d./^_])(\d+)\s+(\d+)\s*/\s*(\d+)(?![\d/])")
# Numbers still set apart by a space once thousands are joined (`5 6`, `5 (6)`): two values, never one.
_DIGITS_APART = re.compile(r"(?<![\d.^_])\d+(?:\.\d+)?\s+\(?\s*-?\d")  # not `\log_2 8`
_EDGE_SPACING = re.compile(r"^(?:\s*(?:\\quad|\\,))+|(?:(?:\\quad|\\,)\s*)+$")
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)\b")
_DEGREE_NUMBER = re.compile(r"(\d+(?:\.\d+)?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b)")
_PERCENT = re.compile(
    r"^(.*?)\s*(?:\\%|%|\\text\{\s*\\?%\s*\}|\\?\s*(?:percent(?:age)?|pct)\b|\\text\{\s*(?:percent(?:age)?|pct)\s*\})$",
    re.IGNORECASE | re.DOTALL,
)
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b|\^\s*\{\s*\\text\{\s*o\s*\}\s*\}")
_SCIENTIFIC = re.compile(r"(?<![\w\\.])(\d+(?:\.\d+)?)[eE]([+-]?\d+)\b")
_CHOICE = re.compile(r"^\(?([A-E])\)?$")
# A choice named in an answer: `(B)`, also inside `\text{(B)}`; not an argument such as `P(A)`.
_CHOICE_LABEL = re.compile(r"(?<![A-Za-z\\])\(\s*([A-E])\s*\)")
_LABELED_CHOICE = re.compile(r"^\\(?:text|textbf|mathrm)\s*\{\s*\(([A-E])\)\s*\}|^\(([A-E])\)(?=\s)")
_TEXT_WRAPPED = re.compile(r"^\\(?:text|textbf|mathrm|textit|mbox)\s*\{([^{}]*)\}$")
_WORDS = re.compile(r"^[A-Za-z][A-Za-z '\-]*[A-Za-z]$")
_INTEGER = re.compile(r"^-?\d+$")
_SIMPLE_FRACTION = re.compile(r"^(-)?\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}$")
_LONE_DECIMAL = re.compile(r"^-?(\d*)\.(\d+)$")
_ALTERNATIVE_WORD = re.compile(r"\\(?:text|mathrm|textbf)\s*\{\s*(or|and)\s*\}")
_ALTERNATIVE_SPLIT = re.compile(r"\s+(?:or|and)\s+|\\lor\b|\\vee\b", re.IGNORECASE)
_LIST_AND = re.compile(r",\s*(?:\\text\s*\{\s*and\s*\}|and)\s+", re.IGNORECASE)
_REPEATING = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\overline\s*\{(\d+)\}")
# A time of day has two-digit minutes (`12:00`, `7:05`, `9:30 pm`); it is compared as written,
# never as the ratio 12:0. Other `a : b` answers are ratios.
_TIME = re.compile(
    r"^([01]?\d|2[0-4]):(0\d|[0-5]\d(?=\s*(?:\\text\s*\{\s*)?[ap]\.?\s*m))\s*(?:\\text\s*\{\s*)?([ap])?\.?\s*m?\.?\s*\}?$",
    re.IGNORECASE,
)
_RATIO = re.compile(r"\d\s*:\s*\d")
_CASE_CONDITION_NOISE = re.compile(r"\\(?:text|mathrm|textrm|mbox)|[{}\s,;.]|\\[,;:!]|^(?:if|when|for)")
_CASES = re.compile(r"\\begin\{cases\}(.*?)\\end\{cases\}", re.DOTALL)
_CASE_WORDS = re.compile(r"\\text\s*\{\s*(?:if|otherwise|when|for)\b|(?<![a-zA-Z\\])(?:if|otherwise|when)\b")
_APPROX = re.compile(r"\\(?:approx|simeq|thickapprox)(?![a-zA-Z])")
_LABEL_VARIABLE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?$")
_NUMBER_WORDS = {
    word: str(value)
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}
_PLACEHOLDERS = frozenset(
    {"?", "...", "\\ldots", "\\cdots", "\\dots", "_", "\\_", "answer", "blank", "n/a", "none"}
)


class AnswerTooComplex(ValueError):
    """An answer too long or too deeply nested to parse in reasonable time."""


@dataclass(frozen=True)
class ParsedAnswer:
    """An answer ready to compare.

    `kind` is `expr` (a sympy `value`), `text` (words or a time of day, compared case-insensitively),
    `choice` (a multiple-choice letter) or `cases` (a case split: `value` holds (value, condition)
    pairs, the values parsed, the conditions as normalized text). `ratio` marks an answer written as
    a ratio `a : b` (its value is a/b). `too_costly` says why the value may only be compared as written (a power
    tower is never evaluated). `percent` marks a trailing percent sign (the value is the number before
    it). Decimals are sympy Floats, so approximations can be judged by the digits written.
    """

    source: str
    kind: str
    value: object = None
    text: str = ""
    percent: bool = False
    too_costly: str | None = None
    ratio: bool = False

    def describe(self) -> str:
        """The parsed form, as a short string for verdict details."""
        if self.kind == KIND_CASES:
            return "cases:" + "; ".join(
                f"{value.describe()} if {condition}" for value, condition in self.value
            )
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
    text = _written_numbers(strip_delimiters(text))
    text = without_spacing(_SIZING.sub(" ", text))
    text = _CONSTANT_WRAPPED.sub(r"\1", text)
    text = _OPERATOR_NAME.sub(
        lambda m: f"\\{m.group(1)}" if m.group(1) in _KNOWN_OPERATORS else m.group(1), text
    )
    text = _STYLED_MATH.sub(r"\1", text)
    if _TRIG.search(text):  # degrees inside a trigonometric argument are an angle: sin(90° - x)
        text = _DEGREE_NUMBER.sub(r"\\left(\1 \\cdot \\frac{\\pi}{180}\\right)", text)
    text = _DEGREES.sub("", text)
    text = _SCIENTIFIC.sub(lambda m: f"{m.group(1)}\\times 10^{{{m.group(2)}}}", text)
    text = _REPEATING.sub(_repeating_as_fraction, text)
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"(?<!\\)[.;]$|(?<!\\)\\$", "", text).strip()


def _written_numbers(text: str) -> str:
    """Numbers as written by people and datasets, made plain: doubled backslashes, Unicode signs,
    thousands separators (`12,\\!345`, `1{,}000`, a lone `1 000` or `$1,234.50`), a decimal comma
    (`2,74`), mixed numbers (`1 1/2`, `1\\frac{1}{2}` are 3/2) and `\\frac 1 2` with its braces."""
    text = _SPACED_DIGIT_ARGUMENTS.sub(r"\\\1{\2}{\3}", _DOUBLED_COMMAND.sub(r"\\", text))
    for symbol, latex in _SYMBOLS.items():
        text = text.replace(symbol, latex)
    text = _THOUSANDS_LATEX.sub(lambda m: re.sub(r"\D", "", m.group(0)), text.strip())
    text = _CURRENCY.sub(r"\1", text).strip()
    lone = _LONE_NUMBER.match(text)
    if lone:
        return lone.group(1) + lone.group(2).replace(",", "").replace(" ", "")
    decimal = _DECIMAL_COMMA.match(text)
    if decimal and (len(decimal.group(3)) != 3 or decimal.group(2) == "0"):
        return f"{decimal.group(1)}{decimal.group(2)}.{decimal.group(3)}"
    text = _MIXED_LATEX.sub(_mixed_as_fraction, text)
    return _MIXED_PLAIN.sub(_mixed_as_fraction, text)


def _mixed_as_fraction(match: re.Match[str]) -> str:
    """`1 1/2` or `1\\frac{1}{2}` -> `\\frac{3}{2}`; left alone unless the fraction is proper."""
    whole, numerator, denominator = (int(g) for g in match.groups())
    if not 0 < numerator < denominator:
        return match.group(0)
    return f"\\frac{{{whole * denominator + numerator}}}{{{denominator}}}"


def _repeating_as_fraction(match: re.Match[str]) -> str:
    """`0.1\\overline{6}` -> `\\frac{1}{6}` (a repeating decimal is an exact rational)."""
    integer, fixed, period = match.group(1) or "0", match.group(2), match.group(3)
    scale = 10 ** len(fixed)
    value = Fraction(int(integer + fixed), scale) + Fraction(int(period), scale * (10 ** len(period) - 1))
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def split_alternatives(text: str, by_spacing: bool = True) -> list[str]:
    """The distinct parts of an answer joined by "or"/"and" ("5 or 6" -> ["5", "6"], "2 and 2" ->
    ["2"]) or, when `by_spacing`, set apart by spacing alone (`5 \\quad 6`, `5\\,6`, `5 \\text{ } 6`,
    see `math_spacing`); one part when none. A list ending in ", and" (`19, 46, and 82`) stays one list."""
    text = canonical_spacing(GLUED_OR.sub(" or ", _written_numbers(strip_delimiters(text))))
    text = _LIST_AND.sub(", ", _ALTERNATIVE_WORD.sub(lambda m: f" {m.group(1)} ", text))
    pieces = _ALTERNATIVE_SPLIT.split(text)
    if by_spacing and "\\begin" not in text:
        pieces = [part for piece in pieces for part in JUXTAPOSED.split(piece)]
    parts = dict.fromkeys(" ".join(_EDGE_SPACING.sub("", part).split()) for part in pieces)
    return [part for part in parts if part] or [text]


def split_approximation(text: str) -> tuple[str, list[str]]:
    """An answer and the approximations it states: `\\frac{1}{3} \\approx 0.33` -> (`\\frac{1}{3}`,
    [`0.33`]). `x \\approx 11` names its variable, so it is the assignment `x = 11`."""
    parts = [part.strip() for part in _APPROX.split(text.replace("≈", "\\approx "))]
    if len(parts) == 1:
        return text, []
    exact, approximations = parts[0], [part for part in parts[1:] if part]
    if _LABEL_VARIABLE.match(strip_delimiters(exact)) and len(approximations) == 1:
        return f"{exact} = {approximations[0]}", []
    return exact, approximations


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


def choice_labels(text: str) -> tuple[str, ...]:
    """The distinct choices an answer names with parentheses, in order: `(A) or (B)` -> ("A", "B")."""
    return tuple(dict.fromkeys(_CHOICE_LABEL.findall(text)))


def _choice_form(text: str) -> str | None:
    """The letter of a multiple-choice answer: `B`, `(B)`, `\\text{(B)}`, or `(B) 15` with the option's
    value; None when the answer names several choices (`(A) (B) (C)`)."""
    if len(choice_labels(text)) > 1:
        return None
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
        elif (
            isinstance(node, (sympy.factorial, sympy.factorial2, sympy.subfactorial))
            and node.args[0].is_number
        ):
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
    """log10 of the number of digits that evaluating base**exp exactly would write: |exp| times the
    digits of the base's largest integer (numerator or denominator of a rational, any integer a
    radical or sum is made of) or of its magnitude, whichever is more. A base near 1 is no cheaper:
    `(1+10^{-30})^{10^{30}}` is a fraction of 10^31 digits."""
    log_height = abs(_log10_abs(power.base))
    for atom in power.base.atoms(sympy.Rational):
        for part in (atom.p, atom.q):
            if part not in (0, 1, -1):
                log_height = max(log_height, math.log10(abs(part)))
    if log_height == math.inf:
        return math.inf
    if log_height < 1e-12:
        return -math.inf
    return _log10_abs(power.exp) + math.log10(log_height)


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
    clock = _TIME.match(text)
    if clock:
        hour, minute, half = clock.groups()
        return ParsedAnswer(
            source, KIND_TEXT, text=f"{int(hour)}:{minute}{(half or '').lower() + 'm' if half else ''}"
        )
    branches = _case_split(text)
    if branches is not None:
        check_nesting(text)
        return ParsedAnswer(source, KIND_CASES, value=branches, text=text)
    percent = _PERCENT.match(text)
    is_percent = bool(percent and percent.group(1).strip())
    if is_percent:
        text = percent.group(1).strip()
    check_nesting(text)
    if _DIGITS_APART.search(text):
        raise ValueError(f"numbers set apart by spacing are several values: {text!r}")
    value = _simple_number(text)
    if value is None:
        value = _parse_latex(text)
    return ParsedAnswer(
        source,
        KIND_EXPR,
        value=value,
        text=text,
        percent=is_percent,
        too_costly=evaluation_cost_problem(value),
        ratio="\\{" not in text and bool(_RATIO.search(text.rsplit("=", 1)[-1])),
    )


def _case_split(text: str) -> tuple[tuple[ParsedAnswer, str], ...] | None:
    """The branches of a case split, `\\begin{cases} a & cond \\\\ b & cond \\end{cases}` or
    `5 \\text{ if } n \\text{ even}, 6 \\text{ otherwise}`, as (value, condition) pairs; None when
    the answer has no case split."""
    environment = _CASES.search(text)
    if environment:
        rows = [row.partition("&") for row in re.split(r"\\\\", environment.group(1)) if row.strip()]
        pairs = [(value, condition) for value, _, condition in rows]
    elif _CASE_WORDS.search(text):
        pairs = []
        for part in _top_level_split(text):
            word = _CASE_WORDS.search(part)
            pairs.append((part[: word.start()], part[word.start() :]) if word else (part, ""))
    else:
        return None
    return tuple((parse_answer(value.strip()), _case_condition(condition)) for value, condition in pairs)


def _case_condition(condition: str) -> str:
    """A branch condition as comparable text: `\\text{if } n \\text{ is even}` -> `nisEven`-like."""
    compact = _CASE_CONDITION_NOISE.sub("", condition.strip().lower())
    compact = _CASE_CONDITION_NOISE.sub("", compact)
    return "otherwise" if compact in ("otherwise", "else", "") else compact


def _top_level_split(text: str) -> list[str]:
    """`text` split at commas and semicolons outside brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char in ",;" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part for part in parts if part.strip()]


def _parse_latex(text: str) -> sympy.Basic:
    """Parse with math-verify (its LaTeX normalization, then latex2sympy), its timeouts off."""
    parsed = mv_parse(
        "\\boxed{" + text + "}",
        extraction_config=[_LATEX_CONFIG],
        fallback_mode="no_fallback",
        parsing_timeout=None,
    )
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
