"""mkdocs hook: the reference pages made from the code at build time.

- `reference/cli.md`: every built-in command of the `genesys` click group (usage, help, options);
- `reference/config.md`: every key of every command's config model (type, default, flags, help), the
  keys each command renamed, and the options of the built-in verifiers that declare an options model;
- `reference/hooks.md`: the plugin hook specifications.

Everything is reached through stable handles: the `genesys` console script's entry point (its module
holds the click group), the commands' `model` attribute (the config model a command validates, where
`ConfigCommand` keeps it), and the functions pluggy marks as `genesys` hook specifications among the
modules `import genesys` loads. Modules may move inside `genesys/` without this file changing.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import sys
import types
import typing
from typing import Any

import click
from mkdocs.structure.files import File

GENERATED = {
    "reference/cli.md": lambda: cli_page(),
    "reference/config.md": lambda: config_page(),
    "reference/hooks.md": lambda: hooks_page(),
}


def on_files(files: Any, config: Any) -> Any:
    for path, render in GENERATED.items():
        files.append(File.generated(config, path, content=render()))
    return files


# --- helpers ----------------------------------------------------------------------------------------


def _cell(text: Any) -> str:
    """Text fit for one markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: Any) -> str:
    text = str(text)  # a pipe inside a code span does not split a table cell
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _main_group() -> click.Group:
    """The click group behind the `genesys` console script."""
    module_name = "genesys.cli"
    for entry_point in importlib.metadata.entry_points(group="console_scripts", name="genesys"):
        module_name = entry_point.module
        break
    module = importlib.import_module(module_name)
    groups = [value for value in vars(module).values() if isinstance(value, click.Group)]
    if not groups:
        raise RuntimeError(f"no click group in {module_name}, the module of the genesys command")
    return next((group for group in groups if group.name in ("cli", "genesys", "main")), groups[0])


def _plugin_command_names() -> set[str]:
    """Names of the commands installed plugins add: left out of the reference."""
    try:
        from genesys.plugins import plugin_commands
    except ImportError:
        return set()
    return set(plugin_commands())


def _commands(group: click.Group, ctx: click.Context) -> list[tuple[click.Context, click.Command]]:
    found = []
    skip = _plugin_command_names() if ctx.parent is None else set()
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden or name in skip:
            continue
        sub_ctx = click.Context(command, info_name=name, parent=ctx)
        found.append((sub_ctx, command))
        if isinstance(command, click.Group):
            found.extend(_commands(command, sub_ctx))
    return found


def _anchor(path: str) -> str:
    return path.replace(" ", "-")


# --- the command line -------------------------------------------------------------------------------


def cli_page() -> str:
    group = _main_group()
    root = click.Context(group, info_name="genesys")
    lines = [
        "# Command line",
        "",
        "Generated from the `genesys` command itself when this site is built: every built-in command, its",
        "usage and its options. Commands whose settings come from a config model (`generate`, `verify`,",
        "`validate`, `filter`, `train`) take every key of that model as a dotted flag too; the",
        "[configuration reference](config.md) lists each key with its type and default.",
        "",
        "Exit codes: 0 when a run completed (rows with errors included), 2 for usage or input errors",
        "(one line on stderr naming the problem), 130 when interrupted (rerun the same command to continue).",
        "",
        *_command_section(root, group, "genesys"),
    ]
    for ctx, command in _commands(group, root):
        lines += _command_section(ctx, command, ctx.command_path)
    return "\n".join(lines) + "\n"


def _command_section(ctx: click.Context, command: click.Command, path: str) -> list[str]:
    usage = " ".join([path, *command.collect_usage_pieces(ctx)])
    lines = [f"## {path} {{#{_anchor(path)}}}", "", "```text", usage, "```", ""]
    help_text = inspect.cleandoc(command.help or command.short_help or "")
    if help_text:
        lines += [help_text, ""]
    if hasattr(command, "model"):
        section = _anchor(path.removeprefix("genesys "))
        lines += [f"Settings: [every key of `{path}`](config.md#{section}).", ""]
    rows = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or "--help" in param.opts:
            continue
        if isinstance(param, click.Argument):
            rows.append((_code(param.make_metavar(ctx)), "argument", _cell(_argument_help(command))))
            continue
        names = ", ".join(_code(name) for name in [*param.opts, *param.secondary_opts])
        if getattr(param, "count", False):
            value = "flag, repeatable"
        elif getattr(param, "is_flag", False):
            value = "flag"
        else:
            value = _code(param.make_metavar(ctx))
        rows.append((names, value, _cell(getattr(param, "help", "") or "")))
    if rows:
        lines += ["| option | value | meaning |", "| --- | --- | --- |"]
        lines += [f"| {names} | {value} | {meaning} |" for names, value, meaning in rows]
        lines.append("")
    if isinstance(command, click.Group):
        subs = [(name, sub) for name in command.list_commands(ctx) if (sub := command.get_command(ctx, name))]
        lines += ["| command | what it does |", "| --- | --- |"]
        skip = _plugin_command_names() if ctx.parent is None else set()
        lines += [
            f"| [{name}](#{_anchor(f'{path} {name}')}) | {_cell(sub.get_short_help_str(200))} |"
            for name, sub in subs
            if not sub.hidden and name not in skip
        ]
        lines.append("")
    return lines


def _argument_help(command: click.Command) -> str:
    """The help of a config command's positional setting (click arguments carry none)."""
    for info in _fields(getattr(command, "model", None)).values():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("positional"):
            return info.description or ""
    return ""


# --- configuration keys -----------------------------------------------------------------------------


def config_page() -> str:
    group = _main_group()
    root = click.Context(group, info_name="genesys")
    lines = [
        "# Configuration keys",
        "",
        "Generated from the config models when this site is built. A command's TOML file has the shape of",
        "its model: top-level keys, then one table per section (`[sampling]`, `[verify]`, ...). Every key is",
        "also a dotted flag, its words joined by dashes (`sampling.max_tokens` is `--sampling.max-tokens 64`;",
        "a yes/no key without a switch is a pair: `--rollout.filter-groups` / `--rollout.no-filter-groups`);",
        "the flags column gives the shorter aliases.",
        "Flags win over the file; an unknown key, a wrong type or a value out of range is refused before",
        "any work, naming the key and its flag. See [configuration files and flags](../guides/configuration.md).",
        "",
    ]
    for ctx, command in _commands(group, root):
        model = getattr(command, "model", None)
        if model is None or not dataclasses.is_dataclass(model):
            continue
        name = ctx.command_path.removeprefix("genesys ")
        lines += [f"## genesys {name} {{#{_anchor(name)}}}", ""]
        doc = _first_paragraph(model)
        lines += [f"`{model.__name__}`: {doc}" if doc else f"`{model.__name__}`", ""]
        lines += _model_tables(model, _anchor(name))
    lines += _verifier_options()
    return "\n".join(lines) + "\n"


def _verifier_options() -> list[str]:
    """A table per built-in verifier that declares its options as a model (`options_model`)."""
    from genesys.plugins import verifier_entries

    lines = [
        "## Verifier options {#verifier-options}",
        "",
        "Generated from the options models of the built-in verifiers. Options are given as `-O KEY=VALUE`",
        "(or the `[verify] options` table); a verifier is given the options it names, checked against",
        "its model before the run starts. The code verifier's limits are also the `[sandbox]` keys and",
        "their flags (`--time-limit`, ...): one definition, `Limits`, makes all of them.",
        "",
    ]
    header = ["| option | type | default | meaning |", "| --- | --- | --- | --- |"]
    for task_type, entry in sorted(verifier_entries().items()):
        model = getattr(entry.cls, "options_model", None)
        if model is None or not entry.cls.__module__.startswith("genesys."):
            continue
        lines += [f"### {task_type} {{#options-{_anchor(task_type)}}}", "", _first_paragraph(model), ""]
        lines += header
        for name, info in _fields(model).items():
            kind = _type_name(info.annotation)
            constraints = _constraints(info)
            kind += f", {constraints}" if constraints else ""
            lines.append(
                f"| {_code(name)} | {_cell(kind)} | {_default(info)} | {_cell(info.description or '')} |"
            )
        lines.append("")
    return lines


def _first_paragraph(cls: type) -> str:
    doc = inspect.cleandoc(cls.__doc__ or "")
    return " ".join(doc.split("\n\n")[0].split())


def _fields(model: Any) -> dict[str, Any]:
    return getattr(model, "__pydantic_fields__", None) or {}


def _model_tables(model: type, anchor: str) -> list[str]:
    top, sections = [], []
    for field_name, info in _fields(model).items():
        key = info.alias or field_name
        if dataclasses.is_dataclass(info.annotation):
            sections.append((key, info.annotation))
        else:
            top.append(_row(key, info))
    lines = []
    header = ["| key | type | default | flags | meaning |", "| --- | --- | --- | --- | --- |"]
    if top:
        lines += [f"### Top-level keys {{#{anchor}-top}}", "", *header, *top, ""]
    for key, section in sections:
        lines += [f"### [{key}] {{#{anchor}-{key}}}", "", _first_paragraph(section), "", *header]
        lines += [_row(f"{key}.{name}", info) for name, info in _fields(section).items()]
        lines.append("")
    renamed = getattr(model, "renamed", None) or {}
    if renamed:
        lines += [
            f"### Renamed keys {{#{anchor}-renamed}}",
            "",
            "Still read, in a file and as dotted flags, with a warning naming the new key.",
            "",
            "| old key | new key |",
            "| --- | --- |",
            *[f"| {_code(old)} | {_code(new)} |" for old, new in renamed.items()],
            "",
        ]
    return lines


def _row(key: str, info: Any) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    flags = list(extra.get("flags") or [])
    if extra.get("switch"):
        flags.append(extra["switch"][0])
    if extra.get("positional"):
        flags = [f"{extra.get('metavar') or key.upper()}... (arguments)"]
    choices = extra.get("choices")
    kind = _type_name(info.annotation)
    if choices and "Literal" not in str(info.annotation):
        kind += " (" + ", ".join(choices) + ")"
    constraints = _constraints(info)
    if constraints:
        kind += ", " + constraints
    return (
        f"| {_code(key)} | {_cell(kind)} | {_default(info)} | "
        f"{' '.join(_code(flag) for flag in flags)} | {_cell(info.description or '')} |"
    )


def _constraints(info: Any) -> str:
    symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >="}
    found = []
    for item in getattr(info, "metadata", ()):
        for attribute, symbol in symbols.items():
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{symbol} {value}")
    return ", ".join(found)


def _default(info: Any) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        try:
            value = info.default_factory()
        except TypeError:
            return "computed"
        return _code(repr(value)) if isinstance(value, (list, dict, tuple, set)) else "see meaning"
    value = info.default
    if value is None:
        return "unset"
    return _code(repr(value))


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(arg) for arg in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(arg) for arg in args)}]"
    if annotation is type(None):
        return "None"
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


# --- plugin hooks -----------------------------------------------------------------------------------


def hooks_page() -> str:
    import genesys

    project = genesys.hookimpl.project_name
    marker = f"{project}_spec"
    specs: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if not (name == "genesys" or name.startswith("genesys.")) or module is None:
            continue
        for value in list(vars(module).values()):
            if inspect.isclass(value):
                for attribute, function in vars(value).items():
                    if callable(function) and hasattr(function, marker):
                        specs[attribute] = function
    if not specs:
        raise RuntimeError(f"no {project} hook specifications found among the loaded genesys modules")
    lines = [
        "# Plugin hooks",
        "",
        "Generated from the hook specifications when this site is built. A plugin implements any of them",
        "as module-level functions (or methods) decorated with `@genesys.hookimpl`, in a module registered",
        f"under the entry-point group `{project}`. Each hook has a page of its own under",
        "[Plugins](../plugins/index.md): what it is for, what to return, and an example.",
        "",
        "| hook | returns | what it is for |",
        "| --- | --- | --- |",
    ]
    for name, function in sorted(specs.items()):
        returns = inspect.signature(function).return_annotation
        returns = returns if isinstance(returns, str) else _type_name(returns)
        doc = _cell(inspect.getdoc(function) or "")
        page = f"../plugins/hooks/{name}.md"
        lines.append(f"| [`{name}()`]({page}) | {_code(returns)} | {doc} |")
    return "\n".join(lines) + "\n"
