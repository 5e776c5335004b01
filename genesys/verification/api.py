"""Verifying rollouts: the Python API (`verify_rollouts`) and file runs (`verify_files`).

A file run (`genesys.data.runs.FileRun`: overlap refused, output locked, unreadable rows to the
rejects file, resume, one flush policy) reads its inputs twice: a first pass finds unusable rows
(to the rejects file) and the task types present, so an unknown task_type is refused before any
work; the second pass feeds the engine, and the reward stage shapes each verified row. Rows come
back from the workers in the order they finish and are written in input order (`InOrder`); rows
held behind a slow one count against `max_pending_rows`. A rerun skips rows whose `response_id` the
output already holds, so a crashed run continues and no row is written twice; with `retry_errors`
the rows whose `error` is set are taken out of the output and verified again. With `completion_field`, each row's completion is read from that column and written
as `llm_response`; a row without a completion (missing or null) is an `invalid_row` error.

Rows `genesys validate` attested (`genesys.data.attestation`) are checked under the trust key before
they are scored, and the scored row is attested again, so `--require-proofs` can tell the score is
this run's; a row whose attestation does not check out is written without one (and counted).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genesys.config import VerifyConfig
from genesys.data.attestation import ATTESTATION_COLUMN, TrustKey
from genesys.data.identity import with_unique_response_ids
from genesys.data.runs import FileRun, FileRunSummary, InOrder
from genesys.errors import InputError
from genesys.plugins.specs import Verifier
from genesys.rewards import RewardStage, reward_problem
from genesys.schema import COMPLETION_COLUMN
from genesys.verification.engine import VerificationEngine
from genesys.verification.pool import VerificationPool
from genesys.verification.stats import RewardMeans, TypeStats, print_type_stats
from genesys.verification.task_types import TaskTypeCensus, refuse_unknown

__all__ = [
    "RunSummary",
    "VerificationEngine",
    "VerifyConfig",
    "print_summary",
    "verification_pool",
    "verify_files",
    "verify_rollouts",
]


def verify_rollouts(
    rows: Iterable[dict[str, Any]],
    *,
    config: VerifyConfig | None = None,
    verifiers: Mapping[str, type[Verifier]] | None = None,
) -> list[dict[str, Any]]:
    """Verify rows in memory; returns them in input order with the verdict columns added.

    `verifiers` maps task_type to Verifier class (default: every installed plugin). Classes must
    be importable by their module path, since workers are separate processes. A row the reward
    terms cannot measure keeps its score, with reward None and a `reward_error`. With
    `config.completion_field`, the completion is read from that column (and returned as `llm_response`).
    """
    config = config or VerifyConfig(progress=False)
    rewards = RewardStage(config.reward)
    out: list[dict[str, Any] | None] = []
    with VerificationEngine(config, verifiers) as engine:
        for index, row in enumerate(rows):
            out.append(None)
            engine.submit(index, map_completion(row, config.completion_field))
            for key, verified in engine.poll():
                out[key] = rewards.apply(verified)  # type: ignore[index]
        for key, verified in engine.drain():
            out[key] = rewards.apply(verified)  # type: ignore[index]
    return out  # type: ignore[return-value]


def map_completion(row: dict[str, Any], completion_field: str) -> dict[str, Any]:
    """`row` with its `completion_field` column renamed `llm_response` (in place), when it has one."""
    if completion_field != COMPLETION_COLUMN and completion_field in row:
        row[COMPLETION_COLUMN] = row.pop(completion_field)
    return row


@dataclass
class RunSummary(FileRunSummary):
    """What a file run did."""

    stats: dict[str, TypeStats] = field(default_factory=dict)
    verified: int = 0
    attested: int = 0  # rows attested again after scoring
    unattested: int = 0  # rows whose attestation did not check out: written without one
    rewards: RewardMeans | None = None  # mean reward per task_type, when the reward is not the score

    @property
    def rows_per_second(self) -> float:
        return self.verified / self.seconds if self.seconds else 0.0


def print_summary(summary: RunSummary, rejects: Path | None = None) -> None:
    """The closing summary of a verify run: the per task_type table, resumed and unreadable rows, the output."""
    from genesys.ui.progress import console

    print_type_stats(summary.stats, summary.verified, summary.seconds, summary.rewards)
    if summary.resumed:
        console.print(f"resumed: {summary.resumed:,} rows were already in {summary.output}")
    if summary.retried:
        console.print(f"retried: {summary.retried:,} rows with an error were taken out of {summary.output}")
    if summary.attested or summary.unattested:
        console.print(f"attested again under the trust key: {summary.attested:,} rows")
    if summary.unattested:
        console.print(
            f"[yellow]{summary.unattested:,} rows carried an attestation that does not check out "
            "(changed since genesys validate, or another key): written without one[/yellow]"
        )
    if rejects is not None and summary.rejects is None:
        summary.rejects = rejects
    summary.print_files()


def print_problems(command: str, stats: Mapping[str, TypeStats], summary: FileRunSummary) -> None:
    """What went wrong in a run without a progress bar (and so without the closing table): rows that
    could not be verified and rows that could not be read, in one line on stderr; nothing otherwise."""
    from genesys.ui.progress import console

    failed = sum(s.errors + s.timeouts for s in stats.values())
    said = []
    if failed:
        verified = sum(s.count for s in stats.values())
        said.append(
            f"{failed:,} of {verified:,} rows could not be verified (their error is set; "
            f"genesys {command} --retry-errors verifies them again)"
        )
    if summary.rejected:
        said.append(f"{summary.rejected:,} unreadable rows written to {summary.rejects}")
    if said:
        console.print(f"genesys {command}: {'; '.join(said)}", markup=False, highlight=False, soft_wrap=True)


@dataclass
class _Scan:
    task_types: TaskTypeCensus = field(default_factory=TaskTypeCensus)
    valid_rows: int = 0
    attested: int = 0  # rows carrying an attestation
    reward_problems: int = 0  # rows lacking what the reward terms need
    first_reward_problem: str = ""


def _unusable(row: dict[str, Any]) -> str | None:
    """Why a readable row cannot be verified at all (it then goes to the rejects file), or None."""
    task_type = row.get("task_type")
    if not isinstance(task_type, str) or not task_type:
        return "field 'task_type' is missing or not a non-empty string"
    return None


def _scan(run: FileRun[RunSummary], config: VerifyConfig, known: set[str]) -> _Scan:
    """The first pass: unusable rows to the rejects file; task types and reward problems counted."""
    scan = _Scan()
    for location, row in run.located_rows(_unusable):
        row = map_completion(row, config.completion_field)
        task_type = row["task_type"]
        scan.task_types.add(task_type, location)
        scan.valid_rows += 1
        scan.attested += bool(row.get(ATTESTATION_COLUMN))
        problem = reward_problem(row, config.reward) if task_type in known else None
        if problem:
            scan.reward_problems += 1
            scan.first_reward_problem = scan.first_reward_problem or f"{location}: {problem}"
    return scan


def verification_pool(
    config: VerifyConfig,
    verifiers: Mapping[str, type[Verifier]] | None = None,
    expected_types: set[str] | None = None,
) -> VerificationPool:
    """The pool `config.cluster` asks for: worker processes here, or actors on a Ray cluster."""
    if config.cluster.ray:
        from genesys.verification.ray_pool import RayVerificationPool

        return RayVerificationPool(config, verifiers, expected_types)
    return VerificationEngine(config, verifiers, expected_types=expected_types)


def verify_files(
    inputs: Sequence[str],
    output: str | Path,
    *,
    config: VerifyConfig | None = None,
    rejects: str | Path | None = None,
    verifiers: Mapping[str, type[Verifier]] | None = None,
    trust_key: str | Path | None = None,
    retry_errors: bool = False,
    overwrite: bool = False,
) -> RunSummary:
    """Verify rollout files into `output` (.jsonl, .parquet, or a directory of parquet shards).

    Rows are written in input order. Rows carrying an attestation are checked and attested again
    with the key in `trust_key` (default: the one `genesys validate` made). `retry_errors`: rows of
    the output whose `error` is set are verified again and replaced. `overwrite`: an existing output
    is removed first (otherwise it is resumed). Raises InputError (before any verification) for
    missing inputs, an output overlapping an input, an output another run is writing, unknown task
    types, unknown verifier options, and attested rows without a trust key.
    """
    config = config or VerifyConfig()
    summary = RunSummary(output=Path(output))
    retry_column = "error" if retry_errors else None
    with FileRun(
        output, summary, inputs=inputs, rejects=rejects, retry_column=retry_column, overwrite=overwrite
    ) as run:
        if verifiers is None:
            from genesys.plugins.registry import verifier_entries

            verifiers = {task_type: entry.cls for task_type, entry in verifier_entries().items()}
        scan = _scan(run, config, set(verifiers))
        if not config.skip_unknown:
            refuse_unknown(scan.task_types, verifiers)
        if scan.reward_problems:
            raise InputError(
                f"{config.reward.describe()}: {scan.reward_problems} row(s) lack what it needs; the first: {scan.first_reward_problem}"
            )
        key = TrustKey.load(trust_key, flag="--trust-key") if scan.attested else None
        rewards = RewardStage(config.reward)
        # made (and its verifier options checked) before the progress bar shows: a refusal comes alone
        pool = verification_pool(config, verifiers, set(scan.task_types.counts))
        run.open_output()
        started = time.monotonic()
        in_order = InOrder()
        if not rewards.is_score:
            summary.rewards = RewardMeans()

        def collect(verified: list[tuple[Any, dict[str, Any]]]) -> None:
            for number, row in verified:
                row = rewards.apply(row)
                if key is not None and row.get(ATTESTATION_COLUMN):
                    row[ATTESTATION_COLUMN] = key.sign(row)
                    summary.attested += 1
                if summary.rewards is not None:
                    summary.rewards.add(row)
                ready = in_order.add(number, row)
                if ready:
                    run.write(ready)
            progress.advance(len(verified))
            summary.verified += len(verified)

        # on an interruption too, the run writes the rows verified so far
        with (
            pool as engine,
            run.progress(scan.valid_rows, "verifying", "rows", enabled=config.progress) as progress,
        ):
            usable = (map_completion(row, config.completion_field) for row in run.rows(_unusable))
            try:
                for number, row in enumerate(run.pending(with_unique_response_ids(usable))):
                    if key is not None and row.get(ATTESTATION_COLUMN) and key.problem(row):
                        row[ATTESTATION_COLUMN] = None
                        summary.unattested += 1
                    engine.submit(number, row)
                    if engine.outstanding >= 256:
                        collect(engine.poll())
                    while len(in_order) > config.max_pending_rows:  # rows held behind a slow one
                        collect(engine.poll(timeout=0.05))
                while engine.outstanding:
                    collect(engine.poll(timeout=0.05))
            finally:
                run.write(in_order.rest())  # interrupted: what was verified is kept, out of order
            summary.stats = engine.stats
    summary.seconds = time.monotonic() - started
    if config.progress:
        print_summary(summary)
    else:
        print_problems("verify", summary.stats, summary)
    return summary
