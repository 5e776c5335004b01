"""Typed settings of every command (pydantic), their TOML files and the `key=value` options of flags.

- `sections`: the settings shared by every command (data, sampling, prompt style, backend options,
  verify, sandbox and its `Limits`, reward, proofs, cluster) and those one command owns (filter,
  validate's thresholds, train's rollout groups, optimizer, loss, checkpoints, sft's batches), each one section
  with its defaults, checks and help.
- `commands`: each command composes sections into one model whose shape is its TOML file:
  top-level keys, then one table per section; a key shared by two commands is the same key, with
  the same type and default, in both. The command line is made from the same models
  (`genesys.cli.flags`): every key is a dotted flag (`--sampling.temperature 0.7`), and the short
  flags users know (`--temperature`) are aliases. `verify_config` makes what the verification engine
  takes from any command's `[verify]`, `[sandbox]`, `[reward]` and `[cluster]`.
- `loading`: TOML files, tables laid over each other, renamed keys (read with a warning naming the
  new key), validation errors as one line each.
- `options`: `key=value` options as written on the command line (`-O`, `-B`, `--tasks` specs).

Every name below is importable from `genesys.config`.
"""

from genesys.config.commands import (
    DEFAULT_BACKEND,
    FilterCommand,
    GenerateCommand,
    GenerateConfig,
    SftConfig,
    TrainConfig,
    ValidateCommand,
    VerifyCommand,
    verify_config,
)
from genesys.config.loading import RenamedKeys, describe_errors, load_toml, merge, upgrade, validate
from genesys.config.sections import (
    BACKEND_ARGS_KEYWORD,
    BACKEND_OPTION_OWNERS,
    DEFAULT_LENGTH_COEF,
    DEFAULT_PROOF_CHUNK,
    DEFAULT_PROOF_TOPK,
    DEFAULT_TARGET_LENGTH_PROMPT,
    LENGTH_PENALTIES,
    LIMIT_NAMES,
    METRICS,
    PROOF_BACKENDS,
    PROOFS_HELP,
    REQUIRE_PROOFS_HELP,
    REWARD_TERMS,
    SANDBOXES,
    SECTION,
    BackendOptions,
    ClusterConfig,
    DataConfig,
    ExpectedSampling,
    FilterConfig,
    GenerateData,
    GenerateProofSettings,
    GenerateVerifySettings,
    Limits,
    PromptStyle,
    ProofConfig,
    ProofPolicy,
    ProofThresholds,
    RewardConfig,
    SamplingConfig,
    SandboxConfig,
    SftData,
    SftSettings,
    TrainData,
    VerifyConfig,
    VerifySettings,
    setting,
)

__all__ = [
    "BACKEND_ARGS_KEYWORD",
    "BACKEND_OPTION_OWNERS",
    "DEFAULT_BACKEND",
    "DEFAULT_LENGTH_COEF",
    "DEFAULT_PROOF_CHUNK",
    "DEFAULT_PROOF_TOPK",
    "DEFAULT_TARGET_LENGTH_PROMPT",
    "LENGTH_PENALTIES",
    "LIMIT_NAMES",
    "METRICS",
    "PROOFS_HELP",
    "PROOF_BACKENDS",
    "REQUIRE_PROOFS_HELP",
    "REWARD_TERMS",
    "SANDBOXES",
    "SECTION",
    "BackendOptions",
    "ClusterConfig",
    "DataConfig",
    "ExpectedSampling",
    "FilterCommand",
    "FilterConfig",
    "GenerateCommand",
    "GenerateConfig",
    "GenerateData",
    "GenerateProofSettings",
    "GenerateVerifySettings",
    "Limits",
    "PromptStyle",
    "ProofConfig",
    "ProofPolicy",
    "ProofThresholds",
    "RenamedKeys",
    "RewardConfig",
    "SamplingConfig",
    "SandboxConfig",
    "SftConfig",
    "SftData",
    "SftSettings",
    "TrainConfig",
    "TrainData",
    "ValidateCommand",
    "VerifyCommand",
    "VerifyConfig",
    "VerifySettings",
    "describe_errors",
    "load_toml",
    "merge",
    "setting",
    "upgrade",
    "validate",
    "verify_config",
]
