"""A seeded, endless, resumable order over a fixed set of items (tasks, or recorded groups).

The order is a stream of epochs, each a fresh seeded permutation of the items. With several
ranks, rank r reads stream positions r, r + W, r + 2W, ... so that W ranks taking k items each
read exactly the items one process taking W * k would read. The state is one counter, and
`resumed_taken` carries the counters of W ranks over to another number of ranks.
"""

from __future__ import annotations

import random
from functools import lru_cache


class ItemOrder:
    """Rank `rank` of `world` ranks' view of the seeded stream over `size` items."""

    def __init__(self, size: int, seed: int, rank: int = 0, world: int = 1, taken: int = 0) -> None:
        if size < 1:
            raise ValueError("an item order needs at least one item")
        self.size = size
        self.seed = seed
        self.rank = rank
        self.world = world
        self.taken = taken

    def take(self, n: int) -> list[tuple[int, int]]:
        """The next `n` items of this rank, as (stream position, item index) pairs."""
        picked = []
        for _ in range(n):
            position = self.rank + self.world * self.taken
            epoch, offset = divmod(position, self.size)
            picked.append((position, _permutation(self.size, self.seed, epoch)[offset]))
            self.taken += 1
        return picked


def resumed_taken(taken: list[int], rank: int, world: int) -> int:
    """The counter of rank `rank` of `world` ranks that go on where ranks that had taken `taken` items
    (one count per old rank) stopped: from the first stream position after the last one any of them
    read. When every old rank took as many, that is exactly where one stream would go on; otherwise
    the positions some ranks had not reached yet are skipped (never read twice)."""
    old_world = len(taken)
    end = max((old + old_world * (count - 1) + 1 for old, count in enumerate(taken) if count > 0), default=0)
    return max(0, -(-(end - rank) // world))


@lru_cache(maxsize=4)
def _permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(f"{seed}/{epoch}").shuffle(order)
    return tuple(order)
