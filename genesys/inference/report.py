"""`genesys plan-inference`'s output: the plan (and its simulation) as rich tables, or as JSON."""

from __future__ import annotations

import json

from rich.console import Console

from genesys.inference.plan import Plan
from genesys.inference.simulate import SimulationResult
from genesys.ui.tables import print_table


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return f"{n:.1f} GB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def print_plan(plan: Plan, simulated: dict[str, SimulationResult] | None = None) -> None:
    """Per-stage and per-schedule tables; with `simulated`, each schedule's simulated figures beside."""
    console = Console()
    console.print(
        f"[bold]{plan.model}[/]: {plan.params / 1e9:.2f}B parameters on {len(plan.stages)} x {plan.gpu.name} "
        f"({plan.gpu.memory_gb:g} GB, {plan.gpu.bandwidth_gbs:g} GB/s, {plan.gpu.tflops:g} TFLOP/s); "
        f"{_ms(plan.latency_s)} one-way latency, {plan.bandwidth_gbps:g} Gbit/s links; "
        f"micro-batch {plan.batch}, {plan.context} tokens of context"
    )
    print_table(
        "stages",
        ["stage", "layers", "weights", "KV cache / token", "max batch", "step", "bound", "sends / step"],
        [
            [
                str(s.index),
                str(s.layers),
                _bytes(s.weights_bytes),
                _bytes(s.kv_bytes_per_token),
                str(s.max_batch),
                _ms(s.step_s),
                s.bound,
                _bytes(s.activation_bytes_per_hop),
            ]
            for s in plan.stages
        ],
    )
    columns = ["schedule", "token latency", "tokens/s", "bound"]
    if simulated is not None:
        columns += ["simulated tokens/s", "simulated / planned"]
    rows = []
    for schedule in plan.schedules:
        row = [schedule.label, _ms(schedule.token_latency_s), f"{schedule.tokens_per_s:,.1f}", schedule.bound]
        if simulated is not None:
            result = simulated[schedule.label]
            row += [f"{result.tokens_per_s:,.1f}", f"{result.tokens_per_s / schedule.tokens_per_s:.3f}"]
        rows.append(row)
    print_table("schedules", columns, rows)
    console.print(
        f"micro-batches to saturate the ring: {plan.saturating_micro_batches}; "
        f"largest batch that fits every stage: {plan.max_batch}"
    )
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {note}")


def plan_json(plan: Plan, simulated: dict[str, SimulationResult] | None = None) -> str:
    data = plan.as_dict()
    if simulated is not None:
        data["simulated"] = {label: vars(result) for label, result in simulated.items()}
    return json.dumps(data, indent=2)
