"""A TRL-style reward function: a verification pool and the reward stage behind one call.

TRL's GRPOTrainer (and the genesys trainer) call reward functions as
`reward_func(prompts, completions, completion_ids=None, **columns)`, where `columns` holds the
dataset's other columns (`task_type`, `verification_info`, ...) with one value per completion:

    from genesys.verification.reward_function import RewardFunction

    with RewardFunction(VerifyConfig(workers=8, reward=RewardConfig("overlong", max_length=4096, overlong_buffer=512))) as reward:
        GRPOTrainer(model=model, reward_funcs=[reward], train_dataset=tasks, args=args).train()

A completion without a verdict (a verifier error, a timeout) or whose reward cannot be computed gets
None: TRL leaves it out of that function's reward. The verified rows of the last call, with their
`error`, stay in `last_rows`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from genesys.config import VerifyConfig
from genesys.plugins.specs import Verifier
from genesys.rewards import RewardStage
from genesys.verification.engine import VerificationEngine
from genesys.verification.pool import VerificationPool


class RewardFunction:
    """Verifies completions and returns their rewards; use as a context manager, which starts the
    pool it was not given (and stops it at the end)."""

    def __init__(
        self,
        config: VerifyConfig | None = None,
        verifiers: Mapping[str, type[Verifier]] | None = None,
        pool: VerificationPool | None = None,
    ) -> None:
        """`pool`: a running pool to use (else one is made from `config` and `verifiers`). The
        reward config is checked and any tokenizer loaded here, before training starts."""
        self.config = config or VerifyConfig(progress=False)
        self.rewards = RewardStage(self.config.reward)
        self._owns_pool = pool is None
        self.pool = VerificationEngine(self.config, verifiers) if pool is None else pool
        self.last_rows: list[dict[str, Any]] = []
        self.__name__ = "genesys"  # the name trainers log this function's rewards under

    def __enter__(self) -> Self:
        if self._owns_pool:
            self.pool.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owns_pool:
            self.pool.close()

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        """The reward of each completion, in order."""
        rows = rollout_rows(prompts, completions, completion_ids, columns)
        self.last_rows = [self.rewards.apply(row) for row in self.pool.verify_rows(rows)]
        return [row["reward"] for row in self.last_rows]


def rollout_rows(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None,
    columns: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Rollout rows from a trainer's call: prompts and completions as text or chat messages, and
    the dataset columns that hold one value per completion (others, like `trainer_state`, are not row data)."""
    count = len(completions)
    if len(prompts) != count or (completion_ids is not None and len(completion_ids) != count):
        raise ValueError(
            f"got {len(prompts)} prompts and {count} completions; a reward function needs one prompt per completion"
        )
    per_row = {
        name: values
        for name, values in columns.items()
        if isinstance(values, (list, tuple)) and len(values) == count
    }
    rows = []
    for index in range(count):
        row = {name: values[index] for name, values in per_row.items()}
        row["prompt"] = _text(prompts[index], last_only=True)
        row["llm_response"] = _text(completions[index], last_only=False)
        if completion_ids is not None:
            row["completion_ids"] = list(completion_ids[index])
        rows.append(row)
    return rows


def _text(value: Any, last_only: bool) -> str:
    """A prompt or completion as text: as given, or the content of its chat messages (the last
    one's alone for a prompt, whose last message is the user's question)."""
    if isinstance(value, str):
        return value
    contents = [str(message.get("content") or "") for message in value]
    return contents[-1] if last_only and contents else "".join(contents)
