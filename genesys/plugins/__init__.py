"""Plugins: the hooks (`hookspecs`), what they return (`specs`: Verifier, TaskSet, BackendSpec) and the
registry that collects it from every installed plugin (`registry`). Knows nothing above it.

The names most callers need are importable from here.
"""

from genesys.errors import PluginError, PluginWarning
from genesys.plugins.hookspecs import hookimpl, hookspec
from genesys.plugins.registry import (
    ENTRY_POINT_GROUP,
    PLUGINS_ENV_VAR,
    BrokenPlugin,
    PluginInfo,
    PluginManager,
    VerifierEntry,
    backend_specs,
    collect,
    default_plugin_manager,
    new_plugin_manager,
    plugin_commands,
    plugin_infos,
    plugin_problems,
    task_sets,
    verifier_entries,
)
from genesys.plugins.specs import BackendSpec, TaskSet, Verifier

__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGINS_ENV_VAR",
    "BackendSpec",
    "BrokenPlugin",
    "PluginError",
    "PluginInfo",
    "PluginManager",
    "PluginWarning",
    "TaskSet",
    "Verifier",
    "VerifierEntry",
    "backend_specs",
    "collect",
    "default_plugin_manager",
    "hookimpl",
    "hookspec",
    "new_plugin_manager",
    "plugin_commands",
    "plugin_infos",
    "plugin_problems",
    "task_sets",
    "verifier_entries",
]
