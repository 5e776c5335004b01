"""The small task sets bundled in `genesys/tasks/data/`."""

from __future__ import annotations

from importlib import resources
from typing import Any

import orjson


def load_sample_file(name: str) -> list[dict[str, Any]]:
    """The rows of a bundled jsonl task file."""
    text = resources.files("genesys.tasks").joinpath("data", name).read_bytes()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]
