"""genesys: verifiable-reward data.

Write a verifier plugin with `Verifier` and `hookimpl`, a multi-turn one with `Environment`, `Step`
and `tool`; verify rollout files with
`verify_rollouts` or the `genesys verify` command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from genesys.plugins.hookspecs import hookimpl
from genesys.plugins.specs import Environment, Step, Verifier
from genesys.schema import Rollout, Task, Verdict

if TYPE_CHECKING:
    from genesys.verification.api import verify_rollouts

__version__ = "0.1.0"
__all__ = [
    "Environment",
    "Rollout",
    "Step",
    "Task",
    "Verdict",
    "Verifier",
    "hookimpl",
    "tool",
    "verify_rollouts",
    "__version__",
]

# Heavier parts of the API load on first use, so `import genesys` stays light.
_LAZY = {"verify_rollouts": "genesys.verification.api", "tool": "genesys.environments.tools"}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'genesys' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
