"""Grading one completion against a gold answer: extraction, hedging checks, parsing, comparison.

Every verdict carries `details` with the `reason` (`matched`, `mismatch`, `no_answer`,
`empty_answer`, `hedging`, `placeholder`, `unparseable`, `too_complex`), the `extracted` answer and
how it was found under which `answer_format`, and the parsed forms of answer and gold.

An answer that cannot be decided within the CPU budget (`math_budget`) is wrong, reason
`too_complex` with `why`, unless it is the gold as written (after normalization): an answer too
costly to decide must cost the policy its reward, never come back as an error.

A gold is read like an answer: a gold split over several boxes (`\\boxed{1} and \\boxed{2}`) is the
list of its boxes, a gold that is a whole solution (GSM8K's `#### 42`, a Minerva "final answer is")
is read for its final answer like a completion.
"""

from __future__ import annotations

import re
from functools import lru_cache
from itertools import pairwise

import sympy
from latex2sympy2_extended.sets import (
    FiniteSet as WrittenOrderSet,  # remembers the written order
)

from genesys.schema import Verdict
from genesys.verifiers.math_budget import CpuBudget, DecisionTooCostly
from genesys.verifiers.math_compare import (
    answers_match,
    candidate_count,
    case_values,
    decimal_shape,
    is_multi_valued,
    ordered_entries,
    stated_value,
)
from genesys.verifiers.math_extract import (
    DEFAULT_ANSWER_FORMAT,
    LENIENT,
    Box,
    boxed_spans,
    extract_answer,
    is_prose,
)
from genesys.verifiers.math_parse import (
    KIND_CASES,
    KIND_CHOICE,
    KIND_EXPR,
    AnswerTooComplex,
    ParsedAnswer,
    choice_labels,
    is_placeholder,
    normalize,
    parse_answer,
    split_alternatives,
    split_approximation,
)

MAX_BOX_GAP_WORDS = 3  # `\boxed{1} papers and \boxed{2} bins` is one gold; a sentence between boxes is not
_GAP_NOISE = re.compile(r"\\(?:text|mathrm|mbox)\s*\{([^{}]*)\}|\\[a-zA-Z]+|\\.|[$]")


class GoldError(ValueError):
    """A ground truth that cannot be used; the verdict is an error, not a wrong answer."""


@lru_cache(maxsize=8192)
def parse_gold(gold: str) -> ParsedAnswer:
    """The parsed ground truth, cached per gold string (each task's gold is parsed once per worker)."""
    if not gold.strip():
        raise GoldError("ground_truth is empty")
    try:
        return parse_answer(_gold_answer(gold))
    except AnswerTooComplex as exc:
        raise GoldError(f"ground_truth {_quoted(gold)} is too complex to check: {exc}") from None
    except ValueError:
        raise GoldError(f"ground_truth {_quoted(gold)} cannot be parsed as math or text") from None


def _gold_answer(gold: str) -> str:
    """The answer a gold states: its boxes (several boxes set apart by a few words are one list),
    the final answer of a gold written as a solution, else the gold itself."""
    boxes = boxed_spans(gold)
    if boxes:
        return ", ".join(dict.fromkeys(box.content for box in _last_box_group(gold, boxes)))
    extraction = extract_answer(gold, LENIENT)  # a gold is trusted: every form of answer counts
    if extraction.answer and (extraction.method in ("final_answer", "answer_line") or is_prose(gold)):
        return extraction.answer  # `#### 72`, "The final answer is 5", "There are 12 ways"
    try:
        parse_answer(gold)
        return gold
    except ValueError:  # a solution written out: its final answer, when it has one
        return extraction.answer or gold


def _last_box_group(text: str, boxes: list[Box]) -> list[Box]:
    """The last run of boxes separated by at most MAX_BOX_GAP_WORDS words (`\\boxed{1} and
    \\boxed{2}`, `\\boxed{2}, \\boxed{3}`); a box after a longer gap starts a new run."""
    group = [boxes[0]]
    for previous, box in pairwise(boxes):
        gap = _GAP_NOISE.sub(lambda m: f" {m.group(1) or ''} ", text[previous.end : box.start])
        group = group + [box] if len(re.findall(r"[A-Za-z]+", gap)) <= MAX_BOX_GAP_WORDS else [box]
    return group


def _quoted(gold: str) -> str:
    return repr(gold if len(gold) <= 200 else gold[:200] + "...")


def grade(
    gold_text: str,
    completion: str,
    answer_format: str = DEFAULT_ANSWER_FORMAT,
    cpu_budget: float | None = None,
) -> Verdict:
    """Score `completion` against `gold_text`: 1.0 for an equivalent final answer, else 0.0.

    `answer_format` is the extraction policy (`boxed` or `lenient`, see `math_extract`);
    `cpu_budget` the CPU seconds that parsing the gold and deciding the answer may each take
    (None: no budget; armed only in the main thread)."""
    extraction = extract_answer(completion, answer_format)
    try:
        with CpuBudget(cpu_budget):
            gold = parse_gold(gold_text)
    except GoldError as exc:
        return Verdict.failed(f"invalid_ground_truth: {exc}", gold=gold_text)
    except DecisionTooCostly as exc:
        return Verdict.failed(
            f"invalid_ground_truth: ground_truth {_quoted(gold_text)} is too costly to parse: {exc}",
            gold=gold_text,
        )
    try:
        with CpuBudget(cpu_budget):
            score, reason, extra = judge(gold_text, extraction.answer, _distinct_boxes(extraction.boxed))
    except DecisionTooCostly as exc:
        score, reason, extra = _undecided(gold_text, extraction.answer, exc)
    details = {
        "reason": reason,
        "extracted": extraction.answer,
        "extracted_by": extraction.method,
        "answer_format": answer_format,
        "gold": gold_text,
        "gold_parsed": gold.describe(),
        **{key: list(value) if isinstance(value, tuple) else value for key, value in extra},
    }
    return Verdict(score=score, details=details)


def _undecided(gold_text: str, answer: str | None, exc: DecisionTooCostly) -> tuple[float, str, tuple]:
    """The verdict on an answer whose decision ran out of budget: right only when it is the gold as
    written (the one cheap proof of equality left), else wrong because too costly to decide."""
    if answer is not None and _written_form(answer) == _written_form(_gold_answer(gold_text)):
        return 1.0, "matched", (("decided_by", "the gold as written"),)
    return 0.0, "too_complex", (("why", f"{exc}: an answer too costly to decide is wrong"),)


def _written_form(text: str) -> str:
    return "".join(normalize(text).split())


@lru_cache(maxsize=16384)
def judge(gold_text: str, answer: str | None, boxed: tuple[str, ...] = ()) -> tuple[float, str, tuple]:
    """(score, reason, extra details as key-value pairs) for an extracted answer; cached, since
    samples of one task often end in the same answer, so everything returned is immutable. `boxed`
    lists the distinct boxed answers of the completion."""
    gold = parse_gold(gold_text)
    if answer is None:
        return 0.0, "no_answer", ()
    answer = answer.strip()
    if not answer:
        return 0.0, "empty_answer", ()
    gold_multi = gold.kind == KIND_EXPR and is_multi_valued(gold.value)
    if gold_multi and boxed:
        answer = ", ".join(boxed)  # several parts, one box each: "(a) \\boxed{5} (b) \\boxed{7}"
    elif _boxes_disagree(boxed):
        return 0.0, "hedging", (("candidates", boxed),)
    answer, approximations = split_approximation(answer)
    if approximations and not _approximates_all(answer, approximations):
        return 0.0, "hedging", (("candidates", (answer, *approximations)),)
    labels = choice_labels(answer) if gold.kind == KIND_CHOICE else ()
    if len(labels) > 1:  # `(A) (B) (C) (D) (E)`, "(A) or (B)": no single choice
        return 0.0, "hedging", (("candidates", labels),)
    if gold.kind == KIND_EXPR:
        alternatives = split_alternatives(answer)
    elif gold.kind == KIND_CHOICE:  # "A or B"; a label and its option's value (`(C)\ 15`) are one answer
        alternatives = split_alternatives(answer, by_spacing=False)
    else:
        alternatives = [answer]
    if len(alternatives) > 1 and not gold_multi:
        return 0.0, "hedging", (("candidates", tuple(alternatives)),)
    try:
        pred = _parse_prediction(answer, alternatives)
    except AnswerTooComplex as exc:
        return 0.0, "too_complex", (("why", str(exc)),)
    except ValueError:
        return 0.0, "placeholder" if is_placeholder(answer) else "unparseable", ()
    parsed = ("answer_parsed", pred.describe())
    if pred.kind == KIND_CASES and gold.kind != KIND_CASES:
        values = case_values(pred.value)
        if len(values) > 1:
            return 0.0, "hedging", (parsed, ("candidates", tuple(v.describe() for v in values)))
        pred = values[0]
    if pred.kind == KIND_EXPR and not gold_multi and candidate_count(stated_value(pred.value)) > 1:
        return 0.0, "hedging", (parsed, ("candidates", tuple(str(v) for v in stated_value(pred.value).args)))
    if answers_match(gold, pred):
        return 1.0, "matched", (parsed,)
    if pred.too_costly:
        return 0.0, "too_complex", (parsed, ("why", pred.too_costly))
    if is_placeholder(answer) or _is_stray_symbol(gold, pred):
        return 0.0, "placeholder", (parsed,)
    return 0.0, "mismatch", (parsed,)


def _approximates_all(answer: str, approximations: list[str]) -> bool:
    """Whether every stated approximation of `answer` is right to the precision written, entry by
    entry for a tuple or vector: within one unit of its last decimal (`\\frac{1}{3} \\approx 0.33`),
    or rounding to it (`\\sqrt{120} \\approx 11`). `5 \\approx 6` states two values."""
    try:
        exact = _numeric_entries(stated_value(parse_answer(answer).value))
        if exact is None:
            return False
        for text in approximations:
            approx = parse_answer(text)
            entries = _numeric_entries(approx.value) if approx.kind == KIND_EXPR else None
            if entries is None or len(entries) != len(exact):
                return False
            if not all(_within_written_precision(e, a) for e, a in zip(exact, entries)):
                return False
        return True
    except (ValueError, TypeError, ArithmeticError):
        return False


def _numeric_entries(value: object) -> list[sympy.Expr] | None:
    """A number as its one entry, or the entries of a tuple or vector of numbers; None otherwise."""
    entries = ordered_entries(value) or [value]
    return entries if all(isinstance(e, sympy.Expr) and e.is_number for e in entries) else None


def _within_written_precision(exact: sympy.Expr, approx: sympy.Expr) -> bool:
    """`approx` is `exact` to the precision written: one unit of its last decimal, or a half for a
    whole number."""
    shape = decimal_shape(approx)
    tolerance = sympy.Rational(1, 10 ** shape[1]) if shape and shape[1] else sympy.Rational(1, 2)
    return bool(abs(sympy.N(exact, 30) - sympy.N(approx, 30)) <= tolerance)


def _parse_prediction(answer: str, alternatives: list[str]) -> ParsedAnswer:
    """The prediction; "x = 1 or x = 2" becomes the set of its parts."""
    if len(alternatives) == 1:
        return parse_answer(answer)
    values = [parse_answer(part).value for part in alternatives]
    return ParsedAnswer(answer, KIND_EXPR, value=WrittenOrderSet(*values), text=answer)


def _distinct_boxes(boxed: tuple[str, ...]) -> tuple[str, ...]:
    """The boxed answers with repeats (up to whitespace) removed, last one last."""
    if len(boxed) < 2:
        return ()
    distinct = list(dict.fromkeys(" ".join(b.split()) for b in reversed(boxed)))
    return tuple(reversed(distinct)) if len(distinct) > 1 else ()


def _boxes_disagree(distinct: tuple[str, ...]) -> bool:
    """Several different boxed answers that are not all the same answer (hedging across boxes)."""
    if len(distinct) < 2:
        return False
    try:
        final = parse_answer(distinct[-1])
        return not all(answers_match(parse_answer(other), final) for other in distinct[:-1])
    except ValueError:  # an unparseable or too complex extra box: the boxes cannot be shown to agree
        return True


def _is_stray_symbol(gold: ParsedAnswer, pred: ParsedAnswer) -> bool:
    """A lone letter such as `x` or `n` given for a gold that does not involve that letter."""
    if pred.kind != KIND_EXPR or not isinstance(pred.value, sympy.Symbol):
        return False
    gold_symbols = getattr(gold.value, "free_symbols", set()) if gold.kind == KIND_EXPR else set()
    return pred.value not in gold_symbols
