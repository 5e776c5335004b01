"""Where an environment's code runs while a rollout is played, and how a call past its deadline ends.

`InThreads` (an environment's default, `isolation = "thread"`) keeps the environment in this process:
async methods are awaited and cancelled at their deadline, sync ones run in daemon threads, so a
hung sync call costs its deadline and a thread that keeps running (a thread cannot be killed).

`InProcess` (`isolation = "process"`) gives each rollout a process of its own, started from
multiprocessing's fork server: the environment is built there, and its `reset`, `step` and tool
calls run there, so the instance keeps its state between turns. A call past its deadline kills the
process (SIGKILL), so sync code that hangs for good, or spins, is stopped; a process that dies is
reported as such. Calls and results cross a pipe, pickled: the environment class must be importable
by name (a plugin's module-level class), and its arguments and results picklable.

Both raise `DeadlinePassed` for a call past its deadline, `ProcessDied` when the process is gone,
and the call's own exception otherwise (from a process, as `RaisedThere` naming its type).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from collections.abc import Callable
from typing import Any

from genesys.environments.tools import tools_of
from genesys.plugins.specs import Environment

ISOLATIONS = ("thread", "process")
EXIT_GRACE = 10.0  # seconds an environment process has to exit once its rollout is over
PROCESS_START_S = 30.0  # what a new process may take to import the environment's modules


class DeadlinePassed(Exception):
    """A call of the environment did not return within its deadline."""


class ProcessDied(RuntimeError):
    """The rollout's environment process is gone."""


class RaisedThere(RuntimeError):
    """An exception raised in the environment's process, carried back as its type's name and text."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name


def host_for(environment: type[Environment]) -> InThreads | InProcess:
    """Where `environment` runs for one rollout, as its `isolation` says."""
    isolation = getattr(environment, "isolation", "thread")
    if isolation not in ISOLATIONS:
        raise ValueError(
            f"{environment.__name__}.isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}"
        )
    return InProcess(environment) if isolation == "process" else InThreads(environment)


class InThreads:
    """The environment in this process; sync calls in daemon threads."""

    def __init__(self, environment: type[Environment]) -> None:
        self.environment = environment
        self.tools = tools_of(environment.tools)
        self.instance: Environment | None = None

    async def start(self, timeout: float) -> None:
        self.instance = self.environment()

    async def method(self, name: str, args: tuple[Any, ...], timeout: float) -> Any:
        return await bounded(getattr(self.instance, name), args, {}, timeout)

    async def tool(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        return await bounded(self.tools[name].validated, (), arguments, timeout)

    def close(self) -> None:
        pass


async def bounded(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float
) -> Any:
    """`function(*args, **kwargs)` within `timeout` seconds (a sync one in a daemon thread); past the
    deadline, `DeadlinePassed`."""
    if inspect.iscoroutinefunction(function):
        work: Any = function(*args, **kwargs)
    else:
        work = _in_daemon_thread(function, args, kwargs)
    try:
        return await asyncio.wait_for(work, timeout)
    except TimeoutError:
        raise DeadlinePassed from None


def _in_daemon_thread(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> asyncio.Future[Any]:
    """Run `function` in a daemon thread (one that cannot hold up the process's exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(method: str, value: Any) -> None:
        if not future.done():
            getattr(future, method)(value)

    def run() -> None:
        try:
            outcome = ("set_result", function(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting side
            outcome = ("set_exception", exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    threading.Thread(target=run, name=f"genesys-{getattr(function, '__name__', 'call')}", daemon=True).start()
    return future


class InProcess:
    """The environment in a process of its own, killed when a call passes its deadline."""

    def __init__(self, environment: type[Environment]) -> None:
        self.environment = environment
        self.process: Any = None
        self.conn: Any = None

    async def start(self, timeout: float) -> None:
        """Start the process and build the environment there, within `timeout` seconds (and
        `PROCESS_START_S` more for the process to import what it needs)."""
        from genesys.verification.fork_server import environment_changes, fork_context

        context = fork_context()
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve,
            args=(self.environment, child, environment_changes()),
            name=f"genesys-environment-{self.environment.__name__}",
            daemon=True,
        )
        await asyncio.to_thread(self.process.start)
        child.close()
        await self._ask(("start", "", (), {}), timeout + PROCESS_START_S)

    async def method(self, name: str, args: tuple[Any, ...], timeout: float) -> Any:
        return await self._ask(("method", name, args, {}), timeout)

    async def tool(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        return await self._ask(("tool", name, (), arguments), timeout)

    async def _ask(self, request: tuple[str, str, tuple[Any, ...], dict[str, Any]], timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        try:
            self.conn.send(request)
        except OSError:
            raise self._died() from None
        readable = loop.create_future()
        descriptor = self.conn.fileno()
        loop.add_reader(descriptor, lambda: readable.done() or readable.set_result(None))
        try:
            await asyncio.wait_for(readable, timeout)
        except TimeoutError:
            self.kill()
            raise DeadlinePassed from None
        finally:
            loop.remove_reader(descriptor)
        try:
            outcome, value = self.conn.recv()
        except (EOFError, OSError):
            raise self._died() from None
        if outcome == "raised":
            raise RaisedThere(*value)
        return value

    def _died(self) -> ProcessDied:
        self.process.join(5)
        return ProcessDied(f"the environment's process died (exit code {self.process.exitcode})")

    def kill(self) -> None:
        """Kill the process (SIGKILL) and wait for it."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(5)

    def close(self) -> None:
        """End the process: its pipe closes, so it leaves its loop and exits (releasing what the
        environment holds); a thread waits for it and kills it if it has not exited within
        `EXIT_GRACE` seconds (still running a call the rollout gave up on)."""
        if self.conn is not None:
            self.conn.close()
        if self.process is not None and self.process.pid is not None:
            threading.Thread(target=self._reap, name="genesys-environment-reaper", daemon=True).start()

    def _reap(self) -> None:
        self.process.join(EXIT_GRACE)
        self.kill()


def _serve(environment: type[Environment], conn: Any, changes: tuple[dict[str, str], list[str]]) -> None:
    """The environment's process: build it, then answer calls until the pipe closes."""
    import os

    changed, removed = changes
    os.environ.update(changed)
    for key in removed:
        os.environ.pop(key, None)
    tools = tools_of(environment.tools)
    loop = asyncio.new_event_loop()  # one loop for every async call, so an environment may keep loop state
    instance: Any = None
    while True:
        try:
            kind, name, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if kind == "start":
                instance, result = environment(), None
            elif kind == "method":
                result = getattr(instance, name)(*args)
            else:
                result = tools[name].validated(*args, **kwargs)
            if inspect.isawaitable(result):
                result = loop.run_until_complete(result)
            reply: tuple[str, Any] = ("ok", result)
        except Exception as exc:  # the environment's own error, reported to the rollout
            reply = (
                "raised",
                (type(exc).__name__, str(exc) or traceback.format_exception_only(exc)[-1].strip()),
            )
        try:
            conn.send(reply)
        except Exception as exc:  # a result that cannot be pickled
            conn.send(
                (
                    "raised",
                    (type(exc).__name__, f"the result of {name or kind} could not be sent back: {exc}"),
                )
            )
