"""Reading settings: TOML files, tables laid over each other, renamed keys, and validation errors as one line each."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, ClassVar

from pydantic import TypeAdapter, ValidationError, model_validator
from pydantic_core import ArgsKwargs

from genesys.errors import ConfigDeprecationWarning, InputError

_ABSENT = object()


class RenamedKeys:
    """A config model some of whose keys were renamed: `renamed` maps each old dotted key to its new one.

    However the model is given its settings (a TOML file, a dict, keywords, a dotted flag), an old key
    is moved to its new place with a `ConfigDeprecationWarning` naming the new key, so old files and
    flags keep working. Giving an old key and its new key with different values is refused.
    """

    renamed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _move_renamed_keys(cls, data: Any) -> Any:
        if not cls.renamed:
            return data
        if isinstance(data, ArgsKwargs):
            return ArgsKwargs(data.args, upgrade(data.kwargs, cls.renamed)) if data.kwargs else data
        return upgrade(data, cls.renamed) if isinstance(data, dict) else data


def upgrade(data: dict[str, Any], renamed: dict[str, str], warn: bool = True) -> dict[str, Any]:
    """`data` (nested tables) with every old key of `renamed` moved to its new key (`data` is not changed).

    `warn`: a `ConfigDeprecationWarning` per old key found, one line naming the new key.
    """
    upgraded = data
    for old, new in renamed.items():
        value = _get(upgraded, old)
        if value is _ABSENT:
            continue
        if warn:
            warnings.warn(f"{old!r} is deprecated; use {new!r}", ConfigDeprecationWarning, stacklevel=2)
        upgraded = _tables(_without(upgraded, old.split(".")), new.split(".")[:-1])
        current = _get(upgraded, new)
        if current is not _ABSENT and current != value:
            raise InputError(f"{old!r} is the deprecated spelling of {new!r}: give only {new!r}")
        upgraded = merge(upgraded, _nested(new, value))
    return upgraded


def _get(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return _ABSENT
        data = data[part]
    return data


def _tables(data: dict[str, Any], path: list[str]) -> dict[str, Any]:
    """`data` with the sections along `path` given as instances turned into tables of their fields."""
    if not path or path[0] not in data:
        return data
    section = data[path[0]]
    if dataclasses.is_dataclass(section) and not isinstance(section, type):
        section = {item.name: getattr(section, item.name) for item in dataclasses.fields(section)}
    if not isinstance(section, dict):
        return data
    return {**data, path[0]: _tables(section, path[1:])}


def _without(data: dict[str, Any], path: list[str]) -> dict[str, Any]:
    copy = dict(data)
    if len(path) == 1:
        del copy[path[0]]
    else:
        copy[path[0]] = _without(copy[path[0]], path[1:])
    return copy


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """The tables of a TOML config file; an unreadable file is an InputError naming it."""
    import tomllib

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise InputError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` laid over it, table by table."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def validate(model: type, data: dict[str, Any], describe_key: Any = None) -> Any:
    """`data` as a `model`; every problem is one InputError line naming the key (and its flag)."""
    try:
        return TypeAdapter(model).validate_python(data)
    except ValidationError as exc:
        raise InputError(describe_errors(exc, describe_key)) from None


def describe_errors(exc: ValidationError, describe_key: Any = None) -> str:
    """One line per problem: the dotted key, its flag when `describe_key` knows one, what is wrong."""
    problems = []
    for error in exc.errors(include_url=False):
        key = ".".join(str(part) for part in error["loc"])
        where = describe_key(key) if describe_key else repr(key)
        if error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            problems.append(f"unknown key {where}")
            continue
        if error["type"] in ("missing", "missing_argument") or (
            error["type"] == "too_short" and not error.get("input")
        ):
            problems.append(f"{where} is required")
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        if key:
            problems.append(
                f"{where}: {message} (got {error['input']!r})"
                if "input" in error and error["type"] != "value_error"
                else f"{where}: {message}"
            )
        else:
            problems.append(message)
    return "; ".join(problems)
