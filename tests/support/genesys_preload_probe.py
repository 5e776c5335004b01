"""Imported by the engine before it forks workers when a verifier names it in `preload`."""

import os

IMPORTED_IN_PID = os.getpid()
os.environ.setdefault("GENESYS_SET_BY_PRELOAD", "yes")  # workers must still see what a preloaded module set
