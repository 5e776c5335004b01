"""Plugin discovery: the plugin manager and what its hooks return, by task type or by name.

Plugins are modules (or objects) with `@genesys.hookimpl` functions, found through the entry-point
group `genesys`. The built-in verifiers, task sets and generation backends are registered through the
very same group. One helper, `collect`, gathers what every plugin returns from one hook, checks its
type and refuses a name taken twice (a `PluginError` naming both plugins); names a caller reserves
(the command line's own subcommands) are handed in, so this module knows nothing above it.

A plugin that cannot be loaded (its module fails to import, or its hooks do not match the specs) is
skipped with a `PluginWarning` and kept in the manager's `broken` list, so one broken package costs
only what it serves. A plugin that defines a hook under a wrong name, or without `@genesys.hookimpl`,
gets a warning too: otherwise it would silently serve nothing.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import warnings
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pluggy

from genesys.errors import PluginError, PluginWarning
from genesys.plugins.hookspecs import PROJECT_NAME, HookSpecs
from genesys.plugins.specs import AUTO, BackendSpec, Environment, TaskSet, Verifier, environment_verifier

ENTRY_POINT_GROUP = "genesys"
PLUGINS_ENV_VAR = "GENESYS_PLUGINS"  # comma-separated modules to load as plugins without installing them
HOOK_NAMES = tuple(sorted(name for name in vars(HookSpecs) if name.startswith(f"{PROJECT_NAME}_")))


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin that could not be loaded: its entry-point (or module) name, where it comes from, why."""

    name: str
    origin: str
    version: str | None
    error: str

    def describe(self) -> str:
        return f"plugin {self.name!r} ({_from(self.origin, self.version)}) cannot be loaded and is skipped: {self.error}"


@dataclass
class PluginInfo:
    """Where a plugin comes from and what it serves; `error` when it could not be loaded, `warnings`
    when it loaded but something in it looks wrong (a misspelled or unmarked hook)."""

    name: str
    version: str | None
    origin: str
    task_types: list[str] = field(default_factory=list)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.error is not None:
            return f"broken: {self.error}"
        if self.warnings:
            return "warning: " + "; ".join(self.warnings)
        return "ok"


@dataclass(frozen=True)
class VerifierEntry:
    """A registered verifier class and the plugin that provided it."""

    cls: type[Verifier]
    plugin: str

    @property
    def task_type(self) -> str:
        return self.cls.task_type


class PluginManager(pluggy.PluginManager):
    """pluggy's manager over the genesys hook specs, which also remembers the distribution each
    entry-point plugin came from and the plugins that could not be loaded (`broken`)."""

    def __init__(self) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(HookSpecs)
        self.broken: list[BrokenPlugin] = []
        self.distributions: dict[str, tuple[str, str | None]] = {}  # plugin name -> (distribution, version)

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Register every installed plugin of the entry-point `group`; one that cannot be loaded goes to
        `broken`. The names of the plugins loaded."""
        loaded = []
        for dist in list(importlib.metadata.distributions()):
            named: tuple[str, str] | None = None  # read once a plugin is found: parsing METADATA costs
            for entry_point in dist.entry_points:
                if entry_point.group != group or self._known(entry_point.name):
                    continue
                if named is None:
                    metadata = dist.metadata
                    named = (metadata["Name"], metadata["Version"])
                dist_name, version = named
                try:
                    self.register(entry_point.load(), name=entry_point.name)
                except Exception as exc:  # any failure of someone else's package
                    self._broken(entry_point.name, dist_name, version, _one_line(exc))
                    continue
                self.distributions[entry_point.name] = (dist_name, version)
                loaded.append(entry_point.name)
        return loaded

    def load_modules(self, module_names: Iterable[str]) -> list[str]:
        """Register the modules named (as $GENESYS_PLUGINS names them); one that cannot be imported
        goes to `broken`. The names of the plugins loaded."""
        loaded = []
        for module_name in module_names:
            try:
                module = importlib.import_module(module_name)
                if self._known(module_name) or self.is_registered(module):
                    continue
                self.register(module, name=module_name)
            except Exception as exc:
                origin = f"${PLUGINS_ENV_VAR}"
                self._broken(module_name, origin, None, _one_line(exc))
                continue
            loaded.append(module_name)
        return loaded

    def _known(self, name: str) -> bool:
        return self.has_plugin(name) or self.is_blocked(name) or any(b.name == name for b in self.broken)

    def _broken(self, name: str, origin: str, version: str | None, error: str) -> None:
        if self.get_plugin(name) is not None:  # pluggy before 1.7 half-registers a plugin a hook spec refuses
            self.unregister(name=name)
        self.broken.append(BrokenPlugin(name, origin, version, error))

    def origin(self, name: str) -> tuple[str | None, str]:
        """A registered plugin's version and origin: its distribution, else its module's file."""
        if name in self.distributions:
            dist_name, version = self.distributions[name]
            return version, dist_name
        plugin = self.get_plugin(name)
        module = inspect.getmodule(plugin) or plugin
        return None, getattr(module, "__file__", None) or repr(plugin)


def new_plugin_manager(load_entry_points: bool = True, extra_plugins: Iterable[Any] = ()) -> PluginManager:
    """A plugin manager with the genesys hook specs, entry-point plugins and `extra_plugins`.

    With `load_entry_points`, the modules named in $GENESYS_PLUGINS are loaded too, and each plugin
    that could not be loaded, or serves nothing for a wrong name, is a `PluginWarning` of one line.
    """
    pm = PluginManager()
    if load_entry_points:
        loaded = pm.load_entry_points()
        loaded += pm.load_modules(
            filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV_VAR, "").split(",")))
        )
        for broken in pm.broken:
            warnings.warn(broken.describe(), PluginWarning, stacklevel=2)
        for name in loaded:
            if problems := plugin_problems(pm, name):
                version, origin = pm.origin(name)
                warnings.warn(
                    f"plugin {name!r} ({_from(origin, version)}): {'; '.join(problems)}",
                    PluginWarning,
                    stacklevel=2,
                )
    for plugin in extra_plugins:
        pm.register(plugin)
    return pm


@lru_cache(maxsize=1)
def default_plugin_manager() -> PluginManager:
    """The process-wide plugin manager over the installed plugins."""
    return new_plugin_manager()


def plugin_problems(pm: pluggy.PluginManager, name: str) -> list[str]:
    """What looks wrong in the registered plugin `name`: a hook implementation under a name that is no
    genesys hook, a hook function without `@genesys.hookimpl`, and then that it serves nothing."""
    plugin = pm.get_plugin(name)
    callers = pm.get_hookcallers(plugin) or []
    implemented = {caller.name for caller in callers}
    problems = [
        f"{caller.name} is no genesys hook{_did_you_mean(caller.name)}"
        for caller in callers
        if caller.spec is None
    ]
    for attribute in sorted(set(dir(plugin)) - implemented):
        if not difflib.get_close_matches(attribute, HOOK_NAMES, n=1, cutoff=0.85):
            continue
        try:
            value = inspect.getattr_static(plugin, attribute)
        except AttributeError:
            continue
        if inspect.isfunction(value) or isinstance(value, staticmethod | classmethod):
            hint = "" if attribute in HOOK_NAMES else f" and is no genesys hook{_did_you_mean(attribute)}"
            problems.append(f"{attribute} lacks @genesys.hookimpl{hint}")
    if not any(caller.spec is not None for caller in callers):
        problems.append(
            "it serves nothing" if problems else "it implements no genesys hook: it serves nothing"
        )
    return problems


def _did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name, HOOK_NAMES, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _from(origin: str, version: str | None) -> str:
    return f"{origin} {version}" if version else origin


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- what the hooks return ------------------------------------------------------------------------


@dataclass(frozen=True)
class Registered:
    """One item a hook returned, under its name, and the plugin that returned it."""

    item: Any
    plugin: str


def collect(
    pm: pluggy.PluginManager,
    hook: str,
    kind: str,
    is_valid: Callable[[Any], bool],
    expected: str,
    *,
    name_of: Callable[[Any], str] = lambda item: item.name,
    check: Callable[[Any, str], None] | None = None,
    describe: Callable[[Any], str] = lambda item: "",
    reserved: Collection[str] = (),
) -> dict[str, Registered]:
    """What every plugin's `hook` returns, by name (`name_of`).

    An item `is_valid` refuses is a PluginError saying it is not what was `expected`; `check(item,
    plugin)` may refuse more. A name claimed by two plugins, or one of `reserved`, is a PluginError
    naming both (`describe` adds each item's own words); one item returned twice is no clash. A hook
    that raises is a PluginError naming the plugin.
    """
    owners = dict.fromkeys(reserved, "genesys")
    found: dict[str, Registered] = {}
    for impl in getattr(pm.hook, hook).get_hookimpls():
        plugin = impl.plugin_name
        try:
            items = impl.function() or ()
        except Exception as exc:  # a plugin's bug, reported as one line naming it
            raise PluginError(f"plugin {plugin!r} failed in {hook}: {_one_line(exc)}") from exc
        for item in items:
            if not is_valid(item):
                raise PluginError(f"plugin {plugin!r} returned {item!r} from {hook}, not {expected}")
            if check is not None:
                check(item, plugin)
            name = name_of(item)
            previous = found.get(name)
            if name in owners and not (
                previous is not None and (previous.item is item or previous.item == item)
            ):
                words = describe(previous.item) if previous is not None else ""
                raise PluginError(
                    f"{kind} {name!r} is claimed by two plugins: {owners[name]}{words} "
                    f"and {plugin}{describe(item)}; uninstall one of them"
                )
            found[name] = Registered(item, plugin)
            owners[name] = plugin
    return found


def _items(found: dict[str, Registered]) -> dict[str, Any]:
    return {name: entry.item for name, entry in found.items()}


def _has_task_type(cls: type[Verifier] | type[Environment], plugin: str) -> None:
    task_type = getattr(cls, "task_type", None)
    if not isinstance(task_type, str) or not task_type:
        kind = "environment" if issubclass(cls, Environment) else "verifier"
        raise PluginError(f"{kind} {_qualname(cls)} from plugin {plugin!r} has no task_type")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def environment_entries(pm: pluggy.PluginManager | None = None) -> dict[str, Registered]:
    """Map each task_type to its Environment class (`item`) and plugin; two plugins claiming one
    task_type is a PluginError."""
    return collect(
        pm or default_plugin_manager(),
        "genesys_environments",
        "task_type",
        lambda cls: isinstance(cls, type) and issubclass(cls, Environment),
        "an Environment subclass",
        name_of=lambda cls: cls.task_type,
        check=_has_task_type,
        describe=lambda cls: f" ({_qualname(cls)})",
    )


def environments(pm: pluggy.PluginManager | None = None) -> dict[str, type[Environment]]:
    """Map each task_type played as a multi-turn environment to its Environment class."""
    return _items(environment_entries(pm))


def verifier_entries(pm: pluggy.PluginManager | None = None) -> dict[str, VerifierEntry]:
    """Map each task_type to its verifier; two plugins claiming one task_type is a PluginError.

    An environment's task_type is scored by the environment (`environment_verifier`), so a verifier
    and an environment claiming one task_type clash too.
    """
    pm = pm or default_plugin_manager()
    found = collect(
        pm,
        "genesys_verifiers",
        "task_type",
        lambda cls: isinstance(cls, type) and issubclass(cls, Verifier),
        "a Verifier subclass",
        name_of=lambda cls: cls.task_type,
        check=_has_task_type,
        describe=lambda cls: f" ({_qualname(cls)})",
    )
    entries = {
        task_type: VerifierEntry(cls=entry.item, plugin=entry.plugin) for task_type, entry in found.items()
    }
    for task_type, entry in environment_entries(pm).items():
        if task_type in entries:
            taken = entries[task_type]
            raise PluginError(
                f"task_type {task_type!r} is claimed by two plugins: {taken.plugin} (verifier "
                f"{_qualname(taken.cls)}) and {entry.plugin} (environment {_qualname(entry.item)}); "
                "uninstall one of them"
            )
        entries[task_type] = VerifierEntry(cls=environment_verifier(entry.item), plugin=entry.plugin)
    return entries


def task_sets(pm: pluggy.PluginManager | None = None) -> dict[str, TaskSet]:
    """Map each task set name to its TaskSet; two plugins offering one name is a PluginError."""
    return _items(
        collect(
            pm or default_plugin_manager(),
            "genesys_tasks",
            "task set",
            lambda t: isinstance(t, TaskSet),
            "a TaskSet",
        )
    )


def backend_specs(pm: pluggy.PluginManager | None = None) -> dict[str, BackendSpec]:
    """Map each backend name to its spec; two plugins claiming one name is a PluginError."""
    return _items(
        collect(
            pm or default_plugin_manager(),
            "genesys_backends",
            "backend",
            lambda spec: isinstance(spec, BackendSpec) and bool(spec.name) and spec.name != AUTO,
            f"a BackendSpec with a name other than {AUTO!r}",
        )
    )


def plugin_commands(pm: pluggy.PluginManager | None = None, reserved: Collection[str] = ()) -> dict[str, Any]:
    """The subcommands plugins add, by name; a name taken twice, or one of `reserved` (the command
    line's own subcommands), is a PluginError."""
    import click

    return _items(
        collect(
            pm or default_plugin_manager(),
            "genesys_commands",
            "command",
            lambda command: isinstance(command, click.Command) and bool(command.name),
            "a named click.Command",
            reserved=reserved,
        )
    )


def plugin_infos(pm: PluginManager | None = None) -> list[PluginInfo]:
    """Every plugin with its version, origin and the task types it serves (an environment's marked so); the plugins that could not
    be loaded with their error, and those that look wrong with their warnings."""
    pm = pm or default_plugin_manager()
    served: dict[str, list[str]] = {}
    played = environment_entries(pm)
    for task_type, entry in verifier_entries(pm).items():
        served.setdefault(entry.plugin, []).append(
            f"{task_type} (environment)" if task_type in played else task_type
        )
    infos = []
    for name, _plugin in pm.list_name_plugin():
        version, origin = pm.origin(name)
        infos.append(
            PluginInfo(
                name=name,
                version=version,
                origin=origin,
                task_types=sorted(served.get(name, [])),
                warnings=plugin_problems(pm, name),
            )
        )
    for broken in pm.broken:
        infos.append(
            PluginInfo(name=broken.name, version=broken.version, origin=broken.origin, error=broken.error)
        )
    return sorted(infos, key=lambda info: info.name)
