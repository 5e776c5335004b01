"""Typed settings of every command (pydantic), their TOML files and the `key=value` options of flags.

- `sections`: the settings shared by every command (sampling, prompt style, backend options, verify,
  sandbox, reward, proofs, cluster, filter), each one section with its defaults, checks and help.
- `commands`: each command composes sections into one model whose shape is its TOML file:
  top-level keys, then one table per section. The command line is made from the same models
  (`genesys.cli.flags`): every key is a dotted flag (`--sampling.temperature 0.7`), and the short
  flags users know (`--temperature`) are aliases. `genesys verify` and `genesys generate --verify`
  read the same `[verify]`, `[sandbox]` and `[reward]` tables.
- `loading`: TOML files, tables laid over each other, validation errors as one line each.
- `options`: `key=value` options as written on the command line (`-O`, `-B`, `--tasks` specs).

Every name below is importable from `genesys.config`.
"""

from genesys.config.commands import (
    FilterCommand,
    GenerateCommand,
    GenerateConfig,
    ValidateCommand,
    VerifyCommand,
)
from genesys.config.loading import describe_errors, load_toml, merge, validate
from genesys.config.sections import (
    BACKEND_ARGS_KEYWORD,
    BACKEND_OPTION_OWNERS,
    DEFAULT_LENGTH_COEF,
    DEFAULT_PROOF_CHUNK,
    DEFAULT_PROOF_TOPK,
    DEFAULT_TARGET_LENGTH_PROMPT,
    LENGTH_PENALTIES,
    METRICS,
    PROOF_BACKENDS,
    PROOFS_HELP,
    REQUIRE_PROOFS_HELP,
    REWARD_TERMS,
    SANDBOXES,
    SECTION,
    BackendOptions,
    ClusterConfig,
    ExpectedSampling,
    FilterConfig,
    GenerateProofSettings,
    GenerateVerifySettings,
    PromptStyle,
    ProofConfig,
    ProofPolicy,
    ProofThresholds,
    RewardConfig,
    SamplingConfig,
    SandboxConfig,
    VerifyConfig,
    VerifySettings,
    setting,
)

__all__ = [
    "BACKEND_ARGS_KEYWORD",
    "BACKEND_OPTION_OWNERS",
    "DEFAULT_LENGTH_COEF",
    "DEFAULT_PROOF_CHUNK",
    "DEFAULT_PROOF_TOPK",
    "DEFAULT_TARGET_LENGTH_PROMPT",
    "LENGTH_PENALTIES",
    "METRICS",
    "PROOFS_HELP",
    "PROOF_BACKENDS",
    "REQUIRE_PROOFS_HELP",
    "REWARD_TERMS",
    "SANDBOXES",
    "SECTION",
    "BackendOptions",
    "ClusterConfig",
    "ExpectedSampling",
    "FilterCommand",
    "FilterConfig",
    "GenerateCommand",
    "GenerateConfig",
    "GenerateProofSettings",
    "GenerateVerifySettings",
    "PromptStyle",
    "ProofConfig",
    "ProofPolicy",
    "ProofThresholds",
    "RewardConfig",
    "SamplingConfig",
    "SandboxConfig",
    "ValidateCommand",
    "VerifyCommand",
    "VerifyConfig",
    "VerifySettings",
    "describe_errors",
    "load_toml",
    "merge",
    "setting",
    "validate",
]
