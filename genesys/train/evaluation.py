"""Evaluation during training ([eval]): held-out task sources, scored as training scores its rollouts.

Every `eval.every` steps (and after the last), each source of `eval.tasks` is generated with the
trainer's own backend at its current weights, once greedily and `eval.samples` (k) times at the
run's sampling settings, and verified by the run's verification engine (same verifiers, deadlines
and sandbox). Per source NAME (a file's stem, a task set's name) the step's metrics gain:

- `eval/NAME/accuracy`: the mean score of the greedy completions;
- `eval/NAME/avg@k`: the mean score of the k sampled completions;
- `eval/NAME/pass@k`: the mean over tasks of the best score among its k samples;
- `eval/NAME/errors`: rollouts whose verification failed (left out of the means, never scored 0).

Every evaluation of a run draws the same random numbers (the seeds depend on the run's seed and the
task, not on the step), so the curve moves with the weights only: a run whose weights do not change
(`optim.lr = 0`) draws a flat line, where fresh samples at each step would scatter by the sampling
noise (plus or minus 3 points over 100 tasks and 2 samples).

With 0/1 verifiers (math, code tests) these are the usual accuracy, avg@k and pass@k.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from genesys.data.identity import task_key
from genesys.errors import InputError
from genesys.generate.backend import Backend, GenerationRequest, iterate
from genesys.generate.episodes import generate_and_play
from genesys.generate.rows import PlannedTask, request_seed
from genesys.schema import Row
from genesys.tasks.prompts import build_messages
from genesys.train.config import TrainConfig
from genesys.train.sources.online import row_builder
from genesys.verification.pool import VerificationPool

EVAL_PREFIX = "eval/"


@dataclass
class EvalSource:
    """One held-out task source and the name its metrics carry."""

    name: str
    tasks: list[Row]


class Evaluator:
    """Generates, verifies and scores the held-out sources with the trainer's backend and engine."""

    def __init__(
        self, config: TrainConfig, sources: Sequence[EvalSource], backend: Backend, pool: VerificationPool
    ) -> None:
        self.config = config
        self.sources = list(sources)
        self.backend = backend
        self.pool = pool
        self.builder = row_builder(config, backend.name)

    @classmethod
    def open(cls, config: TrainConfig, rollouts: Any) -> Evaluator:
        """The evaluator of `config.eval`, using the online rollout source's backend and engine."""
        backend, pool = getattr(rollouts, "backend", None), getattr(rollouts, "pool", None)
        if backend is None or pool is None:
            raise InputError("eval.tasks needs online training with the trainer's own generation backend")
        return cls(config, load_eval_sources(config), backend, pool)

    def due(self, step: int) -> bool:
        """Whether step `step` is evaluated: every `eval.every` steps, and the last."""
        return step % self.config.eval.every == 0 or step == self.config.optim.steps

    def evaluate(self) -> dict[str, float | int | None]:
        """The eval metrics of every source at the current weights."""
        metrics: dict[str, float | int | None] = {}
        for source in self.sources:
            metrics.update(self._evaluate_source(source))
        return metrics

    def _evaluate_source(self, source: EvalSource) -> dict[str, float | int | None]:
        k = self.config.eval.samples
        sampling = self.config.sampling
        greedy, greedy_errors = self._scores(source, dataclasses.replace(sampling, n=1, temperature=0.0))
        sampled, sampled_errors = self._scores(source, dataclasses.replace(sampling, n=k))
        prefix = f"{EVAL_PREFIX}{source.name}/"
        return {
            prefix + "accuracy": _mean([s for scores in greedy for s in scores]),
            prefix + f"avg@{k}": _mean([s for scores in sampled for s in scores]),
            prefix + f"pass@{k}": _mean([max(scores) for scores in sampled if scores]),
            prefix + "errors": greedy_errors + sampled_errors,
        }

    def _scores(self, source: EvalSource, sampling: Any) -> tuple[list[list[float]], int]:
        """Per task, the scores of its `sampling.n` completions, and how many verifications failed
        (those are left out of the scores)."""
        plans: dict[str, PlannedTask] = {}
        requests = []
        for index, task in enumerate(source.tasks):
            key = f"eval-{source.name}-{index}"
            plans[key] = PlannedTask(task_key(task), task, list(range(sampling.n)))
            requests.append(
                GenerationRequest(
                    key,
                    build_messages(task["prompt"], self.config.data.system_prompt),
                    list(range(sampling.n)),
                    request_seed(self.config.sampling.seed, key),
                    sampling,
                )
            )
        rows: list[Row] = []
        owners: list[str] = []
        tasks = {key: plan.row for key, plan in plans.items()}  # environment tasks are played
        for result in iterate(generate_and_play(self.backend, requests, tasks)):
            built = self.builder.rows(plans[result.request.key], result)
            rows.extend(built)
            owners.extend(result.request.key for _ in built)
        verified = self.pool.verify_rows(rows)
        scores: dict[str, list[float]] = {key: [] for key in plans}
        errors = 0
        for key, row in zip(owners, verified):
            if row.get("score") is None:
                errors += 1
            else:
                scores[key].append(float(row["score"]))
        return list(scores.values()), errors


def load_eval_sources(config: TrainConfig) -> list[EvalSource]:
    """The tasks of each `eval.tasks` source, checked as training tasks are, named apart."""
    from genesys.tasks.prepare import prepare_tasks, select_tasks

    sources: list[EvalSource] = []
    names: set[str] = set()
    for spec in config.eval.tasks:
        selected = select_tasks([spec], max_tasks=config.eval.max_tasks, seed=config.sampling.seed)
        tasks = prepare_tasks(selected, reward=config.reward, verify=config.verify_config()).rows
        if not tasks:
            raise InputError(f"eval.tasks: no tasks in {spec}")
        name = source_name(spec)
        while name in names:
            name += "_"
        names.add(name)
        sources.append(EvalSource(name, tasks))
    return sources


def source_name(spec: str) -> str:
    """A short metric name for a task source: a file's or directory's stem, a task set's or hub
    dataset's name (options after ':' dropped), in letters, digits, '-', '_' and '.'."""
    base = (spec[3:] if spec.startswith("hf:") else spec).split(":", 1)[0]
    path = PurePath(base.rstrip("/"))
    name = path.stem if path.suffix in (".jsonl", ".json", ".parquet", ".csv") else path.name
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "tasks"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
