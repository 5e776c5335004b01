"""Per-test resource limits and how verifier options map onto them."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

# Verifier option name -> Limits field; `genesys verify` flags and `-O key=value` both land here.
OPTION_NAMES = {
    "time_limit": "time_s",
    "memory_limit": "memory_mb",
    "process_limit": "processes",
    "output_limit": "output_bytes",
    "disk_limit": "disk_mb",
}


@dataclass(frozen=True)
class Limits:
    """What one test (or one compilation) may use inside the sandbox.

    `time_s` is CPU time; the wall-clock deadline is `2 * time_s + 1` unless `wall_s` is set.
    `output_bytes` caps stdout (a test that prints more fails with `output_limit`); `disk_mb` caps
    any file the program writes.
    """

    time_s: float = 2.0
    memory_mb: int = 512
    processes: int = 64
    output_bytes: int = 8 << 20
    disk_mb: int = 64
    wall_s: float | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None and not value > 0:
                raise ValueError(f"sandbox limit {item.name} must be > 0, got {value!r}")

    @property
    def wall_limit(self) -> float:
        return self.wall_s if self.wall_s is not None else 2 * self.time_s + 1.0

    def to_runner(self) -> dict[str, Any]:
        """The limits as the in-sandbox runner reads them."""
        data = {item.name: getattr(self, item.name) for item in fields(self)}  # asdict would deep-copy
        data["wall_s"] = self.wall_limit
        return data

    @classmethod
    def from_options(cls, options: dict[str, Any], base: Limits | None = None) -> Limits:
        """Limits from verifier options (`time_limit`, `memory_limit`, ...), on top of `base`."""
        changes: dict[str, Any] = {}
        for option, name in OPTION_NAMES.items():
            if options.get(option) is None:
                continue
            raw = options[option]
            try:
                changes[name] = float(raw) if name == "time_s" else int(raw)
            except (TypeError, ValueError):
                raise ValueError(f"option {option!r} must be a number, got {raw!r}") from None
        return replace(base or cls(), **changes)


# Compilers get more room than the programs they build.
COMPILE_LIMITS = Limits(
    time_s=30.0, memory_mb=2048, processes=256, output_bytes=1 << 20, disk_mb=256, wall_s=60.0
)
