"""Plugin discovery: the plugin manager and what its hooks return, by task type or by name.

Plugins are modules (or objects) with `@genesys.hookimpl` functions, found through the entry-point
group `genesys`. The built-in verifiers, task sets and generation backends are registered through the
very same group. A name taken twice is a `PluginError` naming both plugins; names a caller reserves
(the command line's own subcommands) are handed in, so this module knows nothing above it.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pluggy

from genesys.errors import PluginError
from genesys.plugins.hookspecs import PROJECT_NAME, HookSpecs
from genesys.plugins.specs import AUTO, BackendSpec, TaskSet, Verifier

ENTRY_POINT_GROUP = "genesys"
PLUGINS_ENV_VAR = "GENESYS_PLUGINS"  # comma-separated modules to load as plugins without installing them


@dataclass
class PluginInfo:
    """Where a plugin comes from and what it serves."""

    name: str
    version: str | None
    origin: str
    task_types: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class VerifierEntry:
    """A registered verifier class and the plugin that provided it."""

    cls: type[Verifier]
    plugin: str

    @property
    def task_type(self) -> str:
        return self.cls.task_type


def new_plugin_manager(
    load_entry_points: bool = True, extra_plugins: Iterable[Any] = ()
) -> pluggy.PluginManager:
    """A plugin manager with the genesys hook specs, entry-point plugins and `extra_plugins`.

    With `load_entry_points`, the modules named in $GENESYS_PLUGINS are loaded too.
    """
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(HookSpecs)
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        for module_name in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV_VAR, "").split(","))):
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise PluginError(
                    f"${PLUGINS_ENV_VAR} names {module_name!r}, which cannot be imported: {exc}"
                ) from None
            if pm.get_plugin(module_name) is None and not pm.is_registered(module):
                pm.register(module, name=module_name)
    for plugin in extra_plugins:
        pm.register(plugin)
    return pm


@lru_cache(maxsize=1)
def default_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager over the installed plugins."""
    return new_plugin_manager()


def _plugin_origin(pm: pluggy.PluginManager, plugin: Any) -> tuple[str | None, str]:
    for plugin_obj, dist in pm.list_plugin_distinfo():
        if plugin_obj is plugin:
            return dist.version, dist.metadata["Name"]
    module = inspect.getmodule(plugin) or plugin
    return None, getattr(module, "__file__", None) or repr(plugin)


def verifier_entries(pm: pluggy.PluginManager | None = None) -> dict[str, VerifierEntry]:
    """Map each task_type to its verifier; two plugins claiming one task_type is a PluginError."""
    pm = pm or default_plugin_manager()
    entries: dict[str, VerifierEntry] = {}
    for impl in pm.hook.genesys_verifiers.get_hookimpls():
        for cls in impl.function() or ():
            _check_verifier_class(cls, impl.plugin_name)
            previous = entries.get(cls.task_type)
            if previous is not None and previous.cls is not cls:
                raise PluginError(
                    f"task_type {cls.task_type!r} is claimed by two plugins: "
                    f"{previous.plugin} ({_qualname(previous.cls)}) and {impl.plugin_name} ({_qualname(cls)}); "
                    "uninstall one of them"
                )
            entries[cls.task_type] = VerifierEntry(cls=cls, plugin=impl.plugin_name)
    return entries


def _check_verifier_class(cls: Any, plugin_name: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Verifier)):
        raise PluginError(
            f"plugin {plugin_name!r} returned {cls!r} from genesys_verifiers, not a Verifier subclass"
        )
    task_type = getattr(cls, "task_type", None)
    if not isinstance(task_type, str) or not task_type:
        raise PluginError(f"verifier {_qualname(cls)} from plugin {plugin_name!r} has no task_type")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _named_results(
    pm: pluggy.PluginManager, hook: str, kind: str, is_valid: Any, expected: str, taken: Collection[str] = ()
) -> dict[str, Any]:
    """What every plugin's `hook` returns, by `.name`; a name claimed twice (or in `taken`) is a PluginError."""
    found: dict[str, Any] = {}
    owners: dict[str, str] = {name: "genesys" for name in taken}
    for impl in getattr(pm.hook, hook).get_hookimpls():
        for item in impl.function() or ():
            if not is_valid(item):
                raise PluginError(
                    f"plugin {impl.plugin_name!r} returned {item!r} from {hook}, not {expected}"
                )
            if item.name in owners and found.get(item.name) != item:
                raise PluginError(
                    f"{kind} {item.name!r} is claimed by two plugins: {owners[item.name]} and {impl.plugin_name}; uninstall one of them"
                )
            found[item.name] = item
            owners[item.name] = impl.plugin_name
    return found


def backend_specs(pm: pluggy.PluginManager | None = None) -> dict[str, BackendSpec]:
    """Map each backend name to its spec; two plugins claiming one name is a PluginError."""

    def is_valid(spec: Any) -> bool:
        return isinstance(spec, BackendSpec) and bool(spec.name) and spec.name != AUTO

    return _named_results(
        pm or default_plugin_manager(),
        "genesys_backends",
        "backend",
        is_valid,
        f"a BackendSpec with a name other than {AUTO!r}",
    )


def plugin_infos(pm: pluggy.PluginManager | None = None) -> list[PluginInfo]:
    """Every registered plugin with its version, origin and the task types it serves."""
    pm = pm or default_plugin_manager()
    served: dict[str, list[str]] = {}
    for task_type, entry in verifier_entries(pm).items():
        served.setdefault(entry.plugin, []).append(task_type)
    infos = []
    for name, plugin in pm.list_name_plugin():
        version, origin = _plugin_origin(pm, plugin)
        infos.append(
            PluginInfo(name=name, version=version, origin=origin, task_types=sorted(served.get(name, [])))
        )
    return sorted(infos, key=lambda info: info.name)


def task_sets(pm: pluggy.PluginManager | None = None) -> dict[str, TaskSet]:
    """Map each task set name to its TaskSet; two plugins offering one name is a PluginError."""
    return _named_results(
        pm or default_plugin_manager(),
        "genesys_tasks",
        "task set",
        lambda task_set: isinstance(task_set, TaskSet),
        "a TaskSet",
    )


def plugin_commands(pm: pluggy.PluginManager | None = None, reserved: Collection[str] = ()) -> dict[str, Any]:
    """The subcommands plugins add, by name; a name taken twice, or one of `reserved` (the command
    line's own subcommands), is a PluginError."""
    import click

    def is_valid(command: Any) -> bool:
        return isinstance(command, click.Command) and bool(command.name)

    return _named_results(
        pm or default_plugin_manager(),
        "genesys_commands",
        "command",
        is_valid,
        "a named click.Command",
        reserved,
    )
