"""`genesys generate`, the run: select tasks, skip what the output already holds, generate, verify, write.

The run is a `genesys.data.runs.FileRun`: an output overlapping a local task file is refused, the
output is locked, unreadable task rows go to the rejects file, and rows are written in atomic units,
so after a crash the same command generates exactly the (task, sample) pairs that are missing
(`response_id` is `<task key>-<sample index>`; what a row holds is built in `genesys.generate.rows`).
With verification on, rows go to the streaming `VerificationEngine` as they are generated and are
written once verified and given their reward, in the order they were generated (`InOrder`);
generation only waits for it when the engine's backlog passes `VerifyConfig.max_pending_rows`.
Rows are written in the order generation finishes them (a backend may finish a short answer before
a long one asked earlier; holding finished rollouts back for task order would cost memory without
bound). Tasks whose task_type is an environment's are played in it (by the backend's own `play`, else
with their model turns batched through `generate`, `genesys.generate.episodes`); their rows are
trajectories. With `retry_errors`, rows of the output whose `error` is set are taken out and verified
again, keeping their completions. Every reward input is checked before generating; rows done when a
run fails are written before it ends.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genesys.config import GenerateConfig
from genesys.data.identity import response_id
from genesys.data.inputs import InputFile, names_local_input
from genesys.data.io import RolloutWriter, iter_rows
from genesys.data.runs import FileRun, FileRunSummary, InOrder
from genesys.errors import InputError
from genesys.generate.backend import (
    Backend,
    create_backend,
    iterate,
    resolve_backend_name,
)
from genesys.generate.episodes import generate_and_play
from genesys.generate.rows import (
    PlannedTask,
    RowBuilder,
    generation_settings,
    machine_info,
    requests,
)
from genesys.rewards import RewardConfig, RewardStage, reward_problem
from genesys.schema import parse_json_field
from genesys.tasks.prepare import check_verifiable, prepare_tasks
from genesys.tasks.prepare import select_tasks as select_task_sources
from genesys.tasks.prompts import pick_target_length, target_instruction
from genesys.tasks.sources import HUB_PREFIX, Reject
from genesys.ui.progress import RunProgress, console
from genesys.verification.stats import RewardMeans, TypeStats, print_type_stats

__all__ = [
    "GenerateConfig",
    "GenerateSummary",
    "PlannedTask",
    "RowBuilder",
    "check_resumable",
    "check_rewardable",
    "plan_tasks",
    "print_generate_summary",
    "run_generation",
    "select_tasks",
]


@dataclass
class GenerateSummary(FileRunSummary):
    """What a generation run did (`resumed` counts samples the output already held)."""

    tasks: int = 0
    generated: int = 0
    duplicates: int = 0
    tokens: int = 0
    verify_stats: dict[str, TypeStats] = field(default_factory=dict)
    rewards: RewardMeans | None = None  # mean reward per task_type, when the reward is not the score


def print_generate_summary(summary: GenerateSummary) -> None:
    """The closing summary of a generation run, with the verification table when it verified."""
    from rich.table import Table

    seconds = max(summary.seconds, 1e-9)
    table = Table(title=f"generated {summary.generated:,} rollouts in {summary.seconds:.1f}s")
    for column in ("tasks", "rollouts", "resumed", "tokens", "samples/s", "tokens/s"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{summary.tasks:,}",
        f"{summary.generated:,}",
        f"{summary.resumed:,}",
        f"{summary.tokens:,}",
        f"{summary.generated / seconds:,.1f}",
        f"{summary.tokens / seconds:,.0f}",
    )
    console.print(table)
    if summary.duplicates:
        console.print(f"[yellow]{summary.duplicates:,} duplicate tasks were skipped")
    if summary.verify_stats:
        verified = sum(stats.count for stats in summary.verify_stats.values())
        print_type_stats(summary.verify_stats, verified, summary.seconds, summary.rewards)
    if summary.retried:
        console.print(f"retried: {summary.retried:,} rows with an error were verified again")
    summary.print_files()


def select_tasks(
    config: GenerateConfig, reject: Reject | None = None
) -> list[tuple[str, int, dict[str, Any]]]:
    """The run's tasks in order: every `--tasks` source loaded and mixed; unreadable rows of task
    files go to `reject` (without it they are an InputError)."""
    return select_task_sources(
        config.tasks, mix=config.mix, max_tasks=config.max_tasks, seed=config.sampling.seed, reject=reject
    )


def plan_tasks(
    selected: Sequence[tuple[str, int, dict[str, Any]]], config: GenerateConfig, done: set[str]
) -> tuple[list[PlannedTask], int, int]:
    """The planned tasks (validated, deduplicated), the samples already done, and the duplicates dropped."""
    prepared = prepare_tasks(selected, dedupe=True)
    plans, resumed = [], 0
    for task in prepared.tasks:
        missing = [i for i in range(config.sampling.n) if response_id(task.key, i) not in done]
        resumed += config.sampling.n - len(missing)
        target = (
            pick_target_length(config.target_lengths, task.key, config.sampling.seed)
            if config.target_lengths
            else None
        )
        plans.append(PlannedTask(task.key, task.row, missing, target))
    return plans, resumed, prepared.duplicates


def check_rewardable(plans: Sequence[PlannedTask], reward: RewardConfig) -> None:
    """Refuse, before generating, a reward that the rows to be generated could not be given."""
    for plan in plans:
        problem = reward_problem(_row_to_generate(plan), reward)
        if problem:
            raise InputError(f"--verify {reward.describe()}: {problem}")


def _row_to_generate(plan: PlannedTask) -> dict[str, Any]:
    """What `RowBuilder` will make of `plan`, as far as rewards look at it (the ids come later)."""
    row = {**plan.row, "completion_ids": []}
    if plan.target_length is not None:
        row["target_length"] = plan.target_length
    return row


# `generation_config` keys a resumed run may change: more samples, or another engine for the same model.
RESUMABLE_SETTINGS = frozenset({"n", "backend"})


def check_resumable(writer: RolloutWriter, model: str, settings: dict[str, Any]) -> None:
    """Refuse to resume an output made by another model or with other generation settings."""
    files = [
        InputFile(path, "jsonl" if writer.kind == "jsonl" else "parquet") for path in writer.written_files()
    ]
    first = next(iter_rows(files), None)
    if first is None or first.row is None:
        return
    found_model = first.row.get("model_name")
    if found_model is not None and found_model != model:
        raise InputError(
            f"output {str(writer.path)!r} holds rollouts of model {found_model!r}, not {model!r}; write to another output"
        )
    found = parse_json_field(first.row.get("generation_config"), "generation_config")
    changed = sorted(
        k
        for k in found.keys() | settings.keys()
        if k not in RESUMABLE_SETTINGS and found.get(k) != settings.get(k)
    )
    if found and changed:
        described = ", ".join(f"{k} {found.get(k)!r} -> {settings.get(k)!r}" for k in changed)
        raise InputError(
            f"output {str(writer.path)!r} was generated with other settings ({described}); use the same flags or another output"
        )


def local_task_files(specs: Sequence[str]) -> list[str]:
    """The `--tasks` specs that name local files, directories or globs (the run must not overlap them)."""
    return [spec for spec in specs if not spec.startswith(HUB_PREFIX) and names_local_input(spec)]


def run_generation(config: GenerateConfig, backend: Backend | None = None) -> GenerateSummary:
    """Generate the missing rollouts of `config` into its output. `backend`, a running backend, is
    used instead of building one, and stays open: the caller closes it."""
    if config.target_lengths is not None:
        if not config.target_lengths or min(config.target_lengths) < 1:
            raise InputError(f"--target-lengths must be positive integers, got {list(config.target_lengths)}")
        target_instruction(
            config.target_length_prompt, config.target_lengths[0]
        )  # a bad template fails before any work
    summary = GenerateSummary(output=Path(config.output))
    with FileRun(
        config.output,
        summary,
        inputs=local_task_files(config.tasks),
        retry_column="error" if config.retry_errors else None,
        overwrite=config.overwrite,
    ) as run:
        selected = select_tasks(config, run.reject)
        backend_name = backend.name if backend is not None else resolve_backend_name(config.backend)
        settings = generation_settings(config, backend_name)
        done = run.open_output() | set(run.retried)  # retried rows keep their completions
        if done:
            check_resumable(run.writer, config.model, settings)  # type: ignore[arg-type]
        plans, summary.resumed, summary.duplicates = plan_tasks(selected, config, done)
        rewards = None
        if config.verify is not None:
            check_verifiable(selected, config.verify)
            check_rewardable(plans, config.verify.reward)
            rewards = RewardStage(config.verify.reward)
            summary.rewards = None if rewards.is_score else RewardMeans()
        summary.tasks = len(plans)
        todo = [p for p in plans if p.missing]
        if run.retried:
            started = time.monotonic()
            _verify_again(list(run.retried.values()), config, run, summary, rewards)  # type: ignore[arg-type]
            summary.seconds = time.monotonic() - started
        if todo:
            built = backend is None
            backend = backend or _build_backend(config, backend_name)
            try:
                builder = RowBuilder(config.model, settings, machine_info(backend))
                with run.progress(
                    len(plans), "generating", "tasks", rated=("samples", "tokens"), enabled=config.progress
                ) as progress:
                    progress.skip(len(plans) - len(todo))
                    _generate(todo, config, backend, builder, run, progress, summary, rewards)
                    summary.seconds += progress.seconds
            finally:
                if built:
                    backend.close()
    if config.progress:
        print_generate_summary(summary)
    else:
        from genesys.verification.api import print_problems

        print_problems("generate --verify", summary.verify_stats, summary)
    return summary


def _build_backend(config: GenerateConfig, backend_name: str) -> Backend:
    """The backend of the run: here, or on Ray actors (`cluster.backend = "ray"`)."""
    options = (
        config.backend_options
        if config.proofs is None
        else {**config.backend_options, "proofs": config.proofs}
    )
    if config.cluster.ray:
        from genesys.generate.ray_backend import RayBackend

        return RayBackend(backend_name, config.model, config.style, options, config.cluster)
    return create_backend(backend_name, config.model, config.style, options)


def _generate(
    todo: Sequence[PlannedTask],
    config: GenerateConfig,
    backend: Backend,
    builder: RowBuilder,
    run: FileRun[GenerateSummary],
    progress: RunProgress,
    summary: GenerateSummary,
    rewards: RewardStage | None,
) -> None:
    """Generate `todo`; with `rewards` (verification on) rows are written once verified and rewarded,
    in the order they were generated."""
    plans = {p.key: p for p in todo}
    with ExitStack() as stack:
        engine = None
        if config.verify is not None:
            from genesys.verification.api import verification_pool

            engine = stack.enter_context(verification_pool(config.verify))
        written = stack.enter_context(_Verified(run, rewards, summary))  # type: ignore[arg-type]
        numbers = itertools.count()
        tasks = {p.key: p.row for p in todo}
        for result in iterate(generate_and_play(backend, requests(todo, config), tasks)):
            rows = builder.rows(plans[result.request.key], result)
            tokens = sum(c.sampled_tokens for c in result.completions)
            summary.generated += len(rows)
            summary.tokens += tokens
            progress.advance(1, samples=len(rows), tokens=tokens)
            if engine is None:
                run.write(rows)
                continue
            for row in rows:
                engine.submit(next(numbers), row)
            written.add(engine.poll())
            while len(written.in_order) > config.verify.max_pending_rows:  # type: ignore[union-attr]
                written.add(engine.poll(timeout=0.05))  # rows held behind a slow one
        if engine is not None:
            written.add(engine.drain())
            _merge_stats(summary, engine.stats)


def _verify_again(
    rows: list[dict[str, Any]],
    config: GenerateConfig,
    run: FileRun[GenerateSummary],
    summary: GenerateSummary,
    rewards: RewardStage,
) -> None:
    """Verify again rows an earlier run wrote with an error (`--retry-errors`), keeping their completions."""
    from genesys.verification.api import verification_pool

    with _Verified(run, rewards, summary) as written, verification_pool(config.verify) as engine:  # type: ignore[arg-type]
        for number, row in enumerate(rows):
            engine.submit(number, row)
            written.add(engine.poll())
        written.add(engine.drain())
        _merge_stats(summary, engine.stats)


class _Verified:
    """Writes verified rows, rewarded, in the order they were submitted (numbered from 0); as a context
    manager, the rows still held when it ends are written too."""

    def __init__(self, run: FileRun[GenerateSummary], rewards: RewardStage, summary: GenerateSummary) -> None:
        self.run, self.rewards, self.summary = run, rewards, summary
        self.in_order = InOrder()

    def __enter__(self) -> _Verified:
        return self

    def __exit__(self, *exc: object) -> None:
        self.run.write(self.in_order.rest())  # interrupted: what was verified is kept, out of order

    def add(self, verified: Iterable[tuple[Any, dict[str, Any]]]) -> None:
        for number, row in verified:
            row = self.rewards.apply(row)
            if self.summary.rewards is not None:
                self.summary.rewards.add(row)
            self.run.write(self.in_order.add(number, row))


def _merge_stats(summary: GenerateSummary, stats: dict[str, TypeStats]) -> None:
    for task_type, more in stats.items():
        summary.verify_stats.setdefault(task_type, TypeStats()).merge(more)
