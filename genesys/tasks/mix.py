"""Mixing task sources by ratios, with a seeded shuffle so a rerun selects the very same tasks."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from genesys.errors import InputError
from genesys.tasks.sources import TaskSource


def mix_tasks(
    sources: Sequence[TaskSource],
    *,
    ratios: Sequence[float] | None = None,
    max_tasks: int | None = None,
    seed: int = 0,
) -> list[tuple[str, int, dict[str, Any]]]:
    """Select and order tasks from `sources`; returns `(source spec, row index, row)` triples.

    Without `ratios`, every task of every source is used (several sources are shuffled together;
    one source keeps its order) and `max_tasks` keeps the first ones. With `ratios`, source `i`
    contributes `ratios[i] / sum(ratios)` of the tasks, drawn at random; the total is `max_tasks`,
    or as many as the smallest source allows.
    """
    if not sources:
        raise InputError("--tasks names no task source")
    rng = random.Random(seed)
    if ratios is None:
        picked = [(s.spec, i) for s in sources for i in range(len(s))]
        if len(sources) > 1:
            rng.shuffle(picked)
    else:
        counts = _counts_for_ratios(sources, ratios, max_tasks)
        picked = [(s.spec, i) for s, count in zip(sources, counts) for i in rng.sample(range(len(s)), count)]
        rng.shuffle(picked)
    if max_tasks is not None:
        picked = picked[:max_tasks]
    by_spec = {s.spec: s for s in sources}
    return [(spec, i, dict(by_spec[spec].rows[i])) for spec, i in picked]


def _counts_for_ratios(
    sources: Sequence[TaskSource], ratios: Sequence[float], max_tasks: int | None
) -> list[int]:
    if len(ratios) != len(sources):
        raise InputError(
            f"--mix has {len(ratios)} ratios for {len(sources)} task sources; give one ratio per source"
        )
    if any(not r > 0 for r in ratios):
        raise InputError(f"--mix ratios must all be > 0, got {list(ratios)}")
    if len({s.spec for s in sources}) != len(sources):
        raise InputError("--tasks names the same source twice; give it a larger --mix ratio instead")
    total_ratio = sum(ratios)
    shares = [r / total_ratio for r in ratios]
    for source in sources:
        if len(source) == 0:
            raise InputError(f"task source {source.spec!r} holds no tasks")
    total = (
        max_tasks if max_tasks is not None else min(int(len(s) / share) for s, share in zip(sources, shares))
    )
    counts = _apportion(total, shares)
    for source, count in zip(sources, counts):
        if count > len(source):
            raise InputError(
                f"--mix asks for {count} tasks from {source.spec!r}, which holds only {len(source)}; lower --max-tasks or its ratio"
            )
    return counts


def _apportion(total: int, shares: Sequence[float]) -> list[int]:
    """Split `total` by `shares` into integers summing to `total` (largest remainders get the rest)."""
    exact = [total * share for share in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts
