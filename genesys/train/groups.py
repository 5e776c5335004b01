"""Online group filtering, for the trainer's rollout source: keep only groups that carry signal.

Rollouts are grouped by task (`genesys.data.identity.group_key`: the problem id, or the prompt without
one, as `genesys filter` groups them), and a group whose rollouts all have the same value of the
signal (by default binary correctness, score == 1) carries no learning signal and is dropped;
`fill_batch` refills a batch from further generation rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from genesys.data.identity import group_key
from genesys.schema import Row


def signal_value(row: Row, signal: str = "correct") -> float | None:
    """The value a group's signal is judged on: "correct" (score == 1), "score" or "reward"; None for an error."""
    if signal == "correct":
        score = row.get("score")
        return None if score is None else float(score == 1.0)
    if signal in ("score", "reward"):
        value = row.get(signal)
        return None if value is None else float(value)
    raise ValueError(f"signal must be 'correct', 'score' or 'reward', got {signal!r}")


def group_by_task(rows: Iterable[Row], key: Callable[[Row], Hashable] = group_key) -> list[list[Row]]:
    """Rollouts grouped by task, groups in order of first appearance."""
    groups: dict[Hashable, list[Row]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return list(groups.values())


def has_signal(group: Sequence[Row], signal: str = "correct") -> bool:
    """Whether the group's rollouts differ in the signal; rollouts without a value (errors) are not counted."""
    values = {value for value in (signal_value(row, signal) for row in group) if value is not None}
    return len(values) > 1


@dataclass
class GroupSplit:
    """Groups with signal (`kept`) and without (`dropped`)."""

    kept: list[list[Row]] = field(default_factory=list)
    dropped: list[list[Row]] = field(default_factory=list)

    @property
    def fraction_dropped(self) -> float:
        """Dropped groups over all groups (0.0 when there were none)."""
        total = len(self.kept) + len(self.dropped)
        return len(self.dropped) / total if total else 0.0


def split_groups(
    rows: Iterable[Row], signal: str = "correct", key: Callable[[Row], Hashable] = group_key
) -> GroupSplit:
    """Group rollouts by task and separate the groups with signal from those without."""
    split = GroupSplit()
    for group in group_by_task(rows, key):
        (split.kept if has_signal(group, signal) else split.dropped).append(group)
    return split


@dataclass
class FilledBatch:
    """A batch of groups with signal, and how it was filled.

    `surplus` holds kept groups beyond the batch size (pass them as `carry` to the next `fill_batch`).
    """

    groups: list[list[Row]]
    surplus: list[list[Row]]
    size: int
    rounds: int
    groups_seen: int
    groups_dropped: int

    @property
    def complete(self) -> bool:
        """Whether the batch reached its size within the round cap."""
        return len(self.groups) == self.size

    @property
    def fraction_dropped(self) -> float:
        """Dropped groups over all groups generated for this batch."""
        return self.groups_dropped / self.groups_seen if self.groups_seen else 0.0


def fill_batch(
    generate: Callable[[int], Iterable[Row]],
    size: int,
    *,
    max_rounds: int = 4,
    signal: str = "correct",
    carry: Sequence[list[Row]] = (),
    key: Callable[[Row], Hashable] = group_key,
) -> FilledBatch:
    """Fill a batch of `size` groups with signal, calling `generate(n_missing)` for more rollouts.

    `generate` receives how many groups are still missing and returns verified rollouts (whole groups).
    It is called at most `max_rounds` times; a batch still short then comes back with `complete` False.
    Groups in `carry` (an earlier batch's surplus) are used first, without generating.
    """
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    kept = list(carry)
    rounds = seen = dropped = 0
    while len(kept) < size and rounds < max_rounds:
        rounds += 1
        split = split_groups(generate(size - len(kept)), signal, key)
        kept.extend(split.kept)
        seen += len(split.kept) + len(split.dropped)
        dropped += len(split.dropped)
    return FilledBatch(
        groups=kept[:size],
        surplus=kept[size:],
        size=size,
        rounds=rounds,
        groups_seen=seen,
        groups_dropped=dropped,
    )
