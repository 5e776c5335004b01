"""`key=value` options as they are written on the command line."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from genesys.errors import InputError


def parse_key_values(pairs: Iterable[str], where: str) -> dict[str, Any]:
    """A dict from `key=value` strings; values are read as JSON when they are JSON, else kept as text.

    A pair without `=` or without a key is an InputError naming `where` (the flag or spec).
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InputError(f"{where}: expected key=value, got {pair!r}")
        try:
            options[key] = orjson.loads(raw)
        except orjson.JSONDecodeError:
            options[key] = raw
    return options
