"""Imported by the engine before it forks workers when a verifier names it in `preload`."""

import os

IMPORTED_IN_PID = os.getpid()
