"""Verifying rollouts: the Python API (`verify_rollouts`) and file runs (`verify_files`).

A file run reads its inputs twice: a first pass finds unreadable rows (written to the rejects file)
and the task types present, so an unknown task_type is refused before any work; the second pass
feeds the engine, and the reward stage shapes each verified row. Output is appended in atomic units; a rerun skips rows whose `response_id` the
output already holds, so a crashed run continues and no row is written twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from genesys.config import VerifyConfig
from genesys.data.identity import with_unique_response_ids
from genesys.data.inputs import InputFile, resolve_inputs
from genesys.data.io import BufferedWriter, RolloutWriter, RowRecord, iter_rows
from genesys.errors import InputError
from genesys.plugins.specs import Verifier
from genesys.rewards import RewardConfig, RewardStage, reward_problem
from genesys.verification.engine import VerificationEngine
from genesys.verification.pool import VerificationPool
from genesys.verification.stats import TypeStats, print_type_stats
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

FLUSH_ROWS = 10_000


def verify_rollouts(
    rows: Iterable[dict[str, Any]],
    *,
    config: VerifyConfig | None = None,
    verifiers: Mapping[str, type[Verifier]] | None = None,
) -> list[dict[str, Any]]:
    """Verify rows in memory; returns them in input order with the verdict columns added.

    `verifiers` maps task_type to Verifier class (default: every installed plugin). Classes must
    be importable by their module path, since workers are separate processes. A row the reward
    terms cannot measure keeps its score, with reward None and a `reward_error`.
    """
    config = config or VerifyConfig(progress=False)
    rewards = RewardStage(config.reward)
    out: list[dict[str, Any] | None] = []
    with VerificationEngine(config, verifiers) as engine:
        for index, row in enumerate(rows):
            out.append(None)
            engine.submit(index, row)
            for key, verified in engine.poll():
                out[key] = rewards.apply(verified)  # type: ignore[index]
        for key, verified in engine.drain():
            out[key] = rewards.apply(verified)  # type: ignore[index]
    return out  # type: ignore[return-value]


@dataclass
class RunSummary:
    """What a file run did."""

    output: Path
    stats: dict[str, TypeStats] = field(default_factory=dict)
    verified: int = 0
    resumed: int = 0
    rejected: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.verified / self.seconds if self.seconds else 0.0


def print_summary(summary: RunSummary, rejects: Path | None) -> None:
    """The closing summary of a verify run: the per task_type table, resumed and unreadable rows, the output."""
    from genesys.ui.progress import console

    print_type_stats(summary.stats, summary.verified, summary.seconds)
    if summary.resumed:
        console.print(f"resumed: {summary.resumed:,} rows were already in {summary.output}")
    if rejects is not None:
        console.print(f"[yellow]{summary.rejected:,} unreadable rows written to {rejects}")
    console.print(f"output: {summary.output}")


@dataclass
class _Scan:
    task_types: TaskTypeCensus = field(default_factory=TaskTypeCensus)
    valid_rows: int = 0
    rejected: int = 0
    reward_problems: int = 0  # rows lacking what the reward terms need
    first_reward_problem: str = ""


def default_rejects_path(output: str | Path) -> Path:
    output = Path(output)
    return output.with_name(output.name.rstrip("/") + ".rejects.jsonl")


def _unusable(record: RowRecord) -> str | None:
    """Why a row cannot be verified at all (it then goes to the rejects file), or None."""
    if record.error:
        return record.error
    task_type = record.row.get("task_type")  # type: ignore[union-attr]
    if not isinstance(task_type, str) or not task_type:
        return "field 'task_type' is missing or not a non-empty string"
    return None


def _scan(files: Sequence[InputFile], rejects_path: Path, reward: RewardConfig, known: set[str]) -> _Scan:
    scan = _Scan()
    rejects_path.parent.mkdir(parents=True, exist_ok=True)
    with open(rejects_path, "wb") as rejects:
        for record in iter_rows(files):
            reason = _unusable(record)
            if reason:
                scan.rejected += 1
                raw = record.raw if record.raw is not None else orjson.dumps(record.row).decode()
                rejects.write(
                    orjson.dumps(
                        {"location": record.location, "error": reason, "raw": raw},
                        option=orjson.OPT_APPEND_NEWLINE,
                    )
                )
                continue
            task_type = record.row["task_type"]  # type: ignore[index]
            scan.task_types.add(task_type, record.location)
            scan.valid_rows += 1
            problem = reward_problem(record.row, reward) if task_type in known else None  # type: ignore[arg-type]
            if problem:
                scan.reward_problems += 1
                scan.first_reward_problem = scan.first_reward_problem or f"{record.location}: {problem}"
    if not scan.rejected:
        rejects_path.unlink()
    return scan


def _keyed_rows(files: Sequence[InputFile]) -> Iterator[dict[str, Any]]:
    """Usable rows, each with a unique `response_id` (derived when missing, suffixed when repeated)."""
    return with_unique_response_ids(record.row for record in iter_rows(files) if not _unusable(record))  # type: ignore[misc]


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
) -> RunSummary:
    """Verify rollout files into `output` (.jsonl, .parquet, or a directory of parquet shards).

    Raises InputError (before any verification) for missing inputs and unknown task types.
    """
    from genesys.ui.progress import RunProgress

    config = config or VerifyConfig()
    files = resolve_inputs(inputs)
    if verifiers is None:
        from genesys.plugins.registry import verifier_entries

        verifiers = {task_type: entry.cls for task_type, entry in verifier_entries().items()}
    rejects_path = Path(rejects) if rejects else default_rejects_path(output)
    scan = _scan(files, rejects_path, config.reward, set(verifiers))
    if not config.skip_unknown:
        refuse_unknown(scan.task_types, verifiers)
    if scan.reward_problems:
        raise InputError(
            f"{config.reward.describe()}: {scan.reward_problems} row(s) lack what it needs; the first: {scan.first_reward_problem}"
        )
    rewards = RewardStage(config.reward)
    writer = RolloutWriter(output)
    done = writer.existing_keys()
    summary = RunSummary(output=Path(output), rejected=scan.rejected)
    started = time.monotonic()

    def collect(
        verified: list[tuple[Any, dict[str, Any]]], out: BufferedWriter, progress: RunProgress
    ) -> None:
        out.add([rewards.apply(row) for _, row in verified])
        progress.advance(len(verified))
        summary.verified += len(verified)

    with BufferedWriter(
        writer, FLUSH_ROWS
    ) as out:  # on an interruption too, rows verified so far are written
        with RunProgress(scan.valid_rows, "verifying", "rows", enabled=config.progress) as progress:
            with verification_pool(config, verifiers, set(scan.task_types.counts)) as engine:
                for row in _keyed_rows(files):
                    if row["response_id"] in done:
                        summary.resumed += 1
                        progress.skip(1)
                        continue
                    engine.submit(row["response_id"], row)
                    if engine.outstanding >= 256:
                        collect(engine.poll(), out, progress)
                while engine.outstanding:
                    collect(engine.poll(timeout=0.05), out, progress)
                summary.stats = engine.stats
    writer.close()
    summary.seconds = time.monotonic() - started
    if config.progress:
        print_summary(summary, rejects_path if scan.rejected else None)
    return summary
