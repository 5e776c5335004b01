"""The trainer's typed config: one model, read from TOML, any key overridable as a dotted flag.

Sections: `[data]` (where tasks or recorded rollouts come from), `[rollout]` (generation),
`[optim]`, `[loss]`, `[checkpoint]`, `[async]` (bounded staleness) and `[cluster]` (Ray actors);
verification and rewards take the same tables and defaults as `genesys verify` and
`genesys generate` (`[verify]`, `[sandbox]`, `[reward]`, `[style]`, `[backend_options]`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from genesys.config import (
    REQUIRE_PROOFS_HELP,
    SECTION,
    BackendOptions,
    ClusterConfig,
    PromptStyle,
    RewardConfig,
    SamplingConfig,
    SandboxConfig,
    VerifyConfig,
    VerifySettings,
    load_toml,
    merge,
    setting,
    validate,
)

TRACKERS = ("tensorboard", "wandb", "trackio")
SIGNALS = ("reward", "score", "correct")


@dataclass(frozen=True, config=SECTION)
class DataConfig:
    """Where training data comes from ([data]): task sources (online) or rollout files (offline)."""

    tasks: list[str] | None = setting(
        None, "task sources, as `genesys generate --tasks` takes them (online mode)", metavar="SRC"
    )
    rollouts: list[str] | None = setting(
        None, "rollout files from `genesys generate --verify` (offline mode)", metavar="FILE"
    )
    mix: list[float] | None = setting(None, "ratios of the task sources, one per source", metavar="R1,R2,...")
    system_prompt: str | None = setting(None, "system message put before every task")
    require_proofs: bool = setting(
        False,
        REQUIRE_PROOFS_HELP + " (offline mode)",
        switch=("--require-proofs", True, REQUIRE_PROOFS_HELP + " (offline mode)"),
    )

    def __post_init__(self) -> None:
        if bool(self.tasks) == bool(self.rollouts):
            raise ValueError(
                "give exactly one of data.tasks (online training) and data.rollouts (offline training)"
            )
        if self.require_proofs and not self.rollouts:
            raise ValueError(
                "data.require_proofs applies to recorded rollouts (data.rollouts checked by genesys validate)"
            )
        if self.mix is not None and (not self.tasks or len(self.mix) != len(self.tasks)):
            raise ValueError("data.mix needs one ratio per data.tasks source")


@dataclass(frozen=True, config=SECTION)
class RolloutConfig:
    """How a step's rollouts are made ([rollout])."""

    backend: str = setting("transformers", "generation backend (must take new weights in place)")
    prompts_per_step: int = setting(4, "tasks (groups) per optimizer batch", ge=1)
    samples_per_prompt: int = setting(8, "completions per task (the group size)", ge=2)
    max_tokens: int = setting(64, "completion tokens at most", ge=1)
    temperature: float = setting(1.0, "sampling temperature (the trainer's logprobs use the same)", gt=0)
    top_p: float = setting(
        1.0,
        "nucleus sampling mass; below 1 the recomputed logprobs differ from the sampling ones",
        gt=0,
        le=1,
    )
    filter_groups: bool = setting(True, "drop groups whose rollouts all have the same signal, and refill")
    filter_signal: Literal["reward", "score", "correct"] = setting(
        "reward", "what a group must vary in to be kept", choices=SIGNALS
    )
    max_refill_rounds: int = setting(
        4, "generation rounds per step at most when refilling dropped groups", ge=1
    )

    def sampling(self, seed: int) -> SamplingConfig:
        return SamplingConfig(
            n=self.samples_per_prompt,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seed,
        )


@dataclass(frozen=True, config=SECTION)
class OptimConfig:
    """The optimizer and its schedule ([optim])."""

    steps: int = setting(100, "optimizer steps of the run", ge=1)
    lr: float = setting(1e-5, "peak learning rate", ge=0)
    warmup_steps: int = setting(0, "steps of linear warmup from 0 to lr", ge=0)
    schedule: Literal["constant", "cosine"] = setting(
        "constant", "learning rate after warmup", choices=("constant", "cosine")
    )
    min_lr_ratio: float = setting(0.0, "cosine: the final learning rate as a fraction of lr", ge=0, le=1)
    max_grad_norm: float = setting(0.1, "clip the gradient's global norm to this (0: no clipping)", ge=0)
    micro_batch_size: int = setting(8, "sequences per forward/backward pass (bounds memory)", ge=1)
    updates_per_batch: int = setting(1, "optimizer steps on each generated batch (PPO-style epochs)", ge=1)
    weight_decay: float = setting(0.0, "AdamW weight decay", ge=0)
    beta1: float = setting(0.9, "AdamW beta1", ge=0, lt=1)
    beta2: float = setting(0.999, "AdamW beta2", ge=0, lt=1)
    adam_eps: float = setting(1e-8, "AdamW epsilon", gt=0)
    max_nonfinite_steps: int = setting(
        3,
        "steps in a row whose loss or gradient is not finite (each skipped, without an update) before the run stops with an error",
        ge=1,
    )


@dataclass(frozen=True, config=SECTION)
class LossConfig:
    """The GRPO loss ([loss]); see `genesys.train.loss`."""

    eps_low: float = setting(0.2, "lower clip of the ratio for negative advantages", ge=0, lt=1)
    eps_high: float = setting(0.2, "upper clip of the ratio for positive advantages", ge=0)
    delta: float = setting(4.0, "bound of the ratio for negative advantages (must exceed 1 + eps_high)", gt=1)
    kl_beta: float = setting(
        0.0, "weight of the KL to the frozen initial model (0: no reference model)", ge=0
    )
    entropy_coef: float = setting(0.0, "weight of the entropy bonus", ge=0)
    normalize: Literal["token", "sequence"] = setting(
        "token",
        "token: mean over all completion tokens; sequence: mean of per-sequence means",
        choices=("token", "sequence"),
    )
    scale_by_std: bool = setting(False, "divide advantages by their group's standard deviation")

    def __post_init__(self) -> None:
        if self.delta <= 1 + self.eps_high:
            raise ValueError(
                f"loss.delta must exceed 1 + eps_high = {1 + self.eps_high:g}, got {self.delta:g}"
            )


@dataclass(frozen=True, config=SECTION)
class CheckpointConfig:
    """Checkpoints ([checkpoint])."""

    every: int = setting(10, "save every this many steps (0: only the final model)", ge=0)
    keep: int = setting(2, "checkpoints kept (the newest)", ge=1)


@dataclass(frozen=True, config=SECTION)
class AsyncConfig:
    """Asynchronous training ([async]): generation runs ahead of the trainer by a bounded number of steps."""

    max_staleness: int = setting(
        0, "train on rollouts of a policy at most this many steps old (0: synchronous)", ge=0
    )


@dataclass(frozen=True, config=SECTION)
class TrainConfig:
    """`genesys train`: everything a training run needs; the shape of its TOML file."""

    model: str = setting(help="model path or hub name to start from", flags=("--model",))
    output_dir: str = setting(
        help="run directory: metrics, checkpoints, the final model", flags=("-o", "--output-dir")
    )
    seed: int = setting(0, "seed of task order, sampling and initialisation", flags=("--seed",))
    report_to: list[str] = setting(
        help=f"experiment trackers ({', '.join(TRACKERS)})", metavar="TRACKER", default_factory=list
    )
    precision: Literal["fp32", "bf16"] = setting(
        "fp32", "training precision: fp32, or bf16 autocast (GPU)", choices=("fp32", "bf16")
    )
    gradient_checkpointing: bool = setting(
        False, "recompute activations in the backward pass (less memory, more compute)"
    )
    progress: bool = setting(True, "show a progress bar", switch=("--no-progress", False, "no progress bar"))
    data: DataConfig = Field(default_factory=lambda: DataConfig(tasks=None, rollouts=None))
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    style: PromptStyle = Field(default_factory=PromptStyle)
    backend_options: BackendOptions = Field(default_factory=BackendOptions)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")  # `async` is a Python keyword
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        unknown = [name for name in self.report_to if name not in TRACKERS]
        if unknown:
            raise ValueError(
                f"report_to: unknown tracker {unknown[0]!r}; the trackers are {', '.join(TRACKERS)}"
            )
        if self.async_.max_staleness and not self.cluster.ray:
            raise ValueError(
                "async.max_staleness > 0 needs rollout workers apart from the trainer: set cluster.backend = 'ray'"
            )
        if self.cluster.ray and self.optim.updates_per_batch > 1:
            raise ValueError(
                "cluster.backend = 'ray' takes one optimizer step per generated batch (optim.updates_per_batch = 1)"
            )
        if self.cluster.ray and self.offline:
            raise ValueError(
                "cluster.backend = 'ray' generates rollouts; offline training (data.rollouts) runs without it"
            )

    @property
    def offline(self) -> bool:
        """Whether the run trains on recorded rollouts instead of generating."""
        return bool(self.data.rollouts)

    def verify_config(self) -> VerifyConfig:
        """The verification settings, as `genesys verify` would build them."""
        return VerifyConfig(**asdict(self.verify), sandbox=self.sandbox, reward=self.reward, progress=False)

    def as_dict(self) -> dict[str, Any]:
        """The resolved config as plain data, keyed as in TOML (None values left out, as TOML has no null)."""
        data = asdict(self)
        data["async"] = data.pop("async_")
        return _drop_none(data)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """The config of a TOML file with `overrides` (nested tables) laid over it, validated."""
        data = load_toml(path) if path is not None else {}
        return validate(cls, merge(data, overrides or {}))


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
