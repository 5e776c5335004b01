"""The trainer's online group filter: which groups carry signal, the fraction dropped, and refilling a batch."""

from __future__ import annotations

import pytest

from genesys.data.identity import group_key
from genesys.train.groups import fill_batch, group_by_task, has_signal, split_groups


def group(problem_id: str, scores, rewards=None) -> list[dict]:
    rewards = rewards or scores
    return [{"problem_id": problem_id, "score": s, "reward": r} for s, r in zip(scores, rewards)]


def test_groups_follow_problem_id_then_prompt():
    rows = [{"problem_id": "a"}, {"prompt": "q"}, {"problem_id": "a"}, {"prompt": "q"}, {"prompt": "other"}]
    assert [len(g) for g in group_by_task(rows)] == [2, 2, 1]
    assert (
        group_key({"prompt": "q"})
        == group_key({"prompt": "q", "problem_id": None})
        != group_key({"prompt": "r"})
    )


@pytest.mark.parametrize(
    ("scores", "signal", "expected"),
    [
        ([1.0, 1.0, 1.0], "correct", False),  # all solved
        ([0.0, 0.0, 0.0], "correct", False),  # none solved
        ([1.0, 0.0, 0.0], "correct", True),
        ([0.5, 0.0, 0.5], "correct", False),  # partial credit is not correctness
        ([0.5, 0.0, 0.5], "score", True),
        ([1.0, None, None], "correct", False),  # errors carry no value
        ([1.0, None, 0.0], "correct", True),
        ([1.0], "correct", False),
    ],
)
def test_signal_on_correctness_by_default(scores, signal, expected):
    assert has_signal(group("p", scores), signal) is expected


def test_length_shaped_rewards_do_not_count_as_signal_by_default():
    shaped = group("p", [1.0, 1.0, 1.0], rewards=[0.94, 0.97, 0.91])
    assert not has_signal(shaped)
    assert has_signal(shaped, "reward")


def test_split_reports_fraction_dropped():
    rows = group("a", [1, 0]) + group("b", [1, 1]) + group("c", [0, 0]) + group("d", [0, 1])
    split = split_groups(rows)
    assert [g[0]["problem_id"] for g in split.kept] == ["a", "d"]
    assert [g[0]["problem_id"] for g in split.dropped] == ["b", "c"]
    assert split.fraction_dropped == 0.5


class Rounds:
    """A stand-in generator: each call returns the next prepared round of groups."""

    def __init__(self, rounds: list[list[list[dict]]]):
        self.rounds = rounds
        self.asked: list[int] = []

    def __call__(self, missing: int) -> list[dict]:
        self.asked.append(missing)
        return [row for g in self.rounds[len(self.asked) - 1] for row in g]


def test_fill_batch_refills_from_further_rounds_until_full():
    generate = Rounds(
        [
            [group("a", [1, 0]), group("b", [1, 1]), group("c", [0, 0]), group("d", [0, 0])],
            [group("e", [1, 1]), group("f", [0, 1]), group("g", [1, 0]), group("h", [1, 0])],
            [group("never", [1, 0])],
        ]
    )
    batch = fill_batch(generate, 3, max_rounds=5)
    assert generate.asked == [3, 2]  # asked again only for the missing groups
    assert [g[0]["problem_id"] for g in batch.groups] == ["a", "f", "g"]
    assert [g[0]["problem_id"] for g in batch.surplus] == ["h"]
    assert (batch.rounds, batch.groups_seen, batch.groups_dropped) == (2, 8, 4)
    assert batch.fraction_dropped == 0.5 and batch.complete


def test_fill_batch_stops_at_the_round_cap():
    generate = Rounds(
        [[group("a", [1, 1])], [group("b", [0, 1])], [group("c", [0, 0])], [group("d", [1, 0])]]
    )
    batch = fill_batch(generate, 2, max_rounds=3)
    assert generate.asked == [2, 2, 1]
    assert [g[0]["problem_id"] for g in batch.groups] == ["b"]
    assert not batch.complete
    assert (batch.rounds, batch.groups_seen, batch.groups_dropped) == (3, 3, 2)


def test_carried_surplus_is_used_before_generating():
    generate = Rounds([[group("x", [1, 0])]])
    carried = [group("s1", [1, 0]), group("s2", [0, 1])]
    batch = fill_batch(generate, 2, carry=carried)
    assert generate.asked == [] and batch.rounds == 0
    assert batch.groups == carried and batch.fraction_dropped == 0.0
    batch = fill_batch(generate, 3, carry=carried)
    assert generate.asked == [1]
    assert [g[0]["problem_id"] for g in batch.groups] == ["s1", "s2", "x"]


def test_fill_batch_refuses_bad_sizes():
    with pytest.raises(ValueError, match="batch size"):
        fill_batch(Rounds([]), 0)
    with pytest.raises(ValueError, match="max_rounds"):
        fill_batch(Rounds([]), 1, max_rounds=0)
