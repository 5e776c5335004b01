"""Errors that the command line reports as one line with exit code 2."""


class InputError(ValueError):
    """Input that cannot be used: a missing file, an unknown task_type, a bad column. Names what is wrong."""
