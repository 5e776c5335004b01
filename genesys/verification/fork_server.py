"""The fork server that verification workers and process-isolated environments are forked from.

Workers fork from `multiprocessing`'s fork server: a process that imported what they need once
(its preload), so that no worker imports it again. There is one per process. It keeps the
environment of when it started; each child applies what the caller's environment changed since
(`environment_changes`).

Starting it costs an interpreter start and its imports. `start_early` starts it at the beginning of
a command that will verify (`genesys verify`), with the worker's module and the built-in verifiers'
(what the engine would have asked for), so that it starts while the command reads its configuration
and input instead of after. The engine, once it knows its verifiers, starts it again with their
`preload` only when they declare one it lacks (a heavy import, such as sympy, each worker would
otherwise repeat) and nothing has been forked from it yet; other modules that define verifier
classes (a plugin's, light by convention) each worker then imports itself.

A child of a fork server runs the caller's main script first (as `multiprocessing` does for every
start method but fork), unless its server has: the `genesys` command's own script, or a user's
script that imports torch at its top. So the server runs it, once, in its preload (`main_script`;
`multiprocessing`'s own "__main__" preload never receives the script's path on Python 3.11), and
its children skip it. The preload ends with `freeze_heap`, which freezes what the imports before
it built (`gc.freeze`): the garbage collector of the children never walks those objects, so it
copies none of their pages, and the server's own exit, which the command waits for, skips them too.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Collection
from importlib import metadata
from multiprocessing import forkserver, spawn
from multiprocessing.context import BaseContext

WORKER_MODULE = "genesys.verification.worker"
MAIN_SCRIPT_MODULE = "genesys.verification.main_script"  # runs the caller's main script (see above)
MAIN_SCRIPT_VARIABLE = "GENESYS_FORK_SERVER_MAIN_SCRIPT"  # its path, for the server alone
FREEZE_MODULE = "genesys.verification.freeze_heap"  # imported last, it freezes what the others built
DISTRIBUTION = "genesys-rl"

_environ: dict[str, str] | None = None  # os.environ when this process's fork server started
_early: frozenset[str] | None = None  # what start_early preloaded, while nothing was forked from it
running_main_script = False  # True in a fork server while it runs the caller's main script


class MainScriptWork(RuntimeError):
    """genesys work (a training run, a verification) started at the top level of the caller's main
    script while its fork server ran that script for its definitions."""


def refuse_in_main_script(what: str) -> None:
    """Raise MainScriptWork when this process is a fork server running the caller's main script:
    `what` was called outside an `if __name__ == "__main__":` guard. The server keeps what the script
    defined above the call, and its workers skip the script (see `main_script`)."""
    if running_main_script:
        raise MainScriptWork(
            f"{what} was started at the top level of the main script while the verification workers' "
            'fork server imported it; keep it under `if __name__ == "__main__":`'
        )


def start_early() -> None:
    """Start this process's fork server now, preloading the worker's module and the built-in
    verifiers' (see the module docstring)."""
    global _early
    if forkserver._forkserver._forkserver_pid is not None:
        return  # already running: it is kept as it is
    preload = [WORKER_MODULE, *builtin_verifier_modules()]
    mp.get_context("forkserver").set_forkserver_preload([*preload, MAIN_SCRIPT_MODULE, FREEZE_MODULE])
    _start_server()
    _early = frozenset(preload)


def builtin_verifier_modules() -> list[str]:
    """The modules of genesys's own verifier plugins (its `genesys` entry points under
    genesys.verifiers): what nearly every run's workers unpickle verifier classes from."""
    try:
        entry_points = metadata.distribution(DISTRIBUTION).entry_points
    except metadata.PackageNotFoundError:  # run from a source tree without an install
        return []
    return sorted(
        point.value
        for point in entry_points
        if point.group == "genesys" and point.value.startswith("genesys.verifiers.")
    )


def fork_context(preload: Collection[str] = (), declared: Collection[str] = ()) -> BaseContext:
    """The fork-server context to start workers with.

    `preload`: the modules the server should have imported, when it has not started yet (a running
    server keeps its own); `declared`: those of them that verifiers name in their `preload`, for
    which a server `start_early` started, and that nothing was forked from yet, starts again.
    """
    global _early, _environ
    refuse_in_main_script("verification")
    context = mp.get_context("forkserver")
    early, _early = _early, None
    if early is not None and not set(declared) <= early:
        forkserver._forkserver._stop()
        _environ = None  # the next server starts with the environment of then
    if preload:
        context.set_forkserver_preload([*preload, MAIN_SCRIPT_MODULE, FREEZE_MODULE])
        _start_server()
    return context


def _start_server() -> None:
    """Start the fork server, if it is not running, with the path of this process's main script in
    its environment alone (see `main_script`)."""
    if forkserver._forkserver._forkserver_pid is not None:
        return
    _snapshot_environment()
    script = spawn.get_preparation_data("fork server").get("init_main_from_path")
    if script:
        os.environ[MAIN_SCRIPT_VARIABLE] = script
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(MAIN_SCRIPT_VARIABLE, None)


def environment_changes() -> tuple[dict[str, str], list[str]]:
    """What this process's environment has set and removed since its fork server started.

    The fork server hands its children its own environment, that of when it started (plus whatever
    preloaded modules set); they apply these changes on top of it.
    """
    base = _snapshot_environment()
    return {k: v for k, v in os.environ.items() if base.get(k) != v}, [k for k in base if k not in os.environ]


def _snapshot_environment() -> dict[str, str]:
    global _environ
    if _environ is None:
        _environ = dict(os.environ)
    return _environ
