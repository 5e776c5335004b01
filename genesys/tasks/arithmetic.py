"""Generated arithmetic tasks with exact answers and worked solutions: the task set `arithmetic`.

`--tasks arithmetic:digits=2,ops=+-,count=2000,seed=0,split=train` makes 2000 distinct problems
`a op b` with operands of exactly `digits` digits (0-9 for one digit) and operators drawn from `ops` (`+`, `-`, `*`).
Each is a `verifiable_math` row whose `ground_truth` is the exact result and whose
`gold_standard_solution` is a short column-by-column derivation ending in `\\boxed{}`, the text
`genesys sft` learns from.

Every problem belongs to exactly one split, decided by a hash of the problem itself (never by the
seed or the count): `heldout` holds about one problem in `HELDOUT_EVERY`, `train` all the others.
Tasks drawn from `split=heldout` therefore never appear in any `split=train` set, whatever their
seeds and counts, so an evaluation on held-out tasks measures problems no training step saw.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

OPERATORS = "+-*"
SPLITS = ("train", "heldout")
HELDOUT_EVERY = 10  # one problem in ten is held out
MAX_DIGITS = 6
# The operands come last, next to where the answer starts.
PROMPT = "Work digit by digit and give the answer in \\boxed{{}}. Compute {a} {op} {b}."
SOURCE = "genesys-arithmetic"


def split_of(a: int, op: str, b: int) -> str:
    """The split problem `a op b` belongs to, fixed by the problem alone."""
    digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
    return "heldout" if int.from_bytes(digest, "big") % HELDOUT_EVERY == 0 else "train"


def evaluate(a: int, op: str, b: int) -> int:
    """The exact value of `a op b`."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}; the operators are {', '.join(OPERATORS)}")


def _digits(value: int, width: int) -> list[int]:
    """The `width` lowest decimal digits of `value`, lowest first."""
    return [(value // 10**i) % 10 for i in range(width)]


def _add_steps(a: int, b: int, width: int) -> list[str]:
    """Column addition, lowest digit first: `x+y+carry=sum`; the sum's tens are the next carry."""
    steps, carry = [], 0
    for x, y in zip(_digits(a, width), _digits(b, width)):
        total = x + y + carry
        steps.append(f"{x}+{y}+{carry}={total}")
        carry = total // 10
    return steps


def _subtract_steps(a: int, b: int, width: int) -> list[str]:
    """Column subtraction of `b` from `a >= b`, lowest digit first: `x-y-borrow=digit`, where a
    column that borrows writes its digit plus 10 (`13-5-0=8`) and the next column subtracts the 1."""
    steps, borrow = [], 0
    for x, y in zip(_digits(a, width), _digits(b, width)):
        new_borrow = int(x - y - borrow < 0)
        steps.append(f"{x + 10 * new_borrow}-{y}-{borrow}={x + 10 * new_borrow - y - borrow}")
        borrow = new_borrow
    return steps


def _multiply_steps(a: int, b: int) -> list[str]:
    """Partial products of `a` by each digit of `b`, then their sum."""
    partials = []
    steps = []
    for place, digit in enumerate(_digits(b, len(str(b)))):
        partial = a * digit * 10**place
        steps.append(f"{a}*{digit * 10**place}={partial}")
        partials.append(partial)
    if len(partials) > 1:
        steps.append("+".join(map(str, partials)) + f"={sum(partials)}")
    return steps


def worked_solution(a: int, op: str, b: int) -> str:
    """A short derivation of `a op b`, digit by digit, ending in `\\boxed{result}`."""
    result = evaluate(a, op, b)
    width = max(len(str(a)), len(str(b)))
    if op == "+":
        steps = _add_steps(a, b, width)
    elif op == "-" and a >= b:
        steps = _subtract_steps(a, b, width)
    elif op == "-":
        steps = [f"{a}-{b}=-({b}-{a})", *_subtract_steps(b, a, width)]
    else:
        steps = _multiply_steps(a, b)
    return "\n".join([*steps, f"{a}{op}{b}={result}", f"\\boxed{{{result}}}"])


def _operands(digits: int) -> range:
    """The numbers of exactly `digits` digits (0 to 9 for one)."""
    return range(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def _check(digits: int, ops: str, count: int, split: str) -> None:
    if not 1 <= digits <= MAX_DIGITS:
        raise ValueError(f"digits must be from 1 to {MAX_DIGITS}, got {digits}")
    if not ops or any(op not in OPERATORS for op in ops):
        raise ValueError(f"ops must be made of {', '.join(OPERATORS)}, got {ops!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    operands = len(_operands(digits))
    available = len(set(ops)) * operands * operands
    expected = available // HELDOUT_EVERY if split == "heldout" else available - available // HELDOUT_EVERY
    if count > expected // 2:
        raise ValueError(
            f"count={count} is too many distinct {split} problems for digits={digits}, ops={ops!r} "
            f"(about {expected} exist); ask for at most {expected // 2}"
        )


def arithmetic_tasks(
    digits: int = 2, ops: str = "+-", count: int = 1000, seed: int = 0, split: str = "train"
) -> list[dict[str, Any]]:
    """`count` distinct arithmetic tasks of `split` in the GENESYS task schema, the same for the same arguments."""
    ops = str(ops)
    _check(digits, ops, count, split)
    rng = random.Random(f"{seed}/{digits}/{ops}/{split}")
    operators = sorted(set(ops), key=OPERATORS.index)
    seen: set[tuple[int, str, int]] = set()
    operands = _operands(digits)
    rows = []
    while len(rows) < count:
        a, op, b = rng.choice(operands), rng.choice(operators), rng.choice(operands)
        if (a, op, b) in seen or split_of(a, op, b) != split:
            continue
        seen.add((a, op, b))
        rows.append(
            {
                "problem_id": f"arithmetic-{a}{op}{b}",
                "source": SOURCE,
                "task_type": "verifiable_math",
                "in_source_id": f"{a}{op}{b}",
                "prompt": PROMPT.format(a=a, op=op, b=b),
                "gold_standard_solution": worked_solution(a, op, b),
                "verification_info": {"ground_truth": str(evaluate(a, op, b))},
                "metadata": {"generator": SOURCE, "split": split, "digits": digits, "seed": seed},
            }
        )
    return rows
