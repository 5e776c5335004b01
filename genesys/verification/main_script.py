"""Imported by the fork server's preload (see `genesys.verification.fork_server`): runs the caller's
main script there, once, as `multiprocessing` runs it in each child of a server that has not (as
`__mp_main__`: its `if __name__ == "__main__":` part does not run). The children then find it run
and skip it. The caller names the script in MAIN_SCRIPT_VARIABLE, which this removes: nothing forked
from the server sees it. Only the preload imports this module, after the worker's.

A script that fails here is left to the children, which meet the same error as they would have."""

from __future__ import annotations

import os
import sys
from multiprocessing import process, spawn

from genesys.verification.fork_server import MAIN_SCRIPT_VARIABLE


def run_main_script() -> None:
    path = os.environ.pop(MAIN_SCRIPT_VARIABLE, None)
    if not path:
        return
    own = sys.modules["__main__"]
    # As in a child: a script that starts processes outside its main guard is refused, instead of
    # starting another fork server from this one.
    process.current_process()._inheriting = True  # type: ignore[attr-defined]
    try:
        spawn.import_main_path(path)
    except BaseException:  # noqa: BLE001 - whatever it raises, each child raises again
        sys.modules["__main__"] = own
        sys.modules.pop("__mp_main__", None)
    finally:
        del process.current_process()._inheriting  # type: ignore[attr-defined]


run_main_script()
