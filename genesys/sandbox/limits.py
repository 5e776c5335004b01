"""Per-test resource limits: `Limits` (defined with the settings, in `genesys.config.sections`), and the
more generous limits of compilers."""

from __future__ import annotations

from genesys.config.sections import LIMIT_NAMES, Limits

__all__ = ["CHECKER_LIMITS", "COMPILE_LIMITS", "LIMIT_NAMES", "Limits"]

# Compilers get more room than the programs they build.
COMPILE_LIMITS = Limits(
    time_limit=30.0,
    memory_limit=2048,
    process_limit=256,
    output_limit=1 << 20,
    disk_limit=256,
    wall_limit=60.0,
)
# A task's checker runs under its own limits, whatever the program's.
CHECKER_LIMITS = Limits(
    time_limit=10.0,
    memory_limit=1024,
    process_limit=16,
    output_limit=1 << 20,
    disk_limit=16,
    wall_limit=20.0,
)
