"""The `subprocess` backend: the runner as a plain child process with rlimits. Not a sandbox.

Its runners write in a scratch directory of the temporary directory, named with the run id of the
sandbox that made it (a `RunLease`, held while the sandbox is open): one removes its own when it
closes, and a new one removes those whose run has ended without closing them (a worker killed at
its deadline), as the lock of their run id proves, never by age or pid.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from genesys.sandbox.leases import RunLease
from genesys.sandbox.process import RUNNER_PATH, LocalSandbox

logger = logging.getLogger(__name__)
WARNING = (
    "the 'subprocess' sandbox backend is NOT a sandbox: submissions run on this machine with only "
    "rlimits, and can read its files, use its network and see its processes. Use it for development only."
)
SCRATCH_PREFIX = "genesys-unsandboxed-"
RUN_ID_LENGTH = 32


class SubprocessSandbox(LocalSandbox):
    """Runs submissions in child processes of this machine, bounded by rlimits only."""

    name = "subprocess"

    def __init__(self, toolchains: dict[str, dict[str, str]], **kwargs: object) -> None:
        super().__init__(toolchains, **kwargs)  # type: ignore[arg-type]
        logger.warning(WARNING)
        remove_dead_scratch()
        self._run: RunLease | None = None
        self._scratch = ""

    def command(self) -> list[str]:
        if self._run is None:  # again when reused after `close()`
            self._run = RunLease()
            self._scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{self._run.run_id}-")
        python = self.toolchains["python"]["run"]
        return [python, "-I", "-S", "-B", *self.runner_args(RUNNER_PATH, self._scratch)]

    def close(self) -> None:
        super().close()
        if self._run is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._run.release()
            self._run = None


def remove_dead_scratch() -> int:
    """Remove the scratch directories of runs on this host that ended without removing them; returns
    how many went."""
    directory = tempfile.gettempdir()
    removed = 0
    for name in os.listdir(directory):
        run_id = name[len(SCRATCH_PREFIX) : len(SCRATCH_PREFIX) + RUN_ID_LENGTH]
        if not name.startswith(SCRATCH_PREFIX) or RunLease.holder_dead(run_id) is not True:
            continue
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)  # a symlink is refused
        removed += 1
    return removed
