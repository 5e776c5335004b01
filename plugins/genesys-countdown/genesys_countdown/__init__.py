"""Countdown: reach a target number with + - * / over the given numbers, each used exactly once.

Task rows look like::

    {"task_type": "countdown", "prompt": "...",
     "verification_info": {"numbers": [3, 7, 25, 50], "target": 350}}

The completion answers inside `<answer>...</answer>` (the last such block counts), for instance
`<answer>(50 - 25) * 7 * 3 / 1.5</answer>`.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

import genesys
from genesys_countdown.tasks import genesys_tasks  # the Countdown task generator, registered with this module

__all__ = ["Countdown", "evaluate_expression", "genesys_tasks", "genesys_verifiers"]

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class ExpressionError(ValueError):
    """The answer is not an arithmetic expression over integers with + - * / and parentheses."""


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """Evaluate `text` exactly; return its value and the integer literals it uses."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"not an expression: {exc.msg}") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ExpressionError("division by zero")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ExpressionError(
            f"only integers, + - * / and parentheses are allowed, found {ast.unparse(node)!r}"
        )

    return walk(tree.body), used


class Countdown(genesys.Verifier):
    """Score 1 when the last `<answer>` uses each given number exactly once and equals the target."""

    task_type = "countdown"
    accepted_options = frozenset()
    timeout = 5.0

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        info = rollout.verification_info
        numbers, target = sorted(int(n) for n in info["numbers"]), Fraction(info["target"])
        answers = ANSWER_RE.findall(rollout.completion)
        if not answers:
            return genesys.Verdict(score=0.0, details={"reason": "no_answer"})
        answer = answers[-1].strip()
        try:
            value, used = evaluate_expression(answer)
        except ExpressionError as exc:
            return genesys.Verdict(score=0.0, details={"answer": answer, "reason": str(exc)})
        if sorted(used) != numbers:
            return genesys.Verdict(
                score=0.0, details={"answer": answer, "reason": "numbers_mismatch", "used": used}
            )
        correct = value == target
        return genesys.Verdict(
            score=float(correct),
            details={
                "answer": answer,
                "value": str(value),
                "reason": "correct" if correct else "wrong_value",
            },
        )


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [Countdown]
