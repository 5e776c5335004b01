"""Reading settings: TOML files, tables laid over each other, and validation errors as one line each."""

from __future__ import annotations

import os
from typing import Any

from pydantic import TypeAdapter, ValidationError

from genesys.errors import InputError


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
