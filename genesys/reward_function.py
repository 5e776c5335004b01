"""Deprecated: `genesys.reward_function` moved to `genesys.verification.reward_function`."""

import warnings

from genesys.verification.reward_function import RewardFunction, rollout_rows

__all__ = ["RewardFunction", "rollout_rows"]

warnings.warn(
    "genesys.reward_function is deprecated; import from genesys.verification.reward_function",
    DeprecationWarning,
    stacklevel=2,
)
