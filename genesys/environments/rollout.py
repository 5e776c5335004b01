"""Playing one task in its environment: model turn, tool calls or environment step, until done.

`play` asks a chat function (messages and tool schemas -> the assistant's message) for each model
turn, answers tool calls with the tools' results, else calls the environment's `step`, and returns
the `Trajectory`. Every environment call and tool call runs under its deadline: past it, or when the
environment raises, the trajectory ends with an `error` naming the turn. Where the environment's code
runs is its `isolation` (`genesys.environments.isolation`): in this process, a sync method in a
daemon thread (a hung one costs its deadline and a thread, never the run), or in a process of the
rollout's own that a call past its deadline kills.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from genesys.environments.isolation import (
    DeadlinePassed,
    InProcess,
    InThreads,
    ProcessDied,
    RaisedThere,
    host_for,
)
from genesys.environments.tools import Tool, ToolCall, parse_tool_calls, tool_message, tools_of
from genesys.plugins.specs import Environment, Step
from genesys.schema import Task

# The model: the conversation so far and the tools' schemas in, the assistant's message out.
ChatFunction = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Awaitable[dict[str, Any]]]


@dataclass
class Trajectory:
    """A played conversation: its `messages`, the model `turns` taken, why it ended (`done`,
    `max_turns` or `error`) and the error that ended it, naming its turn."""

    messages: list[dict[str, Any]]
    turns: int
    finish_reason: str
    error: str | None = None

    def columns(self) -> dict[str, Any]:
        """The trajectory columns of a rollout row."""
        return {"messages": self.messages, "turns": self.turns, "trajectory_error": self.error}

    @property
    def final_answer(self) -> str:
        """The content of the last assistant message (the row's `llm_response`)."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return message.get("content") or ""
        return ""


class _Ended(Exception):
    """The episode ends in an error (already worded with its turn)."""


async def play(environment: type[Environment], task: Task, chat: ChatFunction) -> Trajectory:
    """Play `task` in a fresh instance of `environment` with the model behind `chat`."""
    tools = tools_of(environment.tools)
    schemas = [item.schema for item in tools.values()]
    messages: list[dict[str, Any]] = []
    turn = 0
    host = host_for(environment)
    try:
        messages = await _open(environment, host, task)
        while turn < environment.max_turns:
            turn += 1
            try:
                reply = await chat(messages, schemas)
            except Exception as exc:  # the model server failed after its retries
                raise _Ended(f"turn {turn}: the model could not be asked: {_one_line(exc)}") from exc
            messages.append(reply)
            calls = parse_tool_calls(reply) if tools else []
            if calls:
                for call in calls:
                    messages.append(await _run_tool(host, tools, call, environment.tool_timeout, turn))
                continue
            step = await _environment_call(host, "step", (task, messages), environment.step_timeout, turn)
            if not isinstance(step, Step):
                raise _Ended(f"turn {turn}: step returned {type(step).__name__}, not a genesys.Step")
            messages.extend(_messages(step.messages, "step", turn))
            if step.done:
                return Trajectory(messages, turn, "done")
    except _Ended as ended:
        return Trajectory(messages, turn, "error", str(ended))
    finally:
        host.close()
    return Trajectory(messages, turn, "max_turns")


async def opening_messages(environment: type[Environment], task: Task) -> list[dict[str, Any]]:
    """The messages a rollout of `task` opens with: `reset` of a fresh instance, run where and under
    the deadline `play` runs it. Raises ValueError naming what went wrong (turn 0)."""
    host = host_for(environment)
    try:
        return await _open(environment, host, task)
    except _Ended as ended:
        raise ValueError(str(ended)) from None
    finally:
        host.close()


async def _open(
    environment: type[Environment], host: InThreads | InProcess, task: Task
) -> list[dict[str, Any]]:
    """Start the environment's instance in `host` and return its opening messages."""
    try:
        await host.start(environment.step_timeout)
    except DeadlinePassed:
        raise _Ended(
            f"turn 0: {environment.__name__}() passed its {environment.step_timeout:g} s deadline"
        ) from None
    except Exception as exc:  # the environment's bug, recorded like one in reset
        raise _Ended(f"turn 0: {environment.__name__}() raised {_one_line(exc)}") from exc
    opening = await _environment_call(host, "reset", (task,), environment.step_timeout, 0)
    return _messages(opening, "reset", 0)


def _messages(value: Any, what: str, turn: int) -> list[dict[str, Any]]:
    """Chat messages an environment returned, copied; anything else ends the episode."""
    if not isinstance(value, list | tuple) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value
    ):
        raise _Ended(f"turn {turn}: {what} returned {value!r:.200}, not a list of chat messages with a role")
    return [dict(message) for message in value]


async def _run_tool(
    host: InThreads | InProcess, tools: dict[str, Tool], call: ToolCall, timeout: float, turn: int
) -> dict[str, Any]:
    """The tool message answering `call`: the result, or an error the model can read. Only a call past
    its deadline (or the loss of the environment's process) ends the episode."""
    if call.problem is not None:
        return tool_message(call, f"error: {call.problem}")
    item = tools.get(call.name or "")
    if item is None:
        return tool_message(
            call, f"error: there is no tool {call.name!r}; the tools are {', '.join(sorted(tools))}"
        )
    try:
        result = await host.tool(item.name, call.arguments, timeout)
    except DeadlinePassed:
        raise _Ended(f"turn {turn}: tool {item.name!r} passed its {timeout:g} s deadline") from None
    except ProcessDied as exc:
        raise _Ended(f"turn {turn}: tool {item.name!r}: {exc}") from None
    except Exception as exc:  # the tool refused its arguments or failed: the model may try again
        return tool_message(call, f"error: {_one_line(exc)}")
    return tool_message(call, result if isinstance(result, str) else _as_text(result))


async def _environment_call(
    host: InThreads | InProcess, name: str, args: tuple[Any, ...], timeout: float, turn: int
) -> Any:
    """An environment method's result; its exception ends the episode like its deadline does."""
    try:
        return await host.method(name, args, timeout)
    except DeadlinePassed:
        raise _Ended(f"turn {turn}: {name} passed its {timeout:g} s deadline") from None
    except ProcessDied as exc:
        raise _Ended(f"turn {turn}: {name}: {exc}") from None
    except Exception as exc:  # the environment's bug, recorded with its turn
        raise _Ended(f"turn {turn}: {name} raised {_one_line(exc)}") from exc


def _as_text(value: Any) -> str:
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    name = exc.type_name if isinstance(exc, RaisedThere) else type(exc).__name__
    return f"{name}: {text}" if text else name
