"""`metrics.jsonl`: one JSON object per optimizer step, appended as the run goes.

A resumed run first cuts the steps after its checkpoint, so the file always reads as one run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import orjson


class MetricsLog:
    """Appends step metrics to `path`; `resume_from` drops lines of steps after that step."""

    def __init__(self, path: Path, resume_from: int) -> None:
        self.path = path
        self.records = (
            [record for record in read_metrics(path) if record["step"] <= resume_from] if resume_from else []
        )
        temporary = path.with_suffix(".jsonl.tmp")
        temporary.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in self.records))
        os.replace(temporary, path)
        self._handle = open(path, "ab")

    def write(self, metrics: dict[str, Any]) -> None:
        self.records.append(metrics)
        self._handle.write(orjson.dumps(metrics) + b"\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The step records of a metrics file (a torn last line, from a killed run, is skipped)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_bytes().splitlines():
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return records


def is_metric_value(value: Any) -> bool:
    """Whether a metric's `value` is a number to draw or log (not null, text, a bool, or infinite)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
