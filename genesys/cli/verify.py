"""`genesys verify`: score rollout files with the installed verifiers."""

from __future__ import annotations

from genesys.cli.flags import config_command
from genesys.config import VerifyCommand


@config_command(
    "verify",
    VerifyCommand,
    short_help="score rollout files with the installed verifiers",
    help="Score rollouts (jsonl, parquet, or directories of parquet shards; - reads JSON lines from stdin) and "
    "write them, in input order, with score, verification_result_info, reward and error. Rows genesys validate "
    "attested are checked and attested again with the trust key (--trust-key). Rerunning the same command "
    "resumes; --retry-errors verifies again the rows whose error is set; --overwrite starts over.",
)
def command(config: VerifyCommand) -> int:
    from genesys.verification.api import verify_files

    verify_files(
        config.inputs,
        config.output,
        config=config.build(),
        rejects=config.rejects,
        trust_key=config.proofs.trust_key,
        retry_errors=config.retry_errors,
        overwrite=config.overwrite,
    )
    return 0
