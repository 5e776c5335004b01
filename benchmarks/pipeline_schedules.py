"""Measured tokens/s of the `pipeline` backend against `genesys plan-inference`'s closed forms, fed with
the per-stage step times measured in the same run.

For each one-way latency, one ring of `--stages` local processes runs a model with random weights
(every sequence decodes `--max-tokens` tokens: stop tokens are ignored) in alternating rounds:

- synchronous: `--batches` batches of `--batch` sequences, one in the ring at a time;
- interleaved: the planner's saturating number of micro-batches M* = ceil(R / max t_i), each of
  `--batch` sequences, all in the ring at once (one wave of M* batches).

The planner is fed with each stage's median decode step measured during the synchronous rounds and
the injected latency (the links' transfer time on one machine is taken as 0). Printed per latency:
measured and planned tokens/s of each schedule (medians over rounds), measured / planned, M*, the
step times and the load average. The planner assumes a device per stage; local stages share this
machine's cores, so while M* micro-batches keep every stage busy each step takes longer: "in-run"
is the plan fed with the steps measured during the interleaved run itself. "overhead" is how much
longer a measured synchronous round took than the planned one (message handling, wake-ups; on a
loaded machine mostly waiting for a core). Goals: synchronous within 15% of planned at 20 and 50 ms,
interleaved at M* at least 80% of planned. `--plot FILE` draws throughput against latency.

    python benchmarks/pipeline_schedules.py                                  # 2 stages, 0..100 ms
    python benchmarks/pipeline_schedules.py --latencies 20,50 --rounds 3
    python benchmarks/pipeline_schedules.py --plot docs/images/pipeline_schedules.png
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from genesys.config import PromptStyle, SamplingConfig
from genesys.generate.backend import GenerationRequest, iterate
from genesys.generate.tiny_model import build_tiny_model
from genesys.inference.backend import PipelineBackend
from genesys.inference.plan import Ring


def requests(count: int, max_tokens: int, offset: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            f"r{offset + i}",
            [{"role": "user", "content": f"Count the primes below {offset + i}."}],
            [0],
            seed=offset + i,
            sampling=SamplingConfig(max_tokens=max_tokens, temperature=0.0),
        )
        for i in range(count)
    ]


def tokens_per_second(
    backend: PipelineBackend, micro_batches: int, count: int, max_tokens: int, offset: int
) -> float:
    backend.micro_batches = micro_batches
    started = time.perf_counter()
    tokens = sum(
        len(c.completion_ids)
        for result in iterate(backend.generate(requests(count, max_tokens, offset)))
        for c in result.completions
    )
    return tokens / (time.perf_counter() - started)


def measure(model: str, args: argparse.Namespace, latency_ms: float) -> dict[str, float]:
    backend = PipelineBackend(
        model, PromptStyle(), stages=args.stages, latency_ms=latency_ms, batch_size=args.batch
    )
    backend.stop_ids = set()  # every sequence decodes max_tokens tokens
    try:
        tokens_per_second(backend, 1, args.batch, 4, 0)  # warm up every stage
        sync: list[float] = []
        interleaved: list[float] = []
        planned_sync: list[float] = []
        planned_interleaved: list[float] = []
        planned_in_run: list[float] = []
        overhead: list[float] = []
        saturating = 0
        for round_index in range(args.rounds):
            offset = 1000 * (round_index + 1)
            backend.step_times.clear()  # the planner gets the steps of this round's synchronous run
            sync.append(tokens_per_second(backend, 1, args.batch * args.batches, args.max_tokens, offset))
            steps = backend.stage_step_seconds()
            ring = Ring.uniform(steps, latency_ms / 1e3)
            saturating = ring.saturating_micro_batches()
            planned_sync.append(ring.throughput(args.batch, 1))
            # What a measured round took beyond the planned one: messages, wake-ups, scheduling.
            overhead.append(args.batch / sync[-1] - ring.round_s)
            planned_interleaved.append(ring.throughput(args.batch, saturating))
            backend.step_times.clear()
            interleaved.append(
                tokens_per_second(backend, saturating, args.batch * saturating, args.max_tokens, offset + 500)
            )
            # The same ring with the steps as long as they were while M* micro-batches shared the cores.
            contended = Ring.uniform(backend.stage_step_seconds(), latency_ms / 1e3)
            planned_in_run.append(contended.throughput(args.batch, saturating))
        return {
            "latency_ms": latency_ms,
            "sync": statistics.median(sync),
            "planned_sync": statistics.median(planned_sync),
            "interleaved": statistics.median(interleaved),
            "planned_interleaved": statistics.median(planned_interleaved),
            "planned_in_run": statistics.median(planned_in_run),
            "micro_batches": saturating,
            "overhead_ms": statistics.median(overhead) * 1e3,
            "steps_ms": [round(t * 1e3, 2) for t in backend.stage_step_seconds()],
            "load": os.getloadavg()[0],
        }
    finally:
        backend.close()


def plot(results: list[dict[str, float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latencies = [r["latency_ms"] for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(latencies, [r["sync"] for r in results], "o-", color="tab:blue", label="synchronous, measured")
    ax.plot(
        latencies, [r["planned_sync"] for r in results], "--", color="tab:blue", label="synchronous, planned"
    )
    ax.plot(
        latencies,
        [r["interleaved"] for r in results],
        "s-",
        color="tab:orange",
        label="interleaved at M*, measured",
    )
    ax.plot(
        latencies,
        [r["planned_interleaved"] for r in results],
        "--",
        color="tab:orange",
        label="interleaved at M*, planned",
    )
    for r in results:
        ax.annotate(
            f"M*={r['micro_batches']}",
            (r["latency_ms"], r["interleaved"]),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=8,
        )
    ax.set_xlabel("one-way latency per hop (ms)")
    ax.set_ylabel("tokens / s")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument(
        "--latencies", default="0,10,20,50,100", help="one-way latencies in ms, comma-separated"
    )
    parser.add_argument("--batch", type=int, default=4, help="sequences per (micro-)batch")
    parser.add_argument("--batches", type=int, default=3, help="batches per synchronous round")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--model", help="an existing model instead of a random-weight one")
    parser.add_argument("--plot", help="write the throughput-against-latency plot here (PNG)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(
            build_tiny_model(
                Path(tmp) / "model",
                hidden_size=args.hidden,
                layers=args.layers,
                heads=8,
                intermediate_size=4 * args.hidden,
            )
        )
        print(
            f"{args.stages} stages, batch {args.batch}, {args.max_tokens} tokens, {args.rounds} alternating rounds; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start"
        )
        header = f"{'latency':>8} {'sync':>8} {'planned':>8} {'ratio':>6} | {'M*':>3} {'interl.':>8} {'planned':>8} {'ratio':>6} {'in-run':>8} {'ratio':>6} | overhead  steps (ms)        load"
        print(header)
        results = []
        for latency in (float(x) for x in args.latencies.split(",")):
            r = measure(model, args, latency)
            results.append(r)
            print(
                f"{latency:>6.0f}ms {r['sync']:>8.1f} {r['planned_sync']:>8.1f} {r['sync'] / r['planned_sync']:>6.2f} | "
                f"{r['micro_batches']:>3} {r['interleaved']:>8.1f} {r['planned_interleaved']:>8.1f} "
                f"{r['interleaved'] / r['planned_interleaved']:>6.2f} {r['planned_in_run']:>8.1f} "
                f"{r['interleaved'] / r['planned_in_run']:>6.2f} | {r['overhead_ms']:>6.1f}ms {r['steps_ms']!s:<17} "
                f"{r['load']:.1f}",
                flush=True,
            )
    if args.plot:
        title = (
            f"{args.stages}-stage ring on {os.cpu_count()} CPU cores, batch {args.batch}, "
            f"{args.hidden}x{args.layers} random-weight model"
        )
        plot(results, args.plot, title)
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
