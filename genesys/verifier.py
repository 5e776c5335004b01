"""The base class every verifier plugin subclasses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from genesys.schema import Rollout, Verdict


class Verifier:
    """Scores rollouts of one `task_type`.

    Subclasses set `task_type` and implement `verify` (plain or `async def`). The engine creates one
    instance per worker process, calls `setup()` once before the first rollout and `teardown()` at
    shutdown, and enforces `timeout` (seconds) per rollout by killing the worker. `max_parallel`
    caps how many rollouts of this type are verified at once (None: one per worker; an async
    verifier runs up to 64 at once in each worker). `options` holds the
    run's verifier options (`genesys verify -O key=value` and the flags that map onto them).
    """

    task_type: ClassVar[str]
    timeout: ClassVar[float] = 30.0
    max_parallel: ClassVar[int | None] = None
    # Modules imported once in the process workers are forked from, so every worker, and every
    # replacement after a timeout or crash, starts with them already loaded.
    preload: ClassVar[tuple[str, ...]] = ()
    # The option names `verify` reads; None means any, and then no option can be refused as unknown.
    accepted_options: ClassVar[frozenset[str] | None] = None

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options: dict[str, Any] = dict(options or {})

    def setup(self) -> None:
        """Build expensive state (parsers, sandboxes, clients) once per worker."""

    def teardown(self) -> None:
        """Release what `setup` built."""

    def verify(self, rollout: Rollout) -> Verdict:
        """Score one rollout."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")


def unknown_options(options: Iterable[str], classes: Iterable[type[Verifier]]) -> list[str]:
    """The option names that none of `classes` reads; none when one of them reads any option."""
    accepted: set[str] = set()
    for cls in classes:
        if cls.accepted_options is None:
            return []
        accepted |= cls.accepted_options
    return sorted(set(options) - accepted)
