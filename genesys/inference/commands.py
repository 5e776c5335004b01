"""What `genesys plan-inference` does with its flags: build the plan, simulate it if asked, print it."""

from __future__ import annotations

from genesys.errors import InputError
from genesys.inference.plan import ModelShape, Network, device, plan
from genesys.inference.report import plan_json, print_plan
from genesys.inference.simulate import simulate as run_simulation


def parse_factors(text: str | None) -> tuple[float, ...] | None:
    """`1,1,2` -> (1.0, 1.0, 2.0); each a positive number."""
    if text is None:
        return None
    try:
        factors = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"--stage-slowdown must be numbers separated by commas, got {text!r}") from None
    if any(f <= 0 for f in factors):
        raise InputError(f"--stage-slowdown factors must be above 0, got {text!r}")
    return factors


def plan_inference(
    *,
    model: str,
    stages: int,
    latency_ms: float,
    gpu: str,
    bandwidth_gbps: float,
    batch: int,
    micro_batches: int | None,
    context: int,
    memory_gb: float | None,
    memory_bandwidth_gbs: float | None,
    tflops: float | None,
    stage_slowdown: str | None,
    simulate: bool,
    jitter: float,
    as_json: bool,
) -> int:
    shape = ModelShape.load(model)
    result = plan(
        shape,
        stages,
        device(gpu, memory_gb, memory_bandwidth_gbs, tflops),
        Network(latency_ms / 1e3, bandwidth_gbps * 1e9),
        batch=batch,
        micro_batches=micro_batches,
        context=context,
        slowdown=parse_factors(stage_slowdown),
    )
    simulated = None
    if simulate or jitter:
        simulated = {
            s.label: run_simulation(result.rings[s.label], s.batch, s.micro_batches, jitter=jitter)
            for s in result.schedules
        }
    if as_json:
        print(plan_json(result, simulated))
    else:
        print_plan(result, simulated)
    return 0
