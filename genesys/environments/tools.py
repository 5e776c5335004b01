"""Tools a model may call: typed Python functions, their JSON schemas, and the calls in model output.

A tool is a plain (or `async`) function with type hints; its OpenAI-format schema is made from the
hints (by pydantic) and its docstring (the first paragraph describes the tool, a Google-style `Args:`
section its parameters). Calls are read from the model's output in the Qwen/Hermes format,
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and from the structured `tool_calls` an
OpenAI-compatible server returns when it parses them itself. A call that cannot be read or run
becomes an error message to the model; only a call past its deadline ends the rollout.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class Tool:
    """A callable tool: its name, the function, and the OpenAI-format schema the model is shown."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]
    validated: Callable[..., Any]  # `function` checking (and converting) its arguments by their hints

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)


def tool(function: Callable[..., Any]) -> Tool:
    """The `Tool` for a typed function (usable as a decorator); its schema is made from the type
    hints and the docstring."""
    if isinstance(function, Tool):
        return function
    return _tool(function)


@functools.cache
def _tool(function: Callable[..., Any]) -> Tool:
    from pydantic import TypeAdapter, validate_call

    summary, arguments = _docstring(inspect.getdoc(function) or "")
    parameters = TypeAdapter(function).json_schema()
    parameters.pop("additionalProperties", None)
    for name, prop in parameters.get("properties", {}).items():
        prop.pop("title", None)
        if name in arguments:
            prop["description"] = arguments[name]
    schema = {
        "type": "function",
        "function": {"name": function.__name__, "description": summary, "parameters": parameters},
    }
    return Tool(function.__name__, function, schema, validate_call(function))


def tools_of(functions: Iterable[Callable[..., Any]]) -> dict[str, Tool]:
    """Tools by name; two with one name is a ValueError."""
    tools: dict[str, Tool] = {}
    for function in functions:
        item = tool(function)
        if item.name in tools:
            raise ValueError(f"two tools are named {item.name!r}")
        tools[item.name] = item
    return tools


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph and the `Args:` descriptions of a Google-style docstring."""
    summary = " ".join(doc.split("\n\n", 1)[0].split())
    arguments: dict[str, str] = {}
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if section:
        current = None
        for line in section.group(1).splitlines():
            match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
            if match and (current is None or len(line) - len(line.lstrip()) <= _indent(section.group(1))):
                current = match.group(1)
                arguments[current] = match.group(2).strip()
            elif current is not None and line.strip():
                arguments[current] = f"{arguments[current]} {line.strip()}"
    return summary, arguments


def _indent(block: str) -> int:
    first = block.splitlines()[0]
    return len(first) - len(first.lstrip())


# --- calls in model output ------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool's name and arguments, or `problem` when it could not be read."""

    id: str
    name: str | None
    arguments: dict[str, Any]
    problem: str | None = None


def parse_tool_calls(message: dict[str, Any]) -> list[ToolCall]:
    """The tool calls of an assistant message: its structured `tool_calls`, else the
    `<tool_call>` blocks of its text (an unclosed last block counts, so a cut-off call is reported)."""
    structured = message.get("tool_calls")
    if structured:
        calls = []
        for index, item in enumerate(structured):
            function = item.get("function") or {}
            calls.append(
                _call(item.get("id") or f"call_{index}", function.get("name"), function.get("arguments"))
            )
        return calls
    text = message.get("content") or ""
    calls = []
    for index, match in enumerate(TOOL_CALL.finditer(text)):
        body = match.group(1).strip()
        call_id = f"call_{index}"
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(
                ToolCall(call_id, None, {}, f"the tool call is not valid JSON ({exc.msg}): {body[:200]}")
            )
            continue
        if not isinstance(payload, dict):
            calls.append(
                ToolCall(call_id, None, {}, 'a tool call must be an object {"name": ..., "arguments": {...}}')
            )
            continue
        calls.append(
            _call(call_id, payload.get("name"), payload.get("arguments", payload.get("parameters", {})))
        )
    return calls


def _call(call_id: str, name: Any, arguments: Any) -> ToolCall:
    if isinstance(arguments, str):  # the OpenAI format sends arguments as JSON text
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(
                call_id,
                name if isinstance(name, str) else None,
                {},
                f"the arguments are not valid JSON ({exc.msg})",
            )
    if not isinstance(name, str) or not name:
        return ToolCall(call_id, None, {}, 'the tool call has no "name"')
    if not isinstance(arguments, dict):
        return ToolCall(call_id, name, {}, '"arguments" must be an object')
    return ToolCall(call_id, name, arguments)


def tool_message(call: ToolCall, content: str) -> dict[str, Any]:
    """The tool message answering `call`."""
    message = {"role": "tool", "tool_call_id": call.id, "content": content}
    if call.name is not None:
        message["name"] = call.name
    return message
