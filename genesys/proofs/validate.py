"""`genesys validate`: recompute rollouts with the model they claim, and mark each valid or not.

Rows are validated in batches of similar length: the model (transformers or vLLM,
`genesys.proofs.recompute`) runs one prefill over prompt + completion and recomputes the final
hidden states that produced each completion token (checked against the row's TOPLOC proofs, chunk by
chunk) and the logprobs the sampling settings imply (checked against the row's). The other checks
of `genesys.proofs.checks` need no model. Each row is written with:

- `toploc_valid`: true when every check passed, false when one failed, null when the row has no proofs;
- `toploc_reason`: why it is not valid (null when valid);
- `toploc_errors`: the measured errors: the worst chunk's exponent mismatches and mantissa error
  mean and median, how many chunks failed, and the largest logprob difference;
- `toploc_problems`: the categories of the problems found (model, proof, proof_format, logprobs,
  text, stop, sampling, sampling_proof, format; unproved for a row without proofs);
- `sampling_proven`: true when the row's tokens are the ones the seeded sampler picks from its seed
  (`genesys.proofs.sampling`), false when they are not, null when it has no sampling proof.

The run is a `genesys.data.runs.FileRun`: an output overlapping an input is refused, the output is
locked, unreadable rows go to the rejects file, output is appended in atomic units and a rerun skips
rows whose `response_id` the output already holds; with `retry_errors`, rows the output holds that
were not found valid (`toploc_reason` set) are taken out and validated again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from genesys.config import ExpectedSampling, ProofConfig, ProofThresholds, SamplingConfig, ValidateCommand
from genesys.data.attestation import ATTESTATION_COLUMN, TrustKey
from genesys.data.identity import with_unique_response_ids
from genesys.data.runs import FileRun, FileRunSummary
from genesys.plugins.registry import environments
from genesys.proofs.checks import (
    SAMPLING_KEYS,
    Expected,
    Problem,
    RowSampling,
    claimed_logprobs_problem,
    decode_problem,
    logprob_problem,
    model_problems,
    prompt_problem,
    proof_settings,
    row_sampling,
    sampling_problems,
    stop_problems,
)
from genesys.proofs.recompute import Pending, Recomputed, recomputer
from genesys.proofs.sampling import SamplingKey, margin_problem, sampling_key, sampling_proven
from genesys.proofs.toploc import ChunkErrors, ProofError, decode_proofs, require_toploc
from genesys.proofs.trajectories import (
    environment_problem,
    is_trajectory,
    mask_problem,
    merged,
    replay_problems,
    turn_parts,
    turn_problems,
    turn_proofs,
)
from genesys.proofs.trusted_tasks import TrustedTasks
from genesys.schema import SchemaError, parse_json_field
from genesys.ui.progress import RunProgress

WINDOW_BATCHES = 8  # rows are sorted by length within this many batches, so a batch pads little
NO_PROOFS = "the row has no toploc_proofs"


@dataclass
class ValidateSummary(FileRunSummary):
    """What a validation run did; `problems` counts invalid rows by the categories of their problems."""

    valid: int = 0
    invalid: int = 0
    unproved: int = 0
    task_bound: int = 0  # rows rebuilt from their trusted task
    tokens: int = 0
    trust_key: TrustKey | None = None
    problems: Counter[str] = field(default_factory=Counter)

    @property
    def validated(self) -> int:
        return self.valid + self.invalid + self.unproved


class Validator:
    """The model a run validates against (`genesys.proofs.recompute`), and the checks of one batch of rows."""

    def __init__(self, config: ValidateCommand, trusted: TrustedTasks | None = None) -> None:
        require_toploc()
        self.config = config
        self.trusted = trusted
        self.model = recomputer(config)
        self.expected = Expected(
            config.model_name or config.model,
            self.model.weights_sha256,
            config.proofs,
            config.expect if trusted is None else trusted_sampling(config.expect),
            self.model.hidden_size,
        )
        self._prompt_ids: dict[tuple[str, int | None], list[int]] = {}
        self.environments = environments()

    def prepare(self, row: dict[str, Any]) -> Pending | dict[str, Any]:
        """A row needing the model, or the row finished already (no proofs, or unusable ids). With a
        trusted task set, the row is first rebuilt from its trusted task (`TrustedTasks.bind`)."""
        key, problems = None, []
        if self.trusted is not None:
            row, key, found = self.trusted.bind(row)
            problems += [Problem("task", message) for message in found]
        row["trusted_task"] = key is not None
        if row.get("toploc_proofs") is None:
            return _finish(row, None, [*problems, Problem("unproved", NO_PROOFS)], {})
        prompt_ids, completion_ids = row.get("prompt_ids"), row.get("completion_ids")
        try:
            toploc_config = parse_json_field(row.get("toploc_config"), "toploc_config")
            generation_config = parse_json_field(row.get("generation_config"), "generation_config")
        except SchemaError as exc:
            return _finish(row, False, [*problems, Problem("format", str(exc))], {})
        sampling = row_sampling(generation_config)
        vocab_size, tokenizer = self.model.vocab_size, self.model.tokenizer
        if not _token_list(prompt_ids, vocab_size) or not _token_list(
            completion_ids, vocab_size, allow_empty=True
        ):
            message = f"prompt_ids and completion_ids must be lists of token ids below {vocab_size}"
            return _finish(row, False, [*problems, Problem("format", message)], {})
        if isinstance(sampling, Problem):
            return _finish(row, False, [*problems, sampling], {})
        problems += model_problems(row, toploc_config, self.expected) + sampling_problems(
            sampling, self.expected.sampling
        )
        if key is not None:  # the trusted settings from here on, and in the row written
            sampling = RowSampling(**{name: getattr(self.expected.sampling, name) for name in SAMPLING_KEYS})
            row["generation_config"] = generation_config | asdict(sampling)
        settings = proof_settings(toploc_config, self.expected)  # the row's own, if allowed
        if isinstance(settings, Problem):
            problems.append(settings)
            settings = None
        sampling_proof = sampling_key(row, self.config.expect, self.config.proofs.require_sampling)
        if isinstance(sampling_proof, Problem):
            problems.append(sampling_proof)
            sampling_proof = None
        if is_trajectory(row, self.environments):  # its prompt is checked by the replay
            if key is not None:
                target = self._target_length(row, key, generation_config)
                found = target if isinstance(target, Problem) else target.problem
                problems += [found] if found is not None else []
            return self._prepare_trajectory(row, sampling, settings, sampling_proof, problems)
        if key is not None:
            problems += self._task_prompt_problems(row, key, prompt_ids, generation_config)
        else:
            problems += [p for p in [prompt_problem(tokenizer, prompt_ids, row.get("prompt"))] if p]
        problems += stop_problems(
            completion_ids, row.get("finish_reason"), sampling.max_tokens, self.model.stop_ids
        )
        problems += [p for p in [decode_problem(tokenizer, completion_ids, row.get("llm_response"))] if p]
        proofs = None
        if settings is not None:
            try:
                proofs = decode_proofs(row["toploc_proofs"], len(completion_ids), settings)
            except ProofError as exc:
                problems.append(Problem("proof_format", str(exc)))
        return Pending(
            row, list(prompt_ids), list(completion_ids), sampling, proofs, problems, settings, sampling_proof
        )

    def _prepare_trajectory(
        self,
        row: dict[str, Any],
        sampling: RowSampling,
        settings: ProofConfig | None,
        key: SamplingKey | None,
        problems: list[Problem],
    ) -> Pending | dict[str, Any]:
        """A trajectory row needing the model, its environment side replayed and found to be the
        row's (`genesys.proofs.trajectories`), or the row finished as invalid."""
        environment = self.environments.get(row.get("task_type"))
        prompt_ids, completion_ids = list(row["prompt_ids"]), list(row["completion_ids"])
        claimed = row.get("completion_logprobs")
        found = environment_problem(row, environment) or mask_problem(
            row.get("completion_mask"), claimed, len(completion_ids)
        )
        if found is not None:
            return _finish(row, False, [*problems, found], {})
        turns, found_problems = replay_problems(
            row, environment, self.model.tokenizer, self.config.style, self.model.stop_ids
        )
        problems += found_problems
        if turns is None:
            return _finish(row, False, problems, {})
        problems += turn_problems(completion_ids, turns, sampling.max_tokens, self.model.stop_ids)
        proofs = None if settings is None else turn_proofs(row["toploc_proofs"], turns, settings)
        if isinstance(proofs, Problem):
            problems.append(proofs)
            proofs = None
        model_positions = [position for start, end in turns for position in range(start, end)]
        return Pending(
            row,
            prompt_ids,
            [completion_ids[position] for position in model_positions],
            sampling,
            None if proofs is None else [proof for turn in proofs for proof in turn],
            problems,
            settings,
            key,
            parts=turn_parts(row, prompt_ids, completion_ids, turns, sampling, proofs, settings, key),
            claimed_logprobs=claimed
            if claimed_logprobs_problem(claimed, len(completion_ids))
            else [claimed[position] for position in model_positions],
        )

    def _task_prompt_problems(
        self, row: dict[str, Any], key: str, prompt_ids: Sequence[int], generation_config: dict[str, Any]
    ) -> list[Problem]:
        """Whether `prompt_ids` are the trusted task's prompt as `genesys generate` renders it (system
        prompt, target-length instruction, chat template, continuation prefix), and the row's
        `target_length` the trusted one (`_target_length`)."""
        target = self._target_length(row, key, generation_config)
        if isinstance(target, Problem):
            return [target]
        problems = [] if target.problem is None else [target.problem]
        if list(prompt_ids) != self._trusted_prompt_ids(key, row["prompt"], target.value):
            problems.append(
                Problem(
                    "task",
                    "prompt_ids are not the trusted task's prompt as rendered for the model (chat template, "
                    "--system-prompt, --continuation-prefix, target length)",
                )
            )
        return problems

    def _target_length(
        self, row: dict[str, Any], key: str, generation_config: dict[str, Any]
    ) -> _Target | Problem:
        """The target length the trusted settings give the row's task (set as its `target_length`),
        and the problem when the row claimed another; a Problem when it cannot be picked."""
        from genesys.tasks.prompts import pick_target_length

        data = self.config.data
        claimed = row.pop("target_length", None)
        target = None
        if data.target_lengths:
            seed = generation_config.get("seed")
            if not isinstance(seed, int) or isinstance(seed, bool):
                return Problem("task", "generation_config has no integer seed to pick the target length by")
            target = row["target_length"] = pick_target_length(data.target_lengths, key, seed)
        if claimed == target:
            return _Target(target, None)
        given = f"{target} for its task and seed" if target is not None else "none (no --target-lengths)"
        return _Target(
            target, Problem("task", f"target_length {claimed!r}, where the trusted settings give {given}")
        )

    def _trusted_prompt_ids(self, key: str, prompt: str, target: int | None) -> list[int]:
        from genesys.tasks.prompts import build_messages, render_ids, target_instruction

        if (key, target) not in self._prompt_ids:
            data = self.config.data
            instruction = (
                target_instruction(data.target_length_prompt, target) if target is not None else None
            )
            messages = build_messages(prompt, data.system_prompt, instruction)
            self._prompt_ids[key, target] = render_ids(self.model.tokenizer, messages, self.config.style)
        return self._prompt_ids[key, target]

    def run(self, batch: Sequence[Pending]) -> list[dict[str, Any]]:
        """The batch recomputed at once (a trajectory as its model turns); each row finished with its
        proof and logprob checks."""
        recomputed = iter(self.model.recompute([part for item in batch for part in item.parts or [item]]))
        return [
            self._judge(
                item,
                next(recomputed) if item.parts is None else merged([next(recomputed) for _ in item.parts]),
            )
            for item in batch
        ]

    def _judge(self, item: Pending, recomputed: Recomputed) -> dict[str, Any]:
        problems = list(item.problems)
        errors: dict[str, Any] = {}
        if recomputed.chunks is not None:
            errors.update(_chunk_summary(recomputed.chunks, self.config.thresholds))
            if errors["failed_chunks"]:
                problems.append(
                    Problem(
                        "proof",
                        f"{errors['failed_chunks']} of {len(recomputed.chunks)} chunks beyond the TOPLOC thresholds",
                    )
                )
        claimed = (
            item.row.get("completion_logprobs") if item.claimed_logprobs is None else item.claimed_logprobs
        )
        malformed = claimed_logprobs_problem(claimed, len(item.completion_ids))
        if malformed is not None:
            problems.append(malformed)
        else:
            errors["max_logprob_diff"], problem = logprob_problem(
                claimed, recomputed.logprobs, self.config.thresholds.logprob_tolerance
            )
            problems += [problem] if problem else []
        if recomputed.margins is not None:
            measured, problem = margin_problem(recomputed.margins, self.config.thresholds.sampling_margin)
            errors.update(measured)
            problems += [problem] if problem else []
        return _finish(item.row, not problems, problems, errors)


@dataclass(frozen=True)
class _Target:
    """A trusted target length (None: none) and the problem with the row's claim."""

    value: int | None
    problem: Problem | None


def _token_list(value: Any, vocab_size: int, allow_empty: bool = False) -> bool:
    return (
        isinstance(value, (list, tuple))
        and (allow_empty or bool(value))
        and all(isinstance(t, int) and 0 <= t < vocab_size for t in value)
    )


def _chunk_summary(chunks: Sequence[ChunkErrors], thresholds: ProofThresholds) -> dict[str, Any]:
    """The worst chunk's errors and how many chunks fail the thresholds."""
    return {
        "chunks": len(chunks),
        "failed_chunks": sum(not chunk.within(thresholds) for chunk in chunks),
        "max_exp_mismatches": max((c.exp_mismatches for c in chunks), default=0),
        "max_mant_err_mean": max((c.mant_err_mean for c in chunks), default=0.0),
        "max_mant_err_median": max((c.mant_err_median for c in chunks), default=0.0),
    }


def _finish(
    row: dict[str, Any],
    valid: bool | None,
    problems: list[Problem],
    errors: dict[str, Any],
) -> dict[str, Any]:
    row.update(
        toploc_valid=valid,
        toploc_reason="; ".join(p.message for p in problems) or None,
        toploc_errors=errors or None,
        toploc_problems=sorted({p.category for p in problems}) or None,
        sampling_proven=sampling_proven(row, problems, errors),
    )
    return row


def trusted_sampling(expect: ExpectedSampling) -> ExpectedSampling:
    """The sampling settings rows of a trusted task set must have: those of `[expect]`, and for each
    one left unset, `genesys generate`'s default (never the worker's choice)."""
    defaults = SamplingConfig()
    return ExpectedSampling(
        **{
            name: getattr(defaults, name) if getattr(expect, name) is None else getattr(expect, name)
            for name in SAMPLING_KEYS
        }
    )


def _windows(items: Iterator[Pending], batch_size: int) -> Iterator[list[Pending]]:
    """Batches of `batch_size`, each of rows of similar length from a window of several batches."""
    window: list[Pending] = []
    for item in items:
        window.append(item)
        if len(window) == batch_size * WINDOW_BATCHES:
            yield from _sorted_batches(window, batch_size)
            window = []
    yield from _sorted_batches(window, batch_size)


def _sorted_batches(window: list[Pending], batch_size: int) -> Iterator[list[Pending]]:
    window.sort(key=lambda item: len(item.prompt_ids) + len(item.completion_ids))
    for start in range(0, len(window), batch_size):
        yield window[start : start + batch_size]


def validate_files(config: ValidateCommand) -> ValidateSummary:
    """Validate the rollout files of `config` into its output, each row signed with the trust key;
    prints progress and a summary when asked."""
    summary = ValidateSummary(output=Path(config.output))
    retry_column = "toploc_reason" if config.retry_errors else None
    with FileRun(
        config.output, summary, inputs=config.inputs, retry_column=retry_column, overwrite=config.overwrite
    ) as run:
        key = TrustKey.load(config.proofs.trust_key, create=True)
        summary.trust_key = key
        trusted = TrustedTasks.load(config.data.tasks) if config.data.tasks else None
        total = sum(1 for _ in run.rows())  # the first pass writes the rejects file
        run.open_output()
        validator = Validator(config, trusted)
        started = time.monotonic()

        def record(rows: list[dict[str, Any]], progress: RunProgress) -> None:
            for row in rows:
                _count(summary, row)
                row[ATTESTATION_COLUMN] = key.sign(row)
            tokens = sum(
                len(row.get("completion_ids") or ())
                for row in rows
                if isinstance(row.get("completion_ids"), list)
            )
            summary.tokens += tokens
            run.write(rows)
            progress.advance(len(rows), tokens=tokens)

        def pending(progress: RunProgress) -> Iterator[Pending]:
            for row in run.pending(with_unique_response_ids(run.rows())):
                prepared = validator.prepare(row)
                if isinstance(prepared, dict):
                    record([prepared], progress)
                else:
                    yield prepared

        try:
            with run.progress(
                total, "validating", "rows", rated=("rows", "tokens"), enabled=config.progress
            ) as progress:
                for batch in _windows(pending(progress), config.batch_size):
                    record(validator.run(batch), progress)
        finally:
            validator.model.close()
    summary.seconds = time.monotonic() - started
    if config.progress:
        print_validate_summary(summary)
    return summary


def _count(summary: ValidateSummary, row: dict[str, Any]) -> None:
    summary.task_bound += row["trusted_task"]
    valid = row["toploc_valid"]
    if valid is None:
        summary.unproved += 1
    elif valid:
        summary.valid += 1
    else:
        summary.invalid += 1
        summary.problems.update(row["toploc_problems"])


def print_validate_summary(summary: ValidateSummary) -> None:
    """The closing table of a validation run, on stderr."""
    from rich.table import Table

    from genesys.ui.progress import console

    rate = summary.validated / summary.seconds if summary.seconds else 0.0
    table = Table(
        title=f"validated {summary.validated:,} rows ({summary.tokens:,} completion tokens) in {summary.seconds:.1f}s ({rate:,.1f} rows/s)"
    )
    table.add_column("rows")
    table.add_column("count", justify="right")
    table.add_row("valid", f"{summary.valid:,}")
    table.add_row("invalid", f"{summary.invalid:,}")
    for category, count in sorted(summary.problems.items()):
        table.add_row(f"  with a {category} problem", f"{count:,}")
    table.add_row("no proofs (toploc_valid null)", f"{summary.unproved:,}")
    table.add_row("of a trusted task (--tasks)", f"{summary.task_bound:,}")
    if summary.resumed:
        table.add_row("already in the output", f"{summary.resumed:,}")
    if summary.retried:
        table.add_row("taken out of the output to validate again", f"{summary.retried:,}")
    if summary.rejected:
        table.add_row("unreadable (to the rejects file)", f"{summary.rejected:,}")
    console.print(table)
    key = summary.trust_key
    if key is not None:
        made = "made now; keep it secret" if key.created else "signed with"
        console.print(
            f"trust key {key.path} ({made}): --require-proofs in filter and train checks rows with it"
        )
        if not summary.task_bound:
            console.print(
                "[yellow]no row is of a trusted task set (give --tasks): --require-proofs counts none[/yellow]"
            )
    summary.print_files()
