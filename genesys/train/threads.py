"""The CPU trainer's intra-op thread count, chosen by measuring, not assumed.

torch runs each CPU operation on all cores by default. When other processes keep those cores busy,
every parallel operation waits for its slowest thread to be scheduled again: on a 2-core machine at
load average 13, a small linear layer took 10.5 ms on 2 threads against 0.64 ms on one (16x), and
the toy training run spent most of its time so. `ThreadTuner` times a forward pass of the model at
each candidate thread count (alternating, the best of a few rounds each) and keeps the fastest; it
measures again every `every` steps, as the machine's load changes. More threads are kept only when
clearly faster (by `margin`), since each extra thread also takes a core from the other work. A
count already `PRUNE` times slower than the fastest after a round is not timed again: on a busy
machine the parallel probes are the slow ones (43 ms against 3.4 on one thread at load 6), and the
trainer's steps pay for the measuring.

It is off when `OMP_NUM_THREADS` is set (the user's choice stands, e.g. for bit-for-bit reproducible
CPU runs) and on other devices than the CPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

ROUNDS = 3
MARGIN = 0.15
EVERY = 10
PRUNE = 3.0


class ThreadTuner:
    """Keeps torch's intra-op thread count at the fastest of 1 and all cores for `probe`."""

    def __init__(
        self,
        probe: Callable[[], object],
        candidates: tuple[int, ...] | None = None,
        every: int = EVERY,
        margin: float = MARGIN,
    ) -> None:
        self.probe = probe
        most = torch.get_num_threads()
        self.candidates = candidates or tuple(sorted({1, most}))
        self.every = every
        self.margin = margin
        self.threads = most
        self.last_timings: dict[int, float] = {}

    @classmethod
    def for_device(cls, device: torch.device, probe: Callable[[], object]) -> ThreadTuner | None:
        """A tuner for training on `device`, or None where the thread count is not ours to choose."""
        if device.type != "cpu" or os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads() < 2:
            return None
        return cls(probe)

    def maybe_tune(self, step: int) -> None:
        """Measure and set the thread count at step 0 and every `every` steps."""
        if step % self.every == 0:
            self.tune()

    def tune(self) -> int:
        """Time the probe at each candidate count, set and return the fastest."""
        best: dict[int, float] = dict.fromkeys(self.candidates, float("inf"))
        timed = list(self.candidates)
        with torch.no_grad():
            for _ in range(ROUNDS):
                for threads in timed:
                    torch.set_num_threads(threads)
                    started = time.perf_counter()
                    self.probe()
                    best[threads] = min(best[threads], time.perf_counter() - started)
                fastest = min(best.values())
                timed = [threads for threads in timed if best[threads] <= fastest * PRUNE]
        self.last_timings = best
        self.threads = choose(best, self.margin)
        torch.set_num_threads(self.threads)
        return self.threads


def choose(timings: dict[int, float], margin: float = MARGIN) -> int:
    """The fewest threads whose time is within `margin` of the fastest's."""
    fastest = min(timings.values())
    return min(threads for threads, seconds in timings.items() if seconds <= fastest * (1 + margin))
