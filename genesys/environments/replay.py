"""Replaying the environment side of a token trajectory: how a validator checks the tokens a worker
may not choose.

`replay` plays the row's task in a fresh instance of its environment, with the isolation and
deadlines of generation (`genesys.environments.tokens.play_on_tokens`), and takes only the model's
turns from the row: each turn is the row's run of model tokens (`completion_mask` 1) that starts
where the rebuilt trajectory stands, cut after its first stop token as the sampler stops. The
opening prompt, the environment's and tools' messages, the chat template's tokens between turns and
the mask are all rebuilt, never read from the row; the replay says where the row first differs
from them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genesys.config import PromptStyle
from genesys.environments.tokens import ModelTurn, TokenTrajectory, play_on_tokens

if TYPE_CHECKING:
    from genesys.environments.rollout import Trajectory
    from genesys.plugins.specs import Environment
    from genesys.schema import Task


class _RowDiffers(Exception):
    """The row's tokens are not those the replay rebuilds (the message says where)."""


@dataclass
class Replayed:
    """A replay: the rebuilt `trajectory` and `tokens`, the (start, end) completion positions of each
    model turn, and where the row first differs from the rebuilt tokens (None: nowhere)."""

    trajectory: Trajectory
    tokens: TokenTrajectory
    turns: list[tuple[int, int]] = field(default_factory=list)
    difference: str | None = None


def replay(
    environment: type[Environment],
    task: Task,
    tokenizer: Any,
    style: PromptStyle,
    row_tokens: tuple[Sequence[int], Sequence[int], Sequence[int]],
    stop_ids: Collection[int],
) -> Replayed:
    """Replay `task` in `environment` with the model turns of `row_tokens` (the row's prompt ids,
    completion ids and completion mask), comparing every token the replay rebuilds with the row's."""
    return asyncio.run(_replay(environment, task, tokenizer, style, row_tokens, stop_ids))


async def _replay(
    environment: type[Environment],
    task: Task,
    tokenizer: Any,
    style: PromptStyle,
    row_tokens: tuple[Sequence[int], Sequence[int], Sequence[int]],
    stop_ids: Collection[int],
) -> Replayed:
    prompt_ids, completion_ids, mask = (list(part) for part in row_tokens)
    tokens = TokenTrajectory(tokenizer, style)
    turns: list[tuple[int, int]] = []
    differences: list[str] = []

    async def model_turn(
        prompt: list[int], messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> ModelTurn:
        start = len(prompt) - len(prompt_ids)
        try:
            _check_prefix(tokens, prompt_ids, completion_ids, mask)
            if start >= len(completion_ids):
                raise _RowDiffers(
                    f"the row ends after {len(turns)} model turns, where the environment asks for another"
                )
            if mask[start] != 1:
                raise _RowDiffers(
                    f"completion position {start}: model turn {len(turns) + 1} begins here, the row's "
                    "completion_mask says 0"
                )
        except _RowDiffers as exc:
            differences.append(str(exc))
            raise
        end = start
        while end < len(completion_ids) and mask[end] == 1:
            end += 1
            if completion_ids[end - 1] in stop_ids:  # the sampler stops at its first stop token
                break
        ids = completion_ids[start:end]
        turns.append((start, end))
        finish = "stop" if ids[-1] in stop_ids else "length"
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return ModelTurn(ids, [0.0] * len(ids), finish, text)

    trajectory = await play_on_tokens(environment, task, tokens, model_turn)
    replayed = Replayed(trajectory, tokens, turns)
    if differences:
        replayed.difference = differences[0]
        return replayed
    try:
        _check_prefix(tokens, prompt_ids, completion_ids, mask)
        if len(tokens.completion_ids) != len(completion_ids):
            raise _RowDiffers(
                f"the row has {len(completion_ids)} completion tokens; replayed, the trajectory has "
                f"{len(tokens.completion_ids)} ({trajectory.finish_reason} after {trajectory.turns} model turns)"
            )
    except _RowDiffers as exc:
        replayed.difference = str(exc)
    return replayed


def _check_prefix(
    tokens: TokenTrajectory, prompt_ids: list[int], completion_ids: list[int], mask: list[int]
) -> None:
    """Raise `_RowDiffers` unless the rebuilt tokens so far are the start of the row's, mask included."""
    if tokens.prompt_ids != prompt_ids:
        where = _first_difference(tokens.prompt_ids, prompt_ids)
        raise _RowDiffers(
            f"prompt_ids differ from the environment's opening messages as rendered, from position {where}"
        )
    rebuilt = len(tokens.completion_ids)
    where = _first_difference(tokens.completion_ids, completion_ids[:rebuilt])
    if where is not None:
        raise _RowDiffers(
            f"completion position {where}: token {_at(completion_ids, where)}, where the replayed "
            f"trajectory has {tokens.completion_ids[where]} "
            f"({'a model' if tokens.completion_mask[where] else 'an environment or tool'} token)"
        )
    where = _first_difference(tokens.completion_mask, mask[:rebuilt])
    if where is not None:
        theirs = "model" if tokens.completion_mask[where] else "environment or tool"
        raise _RowDiffers(
            f"completion position {where}: the completion_mask says {mask[where]}, but the token is a "
            f"{theirs} token"
        )


def _first_difference(ours: Sequence[int], theirs: Sequence[int]) -> int | None:
    for position, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return position
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def _at(values: Sequence[int], position: int) -> Any:
    return values[position] if position < len(values) else "(none: the row ends)"
