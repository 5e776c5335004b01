"""Command-line flags made from the config models, and a command's config from a TOML file plus flags.

Every leaf setting of a command's model becomes one click option named by its dotted key, spelled
with dashes as every flag is (`--sampling.max-tokens` for the key `sampling.max_tokens`), with the
aliases the model declares (`--max-tokens`); a `switch` becomes a flag of its own that sets a
constant (`--no-chat-template`), and a yes/no setting without one is a pair of switches
(`--gradient-checkpointing` / `--no-gradient-checkpointing`). `--config FILE` reads a TOML file of
the same shape; flags given on the command line win over it. The model then validates the whole: an
unknown key or a bad value is one InputError naming the key and its flag. The key's own spelling
with underscores (`--sampling.max_tokens`, `--gradient_checkpointing BOOL`) still works, hidden from
the help, with a warning naming the dashed flag. A key the model lists as renamed (`renamed`) is
still read from the file and as its old dotted flag (hidden from the help), with a warning naming
the new key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import click

from genesys.config import load_toml, merge, upgrade, validate
from genesys.config.options import parse_key_values
from genesys.errors import ConfigDeprecationWarning


@dataclass(frozen=True)
class Setting:
    """One leaf of a config model: its dotted key and how it is written on the command line."""

    key: tuple[str, ...]
    annotation: Any
    help: str
    default: Any
    flags: tuple[str, ...]
    switch: tuple[str, Any, str] | None
    metavar: str | None
    choices: tuple[str, ...] | None
    positional: bool

    @property
    def dotted(self) -> str:
        return ".".join(self.key)

    @property
    def dest(self) -> str:
        return "cfg__" + "__".join(self.key)

    @property
    def shape(self) -> str:
        """How values are written: "value", "list" (repeatable, or several after one flag), "csv" or "mapping"."""
        base = _without_none(self.annotation)
        origin = typing.get_origin(base)
        if origin is dict:
            return "mapping"
        if origin is list:
            return "csv" if self.metavar and "," in self.metavar else "list"
        return "value"

    @property
    def dashed(self) -> str:
        """The flag of the dotted key, spelled with dashes: `--rollout.prompts-per-step`."""
        return "--" + ".".join(part.replace("_", "-") for part in self.key)

    @property
    def underscored(self) -> str | None:
        """The dotted key's own spelling as a flag, when it differs from `dashed` (a deprecated alias)."""
        flag = f"--{self.dotted}"
        return None if flag == self.dashed else flag

    @property
    def is_yes_no(self) -> bool:
        """A bool setting without a switch of its own: written as a pair of switches."""
        return self.switch is None and _without_none(self.annotation) is bool and not self.positional

    @property
    def negated(self) -> str:
        """The switch that turns a yes/no setting off: `--no-gradient-checkpointing`, `--loss.no-scale-by-std`."""
        *sections, last = self.dashed[2:].split(".")
        return "--" + ".".join([*sections, f"no-{last}"])

    def names(self) -> list[str]:
        """Every spelling of this setting on the command line, the most familiar first."""
        return list(self.flags) if self.dashed in self.flags else [*self.flags, self.dashed]

    @property
    def type_name(self) -> str:
        base = _without_none(self.annotation)
        if typing.get_origin(base) is list:
            base = typing.get_args(base)[0]
        return {int: "INT", float: "NUMBER", bool: "BOOL"}.get(base, "TEXT")


def settings_of(model: type, prefix: tuple[str, ...] = ()) -> Iterator[Setting]:
    """The leaf settings of a config model (a pydantic dataclass), sections flattened into dotted keys."""
    for field_name, info in model.__pydantic_fields__.items():  # type: ignore[attr-defined]
        name = info.alias or field_name  # a section named by a keyword (`async`) is spelled by its alias
        annotation = info.annotation
        if dataclasses.is_dataclass(annotation):
            yield from settings_of(annotation, (*prefix, name))
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        switch = extra.get("switch")
        default = None if info.default_factory is not None else info.default
        yield Setting(
            key=(*prefix, name),
            annotation=annotation,
            help=info.description or "",
            default=None
            if default is dataclasses.MISSING or repr(default) == "PydanticUndefined"
            else default,
            flags=tuple(extra.get("flags") or ()),
            switch=(switch[0], switch[1], switch[2]) if switch else None,
            metavar=extra.get("metavar"),
            choices=tuple(extra["choices"]) if extra.get("choices") else None,
            positional=bool(extra.get("positional")),
        )


def renamed_settings(model: type, settings: Sequence[Setting]) -> Iterator[Setting]:
    """The old dotted flags of the model's renamed keys, each taking what its new key takes.

    An old key whose flag was spelled like its new key's alias (`tasks` -> `data.tasks` keeps `--tasks`)
    needs none."""
    by_key = {setting.dotted: setting for setting in settings}
    taken = {name for setting in settings for name in setting.names()}
    for old, new in getattr(model, "renamed", {}).items():
        setting = by_key.get(new)
        flag = f"--{old}"
        if setting is None or flag in taken or f"--{old.replace('_', '-')}" in setting.flags:
            continue
        yield dataclasses.replace(setting, key=tuple(old.split(".")), flags=(), switch=None)


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _click_params(setting: Setting, warn_spelling: bool = True) -> list[click.Parameter]:
    """The click parameters of `setting`; its underscored spelling is a hidden one, read with a
    warning when `warn_spelling` (a renamed key's flags are warned about as renamed)."""
    if setting.positional:
        return [
            click.Argument(
                [setting.dest], nargs=-1, metavar=f"{setting.metavar or setting.key[-1].upper()}..."
            )
        ]
    shape = setting.shape
    help_text = setting.help
    if setting.is_yes_no:
        help_text += " (default: on)" if setting.default else ""
    elif setting.default not in (None, "", (), []) and shape == "value" and not setting.switch:
        help_text += f" (default {setting.default})"
    kind: Any = click.Choice(setting.choices) if setting.choices else None
    old_dest = _OLD_SPELLING + setting.dest if warn_spelling else setting.dest
    old = setting.underscored
    if setting.switch or setting.is_yes_no:
        if setting.switch:
            flag, constant, switch_help = setting.switch
            params = [_switch(f"sw__{setting.dest}", flag, constant, switch_help)]
        else:
            params = [
                _switch(f"sw__{setting.dest}", setting.dashed, True, help_text),
                _switch(
                    f"swoff__{setting.dest}", setting.negated, False, f"the opposite of {setting.dashed}"
                ),
            ]
        taken = {param.opts[0] for param in params}  # type: ignore[attr-defined]
        value_flags = [name for name in (setting.dashed,) if name not in taken]
        if value_flags:  # `--style.chat-template false`, as a config file would say it
            params.append(click.Option([setting.dest, *value_flags], metavar="BOOL", hidden=True))
        if old is not None and old not in taken:
            params.append(click.Option([old_dest, old], metavar="BOOL", hidden=True))
        return params
    params: list[click.Parameter] = [
        click.Option(
            [setting.dest, *setting.names()],
            type=kind,
            metavar=setting.metavar or (setting.type_name if kind is None else None),
            multiple=shape in ("list", "mapping"),
            help=help_text,
        )
    ]
    if old is not None and old not in setting.flags:
        params.append(
            click.Option([old_dest, old], type=kind, multiple=shape in ("list", "mapping"), hidden=True)
        )
    return params


_OLD_SPELLING = "old__"  # the dest prefix of a setting's deprecated underscored flag


def _switch(dest: str, flag: str, constant: Any, help_text: str) -> click.Option:
    return click.Option([dest, flag], is_flag=True, flag_value=constant, default=None, help=help_text)


def _given(setting: Setting, values: dict[str, Any]) -> tuple[bool, Any]:
    """Whether the command line set `setting`, and to what (in the shape the model reads)."""
    value = values.get(setting.dest)
    for prefix in ("sw__", "swoff__"):
        switched = values.get(prefix + setting.dest)
        if switched is not None:
            return True, switched
    old = values.get(_OLD_SPELLING + setting.dest)
    if (value is None or value == ()) and old is not None and old != ():
        warnings.warn(
            f"{setting.underscored} is deprecated; use {_new_spelling(setting)}",
            ConfigDeprecationWarning,
            stacklevel=2,
        )
        value = old
    if value is None or value == ():
        return False, None
    shape = setting.shape
    flag = "/".join(setting.flags) or f"--{setting.dotted}"
    if shape == "mapping":
        return True, parse_key_values(value, flag)
    if shape == "csv":
        return True, [part.strip() for part in value.split(",") if part.strip()]
    if shape == "list" or setting.positional:
        return True, list(value)
    return True, value


def _new_spelling(setting: Setting) -> str:
    if setting.is_yes_no:
        return f"{setting.dashed} / {setting.negated}"
    if setting.switch:
        return (
            setting.switch[0]
            if setting.switch[1] is not False
            else f"{setting.switch[0]} (or {setting.dashed} BOOL)"
        )
    return setting.names()[0] if setting.flags else setting.dashed


def _nest(key: Sequence[str], value: Any) -> dict[str, Any]:
    nested: Any = value
    for part in reversed(key):
        nested = {part: nested}
    return nested


class ConfigCommand(click.Command):
    """A command whose flags come from a config model; its callback receives the validated config.

    A list setting written as `--tasks A B C` takes every value up to the next flag. With
    `config_argument`, the TOML file may also be given as the command's first argument.
    """

    def __init__(
        self,
        name: str,
        model: type,
        callback: Callable[..., int | None],
        config_argument: bool = False,
        options: Sequence[click.Option] = (),
        **kwargs: Any,
    ) -> None:
        self.model = model
        self.settings = list(settings_of(model))
        self.options = [option.name for option in options]  # the command's own, passed as keywords
        params: list[click.Parameter] = [
            click.Option(
                ["--config"], metavar="FILE.toml", help="read settings from a TOML file (flags win)"
            ),
            *options,
        ]
        if config_argument:
            params.append(click.Argument(["config_file"], required=False, metavar="[CONFIG.toml]"))
        for setting in self.settings:
            params.extend(_click_params(setting))
        self.renamed = list(renamed_settings(model, self.settings))
        for setting in self.renamed:
            for param in _click_params(setting, warn_spelling=False):
                param.hidden = True  # type: ignore[attr-defined]
                params.append(param)
        super().__init__(name, params=params, callback=self._invoke, **kwargs)
        self._run = callback
        self._greedy = {
            name
            for s in self.settings
            if s.shape == "list" and not s.positional
            for name in [*s.names(), s.underscored or ""]
            if name
        }

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _repeat_greedy(args, self._greedy))

    def _invoke(self, config: str | None, config_file: str | None = None, **values: Any) -> int | None:
        if config and config_file:
            raise click.UsageError(
                f"give the config file once: as the argument ({config_file}) or as --config ({config})"
            )
        own = {name: values.pop(name) for name in self.options}
        return self._run(self.load(config or config_file, values), **own)

    def load(self, config_file: str | None, values: dict[str, Any]) -> Any:
        """The validated config: the TOML file, if any, with the flags given laid over it.

        Renamed keys move to their new names (with a warning) in each source before the sources are laid
        over each other, so a new flag wins over an old key in the file, and a new flag over an old one."""
        renamed = getattr(self.model, "renamed", {})
        data = upgrade(load_toml(config_file), renamed) if config_file else {}
        for setting in [*self.renamed, *self.settings]:
            given, value = _given(setting, values)
            if given:
                data = merge(data, upgrade(_nest(setting.key, value), renamed))
        return validate(self.model, data, self.describe_key)

    def describe_key(self, dotted: str) -> str:
        """A dotted key as errors name it: the key and its most familiar flag."""
        for setting in self.settings:
            if dotted == setting.dotted or dotted.startswith(setting.dotted + "."):
                spelled = setting.switch[0] if setting.switch and not setting.flags else setting.names()[0]
                return f"{dotted!r} ({'argument' if setting.positional else spelled})"
        return repr(dotted)


def _repeat_greedy(args: list[str], greedy: set[str]) -> list[str]:
    """`--tasks A B --x` becomes `--tasks A --tasks B --x`, so a list flag takes several values."""
    out: list[str] = []
    current: str | None = None
    for arg in args:
        if arg == "--":
            current = None
        elif arg.startswith("-") and arg != "-":
            current = arg if arg in greedy else None
        elif current is not None and out and out[-1] != current:
            out.append(current)
        out.append(arg)
    return out


def config_command(
    name: str, model: type, **kwargs: Any
) -> Callable[[Callable[..., int | None]], ConfigCommand]:
    """Decorator: the function, given the validated `model` instance (and the values of the command's
    own `options`, which are no config keys, by name), becomes the command `name`."""

    def wrap(function: Callable[..., int | None]) -> ConfigCommand:
        return ConfigCommand(name, model, function, help=kwargs.pop("help", function.__doc__), **kwargs)

    return wrap
