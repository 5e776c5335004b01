"""Backends for tests and benchmarks that reuse one engine over several runs."""

from __future__ import annotations

from typing import Any


class KeptOpen:
    """A running backend lent to `run_generation`, which closes the backend it is given when done."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.name = backend.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def close(self) -> None:
        pass
