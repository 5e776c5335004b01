"""What a plugin hands genesys through its hooks: `Verifier` and `Environment` subclasses, `TaskSet`s and
`BackendSpec`s."""

from __future__ import annotations

import copyreg
import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from genesys.errors import InputError
from genesys.schema import Rollout, Task, Verdict

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


# --- environments: multi-turn tasks ---------------------------------------------------------------


@dataclass
class Step:
    """What an environment answers after a model turn: the `messages` it appends (user or tool
    replies) and whether the episode is `done`."""

    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    done: bool = False


class Environment:
    """Plays rows of one `task_type` as a conversation: the model acts, the environment answers.

    `reset(task)` returns the opening messages; after each model turn (the messages end with it)
    `step(task, messages)` returns a `Step`; `score(task, messages)` judges the whole conversation.
    Each method may be `async def`. A fresh instance plays each rollout, so attributes set in `reset`
    are that rollout's state; `score` gets a fresh instance too and must judge from the messages.

    `tools` are typed Python functions the model may call (see `genesys.environments.tools`); a turn
    with tool calls is answered with their results and no `step`. The episode ends when `step` says
    done or after `max_turns` model turns. `step_timeout` bounds each `reset`/`step` call,
    `tool_timeout` each tool call and `timeout` the score, in seconds; past it the rollout is an error
    naming its turn.

    `isolation` says where the environment's code runs while a rollout is played: `"thread"` (the
    default) in the playing process, a sync call in a daemon thread, which a hang leaves running;
    `"process"` in a process of the rollout's own (built there, its state kept there between turns),
    killed when a call passes its deadline: for sync code that may hang for good. The class must then
    be importable by name and its arguments and results picklable. `score` always runs in the
    verification engine, killed at `timeout`.

    `deterministic` says that `reset`, `step` and the tools answer the same messages with the same
    messages every time: `genesys validate` then replays a trajectory's environment side and checks
    the row's against it. An environment that draws randomness or reads the world must set it to
    False; its trajectories are then refused by validation (never accepted unchecked).
    """

    task_type: ClassVar[str]
    max_turns: ClassVar[int] = 8
    tools: ClassVar[tuple[Callable[..., Any], ...]] = ()
    step_timeout: ClassVar[float] = 30.0
    tool_timeout: ClassVar[float] = 30.0
    timeout: ClassVar[float] = 30.0
    isolation: ClassVar[str] = "thread"
    deterministic: ClassVar[bool] = True

    def reset(self, task: Task) -> list[dict[str, Any]]:
        """The opening messages: the task's prompt as the user's message."""
        return [{"role": "user", "content": task.prompt}]

    def step(self, task: Task, messages: list[dict[str, Any]]) -> Step:
        """Answer the model's last turn; by default the episode ends at its first turn without tool calls."""
        return Step(done=True)

    def score(self, task: Task, messages: list[dict[str, Any]]) -> Verdict:
        """Judge the conversation."""
        raise NotImplementedError(f"{type(self).__name__} must implement score()")


class _EnvironmentScorerType(type):
    """The class of the verifiers made from environments; pickled as the environment they score."""


def _reduce_scorer(cls: _EnvironmentScorerType) -> str | tuple[Any, tuple[Any, ...]]:
    environment = cls.__dict__.get("environment")
    if environment is None:  # the base classes themselves: pickled by name, as any class
        return cls.__qualname__
    return environment_verifier, (environment,)


copyreg.pickle(_EnvironmentScorerType, _reduce_scorer)


class _EnvironmentScorer(Verifier, metaclass=_EnvironmentScorerType):
    """Scores a trajectory row with its environment's `score`; a trajectory that ended in an error
    (`trajectory_error`) keeps that error."""

    environment: ClassVar[type[Environment]]

    def verify(self, rollout: Rollout) -> Verdict:
        task, messages, failed = _trajectory(rollout)
        return failed if failed is not None else self.environment().score(task, messages)


class _AsyncEnvironmentScorer(_EnvironmentScorer):
    async def verify(self, rollout: Rollout) -> Verdict:  # type: ignore[override]
        task, messages, failed = _trajectory(rollout)
        return failed if failed is not None else await self.environment().score(task, messages)


def _trajectory(rollout: Rollout) -> tuple[Task, list[dict[str, Any]], Verdict | None]:
    """A trajectory row's task and messages, or the failed verdict it can only get."""
    task = Task.from_row(rollout.to_row())
    error = rollout.extra.get("trajectory_error")
    if error:
        return task, [], Verdict.failed(str(error))
    messages = rollout.extra.get("messages")
    if isinstance(messages, str):
        import orjson

        messages = orjson.loads(messages)
    if not isinstance(messages, list):
        return task, [], Verdict.failed("the row has no 'messages' list: it is no trajectory")
    return task, messages, None


@functools.cache
def environment_verifier(environment: type[Environment]) -> type[Verifier]:
    """The verifier that scores `environment`'s trajectories, under the environment's `timeout`."""
    base = _AsyncEnvironmentScorer if inspect.iscoroutinefunction(environment.score) else _EnvironmentScorer
    name = f"{environment.__name__}Scorer"
    namespace = {
        "task_type": environment.task_type,
        "timeout": environment.timeout,
        "environment": environment,
        "__module__": __name__,
        "__qualname__": name,
    }
    return _EnvironmentScorerType(name, (base,), namespace)
