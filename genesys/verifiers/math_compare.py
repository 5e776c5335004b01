"""Deciding whether a predicted answer is equivalent to the gold answer.

Exact values compare exactly: decimals are read as the rationals they spell, rationals are equal
only when identical, and other closed forms must simplify to the same value (never "equal after
rounding"). A written decimal approximates an irrational or repeating gold only when it carries at
least `MIN_APPROX_DIGITS` significant digits (trailing zeros do not count) and is within one unit of
its last digit, wherever it stands: a bare answer, an entry of a tuple, interval, set or matrix, or
the value of `x = 0.333333`.
Tuples and intervals keep order and open/closed ends; sets ignore order; equations compare as
equations, never by collapsing both sides to `0 = 0`. An equation whose left side is a label (`x`,
`AB`, `|AB|`, `(p, q)`, `V_1 : V_2`, `f(x)`) states its right side, so `(p, q) = (3, 2)` matches
`(3, 2)`; in a chain `x = 5 + 5 + 1 = 11` the last member is the value, when every link after the
label holds (`x = 5 + 5 + 1 = 7 = 11` and `6 = 7 = 5` state nothing). A ratio `a : b` matches
only a gold written as a ratio; a case split matches a case split with the same branches.
"""

from __future__ import annotations

from decimal import Decimal
from itertools import pairwise

import sympy
from latex2sympy2_extended.logic import And
from sympy import Basic, Eq, FiniteSet, Float, Interval, Rational, Tuple, Union
from sympy.core.function import AppliedUndef
from sympy.core.relational import Relational
from sympy.matrices import MatrixBase
from sympy.matrices.expressions import MatrixExpr

from genesys.verifiers.math_parse import KIND_CASES, KIND_EXPR, ParsedAnswer

MIN_APPROX_DIGITS = 6
_INVERSE = {
    sympy.StrictLessThan: sympy.StrictGreaterThan,
    sympy.StrictGreaterThan: sympy.StrictLessThan,
    sympy.LessThan: sympy.GreaterThan,
    sympy.GreaterThan: sympy.LessThan,
}
_COLLECTIONS = (FiniteSet, Tuple, Interval, Union, MatrixBase)


def answers_match(gold: ParsedAnswer, pred: ParsedAnswer) -> bool:
    """Whether `pred` is an acceptable answer for `gold`."""
    if gold.kind == KIND_CASES or pred.kind == KIND_CASES:
        return gold.kind == pred.kind and _same_cases(gold.value, pred.value)
    if gold.kind != KIND_EXPR or pred.kind != KIND_EXPR:
        return gold.kind == pred.kind and gold.text.lower() == pred.text.lower()
    if pred.ratio and not gold.ratio:
        return False  # `3:2` is a ratio only where a ratio was asked for
    if gold.too_costly or pred.too_costly:
        return gold.value == pred.value and gold.percent == pred.percent  # as written, never evaluated
    if gold.percent or pred.percent:
        return any(equivalent(g, p) for g in _percent_readings(gold) for p in _percent_readings(pred))
    return equivalent(gold.value, pred.value)


def _same_cases(gold: tuple, pred: tuple) -> bool:
    """Two case splits with the same branches, in any order: equivalent values, same conditions."""
    if len(gold) != len(pred):
        return False
    unused = list(pred)
    for value, condition in gold:
        match = next(
            (i for i, (v, c) in enumerate(unused) if c == condition and answers_match(value, v)), None
        )
        if match is None:
            return False
        unused.pop(match)
    return True


def case_values(branches: tuple) -> list[ParsedAnswer]:
    """The distinct values of a case split's branches (one when every branch gives the same value)."""
    distinct: list[ParsedAnswer] = []
    for value, _ in branches:
        if not any(answers_match(value, seen) for seen in distinct):
            distinct.append(value)
    return distinct


def stated_value(value: object) -> object:
    """What an answer states: the value of a labelled equation (`(p, q) = (3, 2)` -> `(3, 2)`),
    else the answer itself."""
    if _is_assignment(value):
        stated = _equation_value(value)
        return value if stated is None else stated
    return value


def is_multi_valued(value: object) -> bool:
    """Whether a parsed gold holds several values (a set, tuple, interval, matrix or list)."""
    value = stated_value(value)
    if isinstance(value, (*_COLLECTIONS, sympy.Set)):
        return True
    return isinstance(value, And) and not _is_assignment(value)


def candidate_count(value: object) -> int:
    """How many separate candidate answers a parsed prediction lists (1 for a single value)."""
    if isinstance(value, (FiniteSet, Tuple)):
        return len(value.args)
    return 1


def _percent_readings(answer: ParsedAnswer) -> list[Basic]:
    if not answer.percent:
        return [answer.value]
    return [answer.value, sympy.Mul(answer.value, Rational(1, 100))]


def decimal_shape(value: object) -> tuple[int, int] | None:
    """(significant digits, decimal places) of a decimal number as written, trailing zeros left out
    (`0.3330` -> (3, 3)); None for anything that is not a decimal number."""
    if not isinstance(value, Float):
        return None
    _, digits, exponent = Decimal(str(value)).normalize().as_tuple()
    return len(digits), max(0, -int(exponent))


def _approximates(decimal: object, exact: object) -> bool:
    """A decimal with enough significant digits and a fractional part (`123456.0` is a whole
    number), within one unit of its last digit of an exact number (one written without decimals)."""
    shape = decimal_shape(decimal)
    if shape is None or shape[0] < MIN_APPROX_DIGITS or shape[1] == 0:
        return False
    if not isinstance(exact, Basic) or exact.has(Float) or exact.free_symbols or not exact.is_number:
        return False
    places = shape[1]
    try:
        value = sympy.N(exact.doit(), places + 20)
        return bool(value.is_real) and abs(value - Rational(str(decimal))) < Rational(1, 10**places)
    except (TypeError, ValueError, ArithmeticError):
        return False


def equivalent(gold: object, pred: object) -> bool:
    """Whether two parsed values are mathematically the same answer."""
    gold, pred = _evaluated(_unwrap_single(gold)), _evaluated(_unwrap_single(pred))
    if isinstance(gold, Basic) and gold == pred:
        return True
    if _is_equation_like(gold) or _is_equation_like(pred):
        return _equations_match(gold, pred)
    if (
        isinstance(gold, Relational)
        or isinstance(pred, Relational)
        or isinstance(gold, And)
        or isinstance(pred, And)
    ):
        return _relations_match(gold, pred)
    if isinstance(gold, MatrixBase) or isinstance(pred, MatrixBase):
        return _matrices_match(gold, pred)
    if isinstance(gold, (*_COLLECTIONS, sympy.Set)) or isinstance(pred, (*_COLLECTIONS, sympy.Set)):
        return _collections_match(gold, pred)
    if isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr):
        return _expressions_match(gold, pred)
    return isinstance(gold, Basic) and gold == pred


def _evaluated(value: object) -> object:
    """Matrix arithmetic written out (`A + B`, `I \\cdot I` of explicit matrices) carried out."""
    if isinstance(value, MatrixExpr) and not isinstance(value, MatrixBase):
        try:
            return value.doit()
        except Exception:  # shapes that do not fit: compared as written
            return value
    return value


def _unwrap_single(value: object) -> object:
    """A one-element set or tuple stands for its element."""
    if isinstance(value, (FiniteSet, Tuple)) and len(value.args) == 1:
        return value.args[0]
    return value


# --- equations -----------------------------------------------------------------------------------


def _relations_of(value: object) -> list[Relational]:
    if isinstance(value, And):
        return [arg for arg in value._unsorted_args if isinstance(arg, Relational)]
    return [value] if isinstance(value, Relational) else []


def _is_equation_like(value: object) -> bool:
    relations = _relations_of(value)
    return bool(relations) and all(isinstance(r, Eq) for r in relations)


def _is_label(value: object) -> bool:
    """A name rather than a quantity: a symbol, a product or ratio of symbols (`AB`, `V_1 / V_2`),
    its absolute value (`|AB|`), a function applied to anything (`f(x)`, `f(2)`), or a tuple of
    names (`(p, q)`). Numbers, sums and powers are quantities."""
    if isinstance(value, sympy.Symbol) or isinstance(value, AppliedUndef):
        return True
    if isinstance(value, Tuple):
        return len(value.args) > 0 and all(_is_label(item) for item in value.args)
    if isinstance(value, sympy.Abs):
        return _is_label(value.args[0])
    if isinstance(value, sympy.Pow):
        return value.exp == -1 and _is_label(value.base)
    if isinstance(value, sympy.Mul):
        return all(_is_label(factor) for factor in value.args)
    return False


def _is_assignment(value: object) -> bool:
    """`x = 5`, `AB = 4`, `(p, q) = (3, 2)`, `f(x) = 2x`, `a = b = 5`: an equation chain whose left
    side is a label."""
    relations = _relations_of(value)
    if not relations or not all(isinstance(r, Eq) for r in relations):
        return False
    return _is_label(relations[0].lhs)


def _equation_value(value: object) -> Basic | None:
    """The value an equation states as an answer: its last member, when every link after the
    leading labels holds (`x = 5`, `a = b = 5`, `x = 5 + 5 + 1 = 11`, `7 - 2 = 6 - 1 = 5`); None for
    anything else: a false link (`6 = 5`, `6 = 7 = 5`, `x = 5 + 5 + 1 = 7 = 11`) or an unlabelled
    equation in unknowns (`x + y = 6`)."""
    relations = _relations_of(value)
    sides = [relations[0].lhs] + [r.rhs for r in relations]
    labels = 0
    while labels < len(sides) - 1 and _is_label(sides[labels]):
        labels += 1
    stated = sides[labels:]
    if not labels and any(side.free_symbols for side in stated):
        return None
    if all(equivalent(left, right) for left, right in pairwise(stated)):
        return stated[-1]
    return None


def _equations_match(gold: object, pred: object) -> bool:
    gold_is_eq, pred_is_eq = _is_equation_like(gold), _is_equation_like(pred)
    if gold_is_eq and pred_is_eq:
        if _is_assignment(gold) and _is_assignment(pred):
            if not _same_label(_relations_of(gold)[0].lhs, _relations_of(pred)[0].lhs):
                return False
            gold_value, pred_value = _equation_value(gold), _equation_value(pred)
            return gold_value is not None and pred_value is not None and equivalent(gold_value, pred_value)
        if _same_equation(gold, pred):
            return True
    # An equation that states a value (`x = 5`, `7 - 2 = 5`) matches that value, in either direction.
    gold_value = _equation_value(gold) if gold_is_eq else gold
    pred_value = _equation_value(pred) if pred_is_eq else pred
    return gold_value is not None and pred_value is not None and equivalent(gold_value, pred_value)


def _same_label(gold: Basic, pred: Basic) -> bool:
    """Two labels naming the same thing; a function's argument names do not matter (`f(x)`, `f(n)`)."""
    if isinstance(gold, AppliedUndef) and isinstance(pred, AppliedUndef):
        return gold.func == pred.func and len(gold.args) == len(pred.args)
    return gold == pred


def _same_equation(gold: object, pred: object) -> bool:
    """Two single equations with the same solutions: lhs - rhs agree up to a nonzero constant factor.
    A trivial side (`0 = 0`, `5 = 5`) matches nothing but another trivial one."""
    g_rel, p_rel = _relations_of(gold), _relations_of(pred)
    if len(g_rel) != 1 or len(p_rel) != 1:
        return False
    g = g_rel[0].lhs - g_rel[0].rhs
    p = p_rel[0].lhs - p_rel[0].rhs
    if not g.free_symbols or not p.free_symbols:
        return False
    if _is_zero(g - p):
        return True
    try:
        ratio = sympy.simplify(g / p)
    except Exception:  # sympy may fail on exotic forms; then the equations are not shown equal
        return False
    return not ratio.free_symbols and ratio.is_number and not _is_zero(ratio)


# --- inequalities and sets -----------------------------------------------------------------------


def _as_set(value: object) -> object:
    """An inequality in one variable, or about one quantity (`0 < f(x) < 1`), as the set it
    describes; other values unchanged."""
    relations = _relations_of(value)
    if not relations:
        return value
    if len(set().union(*(r.free_symbols for r in relations))) == 1:
        solved = _solved_set(relations)
        if solved is not None:
            return solved
    subjects = {side for r in relations for side in (r.lhs, r.rhs) if not side.is_number}
    if len(subjects) == 1:
        quantity = {subjects.pop(): sympy.Dummy("t")}
        solved = _solved_set([r.xreplace(quantity) for r in relations])
        if solved is not None:
            return solved
    return value


def _solved_set(relations: list[Relational]) -> sympy.Set | None:
    """The set of values of the one symbol that satisfy all `relations`; None when sympy cannot
    solve them for it (`0 < f(x) < 1` in x)."""
    bounded = _bounded_interval(relations)
    if bounded is not None:
        return bounded
    if any(r.has(AppliedUndef) for r in relations):
        return None  # an unknown function cannot be inverted
    try:
        solved = sympy.And(*relations).as_set()
    except Exception:  # not solvable as a set; compared as relations instead
        return None
    return None if solved.has(sympy.ConditionSet) else solved


_HALF_LINES = {
    sympy.StrictLessThan: lambda bound: Interval.open(-sympy.oo, bound),
    sympy.LessThan: lambda bound: Interval(-sympy.oo, bound),
    sympy.StrictGreaterThan: lambda bound: Interval.open(bound, sympy.oo),
    sympy.GreaterThan: lambda bound: Interval(bound, sympy.oo),
}


def _bounded_interval(relations: list[Relational]) -> sympy.Set | None:
    """Relations that each compare a symbol with a real number (`-2 <= x`, `x < 7`) as the set of
    values they allow, without sympy's general solver (slow on these common answers); None when
    a relation is of any other form."""
    allowed: sympy.Set = Interval(-sympy.oo, sympy.oo)
    for relation in relations:
        kind, subject, bound = type(relation), relation.lhs, relation.rhs
        if subject.is_number and kind in _INVERSE:
            kind, subject, bound = _INVERSE[kind], bound, subject
        if (
            kind not in _HALF_LINES
            or not subject.is_Symbol
            or not (bound.is_number and bound.is_extended_real)
        ):
            return None
        allowed = allowed.intersect(_HALF_LINES[kind](bound))
    return allowed


def _relations_match(gold: object, pred: object) -> bool:
    gold_set, pred_set = _as_set(gold), _as_set(pred)
    if isinstance(gold_set, sympy.Set) and isinstance(pred_set, sympy.Set):
        return _collections_match(gold_set, pred_set)
    g_rel, p_rel = _relations_of(gold), _relations_of(pred)
    if len(g_rel) != len(p_rel) or not g_rel:
        return False
    if len(g_rel) > 1:  # a chain about several quantities: the same relations, in any order
        return _same_elements(g_rel, p_rel)
    g, p = g_rel[0], p_rel[0]
    if type(g) is type(p):
        return _is_zero((g.lhs - g.rhs) - (p.lhs - p.rhs))
    if _INVERSE.get(type(g)) is type(p):
        return _is_zero((g.lhs - g.rhs) + (p.lhs - p.rhs))
    return False


def _matrices_match(gold: object, pred: object) -> bool:
    """Matrices entry by entry (same shape); a vector also matches a tuple of its entries."""
    if isinstance(gold, MatrixBase) and isinstance(pred, MatrixBase):
        if gold.shape != pred.shape:
            return False
        g_items, p_items = list(gold), list(pred)
    else:
        g_items, p_items = ordered_entries(gold), ordered_entries(pred)
    if g_items is None or p_items is None or len(g_items) != len(p_items):
        return False
    return all(equivalent(g, p) for g, p in zip(g_items, p_items))


def ordered_entries(value: object) -> list | None:
    """The entries of a vector, tuple, list or open interval read as a point, in order; None for
    other values."""
    items = _vector_items(value)
    return items if items is not None else _ordered_items(value)


def _vector_items(value: object) -> list | None:
    """The entries of a row/column vector or a tuple, in order; None for other values."""
    if isinstance(value, MatrixBase):
        return list(value) if 1 in value.shape else None
    if isinstance(value, Tuple):
        return list(value.args)
    return None


def _ordered_items(value: object) -> list | None:
    """Entries of an ordered pair or tuple; an open interval `(a, b)` may be a point. Assignments
    (`y = 1, x = 2`) are put in the order of their variables' names, as in (x, y)."""
    if isinstance(value, Tuple):
        items = list(value.args)
    elif isinstance(value, Interval) and value.left_open and value.right_open:
        items = [value.start, value.end]
    elif isinstance(value, FiniteSet):
        items = list(getattr(value, "_unsorted_args", value.args))
    else:
        return None
    names = [str(item.lhs) if isinstance(item, Eq) and item.lhs.is_Symbol else None for item in items]
    if all(names) and len(set(names)) == len(names):
        items = [item for _, item in sorted(zip(names, items), key=lambda pair: pair[0])]
    return items


def _collections_match(gold: object, pred: object) -> bool:
    if isinstance(gold, Interval) and isinstance(pred, Interval):
        return (
            gold.left_open == pred.left_open
            and gold.right_open == pred.right_open
            and equivalent(gold.start, pred.start)
            and equivalent(gold.end, pred.end)
        )
    if isinstance(gold, FiniteSet) and isinstance(pred, FiniteSet):
        if _labelled_parts(gold) and not any(_is_assignment(item) for item in pred.args):
            # `AB = 4, CD = 5` answered `4, 5`: the values name their parts by their order
            g_items, p_items = _written(gold), _written(pred)
            return len(g_items) == len(p_items) and all(equivalent(g, p) for g, p in zip(g_items, p_items))
        return _same_elements(list(gold.args), list(pred.args))
    if (
        isinstance(gold, (Interval, Union))
        and isinstance(pred, FiniteSet)
        and all(_is_inequality(i) for i in pred.args)
    ):
        return _sets_equal(gold, Union(*(_as_set(item) for item in pred.args)))  # `x <= -3 or x >= 2`
    if isinstance(gold, FiniteSet) and isinstance(pred, (Tuple, Interval)):
        items = _ordered_items(pred)
        return items is not None and _same_elements(list(gold.args), items)
    if isinstance(gold, (Tuple, Interval)) and isinstance(pred, (Tuple, Interval, FiniteSet)):
        g_items, p_items = _ordered_items(gold), _ordered_items(pred)
        if g_items is None or p_items is None or len(g_items) != len(p_items):
            return False
        return all(equivalent(g, p) for g, p in zip(g_items, p_items))
    if isinstance(gold, sympy.Set) and isinstance(pred, sympy.Set):
        return _sets_equal(gold, pred)
    return False


def _labelled_parts(value: FiniteSet) -> bool:
    """A list of labelled values with different labels: `AB = 4, CD = 5`."""
    labels = [_relations_of(item)[0].lhs for item in value.args if _is_assignment(item)]
    return len(labels) == len(value.args) > 1 and len(set(labels)) == len(labels)


def _written(value: FiniteSet) -> list:
    """The items of a set in the order they were written."""
    return list(getattr(value, "_unsorted_args", value.args))


def _is_inequality(value: object) -> bool:
    return isinstance(value, Relational) and not isinstance(value, Eq) and len(value.free_symbols) == 1


def _same_elements(gold: list, pred: list) -> bool:
    """Whether two lists hold equivalent elements, in any order (a perfect matching)."""
    if len(gold) != len(pred):
        return False
    unused = list(pred)
    for item in gold:
        match = next((i for i, candidate in enumerate(unused) if equivalent(item, candidate)), None)
        if match is None:
            return False
        unused.pop(match)
    return True


def _sets_equal(gold: sympy.Set, pred: sympy.Set) -> bool:
    if gold == pred:
        return True
    try:
        return bool(gold.symmetric_difference(pred).is_empty)
    except Exception:  # sympy cannot always decide set identities; undecided is not equal
        return False


# --- numbers and expressions ---------------------------------------------------------------------


def _exact_form(value: Basic) -> Basic:
    """`value` with every decimal replaced by the rational it spells and unevaluated wrappers opened."""
    replacements = {f: Rational(str(f)) for f in value.atoms(Float)}
    replacements.update({u: u.args[0] for u in value.atoms(sympy.UnevaluatedExpr)})
    return value.xreplace(replacements) if replacements else value


def _expressions_match(gold: Basic, pred: Basic) -> bool:
    if gold == pred:
        return True
    if _approximates(gold, pred) or _approximates(pred, gold):
        return True
    gold, pred = _align_imaginary_unit(_exact_form(gold), _exact_form(pred))
    if gold == pred:
        return True
    if gold.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or pred.has(
        sympy.oo, -sympy.oo, sympy.zoo, sympy.nan
    ):
        return gold == pred
    if gold.is_Rational and pred.is_Rational:
        return False  # already compared exactly above
    if _clearly_different(gold, pred):
        return False
    return _is_zero(gold - pred)


def _clearly_different(gold: Basic, pred: Basic) -> bool:
    """A cheap refutation before symbolic simplification: the two values, evaluated at one generic
    point to 30 digits, differ by far more than rounding could explain. Inconclusive is False."""
    symbols = sorted(gold.free_symbols | pred.free_symbols, key=str)
    point = {s: Rational(3 + 2 * i, 7 + 3 * i) for i, s in enumerate(symbols)}
    try:
        g = sympy.N(gold.xreplace(point), 30)
        p = sympy.N(pred.xreplace(point), 30)
        if not (g.is_number and p.is_number) or g.has(sympy.nan, sympy.zoo) or p.has(sympy.nan, sympy.zoo):
            return False
        scale = max(1, abs(g), abs(p))
        return bool(abs(g - p) > Rational(1, 10**20) * scale)
    except Exception:  # evaluation failed (undefined at the point, exotic functions): no refutation
        return False


def _align_imaginary_unit(gold: Basic, pred: Basic) -> tuple[Basic, Basic]:
    """Read a symbol `i` on one side as the imaginary unit when the other side has no symbol `i`
    (`e^{i\\pi}` for `-1`, `4i + 3` for `3 + 4i` parsed as complex)."""
    gold_i = [s for s in gold.free_symbols if s.name == "i"]
    pred_i = [s for s in pred.free_symbols if s.name == "i"]
    if pred_i and not gold_i:
        pred = pred.subs(pred_i[0], sympy.I)
    elif gold_i and not pred_i:
        gold = gold.subs(gold_i[0], sympy.I)
    return gold, pred


def _is_zero(difference: Basic) -> bool:
    """Whether an expression is provably zero: exact arithmetic, then simplification, then sympy's
    numeric-and-algebraic zero test. Undecided counts as not zero."""
    try:
        difference = difference.doit()
        if difference == 0:
            return True
        if difference.is_Rational:
            return False
        if sympy.expand(difference) == 0 or sympy.simplify(difference) == 0:
            return True
        return difference.equals(0) is True
    except Exception:  # sympy raises on some exotic forms; undecided is not equal
        return False
