"""The `math_python` environment: a math task where the model may run Python (in the sandbox) before it
answers, scored by the `verifiable_math` verifier.

Rows are `verifiable_math` rows under the task type `math_python` (`verification_info.ground_truth`,
optional `answer_format`). Each turn may call the `python` tool; the first turn without a tool call is
the answer, graded like a single completion of the math task. A built-in plugin of its own (entry
point `math_python`).
"""

from __future__ import annotations

from typing import Any

import genesys
from genesys.environments.python_tool import python_tool
from genesys.schema import Rollout
from genesys.verifiers.math import TIMEOUT_S, MathVerifier

SYSTEM = (
    "You may run Python to help you: call the python tool with a whole program, it returns what the "
    "program prints. When you are sure, give the final answer in \\boxed{}."
)


class PythonMath(genesys.Environment):
    """Math with a Python tool; the final message is graded by the math verifier."""

    task_type = "math_python"
    max_turns = 6
    tools = (python_tool(),)
    tool_timeout = 60.0
    timeout = TIMEOUT_S

    def reset(self, task: genesys.Task) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt}]

    def score(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Verdict:
        final = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        rollout = Rollout(
            task_type=MathVerifier.task_type,
            prompt=task.prompt,
            verification_info=task.verification_info,
            completion=final,
        )
        return MathVerifier().verify(rollout)


@genesys.hookimpl
def genesys_environments() -> list[type[genesys.Environment]]:
    return [PythonMath]
