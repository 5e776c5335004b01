"""What `genesys validate` checks of a trajectory row (a task played in its environment on a token
backend) besides what it checks of every row.

A trajectory's `completion_ids` interleave the model's turns (`completion_mask` 1) with the tokens
the chat template renders from the environment's and tools' messages (mask 0). Only the model's
tokens come from the worker: the environment side is replayed (`genesys.environments.replay`: a
fresh environment, the model's turns from the row, the isolation and deadlines of generation) and
must give the row's tokens, mask, messages and ending exactly. An environment that declares its
steps not deterministic (`Environment.deterministic = False`) cannot be replayed, and its rows are
invalid with that reason.

The model's turns are then recomputed one by one (`turn_parts`): turn t's prompt is the row's
prompt and every completion token before it, its completion the turn's tokens, its proofs the
turn's share of the row's `toploc_proofs` (each turn chunked on its own, in turn order) and its
sampling key `turn_seed(seed, sample, t)` with sample index 0, as generation drew it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from genesys.config import PromptStyle, ProofConfig
from genesys.proofs.checks import Problem, RowSampling, stop_problems
from genesys.proofs.recompute import Pending, Recomputed
from genesys.proofs.sampling import SamplingKey
from genesys.proofs.toploc import ProofError, decode_proofs, proof_count


def is_trajectory(row: dict[str, Any], played: dict[str, Any]) -> bool:
    """Whether `row` is to be validated as a trajectory: its task type is an environment's, or it
    carries a completion mask."""
    return row.get("task_type") in played or row.get("completion_mask") is not None


def environment_problem(row: dict[str, Any], environment: Any) -> Problem | None:
    """Why the row's environment cannot be replayed, or None."""
    if environment is None:
        return Problem(
            "environment",
            f"the row has a completion_mask but its task_type {row.get('task_type')!r} is played in no "
            "installed environment: its environment tokens cannot be replayed",
        )
    if not environment.deterministic:
        return Problem(
            "environment",
            f"environment {environment.__name__} declares its steps not deterministic "
            "(deterministic = False): its environment tokens cannot be replayed, so its rows are not validated",
        )
    return None


def mask_problem(mask: Any, claimed: Any, tokens: int) -> Problem | None:
    """Whether the mask is one 0 or 1 per completion token, and every environment token has logprob 0."""
    if not isinstance(mask, (list, tuple)) or len(mask) != tokens or any(bit not in (0, 1) for bit in mask):
        return Problem("format", "completion_mask must be one 0 or 1 per completion token")
    if isinstance(claimed, (list, tuple)) and len(claimed) == tokens:
        for position, (bit, value) in enumerate(zip(mask, claimed)):
            if bit == 0 and value != 0:
                return Problem(
                    "logprobs", f"completion_logprobs[{position}] of an environment token is {value!r}, not 0"
                )
    return None


def replay_problems(
    row: dict[str, Any],
    environment: Any,
    tokenizer: Any,
    style: PromptStyle,
    stop_ids: set[int],
) -> tuple[list[tuple[int, int]] | None, list[Problem]]:
    """Replay the row's environment side: the (start, end) of each model turn, None when the row's
    tokens differ from the replay's, and the problems found (category `environment`)."""
    from genesys.environments.replay import replay
    from genesys.schema import Task

    replayed = replay(
        environment,
        Task.from_row(row),
        tokenizer,
        style,
        (row["prompt_ids"], row["completion_ids"], row["completion_mask"]),
        stop_ids,
    )
    if replayed.difference is not None:
        reason = replayed.difference
        if (
            replayed.trajectory.error is not None
            and "the model could not be asked" not in replayed.trajectory.error
        ):
            reason += f" (the replay ended: {replayed.trajectory.error})"
        return None, [Problem("environment", f"replayed in {environment.__name__}: {reason}")]
    trajectory = replayed.trajectory
    problems = []
    messages = row.get("messages")
    if isinstance(messages, (str, bytes)):  # a JSON string from parquet
        try:
            messages = orjson.loads(messages)
        except orjson.JSONDecodeError:
            pass  # differs from the replay's list of messages
    rebuilt = {**trajectory.columns(), "finish_reason": trajectory.finish_reason}
    claimed = {"messages": messages, **{name: row.get(name) for name in ("turns", "trajectory_error")}}
    claimed["finish_reason"] = row.get("finish_reason")
    differing = [name for name in rebuilt if claimed[name] != rebuilt[name]]
    if row.get("llm_response") != trajectory.final_answer:
        differing.append("llm_response")
    if differing:
        problems.append(
            Problem(
                "environment",
                f"replayed in {environment.__name__}, the trajectory's {', '.join(differing)} differ from the row's",
            )
        )
    return replayed.turns, problems


def turn_problems(
    completion_ids: Sequence[int], turns: Sequence[tuple[int, int]], max_tokens: int, stop_ids: set[int]
) -> list[Problem]:
    """Whether each model turn stops where the sampler stops: at its first stop token or at max_tokens."""
    problems = []
    for number, (start, end) in enumerate(turns, 1):
        ids = completion_ids[start:end]
        finish = "stop" if ids and ids[-1] in stop_ids else "length"
        problems += [
            Problem(p.category, f"model turn {number}: {p.message}")
            for p in stop_problems(ids, finish, max_tokens, stop_ids)
        ]
    return problems


def turn_proofs(
    proofs: Any, turns: Sequence[tuple[int, int]], settings: ProofConfig
) -> list[list[bytes]] | Problem:
    """The row's `toploc_proofs` split into each model turn's, decoded, or the problem with them."""
    counts = [proof_count(end - start, settings) for start, end in turns]
    if not isinstance(proofs, (list, tuple)) or len(proofs) != sum(counts):
        given = len(proofs) if isinstance(proofs, (list, tuple)) else "no list of"
        return Problem(
            "proof_format",
            f"{given} proofs for {len(turns)} model turns; chunks of {settings.decode_batching_size} "
            f"tokens per turn need {sum(counts)}",
        )
    split, start = [], 0
    try:
        for (first, end), count in zip(turns, counts):
            split.append(decode_proofs(list(proofs[start : start + count]), end - first, settings))
            start += count
    except ProofError as exc:
        return Problem("proof_format", str(exc))
    return split


def turn_parts(
    row: dict[str, Any],
    prompt_ids: list[int],
    completion_ids: list[int],
    turns: Sequence[tuple[int, int]],
    sampling: RowSampling,
    proofs: list[list[bytes]] | None,
    settings: ProofConfig | None,
    key: SamplingKey | None,
) -> list[Pending]:
    """One recomputation per model turn: after the conversation before it, with its proofs and key."""
    from genesys.environments.tokens import turn_seed

    return [
        Pending(
            row,
            prompt_ids + completion_ids[:start],
            completion_ids[start:end],
            sampling,
            None if proofs is None else proofs[number],
            [],
            settings,
            None if key is None else SamplingKey(turn_seed(key.seed, key.sample, number), 0),
        )
        for number, (start, end) in enumerate(turns)
    ]


def merged(parts: Sequence[Recomputed]) -> Recomputed:
    """The recomputations of a row's model turns as one, in turn order."""
    chunks = [part.chunks for part in parts]
    margins = [part.margins for part in parts]
    return Recomputed(
        None if any(c is None for c in chunks) else [chunk for part in chunks for chunk in part],  # type: ignore[union-attr]
        [value for part in parts for value in part.logprobs],
        None if any(m is None for m in margins) else [value for part in margins for value in part],  # type: ignore[union-attr]
    )
