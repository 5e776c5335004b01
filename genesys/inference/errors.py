"""The errors of a pipeline ring, each naming the stage or connection it is about."""

from __future__ import annotations

from genesys.errors import GenesysError


class StageError(GenesysError, RuntimeError):
    """A pipeline stage failed, died, stopped answering or sent something malformed; the message names
    the stage."""


class AuthenticationError(StageError):
    """A connection whose other end did not prove it knows the ring's secret, or a message whose MAC
    does not check out; nothing it sent is used."""
