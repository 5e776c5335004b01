"""The built-in `python` tool: the model's code runs in the genesys sandbox, as code verification runs it.

`python_tool()` makes the tool; its sandbox (docker, bwrap, or unsandboxed `subprocess` for
development, as `--sandbox` names them) opens on the first call and serves every call of the process
after it. Each call is one submission: fresh namespaces and the same `Limits` (CPU, memory, processes,
output, wall clock) as a test of a code task, so a hung program is killed by the sandbox at its wall
limit, and the tool's deadline only backs that up.
"""

from __future__ import annotations

import threading
from typing import Any

from genesys.environments.tools import Tool, tool
from genesys.sandbox.limits import Limits

OUTPUT_CHARS = 4000  # what the model is shown of stdout and of stderr


class _SharedSandbox:
    """A sandbox opened on first use and kept for the process; calls run one at a time."""

    def __init__(self, kind: str, limits: Limits, image: str | None) -> None:
        self.kind, self.limits, self.image = kind, limits, image
        self._lock = threading.Lock()
        self._sandbox: Any = None

    def run(self, code: str) -> dict[str, Any]:
        from genesys.sandbox.backends import open_sandbox
        from genesys.sandbox.base import Submission

        with self._lock:
            if self._sandbox is None:
                self._sandbox = open_sandbox(self.kind, limits=self.limits, image=self.image)
            result = self._sandbox.run(
                Submission("python", code, [{"type": "stdin_stdout", "input": ""}], limits=self.limits)
            )
        return (
            result.tests[0] if result.tests else {"status": "runtime_error", "stderr": result.compile_message}
        )


def python_tool(sandbox: str = "auto", limits: Limits | None = None, image: str | None = None) -> Tool:
    """The `python` tool, running code in the sandbox `sandbox` under `limits` (those of a code test
    by default)."""
    shared = _SharedSandbox(sandbox, limits or Limits(), image)

    def python(code: str) -> str:
        """Run a Python program and return what it prints. Variables do not persist between calls.

        Args:
            code: the whole program; print what you want to see.
        """
        report = shared.run(code)
        status = report.get("status", "ok")
        stdout = (report.get("stdout") or "")[-OUTPUT_CHARS:]
        if status == "ok":
            return stdout
        stderr = (report.get("stderr") or "")[-OUTPUT_CHARS:]
        return f"{stdout}\n[{status}] {stderr}".strip()

    return tool(python)
