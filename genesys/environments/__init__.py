"""Multi-turn environments: the runtime that plays a task as a conversation (`rollout.play`), the tools a
model may call (`tools`) and the built-in `python` tool (`python_tool`).

The contract a plugin implements, `Environment` and `Step`, lives in `genesys.plugins.specs` (and is
`genesys.Environment`, `genesys.Step`); environments register through the `genesys_environments` hook.
"""

from genesys.environments.rollout import ChatFunction, Trajectory, play
from genesys.environments.tools import Tool, ToolCall, parse_tool_calls, tool, tools_of
from genesys.plugins.specs import Environment, Step

__all__ = [
    "ChatFunction",
    "Environment",
    "Step",
    "Tool",
    "ToolCall",
    "Trajectory",
    "parse_tool_calls",
    "play",
    "tool",
    "tools_of",
]
