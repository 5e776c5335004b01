"""Errors that the command line reports as one line with exit code 2."""


class GenesysError(Exception):
    """An error genesys reports as one line naming what is wrong, never as a traceback."""


class InputError(GenesysError, ValueError):
    """Input that cannot be used: a missing file, an unknown task_type, a bad column. Names what is wrong."""


class PluginError(GenesysError, RuntimeError):
    """A plugin that cannot be used: a clash between plugins or a malformed hook result."""


class ConfigDeprecationWarning(DeprecationWarning):
    """A config key or flag spelled the old way: it still works, and the message names the new spelling."""


class PluginWarning(UserWarning):
    """A plugin that was skipped or looks wrong (it cannot be imported, or a hook is misspelled); the
    command line prints it as one line and goes on."""


class TrainingError(GenesysError, RuntimeError):
    """A training run that cannot go on: steps whose loss or gradient kept being non-finite, weights gone non-finite."""
