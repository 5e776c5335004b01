"""A discrete-event simulation of the pipeline schedules, to check `genesys.inference.plan`'s closed forms
and to go where they do not reach (stages of different speeds, step times that jitter).

The ring is a loop of single servers taken first come, first served: stage i (one step of one micro-batch
at a time), then link i (its transfer time), then the link's latency (a pure delay, any number of
messages in flight), to stage i+1; the last link leads back to stage 0, whose next step starts the next
token. M micro-batches start together at stage 0; the synchronous schedule is M = 1. Throughput is
measured in the steady state: the tokens of rounds `warmup..rounds` over the time between the last
token of round `warmup` and the last token of the final round.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from genesys.inference.plan import Ring


@dataclass
class SimulationResult:
    tokens_per_s: float
    token_latency_s: float  # mean time between two tokens of one sequence, in the steady state
    stage_utilisation: list[float]  # busy fraction of each stage over the measured window


def simulate(
    ring: Ring,
    batch: int,
    micro_batches: int = 1,
    rounds: int = 40,
    warmup: int = 8,
    jitter: float = 0.0,
    seed: int = 0,
) -> SimulationResult:
    """Run M micro-batches of `batch` sequences round `ring` for `rounds` tokens each.

    `jitter` scales every step by a factor drawn uniformly from [1 - jitter, 1 + jitter] (seeded).
    """
    if not 0 <= warmup < rounds:
        raise ValueError(f"warmup must be in [0, rounds), got {warmup} of {rounds}")
    if not 0 <= jitter < 1:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    rng = random.Random(seed)
    stages = len(ring.step_s)
    hops = len(ring.hop_latency_s)
    # events: (time, order, kind, place, micro-batch); kinds: arrive at a stage, done at a stage, arrive at a link
    events: list[tuple[float, int, str, int, int]] = []
    order = 0

    def push(time: float, kind: str, place: int, micro_batch: int) -> None:
        nonlocal order
        heapq.heappush(events, (time, order, kind, place, micro_batch))
        order += 1

    stage_free = [0.0] * stages
    link_free = [0.0] * hops
    busy = [[] for _ in range(stages)]  # (start, end) of each step
    round_done: list[list[float]] = [[] for _ in range(rounds)]
    tokens_done = [0] * micro_batches
    for m in range(micro_batches):
        push(0.0, "stage", 0, m)
    while events:
        time, _, kind, place, m = heapq.heappop(events)
        if kind == "stage":  # a micro-batch reaches a stage: queue behind the one being served
            start = max(time, stage_free[place])
            factor = 1.0 + rng.uniform(-jitter, jitter) if jitter else 1.0
            end = start + ring.step_s[place] * factor
            stage_free[place] = end
            busy[place].append((start, end))
            push(end, "done", place, m)
        elif kind == "done":
            if place == stages - 1:  # the last stage sampled this micro-batch's token
                round_done[tokens_done[m]].append(time)
                tokens_done[m] += 1
                if tokens_done[m] == rounds:
                    continue
            if hops == 0:
                push(time, "stage", 0, m)
            else:
                push(time, "link", place, m)
        else:  # a link: transfer when free, then the latency
            start = max(time, link_free[place])
            link_free[place] = start + ring.hop_transfer_s[place]
            push(link_free[place] + ring.hop_latency_s[place], "stage", (place + 1) % stages, m)
    begin, end = max(round_done[warmup]), max(round_done[-1])
    tokens = (rounds - 1 - warmup) * micro_batches * batch
    window = end - begin
    utilisation = [
        sum(max(0.0, min(e, end) - max(s, begin)) for s, e in spans) / window if window else 1.0
        for spans in busy
    ]
    return SimulationResult(
        tokens_per_s=tokens / window if window else float("inf"),
        token_latency_s=window / (rounds - 1 - warmup),
        stage_utilisation=utilisation,
    )
