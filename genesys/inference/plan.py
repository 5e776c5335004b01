"""How a decoder model runs split layer-wise over N stages on a slow network: memory, step times from a
roofline, and the throughput of the synchronous and interleaved schedules, in closed form.

**Shapes.** A dense decoder layer with hidden size h, MLP width f, q heads of size d and k key/value
heads holds `h*q*d` (query) + `2*h*k*d` (key, value) + `q*d*h` (output) + `3*h*f` (gated MLP) + `2*h`
(two norms) parameters. The embedding holds `V*h`, the final norm `h`, the output layer `V*h` (the
embedding's own matrix when tied). Stages take contiguous, equal shares of the layers (the first ones
one more when they do not divide); the first stage holds the embedding, the last the final norm and the
output layer (a copy of the tied embedding when N > 1).

**Memory.** A stage stores its weights (`params * bytes`) and, per sequence and token of context, the
keys and values of its layers: `kv_per_token = 2 * layers * k * d * bytes`. The largest batch that fits
is `floor((memory * usable - weights) / (kv_per_token * context))`; the pipeline's is the smallest stage's.

**Roofline step.** One decode step of a batch of b sequences at `context` tokens does, per stage,
`2 * matmul_params * b` FLOPs for the weights (the output layer's `V*h` included on the last stage; the
embedding is a lookup, no FLOPs) plus `4 * b * context * layers * q * d` for attention (scores and
weighted sum), and reads every weight once (the embedding table aside) plus the whole KV cache of the
batch: `weight_bytes + b * context * kv_per_token`. It lasts `t = max(flops / F, bytes / BW)`: memory-
bound while `b` is small (t hardly grows with b), compute-bound once `2 * b * bytes_per_param^-1 >=
F / BW` (about 300 sequences for bf16 on an H100).

**Hops.** The ring has N hops when N > 1 (stage i to i+1, and the last stage's sampled token ids back
to the first; one stage has none). A hop carries `b * h * bytes` of activations (`b * 4` bytes of int32
token ids back to the first stage) and costs `latency + bytes * 8 / bandwidth`; the transfer part
occupies the link, the latency does not.

**Synchronous schedule (batch B).** One batch goes round the ring and the first stage waits for its
token before the next step: a token every `R(B) = sum_i t_i(B) + sum_j hop_j(B)`, i.e. about
`N * latency + step_time`, and `B / R(B)` tokens per second. More stages pay off only as memory (a
bigger B fits): the latency term grows with N, the step time does not shrink below what B needs.

**Interleaved schedule (M micro-batches of b).** M micro-batches circulate in the ring at once; each
stage serves them in turn. A micro-batch's round takes at least `R(b)`; a stage is busy `M * t_i(b)`
per round (a link `M * s_j(b)`), so the period is `P = max(R(b), M * max_i t_i(b), M * max_j s_j(b))`
and throughput `M * b / P`; each sequence gets a token every P. It saturates (the slowest resource busy
all the time) from `M* = ceil(R(b) / max(t_i, s_j))` on, where throughput is `b / max(t_i, s_j)`: a
straggler stage bounds it at `b / max_i t_i`.

**The claims.** Memory-bound, `t_i(M*b) ~ t_i(b)`, so an unsaturated interleaved ring (`P = R(b)`)
gives `M*b / R(b) ~ M*b / R(M*b)`: the synchronous schedule with one batch of M*b sequences does as
well, with the same memory (the KV cache of M*b sequences either way). Compute-bound, `t_i(M*b) = M *
t_i(b)`, so synchronous pays `M * sum_i t_i(b) + hops` per token while a saturated interleaved ring pays
`M * max_i t_i(b)`: interleaving wins by up to a factor N (balanced stages, negligible latency), more
when the latency is not negligible.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from genesys.errors import InputError

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8": 1, "int8": 1}
TOKEN_ID_BYTES = 4  # int32 token ids on the hop back to the first stage
DEFAULT_USABLE_MEMORY = 0.9  # of a device's memory, the rest for the framework and activations


@dataclass(frozen=True)
class Device:
    """An accelerator for the roofline: memory (GB), memory bandwidth (GB/s), dense bf16 FLOP/s (TFLOP/s)."""

    name: str
    memory_gb: float
    bandwidth_gbs: float
    tflops: float

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def bytes_per_second(self) -> float:
        return self.bandwidth_gbs * 1e9

    @property
    def flops(self) -> float:
        return self.tflops * 1e12


# Datasheet figures: memory, memory bandwidth, dense bf16 tensor throughput (FP32 accumulation).
GPUS: dict[str, Device] = {
    device.name: device
    for device in (
        Device("h200", 141, 4800, 989),
        Device("h100", 80, 3350, 989),
        Device("a100-80gb", 80, 2039, 312),
        Device("a100-40gb", 40, 1555, 312),
        Device("l40s", 48, 864, 362),
        Device("a10g", 24, 600, 125),
        Device("l4", 24, 300, 121),
        Device("rtx4090", 24, 1008, 82.6),
        Device("rtx3090", 24, 936, 35.6),
    )
}


def device(
    kind: str, memory_gb: float | None = None, bandwidth_gbs: float | None = None, tflops: float | None = None
) -> Device:
    """The built-in device `kind` with any figure overridden; `custom` needs all three."""
    base = GPUS.get(kind.lower())
    if base is None:
        if None in (memory_gb, bandwidth_gbs, tflops):
            raise InputError(
                f"--gpu {kind!r} is not in the built-in table ({', '.join(GPUS)}); "
                "give --memory-gb, --memory-bandwidth-gbs and --tflops to describe it"
            )
        base = Device(kind, 0, 0, 0)
    overrides = {"memory_gb": memory_gb, "bandwidth_gbs": bandwidth_gbs, "tflops": tflops}
    return replace(base, **{name: value for name, value in overrides.items() if value is not None})


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a dense decoder: its sizes and the bytes of one weight."""

    name: str
    layers: int
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    bytes_per_param: int

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str = "model") -> ModelShape:
        """From a Hugging Face `config.json` (its `text_config` for a multimodal one)."""
        text = config.get("text_config") or config
        if (text.get("num_experts") or text.get("num_local_experts") or 0) > 1:
            raise InputError(
                f"--model {name}: mixture-of-experts layers are not planned (dense decoders only)"
            )
        try:
            heads = int(text["num_attention_heads"])
            hidden = int(text["hidden_size"])
            dtype = str(
                text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16"
            )
            return cls(
                name=name,
                layers=int(text["num_hidden_layers"]),
                hidden_size=hidden,
                intermediate_size=int(text["intermediate_size"]),
                heads=heads,
                kv_heads=int(text.get("num_key_value_heads") or heads),
                head_dim=int(text.get("head_dim") or hidden // heads),
                vocab_size=int(text["vocab_size"]),
                tied_embeddings=bool(
                    config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
                ),
                bytes_per_param=DTYPE_BYTES[dtype.removeprefix("torch.")],
            )
        except KeyError as exc:
            raise InputError(f"--model {name}: config.json has no {exc.args[0]!r}") from None

    @classmethod
    def load(cls, model: str) -> ModelShape:
        """From a `config.json` path or a local model directory holding one (no model hub)."""
        path = Path(model)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise InputError(
                f"--model {model!r}: no such config.json or model directory (the planner reads local files only)"
            )
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"--model {model!r}: {path} is not JSON ({exc})") from None
        return cls.from_config(config, name=model)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (biases left out: a few thousand against millions)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h
        return attention + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """Parameters of the whole model, tied embeddings counted once."""
        output = 0 if self.tied_embeddings else self.embedding_params
        return self.layers * self.layer_params + self.embedding_params + self.hidden_size + output

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.kv_heads * self.head_dim * self.bytes_per_param


def split_layers(layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) layer ranges of `stages` nearly equal shares (the first ones larger)."""
    if not 1 <= stages <= layers:
        raise InputError(f"--stages must be between 1 and the model's {layers} layers, got {stages}")
    base, extra = divmod(layers, stages)
    ranges, start = [], 0
    for i in range(stages):
        end = start + base + (i < extra)
        ranges.append((start, end))
        start = end
    return ranges


@dataclass(frozen=True)
class Stage:
    """One stage's share of the model: its layers and whether it holds the embedding or output layer."""

    index: int
    layers: int
    first: bool
    last: bool

    def stored_params(self, shape: ModelShape) -> int:
        params = self.layers * shape.layer_params
        if self.first:
            params += shape.embedding_params
        if self.last:
            tied_here = shape.tied_embeddings and self.first  # one stage: the tied matrix is stored once
            params += shape.hidden_size + (0 if tied_here else shape.embedding_params)
        return params

    def matmul_params(self, shape: ModelShape) -> int:
        """Parameters read and multiplied in every step (the embedding is a lookup)."""
        return self.layers * shape.layer_params + (shape.embedding_params + shape.hidden_size) * self.last

    def kv_bytes_per_token(self, shape: ModelShape) -> int:
        return self.layers * shape.kv_bytes_per_token_per_layer

    def step_flops(self, shape: ModelShape, batch: int, context: int) -> float:
        attention = 4 * batch * context * self.layers * shape.heads * shape.head_dim
        return 2 * self.matmul_params(shape) * batch + attention

    def step_bytes(self, shape: ModelShape, batch: int, context: int) -> float:
        weights = self.matmul_params(shape) * shape.bytes_per_param
        return weights + batch * context * self.kv_bytes_per_token(shape)


def stages_of(shape: ModelShape, stages: int) -> list[Stage]:
    ranges = split_layers(shape.layers, stages)
    return [Stage(i, end - start, i == 0, i == stages - 1) for i, (start, end) in enumerate(ranges)]


@dataclass(frozen=True)
class Network:
    """The links between stages: one-way latency (seconds) and bandwidth (bits per second)."""

    latency_s: float
    bits_per_second: float = 1e9

    def transfer_s(self, nbytes: float) -> float:
        return nbytes * 8 / self.bits_per_second


@dataclass(frozen=True)
class Ring:
    """A pipeline reduced to what the schedules need, for one micro-batch size: each stage's step time
    and, per hop j (stage j to j+1, the last back to the first), its latency and transfer time."""

    step_s: tuple[float, ...]
    hop_latency_s: tuple[float, ...]
    hop_transfer_s: tuple[float, ...]

    @classmethod
    def uniform(
        cls, step_s: list[float] | tuple[float, ...], latency_s: float, transfer_s: float = 0.0
    ) -> Ring:
        """Given step times; every hop the same (none with one stage)."""
        hops = len(step_s) if len(step_s) > 1 else 0
        return cls(tuple(step_s), (latency_s,) * hops, (transfer_s,) * hops)

    @property
    def round_s(self) -> float:
        """R: one micro-batch once round the ring, with nothing else in it."""
        return sum(self.step_s) + sum(self.hop_latency_s) + sum(self.hop_transfer_s)

    @property
    def busiest_s(self) -> float:
        """The longest time one resource (a stage, or a link's transfer) is held per micro-batch."""
        return max((*self.step_s, *self.hop_transfer_s))

    def period_s(self, micro_batches: int) -> float:
        """P: the time between two tokens of one sequence with M micro-batches in the ring."""
        return max(self.round_s, micro_batches * self.busiest_s)

    def throughput(self, batch: int, micro_batches: int = 1) -> float:
        """Tokens per second with M micro-batches of `batch` sequences (M = 1: synchronous)."""
        return micro_batches * batch / self.period_s(micro_batches)

    def scaled(self, factors: tuple[float, ...] | None) -> Ring:
        """The same ring with stage i's step `factors[i]` times as long (a slower device there)."""
        if factors is None:
            return self
        if len(factors) != len(self.step_s):
            raise InputError(
                f"--stage-slowdown needs one factor per stage ({len(self.step_s)}), got {len(factors)}"
            )
        return replace(self, step_s=tuple(t * f for t, f in zip(self.step_s, factors)))

    def saturating_micro_batches(self) -> int:
        """M*: the fewest micro-batches that keep the busiest resource always busy."""
        return max(1, math.ceil(self.round_s / self.busiest_s - 1e-9))


def ring_for(
    shape: ModelShape, stages: list[Stage], gpu: Device, network: Network, batch: int, context: int
) -> tuple[Ring, list[str]]:
    """The ring for micro-batches of `batch` sequences, and what bounds each stage's step (compute|memory)."""
    steps, bounds = [], []
    for stage in stages:
        compute = stage.step_flops(shape, batch, context) / gpu.flops
        memory = stage.step_bytes(shape, batch, context) / gpu.bytes_per_second
        steps.append(max(compute, memory))
        bounds.append("compute" if compute > memory else "memory")
    hops = len(stages) if len(stages) > 1 else 0
    hop_bytes = [activation_bytes(shape, batch)] * (hops - 1) + [batch * TOKEN_ID_BYTES] * (hops > 0)
    transfers = tuple(network.transfer_s(nbytes) for nbytes in hop_bytes)
    return Ring(tuple(steps), (network.latency_s,) * hops, transfers), bounds


def activation_bytes(shape: ModelShape, batch: int) -> int:
    """Bytes one decode step sends from a stage to the next: one hidden state per sequence."""
    return batch * shape.hidden_size * shape.bytes_per_param


@dataclass
class StagePlan:
    index: int
    layers: int
    weights_bytes: float
    kv_bytes_per_token: int
    max_batch: int
    step_s: float
    bound: str
    activation_bytes_per_hop: int


@dataclass
class SchedulePlan:
    name: str
    batch: int
    micro_batches: int
    token_latency_s: float
    tokens_per_s: float
    bound: str

    @property
    def label(self) -> str:
        if self.micro_batches == 1:
            return f"{self.name}, batch {self.batch}"
        return f"{self.name}, {self.micro_batches} x {self.batch}"


@dataclass
class Plan:
    """What `genesys plan-inference` prints: per stage, per schedule, and the settings behind them."""

    model: str
    params: int
    gpu: Device
    stages: list[StagePlan]
    schedules: list[SchedulePlan]
    latency_s: float
    bandwidth_gbps: float
    batch: int
    micro_batches: int
    saturating_micro_batches: int
    context: int
    max_batch: int
    rings: dict[str, Ring] = field(default_factory=dict)  # the ring each schedule runs, by schedule label
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ring_bound(ring: Ring, micro_batches: int, stage_bounds: list[str]) -> str:
    """What limits a schedule: the ring's latency, or the busiest stage's compute/memory, or a link."""
    if ring.round_s >= micro_batches * ring.busiest_s:
        network = sum(ring.hop_latency_s) + sum(ring.hop_transfer_s)
        return (
            "network latency" if network >= sum(ring.step_s) else f"stage steps ({_majority(stage_bounds)})"
        )
    slowest = max(range(len(ring.step_s)), key=ring.step_s.__getitem__)
    if ring.hop_transfer_s and max(ring.hop_transfer_s) > ring.step_s[slowest]:
        return "network bandwidth"
    return f"stage {slowest} {stage_bounds[slowest]}"


def _majority(bounds: list[str]) -> str:
    return max(set(bounds), key=bounds.count)


def plan(
    shape: ModelShape,
    stages: int,
    gpu: Device,
    network: Network,
    batch: int = 1,
    micro_batches: int | None = None,
    context: int = 4096,
    usable_memory: float = DEFAULT_USABLE_MEMORY,
    slowdown: tuple[float, ...] | None = None,
) -> Plan:
    """The plan for `stages` stages of `gpu`s on `network`: micro-batches of `batch` sequences, and
    `micro_batches` of them in the interleaved ring (default: the saturating number, within memory).
    `slowdown` makes stage i's steps `slowdown[i]` times longer than the roofline's (heterogeneous stages)."""
    parts = stages_of(shape, stages)
    ring, bounds = ring_for(shape, parts, gpu, network, batch, context)
    ring = ring.scaled(slowdown)
    budget = gpu.memory_bytes * usable_memory
    per_stage = []
    for stage, step, bound in zip(parts, ring.step_s, bounds):
        weights = stage.stored_params(shape) * shape.bytes_per_param
        kv = stage.kv_bytes_per_token(shape)
        per_stage.append(
            StagePlan(
                index=stage.index,
                layers=stage.layers,
                weights_bytes=weights,
                kv_bytes_per_token=kv,
                max_batch=max(0, math.floor((budget - weights) / (kv * context))) if kv else 0,
                step_s=step,
                bound=bound,
                activation_bytes_per_hop=activation_bytes(shape, batch)
                if not stage.last
                else batch * TOKEN_ID_BYTES,
            )
        )
    max_batch = min(stage.max_batch for stage in per_stage)
    saturating = ring.saturating_micro_batches()
    notes = []
    if micro_batches is None:
        micro_batches = max(1, min(saturating, max_batch // batch)) if max_batch >= batch else 1
        if micro_batches < saturating:
            notes.append(
                f"{saturating} micro-batches would saturate the ring; memory holds {micro_batches} of {batch}"
            )
    if max_batch < batch * micro_batches:
        notes.append(
            f"{batch * micro_batches} sequences of {context} tokens do not fit: at most {max_batch} per stage"
        )
    total = batch * micro_batches
    big_ring, big_bounds = ring_for(shape, parts, gpu, network, total, context)
    big_ring = big_ring.scaled(slowdown)
    schedules = [
        SchedulePlan(
            "synchronous", batch, 1, ring.period_s(1), ring.throughput(batch), _ring_bound(ring, 1, bounds)
        ),
        SchedulePlan(
            "synchronous",
            total,
            1,
            big_ring.period_s(1),
            big_ring.throughput(total),
            _ring_bound(big_ring, 1, big_bounds),
        ),
        SchedulePlan(
            "interleaved",
            batch,
            micro_batches,
            ring.period_s(micro_batches),
            ring.throughput(batch, micro_batches),
            _ring_bound(ring, micro_batches, bounds),
        ),
    ]
    rings = {schedules[0].label: ring, schedules[1].label: big_ring, schedules[2].label: ring}
    if micro_batches == 1:
        schedules = schedules[:1]
    return Plan(
        model=shape.name,
        params=shape.params,
        gpu=gpu,
        stages=per_stage,
        schedules=schedules,
        latency_s=network.latency_s,
        bandwidth_gbps=network.bits_per_second / 1e9,
        batch=batch,
        micro_batches=micro_batches,
        saturating_micro_batches=saturating,
        context=context,
        max_batch=max_batch,
        rings={label: rings[label] for label in (schedule.label for schedule in schedules)},
        notes=notes,
    )
