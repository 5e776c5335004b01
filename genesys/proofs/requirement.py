"""What `--require-proofs` counts (`genesys filter`, `genesys train`): never a flag a row carries.

A row counts only when its attestation checks out under the trust key (so it is, unchanged, what
`genesys validate` and then `genesys verify` wrote on the trusted side), `genesys validate` marked it
valid, it was rebuilt from a trusted task set (`genesys validate --tasks`), and its tokens are proven
to be the seeded sampler's picks (`sampling_proven`; see `genesys.proofs.sampling`). Given a trusted
task set of its own (`--tasks`), the consumer also counts only rows of tasks in it, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from genesys.data.attestation import TrustKey
from genesys.proofs.trusted_tasks import TrustedTasks
from genesys.schema import Row


@dataclass
class ProofRequirement:
    """The trust key rows must be attested under, and the trusted task set they must belong to (if any)."""

    key: TrustKey
    trusted: TrustedTasks | None = None

    @classmethod
    def load(cls, trust_key: str | None, tasks: Sequence[str] | None) -> ProofRequirement:
        """The key in `trust_key` (default: the one `genesys validate` made) and the task sources
        `tasks`; a missing key is an InputError naming the flag."""
        return cls(TrustKey.load(trust_key), TrustedTasks.load(tasks) if tasks else None)

    def problem(self, row: Row) -> str | None:
        """Why `row` does not count, or None when it does."""
        problem = self.key.problem(row)
        if problem:
            return problem
        if row.get("toploc_valid") is not True:
            return f"genesys validate did not mark it valid ({row.get('toploc_reason') or 'no reason given'})"
        if row.get("trusted_task") is not True:
            return "it was not validated against a trusted task set (genesys validate --tasks)"
        if row.get("sampling_proven") is not True:
            return "its sampling is not proven (generated without sampling proofs, or validated with --allow-unsampled)"
        return self.trusted.problem(row) if self.trusted is not None else None
