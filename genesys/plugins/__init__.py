"""Plugins: the hooks (`hookspecs`), what they return (`specs`: Verifier, Environment, TaskSet, BackendSpec) and the
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
    environments,
    new_plugin_manager,
    plugin_commands,
    plugin_infos,
    plugin_problems,
    task_sets,
    verifier_entries,
)
from genesys.plugins.specs import BackendSpec, Environment, Step, TaskSet, Verifier

__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGINS_ENV_VAR",
    "BackendSpec",
    "BrokenPlugin",
    "Environment",
    "PluginError",
    "PluginInfo",
    "PluginManager",
    "PluginWarning",
    "Step",
    "TaskSet",
    "Verifier",
    "VerifierEntry",
    "backend_specs",
    "collect",
    "default_plugin_manager",
    "environments",
    "hookimpl",
    "hookspec",
    "new_plugin_manager",
    "plugin_commands",
    "plugin_infos",
    "plugin_problems",
    "task_sets",
    "verifier_entries",
]
