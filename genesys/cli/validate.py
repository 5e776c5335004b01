"""`genesys validate`: check rollouts' TOPLOC proofs, logprobs and claims against the model they name."""

from __future__ import annotations

from genesys.cli.flags import config_command
from genesys.config import ValidateCommand


@config_command(
    "validate",
    ValidateCommand,
    short_help="check rollouts' TOPLOC proofs and logprobs against the model they claim",
    help="Recompute rollouts written with `genesys generate --proofs` in one prefill with --model and write each "
    "with toploc_valid (true, false, or null when it has no proofs), toploc_reason and toploc_errors. Besides the "
    "TOPLOC proofs, a row must name the expected model and weights, its ids must decode to its text, its logprobs "
    "must match the model's, and it must stop within max_tokens at its first stop token. Rerunning the same "
    "command resumes; --retry-errors validates again the rows not found valid; --overwrite starts over.",
)
def command(config: ValidateCommand) -> int:
    from genesys.proofs.validate import validate_files

    validate_files(config)
    return 0
