"""The intra-op thread count of CPU training and generation, chosen by measuring, not assumed.

torch runs each CPU operation on all cores by default. When other processes keep those cores busy,
every parallel operation waits for its slowest thread to be scheduled again: on a 2-core machine at
load average 13, a small linear layer took 10.5 ms on 2 threads against 0.64 ms on one (16x), and
the toy training run spent most of its time so. `ThreadTuner` times a forward pass of the model at
each candidate thread count (alternating, the median of a few rounds each) and keeps the fastest; it
measures again every `every` steps, as the machine's load changes. More threads are kept only when
clearly faster (by `margin`), since each extra thread also takes a core from the other work. The
median, not the best round: on a busy machine two threads have lucky rounds, and a GRPO run that
kept two threads on the strength of one (best of 3) took 25-70 s per step for ten steps, against
1.5-5 s on one thread before and after. From the second round on, a count whose fastest round is
already `PRUNE` times slower than the fastest median is not timed again: on a busy machine the
parallel probes are the slow ones (43 ms against 3.4 on one thread at load 6), and the trainer's
steps pay for the measuring.

The trainer tunes its own thread; the transformers generation backend tunes the worker thread it
generates in (`genesys.generate.hf`), every few batches.

It is off when `OMP_NUM_THREADS` is set (the user's choice stands, e.g. for bit-for-bit reproducible
CPU runs) and on other devices than the CPU.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

ROUNDS = 5
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
    def for_device(
        cls, device: torch.device, probe: Callable[[], object], every: int = EVERY
    ) -> ThreadTuner | None:
        """A tuner for work on `device`, or None where the thread count is not ours to choose."""
        if device.type != "cpu" or os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads() < 2:
            return None
        return cls(probe, every=every)

    def maybe_tune(self, step: int) -> None:
        """Measure and set the thread count at step 0 and every `every` steps (or batches)."""
        if step % self.every == 0:
            self.tune()

    def tune(self) -> int:
        """Time the probe at each candidate count, set and return the fastest."""
        rounds: dict[int, list[float]] = {threads: [] for threads in self.candidates}
        timed = list(self.candidates)
        with torch.no_grad():
            for round_ in range(ROUNDS):
                for threads in timed:
                    torch.set_num_threads(threads)
                    started = time.perf_counter()
                    self.probe()
                    rounds[threads].append(time.perf_counter() - started)
                if round_ >= 1:  # one round is no median: a lucky one must not drop the others
                    fastest = min(statistics.median(times) for times in rounds.values())
                    timed = [threads for threads in timed if min(rounds[threads]) <= fastest * PRUNE]
        self.last_timings = {threads: statistics.median(times) for threads, times in rounds.items()}
        self.threads = choose(self.last_timings, self.margin)
        torch.set_num_threads(self.threads)
        return self.threads


def choose(timings: dict[int, float], margin: float = MARGIN) -> int:
    """The fewest threads whose time is within `margin` of the fastest's."""
    fastest = min(timings.values())
    return min(threads for threads, seconds in timings.items() if seconds <= fastest * (1 + margin))


def forward_probe(model: torch.nn.Module, vocab_size: int, device: torch.device | str) -> Callable[[], None]:
    """A probe for `ThreadTuner`: a small forward pass of `model` on fixed random tokens, in eval mode
    (the model's mode is restored; no global RNG is drawn)."""
    tokens = torch.randint(0, vocab_size, (4, 64), generator=torch.Generator().manual_seed(0)).to(device)

    def probe() -> None:
        training = model.training
        model.eval()
        try:
            model(input_ids=tokens, use_cache=False)
        finally:
            model.train(training)

    return probe
