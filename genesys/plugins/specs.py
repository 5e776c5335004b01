"""What a plugin hands genesys through its hooks: `Verifier` subclasses, `TaskSet`s and `BackendSpec`s."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from genesys.errors import InputError
from genesys.schema import Rollout, Verdict

AUTO = "auto"  # the backend name that picks a usable backend; no plugin may register it


class Verifier:
    """Scores rollouts of one `task_type`.

    Subclasses set `task_type` and implement `verify` (plain or `async def`). The engine creates one
    instance per worker process, calls `setup()` once before the first rollout and `teardown()` at
    shutdown, and enforces `timeout` (seconds) per rollout by killing the worker. `max_parallel`
    caps how many rollouts of this type are verified at once (None: one per worker; an async
    verifier runs up to 64 at once in each worker). `options` holds the
    run's verifier options (`genesys verify -O key=value` and the flags that map onto them).

    A verifier with options declares them as a dataclass, `options_model` (a pydantic one checks
    types and ranges, and its fields' descriptions are the options' help in the documentation):
    `settings` is then that model made from the options it names, and `accepted_options` its field
    names, so a mistyped option is refused before the run starts.
    """

    task_type: ClassVar[str]
    timeout: ClassVar[float] = 30.0
    max_parallel: ClassVar[int | None] = None
    # Modules imported once in the process workers are forked from, so every worker, and every
    # replacement after a timeout or crash, starts with them already loaded.
    preload: ClassVar[tuple[str, ...]] = ()
    # The typed options this verifier reads (a dataclass); None: untyped, see accepted_options.
    options_model: ClassVar[type | None] = None
    # The option names `verify` reads; None means any, and then no option can be refused as unknown.
    # Made from `options_model` when a class declares one.
    accepted_options: ClassVar[frozenset[str] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        model = cls.__dict__.get("options_model")
        if model is not None and "accepted_options" not in cls.__dict__:
            cls.accepted_options = frozenset(item.name for item in dataclasses.fields(model))

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options: dict[str, Any] = dict(options or {})
        self.settings: Any = typed_options(type(self), self.options)

    def setup(self) -> None:
        """Build expensive state (parsers, sandboxes, clients) once per worker."""

    def teardown(self) -> None:
        """Release what `setup` built."""

    def verify(self, rollout: Rollout) -> Verdict:
        """Score one rollout."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")


def typed_options(cls: type[Verifier], options: Mapping[str, Any]) -> Any:
    """`cls.options_model` made from the options it names (None without a model); a bad value is an
    InputError naming the option and the task type."""
    model = cls.options_model
    if model is None:
        return None
    from genesys.config.loading import validate

    names = {item.name for item in dataclasses.fields(model)}
    given = {name: value for name, value in options.items() if name in names}
    try:
        return validate(model, given, lambda key: f"verifier option {key!r} ({cls.task_type})")
    except InputError as exc:
        raise InputError(f"-O/--option: {exc}") from None


def unknown_options(options: Iterable[str], classes: Iterable[type[Verifier]]) -> list[str]:
    """The option names that none of `classes` reads; none when one of them reads any option."""
    accepted: set[str] = set()
    for cls in classes:
        if cls.accepted_options is None:
            return []
        accepted |= cls.accepted_options
    return sorted(set(options) - accepted)


@dataclass(frozen=True)
class TaskSet:
    """A named source of task rows; `load(**options)` returns rows in the GENESYS task schema."""

    name: str
    load: Callable[..., Iterable[dict[str, Any]]]
    description: str = ""


@dataclass(frozen=True)
class BackendSpec:
    """A generation backend as a plugin registers it through the `genesys_backends` hook.

    `cls` is the backend class, or its `"module:Class"` path, imported only when the backend is built
    (so listing the backends imports no torch). `usable` says whether the backend can run here;
    `--backend auto` picks the usable backend of highest `priority` (a backend without `usable` is
    never picked by `auto`).
    """

    name: str
    cls: type | str
    usable: Callable[[], bool] | None = None
    priority: int = 0
    description: str = ""

    def load(self) -> type:
        """The backend class (importing its module when given as a path)."""
        if not isinstance(self.cls, str):
            return self.cls
        module_name, _, attribute = self.cls.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except ImportError as exc:
            raise InputError(
                f"--backend {self.name} cannot be loaded ({exc}); install what it needs, e.g. pip install 'genesys-rl[generate]'"
            ) from None
