"""Imported by the fork server's preload (see `genesys.verification.fork_server`): runs the caller's
main script there, once, as `multiprocessing` runs it in each child of a server that has not (as
`__mp_main__`: its `if __name__ == "__main__":` part does not run). The children then find it run
and skip it. The caller names the script in MAIN_SCRIPT_VARIABLE, which this removes: nothing forked
from the server sees it. Only the preload imports this module, after the worker's.

A script that starts genesys work at its top level, outside an `if __name__ == "__main__":` guard
(`train(...)`, `verify_rollouts(...)`), is stopped at that call (`fork_server.MainScriptWork`): the
server keeps what the script defined above it, and the children skip the script as if it had run,
so the run goes on in the caller as it would with the guard. A script that fails here otherwise is
left to the children, which meet the same error as they would have."""

from __future__ import annotations

import os
import sys
import types
from multiprocessing import process, spawn

from genesys.verification import fork_server
from genesys.verification.fork_server import MAIN_SCRIPT_VARIABLE


def run_main_script() -> None:
    path = os.environ.pop(MAIN_SCRIPT_VARIABLE, None)
    if not path:
        return
    own = sys.modules["__main__"]
    # As in a child: a script that starts processes outside its main guard is refused, instead of
    # starting another fork server from this one.
    process.current_process()._inheriting = True  # type: ignore[attr-defined]
    fork_server.running_main_script = True
    try:
        if os.path.isfile(path):
            _run_as_mp_main(path)
        else:  # a directory or a zip file with a __main__.py
            spawn.import_main_path(path)
    except fork_server.MainScriptWork:
        pass  # what the script defined above the call stays; the children skip the script
    except BaseException:  # noqa: BLE001 - whatever it raises, each child raises again
        sys.modules["__main__"] = own
        sys.modules.pop("__mp_main__", None)
    finally:
        fork_server.running_main_script = False
        del process.current_process()._inheriting  # type: ignore[attr-defined]


def _run_as_mp_main(path: str) -> None:
    """Run the script file as `multiprocessing` does (`__mp_main__`, installed as `__main__` too),
    in a module installed before it runs, so that what it defined stays when it is stopped."""
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    with open(path, "rb") as handle:
        code = compile(handle.read(), path, "exec")
    exec(code, module.__dict__)  # noqa: S102 - the caller's own script, as multiprocessing runs it


run_main_script()
