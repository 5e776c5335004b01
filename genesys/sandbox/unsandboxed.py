"""The `subprocess` backend: the runner as a plain child process with rlimits. Not a sandbox."""

from __future__ import annotations

import logging
import shutil
import tempfile

from genesys.sandbox.process import RUNNER_PATH, LocalSandbox

logger = logging.getLogger(__name__)
WARNING = (
    "the 'subprocess' sandbox backend is NOT a sandbox: submissions run on this machine with only "
    "rlimits, and can read its files, use its network and see its processes. Use it for development only."
)


class SubprocessSandbox(LocalSandbox):
    """Runs submissions in child processes of this machine, bounded by rlimits only."""

    name = "subprocess"

    def __init__(self, toolchains: dict[str, dict[str, str]], **kwargs: object) -> None:
        super().__init__(toolchains, **kwargs)  # type: ignore[arg-type]
        logger.warning(WARNING)
        self._scratch = tempfile.mkdtemp(prefix="genesys-unsandboxed-")

    def command(self) -> list[str]:
        python = self.toolchains["python"]["run"]
        return [python, "-I", "-S", "-B", *self.runner_args(RUNNER_PATH, self._scratch)]

    def close(self) -> None:
        super().close()
        shutil.rmtree(self._scratch, ignore_errors=True)
