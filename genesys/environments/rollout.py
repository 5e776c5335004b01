"""Playing one task in its environment: model turn, tool calls or environment step, until done.

`play` asks a chat function (messages and tool schemas -> the assistant's message) for each model
turn, answers tool calls with the tools' results, else calls the environment's `step`, and returns
the `Trajectory`. Every environment call and tool call runs under its deadline: past it, or when the
environment raises, the trajectory ends with an `error` naming the turn. A sync method runs in a
daemon thread, so a hung one costs its deadline and a thread, never the run (a thread cannot be
killed: code that may hang for good belongs in a tool that runs in the sandbox, like `python`).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

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
    try:
        try:
            env = environment()
        except Exception as exc:  # the environment's bug, recorded like one in reset
            raise _Ended(f"turn 0: {environment.__name__}() raised {_one_line(exc)}") from exc
        opening = await _environment_call(env.reset, (task,), environment.step_timeout, "reset", turn)
        messages = _messages(opening, "reset", turn)
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
                    messages.append(await _run_tool(tools, call, environment.tool_timeout, turn))
                continue
            step = await _environment_call(env.step, (task, messages), environment.step_timeout, "step", turn)
            if not isinstance(step, Step):
                raise _Ended(f"turn {turn}: step returned {type(step).__name__}, not a genesys.Step")
            messages.extend(_messages(step.messages, "step", turn))
            if step.done:
                return Trajectory(messages, turn, "done")
    except _Ended as ended:
        return Trajectory(messages, turn, "error", str(ended))
    return Trajectory(messages, turn, "max_turns")


def _messages(value: Any, what: str, turn: int) -> list[dict[str, Any]]:
    """Chat messages an environment returned, copied; anything else ends the episode."""
    if not isinstance(value, list | tuple) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value
    ):
        raise _Ended(f"turn {turn}: {what} returned {value!r:.200}, not a list of chat messages with a role")
    return [dict(message) for message in value]


async def _run_tool(tools: dict[str, Tool], call: ToolCall, timeout: float, turn: int) -> dict[str, Any]:
    """The tool message answering `call`: the result, or an error the model can read. Only a call past
    its deadline ends the episode."""
    if call.problem is not None:
        return tool_message(call, f"error: {call.problem}")
    item = tools.get(call.name or "")
    if item is None:
        return tool_message(
            call, f"error: there is no tool {call.name!r}; the tools are {', '.join(sorted(tools))}"
        )
    try:
        result = await _bounded(item.validated, (), timeout, f"tool {item.name!r}", turn, call.arguments)
    except _Ended:
        raise
    except Exception as exc:  # the tool refused its arguments or failed: the model may try again
        return tool_message(call, f"error: {_one_line(exc)}")
    return tool_message(call, result if isinstance(result, str) else _as_text(result))


async def _environment_call(
    function: Callable[..., Any], args: tuple[Any, ...], timeout: float, what: str, turn: int
) -> Any:
    """An environment method's result; its exception ends the episode like its deadline does."""
    try:
        return await _bounded(function, args, timeout, what, turn)
    except _Ended:
        raise
    except Exception as exc:  # the environment's bug, recorded with its turn
        raise _Ended(f"turn {turn}: {what} raised {_one_line(exc)}") from exc


async def _bounded(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    timeout: float,
    what: str,
    turn: int,
    kwargs: dict[str, Any] | None = None,
) -> Any:
    """`function(*args, **kwargs)` within `timeout` seconds (a sync one in a daemon thread); past the
    deadline it is an `_Ended` naming `what` and the turn."""
    kwargs = kwargs or {}
    if inspect.iscoroutinefunction(function):
        work: Awaitable[Any] = function(*args, **kwargs)
    else:
        work = _in_daemon_thread(function, args, kwargs)
    try:
        return await asyncio.wait_for(work, timeout)
    except TimeoutError:
        raise _Ended(f"turn {turn}: {what} passed its {timeout:g} s deadline") from None


def _in_daemon_thread(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> asyncio.Future[Any]:
    """Run `function` in a daemon thread (one that cannot hold up the process's exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(method: str, value: Any) -> None:
        if not future.done():
            getattr(future, method)(value)

    def run() -> None:
        try:
            outcome = ("set_result", function(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting side
            outcome = ("set_exception", exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    threading.Thread(target=run, name=f"genesys-{getattr(function, '__name__', 'call')}", daemon=True).start()
    return future


def _as_text(value: Any) -> str:
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
