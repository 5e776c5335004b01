"""A tool-use environment with known behaviour for the environment tests; loaded with
GENESYS_PLUGINS=genesys_toolenv.

`calculator` tasks ask for `a + b` (verification_info); the model may call `add`, and `hang`, a tool
that never returns within its deadline. The score is 1 when the final answer holds the sum.
"""

from __future__ import annotations

import time
from typing import Any

import genesys


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def hang(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: how long to wait
    """
    time.sleep(seconds)
    return "waited"


class Calculator(genesys.Environment):
    """One question; tool calls are answered, the first turn without one ends the episode."""

    task_type = "calculator"
    max_turns = 4
    tools = (add, hang)
    tool_timeout = 1.0

    def score(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Verdict:
        info = task.verification_info
        final = messages[-1].get("content") or ""
        return genesys.Verdict(score=float(str(info["a"] + info["b"]) in final))


class Broken(genesys.Environment):
    """Its step raises: the trajectory ends in an error naming the turn."""

    task_type = "broken_env"

    def step(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Step:
        raise RuntimeError("the environment broke")

    def score(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Verdict:
        return genesys.Verdict(score=1.0)


@genesys.hookimpl
def genesys_environments() -> list[type[genesys.Environment]]:
    return [Calculator, Broken]


class Stubborn(genesys.Environment):
    """Runs in a process of its own (`isolation = "process"`). Each step answers with its process id
    and how many steps it has taken (state kept between turns); a model message `spin` makes the step
    spin for good, `exit` ends the process, `raise` raises; the `hang` tool sleeps."""

    task_type = "stubborn"
    isolation = "process"
    max_turns = 4
    tools = (hang,)
    step_timeout = 1.0
    tool_timeout = 1.0

    def reset(self, task: genesys.Task) -> list[dict[str, Any]]:
        self.steps = 0
        return [{"role": "user", "content": task.prompt}]

    def step(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Step:
        import os

        move = messages[-1].get("content")
        if move == "spin":
            while True:
                pass
        if move == "exit":
            os._exit(3)
        if move == "raise":
            raise ValueError("a bad move")
        self.steps += 1
        return genesys.Step([{"role": "user", "content": f"{os.getpid()} {self.steps}"}])

    def score(self, task: genesys.Task, messages: list[dict[str, Any]]) -> genesys.Verdict:
        return genesys.Verdict(score=1.0)
