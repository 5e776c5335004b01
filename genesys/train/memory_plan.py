"""The memory one training rank needs, estimated from the model's config before any weight is loaded.

`plan_memory(config, world_size)` builds the model on the meta device (shapes, no storage) and adds up:

- weights: every parameter in the training dtype (fp32; with `precision = "bf16"` a bf16 copy for
  forward and backward plus the fp32 master), divided among the ranks by `[parallel] strategy = "fsdp2"`
  (plus the unsharded working set: the two largest layers, gathered one ahead of use);
- gradients: fp32 for every trainable parameter (LoRA: the adapters only), sharded by fsdp2;
  DistributedDataParallel keeps its communication buckets beside them (as much again);
- optimizer: AdamW's two fp32 moments per trainable parameter, sharded by fsdp2;
- activations at the token budget: what autograd saves for the backward pass, counted by running the
  model's own forward on the meta device (`saved_tensors_hooks`), per token and per layer, times the
  tokens of one micro-batch (`optim.micro_batch_tokens`, or `micro_batch_size` sequences of
  `ASSUMED_PROMPT_TOKENS + sampling.max_tokens`, or of `ASSUMED_PROMPT_TOKENS +
  ASSUMED_SFT_COMPLETION_TOKENS` for `genesys sft`, whose examples are read after the check); with gradient checkpointing, each layer's input plus
  one layer recomputed. Attention's saved mask is added by rule (`attention_mask_bytes`), as the meta
  device runs another attention kernel than the device would; plus the backward's transient: one
  layer's activation gradients, four chunks of vocabulary logits (`genesys.train.logprobs`) and two
  vocabulary-sized weight gradients (a chunk's and the embedding's, before they are accumulated);
- engine: the generation backend that shares the rank's device (none offline, with Ray workers or
  for `genesys sft`). On a GPU, a vLLM engine whose run names neither `gpu_memory_utilization` nor
  `kv_cache_memory_bytes` gets the share the training steps leave, less `ENGINE_MARGIN` of the
  device (`colocated_engine_share`), and the trainer starts it with that share.

Two moments outside the training steps can need more (`outside_steps`): while the model loads,
rank 0 holds the pretrained model it reads (in its own dtype) beside its fp32 shards
(`genesys.train.loading`); while a checkpoint is written, the step's weights, gradients and
optimizer state stay beside one file of the model folder (rank 0) and one serialised file of the
rank's shards (`genesys.train.checkpoint`). On a CPU they take the rank's memory and count in its
peak; on a GPU they are host memory, and the plan says how much.

The peak is compared with the memory of the device the rank sees (a GPU's, or this machine's RAM
shared by its local ranks). It is an upper estimate: gradients and activations never peak together.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from genesys.config import SftConfig
from genesys.errors import InputError
from genesys.train.checkpoint import SHARD_FILE_BYTES
from genesys.train.config import TrainConfig
from genesys.train.export import MAX_SHARD_BYTES, declared_dtype
from genesys.train.logprobs import chunk_tokens

GIB = 2**30
ENGINE_MARGIN = 0.1  # of a GPU, left free beside a colocated vLLM engine's default share
ENGINE_SHARE_BOUNDS = (0.05, 0.9)  # the least and the most of a GPU that default share is
ASSUMED_PROMPT_TOKENS = 256  # prompt length assumed for padded micro-batches, whose prompts are unknown here
ASSUMED_SFT_COMPLETION_TOKENS = 1024  # the same for supervised examples' completions
PROBE_TOKENS = 97  # tokens of the meta forward: a prime, so no model dimension has its size
ADAM_MOMENTS = 2
FP32 = 4
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Layout:
    """How the run trains, as far as memory goes (read from the config, see `layout`)."""

    world_size: int
    strategy: str  # "ddp" or "fsdp2"; a single process is "ddp" (nothing to shard)
    precision: str  # "fp32" or "bf16"
    lora_rank: int
    lora_targets: tuple[str, ...]
    tokens: int  # tokens of one micro-batch
    sequences: int  # sequences of one micro-batch (for the padded layout's attention masks)
    packed: bool
    gradient_checkpointing: bool
    device_type: str
    flash_attention: bool


@dataclass(frozen=True)
class ModelFacts:
    """What the estimate needs of a model: parameter counts and saved activations per token."""

    params: int
    trainable: int
    largest_layer: int  # parameters of the largest decoder layer
    layers: int
    hidden: int
    vocab: int
    layer_bytes_per_token: int  # saved by one decoder layer, per token, in the compute dtype
    other_bytes_per_token: int  # saved outside the decoder layers (embedding, final norm)
    declared_bytes: int = FP32  # per parameter in the dtype the model's config declares (its files')


@dataclass
class MemoryPlan:
    """The estimate of one rank's memory, its parts, and the device memory it is compared with."""

    layout: Layout
    facts: ModelFacts
    parts: dict[str, int]
    device: str
    capacity: int | None  # bytes this rank may use; None when unknown
    notes: list[str] = field(default_factory=list)
    moments: dict[str, int] = field(default_factory=dict)  # on the device, outside the steps
    engine_share: float | None = None  # the default gpu_memory_utilization of a colocated vLLM engine

    @property
    def total(self) -> int:
        """The memory of a training step."""
        return sum(self.parts.values())

    @property
    def peak(self) -> int:
        """The most the rank needs at any moment: a step, loading the model, writing a checkpoint."""
        return max([self.total, *self.moments.values()])

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak <= self.capacity

    def table(self) -> str:
        """The estimate as lines of text, one per part."""
        layout = self.layout
        lines = [
            f"model: {self.facts.params / 1e9:.3f}B parameters ({self.facts.trainable / 1e9:.3f}B trainable), "
            f"{self.facts.layers} layers, hidden {self.facts.hidden}, vocabulary {self.facts.vocab}",
            f"layout: {layout.world_size} process(es), strategy {layout.strategy}, precision {layout.precision}, "
            f"LoRA rank {layout.lora_rank}, {layout.tokens} tokens per micro-batch "
            f"({'packed' if layout.packed else f'{layout.sequences} padded sequences'})"
            f"{', gradient checkpointing' if layout.gradient_checkpointing else ''}",
            "estimated memory per rank:",
        ]
        lines += [f"  {name:<12} {size(value):>12}" for name, value in self.parts.items()]
        lines.append(f"  {'total':<12} {size(self.total):>12}")
        lines += [f"  {name:<12} {size(value):>12}" for name, value in self.moments.items()]
        if self.moments:
            lines.append(f"  {'peak':<12} {size(self.peak):>12}")
        if self.capacity is not None:
            lines.append(f"  {'available':<12} {size(self.capacity):>12} on {self.device}")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def size(value: int) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / 2**20:.1f} MiB"


def layout(config: TrainConfig | SftConfig, world_size: int, device_type: str) -> Layout:
    """The run's layout from its config: `[parallel] strategy` (default fsdp2 with several processes),
    `precision`, `[lora] rank` and `target_modules`, the micro-batch's tokens."""
    parallel = getattr(config, "parallel", None)
    strategy = str(getattr(parallel, "strategy", None) or "auto")
    if strategy == "auto":
        strategy = "fsdp2" if world_size > 1 else "ddp"
    lora = getattr(config, "lora", None)
    rank = int(getattr(lora, "rank", 0) or 0)
    targets = getattr(lora, "target_modules", None) or DEFAULT_LORA_TARGETS
    optim = config.optim
    if optim.micro_batch_tokens:
        tokens, sequences, packed = optim.micro_batch_tokens, 1, True
    else:
        sequences, packed = optim.micro_batch_size, False
        tokens = sequences * (ASSUMED_PROMPT_TOKENS + completion_tokens(config))
    options = config.backend_options
    return Layout(
        world_size=world_size,
        strategy=strategy,
        precision=config.precision,
        lora_rank=rank,
        lora_targets=tuple([targets] if isinstance(targets, str) else targets),
        tokens=tokens,
        sequences=sequences,
        packed=packed,
        gradient_checkpointing=config.gradient_checkpointing,
        device_type=device_type,
        flash_attention="flash" in str(getattr(options, "attn_implementation", "") or ""),
    )


def _meta_model(model: str, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.dtype]:
    """The model on the meta device in `dtype`, and the dtype its config declares."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        model_config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as exc:
        raise InputError(f"model {model!r}: its config cannot be read ({exc})") from None
    declared = declared_dtype(model_config)
    model_config.use_cache = False
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(model_config, dtype=dtype), declared


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)
    if layers is None:
        raise InputError(f"{type(model).__name__}: no decoder layers found to estimate activations")
    return list(layers)


def _lora_params(model: torch.nn.Module, rank: int, targets: tuple[str, ...]) -> int:
    """Parameters of rank-`rank` adapters on the linear layers whose names end in a target."""
    if "all-linear" in targets:
        head = model.get_output_embeddings()
        chosen = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    else:
        chosen = [
            m
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
        ]
    return sum(rank * (m.in_features + m.out_features) for m in chosen)


def saved_activation_bytes(model: torch.nn.Module, tokens: int = PROBE_TOKENS) -> tuple[int, int]:
    """(bytes one decoder layer saves for backward per token, bytes saved outside the layers per token),
    counted on a meta-device forward of `tokens` tokens; parameters and attention-shaped (tokens x
    tokens) tensors are left out (the latter are counted by `attention_mask_bytes`)."""
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    layers = _decoder_layers(model)
    inside: list[int] = []  # the index of the layer running now, if any
    saved: dict[int, tuple[int, int]] = {}  # storage -> (layer or -1, bytes)

    def enter(index: int) -> Callable[..., None]:
        return lambda *_: inside.append(index)

    def leave(*_: Any) -> None:
        inside.pop()

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in params and tuple(tensor.shape[-2:]) != (tokens, tokens):
            saved.setdefault(storage._cdata, (inside[-1] if inside else -1, storage.nbytes()))
        return tensor

    handles = [layer.register_forward_pre_hook(enter(i)) for i, layer in enumerate(layers)]
    handles += [layer.register_forward_hook(leave) for layer in layers]
    ids = torch.zeros((1, tokens), dtype=torch.long, device="meta")
    mask = torch.ones((1, 1, tokens, tokens), dtype=torch.bool, device="meta")  # as given: no value checks
    positions = torch.arange(tokens, device="meta")[None]
    try:
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        del output
    finally:
        for handle in handles:
            handle.remove()
    first_layer = sum(size for where, size in saved.values() if where == 0)
    outside = sum(size for where, size in saved.values() if where == -1)
    return -(-first_layer // tokens), -(-outside // tokens)


def model_facts(model: str, layout: Layout) -> ModelFacts:
    """The facts of `model` (a path or hub name) for `layout`, from its config on the meta device."""
    dtype = torch.bfloat16 if layout.precision == "bf16" else torch.float32
    meta, declared = _meta_model(model, dtype)
    meta.train()
    params = sum(p.numel() for p in meta.parameters())  # tied weights are one parameter
    layers = _decoder_layers(meta)
    trainable = _lora_params(meta, layout.lora_rank, layout.lora_targets) if layout.lora_rank else params
    layer_bytes, other_bytes = saved_activation_bytes(meta)
    text = meta.config.get_text_config()
    return ModelFacts(
        params=params,
        trainable=trainable,
        largest_layer=max(sum(p.numel() for p in layer.parameters()) for layer in layers),
        layers=len(layers),
        hidden=text.hidden_size,
        vocab=meta.get_output_embeddings().weight.shape[0],
        layer_bytes_per_token=layer_bytes,
        other_bytes_per_token=other_bytes,
        declared_bytes=declared.itemsize,
    )


def attention_mask_bytes(layout: Layout, facts: ModelFacts) -> int:
    """What attention keeps of its mask: flash attention none (packed sequences go by their
    lengths); sdpa with a mask converts it once per layer to the compute dtype and keeps it for the
    backward pass (packed: one tokens x tokens block-diagonal mask; padded: one per sequence)."""
    if layout.flash_attention:
        return 0
    element = 2 if layout.precision == "bf16" and layout.device_type == "cuda" else FP32
    if layout.device_type == "cpu":
        element = FP32  # the CPU kernel takes its mask as float32
    length = layout.tokens // layout.sequences
    per_layer = layout.sequences * length * length * element
    return facts.layers * per_layer + layout.sequences * length * length  # and the boolean mask itself


def estimate(layout: Layout, facts: ModelFacts) -> dict[str, int]:
    """The parts of one rank's memory in bytes (see the module's docstring)."""
    shards = layout.world_size if layout.strategy == "fsdp2" else 1
    compute = 2 if layout.precision == "bf16" else FP32
    frozen = facts.params - facts.trainable if layout.lora_rank else 0
    trained = facts.params - frozen
    if layout.precision == "bf16":  # bf16 for compute, fp32 master of what is trained
        weights = (facts.params * compute + trained * FP32) // shards
    else:
        weights = facts.params * FP32 // shards
    if shards > 1:  # the gathered layers: the one computing and the one prefetched
        weights += 2 * facts.largest_layer * compute
    gradients = facts.trainable * FP32 // shards
    if layout.strategy == "ddp" and layout.world_size > 1:
        gradients *= 2  # DistributedDataParallel's buckets
    optimizer = ADAM_MOMENTS * facts.trainable * FP32 // shards
    tokens = layout.tokens
    layer = facts.layer_bytes_per_token * tokens
    if layout.gradient_checkpointing:
        saved = facts.layers * tokens * facts.hidden * compute + layer
    else:
        saved = facts.layers * layer
    saved += facts.other_bytes_per_token * tokens + attention_mask_bytes(layout, facts)
    logits = 4 * min(tokens, chunk_tokens(facts.vocab)) * facts.vocab * FP32
    # The vocabulary projection's gradient of one chunk and the embedding's, beside the accumulated ones.
    logits += 2 * facts.vocab * facts.hidden * FP32
    return {
        "weights": weights,
        "gradients": gradients,
        "optimizer": optimizer,
        "activations": saved + layer + logits,
        "engine": 0,  # the generation backend's: plan_memory sets it beside these
    }


def pretrained_bytes(layout: Layout, facts: ModelFacts) -> int:
    """The pretrained model as rank 0 reads it: in its own dtype, in fp32 with LoRA (whose adapters
    start from an fp32 base)."""
    return facts.params * (FP32 if layout.lora_rank else facts.declared_bytes)


def outside_steps(
    layout: Layout, facts: ModelFacts, parts: dict[str, int], checkpoints: bool
) -> dict[str, int]:
    """One rank's memory at the moments outside the training steps (see the module's docstring):
    `loading` on rank 0, the most loaded (its fp32 shards and the pretrained model it reads,
    `pretrained_bytes`), and with `checkpoints`, `checkpoint` (what the step keeps beside the files
    being written: one of the model folder's on rank 0, one serialised file of the rank's shards,
    whose state is written once over all the ranks)."""
    shards = layout.world_size if layout.strategy == "fsdp2" else 1
    moments = {"loading": facts.params * FP32 // shards + pretrained_bytes(layout, facts)}
    if checkpoints:
        kept = parts["weights"] + parts["gradients"] + parts["optimizer"] + parts["engine"]
        model_file = min(facts.params * facts.declared_bytes, MAX_SHARD_BYTES)
        state = facts.trainable * (1 + ADAM_MOMENTS) * FP32 // layout.world_size
        moments["checkpoint"] = kept + model_file + min(state, SHARD_FILE_BYTES)
    return moments


def colocated_engine_share(training: int, capacity: int) -> float:
    """The share of a GPU of `capacity` bytes that a vLLM engine beside training steps of `training`
    bytes takes when the run names none: what the steps leave, less ENGINE_MARGIN of the device,
    within ENGINE_SHARE_BOUNDS (at the least bound, a run the steps fill does not fit)."""
    low, high = ENGINE_SHARE_BOUNDS
    return round(min(high, max(low, (capacity - training) / capacity - ENGINE_MARGIN)), 3)


def engine_bytes(
    config: TrainConfig | SftConfig, facts: ModelFacts, layout: Layout, capacity: int | None, training: int
) -> tuple[int, str, float | None]:
    """The generation backend's memory on this rank's device beside training steps of `training`
    bytes, how it was reckoned, and the share of a GPU a vLLM engine takes by default (None when
    the run names its memory, or off a GPU)."""
    if _supervised(config):
        return 0, "supervised fine-tuning: no generation engine", None
    if config.offline:
        return 0, "offline: no generation engine", None
    if config.cluster.ray:
        return 0, "rollout workers are Ray actors on their own resources", None
    from genesys.generate.backend import resolve_backend_name

    backend = resolve_backend_name(config.backend)
    options = config.backend_options.for_backend(backend)
    engine_args = dict(options.get("engine_args") or {})
    if backend == "vllm":
        if "kv_cache_memory_bytes" in engine_args:
            kv = int(engine_args["kv_cache_memory_bytes"])
            return facts.params * 2 + kv, "vLLM: bf16 weights and its KV cache (kv_cache_memory_bytes)", None
        if layout.device_type == "cuda" and capacity:
            if "gpu_memory_utilization" in engine_args:
                share = float(engine_args["gpu_memory_utilization"])
                return int(share * capacity), f"vLLM: gpu_memory_utilization {share} of the device", None
            share = colocated_engine_share(training, capacity)
            note = (
                f"vLLM: gpu_memory_utilization {share} of the device, what the training steps leave less "
                f"{ENGINE_MARGIN:.0%} of it (backend_options.args.gpu_memory_utilization sets another)"
            )
            return int(share * capacity), note, share
        from genesys.generate.vllm import cpu_kv_cache_bytes

        kv = cpu_kv_cache_bytes(config.model, engine_args)
        return facts.params * 2 + kv, "vLLM on CPU: weights and its KV cache", None
    element = 2 if layout.precision == "bf16" and layout.device_type == "cuda" else FP32
    sequences = config.rollout.prompts_per_step * config.sampling.n // layout.world_size
    kv_per_token = 2 * facts.layers * facts.hidden * element  # an upper bound: all heads keep keys and values
    kv = sequences * (ASSUMED_PROMPT_TOKENS + config.sampling.max_tokens) * kv_per_token
    return (
        facts.params * element + kv,
        f"{backend}: its own copy of the weights and a KV cache of the batch",
        None,
    )


def completion_tokens(config: TrainConfig | SftConfig) -> int:
    """The completion length a padded micro-batch is reckoned with: the sampling limit of a GRPO run,
    `ASSUMED_SFT_COMPLETION_TOKENS` for supervised fine-tuning."""
    return ASSUMED_SFT_COMPLETION_TOKENS if _supervised(config) else config.sampling.max_tokens


def _supervised(config: TrainConfig | SftConfig) -> bool:
    """Whether `config` is a `genesys sft` run's (it has examples, no sampling settings)."""
    return getattr(config, "sampling", None) is None


def device_capacity(device: torch.device, local_processes: int) -> tuple[str, int | None]:
    """(a name for the memory one rank may use, its bytes): the GPU's memory, or this machine's RAM
    divided among its local training processes."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        _, total = torch.cuda.mem_get_info(index)
        return f"{torch.cuda.get_device_name(index)} (cuda:{index})", total
    if device.type == "cpu":
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return "cpu", None
        share = f" (1/{local_processes} of it per process)" if local_processes > 1 else ""
        return f"this machine's RAM{share}", total // local_processes
    return str(device), None


def plan_memory(
    config: TrainConfig | SftConfig, world_size: int = 1, device: torch.device | None = None
) -> MemoryPlan:
    """The memory plan of one rank of `config` run by `world_size` processes on `device`."""
    if device is None:
        device = torch.device(
            config.backend_options.device or ("cuda" if torch.cuda.is_available() else "cpu")
        )
    run_layout = layout(config, world_size, device.type)
    facts = model_facts(config.model, run_layout)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size if device.type == "cpu" else 1))
    name, capacity = device_capacity(device, local)
    parts = estimate(run_layout, facts)
    engine, engine_note, engine_share = engine_bytes(config, facts, run_layout, capacity, sum(parts.values()))
    parts["engine"] = engine
    notes = [engine_note]
    if not run_layout.packed:
        notes.append(
            f"padded micro-batches: {run_layout.sequences} sequences of {ASSUMED_PROMPT_TOKENS} prompt + "
            f"{completion_tokens(config)} completion tokens assumed; set optim.micro_batch_tokens for a bound"
        )
    moments = outside_steps(run_layout, facts, parts, bool(config.checkpoint.every))
    if device.type != "cpu":  # host memory, beside the device's
        notes.append(
            f"host memory: rank 0 reads the pretrained model ({size(pretrained_bytes(run_layout, facts))}) "
            "before sending it out; a checkpoint stages at most "
            f"{size(2 * SHARD_FILE_BYTES + MAX_SHARD_BYTES)} per rank"
        )
        moments = {}
    return MemoryPlan(run_layout, facts, parts, name, capacity, notes, moments, engine_share)


def default_engine_share(config: TrainConfig, world_size: int, device: torch.device | str) -> float | None:
    """The gpu_memory_utilization a colocated vLLM engine of `config` starts with on `device` when
    the run names neither it nor kv_cache_memory_bytes (see `colocated_engine_share`); None off a
    GPU, when the run names its engine's memory, or when no plan can be made (vLLM's own default)."""
    if torch.device(device).type != "cuda":
        return None
    try:
        return plan_memory(config, world_size, torch.device(device)).engine_share
    except Exception:  # noqa: BLE001 - no estimate: the engine keeps vLLM's default, as the check does
        return None


def check_fits(plan: MemoryPlan) -> None:
    """An InputError with the numbers when the plan does not fit the device it was made for."""
    if not plan.fits:
        raise InputError(
            f"this run needs about {size(plan.peak)} per rank but {plan.device} has "
            f"{size(plan.capacity or 0)}; shrink optim.micro_batch_tokens, turn on "
            "gradient_checkpointing, use more processes with parallel.strategy = 'fsdp2', precision = 'bf16' "
            "or lora.rank, lower a vLLM engine's backend_options.args.gpu_memory_utilization, or run on a "
            "larger device.\n" + plan.table()
        )
