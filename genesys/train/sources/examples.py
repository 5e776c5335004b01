"""What `genesys sft` learns from: prompt and completion pairs, tokenized as generation would see them.

Two kinds of rows make examples:

- tasks of `data.tasks` with a `gold_standard_solution` (worked solutions): the solution is the
  completion; tasks without one are left out and counted;
- rollouts of `data.rollouts` (from `genesys generate --verify`) whose `score` reaches
  `data.min_score` (rejection-sampling fine-tuning): `llm_response` is the completion; rollouts
  below it, and those whose verification failed (score null), are left out and counted.

The prompt is rendered exactly as generation renders it (`genesys.tasks.prompts`: the system
prompt, the chat template with its generation prompt, the continuation prefix), and the completion
is the completion's tokens followed by the end-of-sequence token, as a generated completion ends.
`SftExamples` serves them in a seeded, resumable order (`genesys.train.order.ItemOrder`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from genesys.config import SftConfig
from genesys.data.inputs import resolve_inputs
from genesys.data.io import iter_rows
from genesys.errors import InputError
from genesys.train.batch import TrainingSequence
from genesys.train.distributed import World
from genesys.train.order import ItemOrder
from genesys.train.sources.base import FileSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    """One prompt (task text) and the completion to learn for it, and where it came from."""

    prompt: str
    completion: str
    origin: str  # "task <problem_id>" or "file:line", for error messages


@dataclass
class ExampleCounts:
    """How many rows became examples, and why the others did not."""

    from_tasks: int = 0
    from_rollouts: int = 0
    tasks_without_solution: int = 0
    rollouts_below_threshold: int = 0
    rollouts_unscored: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def examples(self) -> int:
        return self.from_tasks + self.from_rollouts

    def describe(self) -> str:
        parts = [
            f"{self.examples} examples ({self.from_tasks} worked solutions, {self.from_rollouts} rollouts)"
        ]
        if self.tasks_without_solution:
            parts.append(f"{self.tasks_without_solution} tasks without a gold_standard_solution left out")
        if self.rollouts_below_threshold:
            parts.append(f"{self.rollouts_below_threshold} rollouts below data.min_score left out")
        if self.rollouts_unscored:
            parts.append(f"{self.rollouts_unscored} rollouts without a score (verification failed) left out")
        return "; ".join(parts)


def load_examples(config: SftConfig) -> tuple[list[Example], ExampleCounts]:
    """The examples of `config.data`, checked (an InputError names the row that cannot be used)."""
    counts = ExampleCounts()
    examples: list[Example] = []
    if config.data.tasks:
        examples += _task_examples(config, counts)
    if config.data.rollouts:
        examples += _rollout_examples(config.data.rollouts, config.data.min_score, counts)
    if not examples:
        raise InputError(f"data: nothing to learn from ({counts.describe()})")
    return examples, counts


def _task_examples(config: SftConfig, counts: ExampleCounts) -> list[Example]:
    from genesys.tasks.prepare import select_tasks

    examples = []
    for spec, index, row in select_tasks(config.data.tasks or [], mix=config.data.mix, seed=config.sft.seed):
        where = f"task {row.get('problem_id', index)!r} of {spec!r}"
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise InputError(f"{where}: prompt must be a non-empty string")
        solution = row.get("gold_standard_solution")
        if not isinstance(solution, str) or not solution.strip():
            counts.tasks_without_solution += 1
            continue
        examples.append(Example(prompt, solution, where))
        counts.from_tasks += 1
    return examples


def _rollout_examples(patterns: Sequence[str], min_score: float, counts: ExampleCounts) -> list[Example]:
    examples = []
    for record in iter_rows(resolve_inputs(patterns)):
        if record.row is None:
            raise InputError(f"{record.location}: {record.error}")
        row = record.row
        missing = [name for name in ("prompt", "llm_response") if not isinstance(row.get(name), str)]
        if missing or "score" not in row:
            lacks = ", ".join(missing + ([] if "score" in row else ["score"]))
            raise InputError(
                f"{record.location}: rollout has no {lacks} (learn from verified rollouts: genesys generate --verify, or genesys verify)"
            )
        if row.get("messages") is not None:
            raise InputError(
                f"{record.location}: the rollout is a trajectory (a task played in an environment, task type "
                f"{row.get('task_type')!r}); genesys sft learns single completions: train on trajectories with genesys train"
            )
        score = row["score"]
        if score is None:
            counts.rollouts_unscored += 1
            continue
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise InputError(f"{record.location}: score must be a number or null, got {score!r}")
        if score < min_score:
            counts.rollouts_below_threshold += 1
            continue
        examples.append(Example(row["prompt"], row["llm_response"], record.location))
        counts.from_rollouts += 1
    return examples


def tokenize_example(example: Example, tokenizer: Any, config: SftConfig) -> TrainingSequence:
    """The example as a training sequence: the prompt's ids as generation renders them, then the
    completion's ids and the end-of-sequence token (the only tokens the loss counts)."""
    from genesys.tasks.prompts import build_messages, render_ids

    prompt_ids = render_ids(
        tokenizer, build_messages(example.prompt, config.data.system_prompt), config.style
    )
    completion_ids = list(tokenizer(example.completion, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is None:
        raise InputError(f"the tokenizer of {config.model!r} has no eos token: a completion could not end")
    completion_ids.append(tokenizer.eos_token_id)
    return TrainingSequence(prompt_ids, completion_ids, [0.0] * len(completion_ids), 0.0)


class SftExamples(FileSource):
    """The run's tokenized examples in a seeded, endless order; its state is the count taken.
    It has the methods of a `RolloutSource`; its batches are training sequences, not groups."""

    def __init__(self, examples: Sequence[Example], tokenizer: Any, config: SftConfig, world: World) -> None:
        self.sequences = [tokenize_example(example, tokenizer, config) for example in examples]
        self.order = ItemOrder(len(self.sequences), config.sft.seed, world.rank, world.size)

    def next_batch(self, size: int) -> list[TrainingSequence]:
        """This rank's next `size` examples, shortest first (less padding)."""
        picked = [self.sequences[index] for _, index in self.order.take(size)]
        return sorted(picked, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))

    @property
    def epoch(self) -> float:
        """Passes over the examples so far (all ranks)."""
        return self.order.taken * self.order.world / self.order.size
