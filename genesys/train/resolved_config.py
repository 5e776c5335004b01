"""The resolved config of a run, written as `config.toml` in its directory and compared on resume."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import tomli_w


def write_config(path: Path, config: dict[str, Any]) -> None:
    """Write `config` (plain data, no None) as TOML, atomically."""
    temporary = path.with_suffix(".toml.tmp")
    temporary.write_bytes(tomli_w.dumps(config).encode())
    os.replace(temporary, path)


def read_config(path: Path) -> dict[str, Any] | None:
    """The config a run directory holds, or None when it has none (or an unreadable one)."""
    try:
        return tomllib.loads(path.read_text())
    except (FileNotFoundError, tomllib.TOMLDecodeError):
        return None


def changed_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs."""
    changed = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        dotted = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            changed.extend(changed_keys(a, b, dotted + "."))
        elif a != b:
            changed.append(dotted)
    return changed
