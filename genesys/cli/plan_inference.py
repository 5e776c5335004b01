"""`genesys plan-inference`: memory, step times and schedule throughput of a layer-split pipeline."""

from __future__ import annotations

import click


@click.command(
    "plan-inference",
    short_help="plan a model split layer-wise over machines on a slow network (roofline, schedules)",
    help="Read a model's config.json and print, per stage, its weights, KV cache per token, largest batch, "
    "roofline step time and bytes sent per step, and for the whole ring the token latency and throughput of the "
    "synchronous and interleaved (micro-batched) schedules, the micro-batches that saturate it and what bounds "
    "it. --simulate checks the schedules in a discrete-event simulation.",
)
@click.option("--model", required=True, help="a config.json, or a local model directory holding one")
@click.option("--stages", type=click.IntRange(min=1), required=True, help="pipeline stages (machines)")
@click.option(
    "--latency-ms", type=click.FloatRange(min=0), required=True, help="one-way latency per hop (ms)"
)
@click.option(
    "--gpu",
    required=True,
    help="device kind: h200, h100, a100-80gb, a100-40gb, l40s, a10g, l4, rtx4090, rtx3090, or a name of your own with the three figures below",
)
@click.option(
    "--bandwidth-gbps",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="network bandwidth per link (Gbit/s)",
)
@click.option(
    "--batch", type=click.IntRange(min=1), default=1, show_default=True, help="sequences per micro-batch"
)
@click.option(
    "--micro-batches",
    type=click.IntRange(min=1),
    help="micro-batches in the interleaved ring (default: enough to saturate it, as memory allows)",
)
@click.option(
    "--context",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="tokens per sequence held in the KV cache",
)
@click.option(
    "--memory-gb", type=click.FloatRange(min=0, min_open=True), help="device memory (overrides the table)"
)
@click.option(
    "--memory-bandwidth-gbs",
    type=click.FloatRange(min=0, min_open=True),
    help="device memory bandwidth in GB/s (overrides the table)",
)
@click.option(
    "--tflops", type=click.FloatRange(min=0, min_open=True), help="dense bf16 TFLOP/s (overrides the table)"
)
@click.option(
    "--stage-slowdown",
    metavar="F,F,...",
    help="per-stage step-time factors, e.g. 1,1,2 (a slower machine last)",
)
@click.option("--simulate", is_flag=True, help="also run each schedule in a discrete-event simulation")
@click.option(
    "--jitter",
    type=click.FloatRange(min=0, max=1, max_open=True),
    default=0.0,
    help="simulation: steps vary uniformly by this fraction",
)
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def command(**options: object) -> int:
    from genesys.inference.commands import plan_inference

    return plan_inference(**options)
