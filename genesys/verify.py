"""Deprecated: `genesys.verify` moved to `genesys.verification.api`."""

import warnings

from genesys.verification.api import *  # noqa: F403
from genesys.verification.api import __all__  # noqa: F401

warnings.warn(
    "genesys.verify is deprecated; import from genesys.verification.api", DeprecationWarning, stacklevel=2
)
