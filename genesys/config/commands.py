"""The commands' settings: each command composes the sections it reads into one model.

A command's model (`VerifyCommand`, `GenerateCommand`, `FilterCommand`, `ValidateCommand`, `TrainConfig`)
has the shape of its TOML file: top-level keys, then one table per section. Two commands that read the
same concern compose the same section under the same table name, so a key means the same thing, with
the same type and default, in every command (`tests/test_config_vocabulary.py` holds them to it).
`verify_config` turns any of them into what the verification engine takes; `build()` turns
`genesys generate`'s into what its run takes. Keys that were renamed are listed in each model's
`renamed` and still read, with a warning naming the new key.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from genesys.config.loading import RenamedKeys, load_toml, merge, upgrade, validate
from genesys.config.sections import (
    DEFAULT_TARGET_LENGTH_PROMPT,
    PRECISIONS,
    PROOF_BACKENDS,
    SECTION,
    TRACKERS,
    AsyncConfig,
    BackendOptions,
    CheckpointConfig,
    ClusterConfig,
    EvalConfig,
    ExpectedSampling,
    FilterConfig,
    FilterData,
    GenerateData,
    GenerateProofSettings,
    GenerateVerifySettings,
    LoraConfig,
    LossConfig,
    OptimConfig,
    ParallelConfig,
    PromptStyle,
    ProofConfig,
    ProofPolicy,
    ProofThresholds,
    RewardConfig,
    RolloutConfig,
    SamplingConfig,
    SandboxConfig,
    SftData,
    SftSettings,
    TrainData,
    TrustSettings,
    ValidateData,
    VerifyConfig,
    VerifySettings,
    setting,
)

# The one backend default of every command that runs a model (generate, validate, train): the usable
# backend of highest priority, vllm where it is installed and a GPU is visible, else transformers.
DEFAULT_BACKEND = "auto"
VALIDATE_BACKENDS = ("auto", *PROOF_BACKENDS)
OUTPUT_HELP = "output: .jsonl, .parquet, or a directory for parquet shards"


def _progress() -> Any:
    return setting(True, "show a progress bar", switch=("--no-progress", False, "no progress bar"))


OVERWRITE_HELP = "remove an existing output and start over (without it, an existing output is resumed)"


def _overwrite(help: str = OVERWRITE_HELP) -> Any:
    return setting(False, help, switch=("--overwrite", True, help))


def _retry_errors(help: str) -> Any:
    return setting(False, help, switch=("--retry-errors", True, help))


RETRY_ERRORS_HELP = (
    "verify again the rows of the output whose error is set (after fixing a verifier), replacing them"
)


def _model_to_train() -> Any:
    return setting(help="model path or hub name to start from", flags=("--model",))


def _run_dir() -> Any:
    return setting(help="run directory: metrics, checkpoints, the final model", flags=("-o", "--output-dir"))


def _report_to() -> Any:
    return setting(
        help=f"experiment trackers ({', '.join(TRACKERS)})", metavar="TRACKER", default_factory=list
    )


def _precision() -> Any:
    return setting(
        "fp32",
        "fp32, or bf16: bf16 weights and activations in forward and backward, "
        "fp32 master weights, optimizer state and gradient reduction",
        choices=PRECISIONS,
    )


def _gradient_checkpointing() -> Any:
    return setting(False, "recompute activations in the backward pass (less memory, more compute)")


def _check_trackers(report_to: list[str]) -> None:
    unknown = [name for name in report_to if name not in TRACKERS]
    if unknown:
        raise ValueError(f"report_to: unknown tracker {unknown[0]!r}; the trackers are {', '.join(TRACKERS)}")


def _backend(help: str, choices: tuple[str, ...] | None = None) -> Any:
    return setting(DEFAULT_BACKEND, help, flags=("--backend",), choices=choices)


def verify_config(
    config: Any, progress: bool = False, completion_field: str = "llm_response"
) -> VerifyConfig:
    """What the verification engine takes, from any command's config: its `[verify]` settings
    (without `genesys generate`'s `enabled`), `[sandbox]`, `[reward]` and `[cluster]`.

    Every command that verifies builds its `VerifyConfig` here. `progress`: the engine draws its own
    progress bar (`genesys verify`; generate and train draw theirs). `completion_field`: the column
    rollouts hold their completion in (`genesys verify --completion-field`).
    """
    settings = {name: getattr(config.verify, name) for name in VerifySettings.__pydantic_fields__}  # type: ignore[attr-defined]
    return VerifyConfig(
        **settings,
        sandbox=config.sandbox,
        reward=config.reward,
        progress=progress,
        cluster=config.cluster,
        completion_field=completion_field,
    )


@dataclass(frozen=True, config=SECTION)
class GenerateConfig:
    """Everything a generation run needs; `GenerateCommand.build()` makes it from a TOML file and flags."""

    tasks: list[str]
    model: str
    output: str | Path
    backend: str = DEFAULT_BACKEND
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    style: PromptStyle = Field(default_factory=PromptStyle)
    system_prompt: str | None = None
    target_lengths: list[int] | None = None
    target_length_prompt: str = DEFAULT_TARGET_LENGTH_PROMPT
    mix: list[float] | None = None
    max_tasks: int | None = Field(None, ge=1)
    backend_options: dict[str, Any] = Field(default_factory=dict)
    verify: VerifyConfig | None = None  # None: no verification
    proofs: ProofConfig | None = None  # None: no TOPLOC proofs
    progress: bool = True
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    overwrite: bool = False  # remove an existing output first
    retry_errors: bool = False  # generate nothing again, verify again the rows whose error is set


@dataclass(frozen=True, config=SECTION)
class VerifyCommand:
    """`genesys verify`: its TOML file and flags."""

    inputs: list[str] = setting(
        help="rollout files, directories or globs", positional=True, metavar="INPUT", min_length=1
    )
    output: str = setting(help=OUTPUT_HELP, flags=("-o", "--output"))
    rejects: str | None = setting(
        None, "where unreadable rows go (default: OUTPUT.rejects.jsonl)", flags=("--rejects",)
    )
    completion_field: str = setting(
        "llm_response",
        "the column holding each rollout's completion, written as llm_response",
        flags=("--completion-field",),
        metavar="NAME",
    )
    progress: bool = _progress()
    overwrite: bool = _overwrite()
    retry_errors: bool = _retry_errors(RETRY_ERRORS_HELP)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    proofs: TrustSettings = Field(default_factory=TrustSettings)

    def __post_init__(self) -> None:
        _one_of_overwrite_and_retry(self)

    def build(self) -> VerifyConfig:
        """The verification run's settings."""
        return verify_config(self, progress=self.progress, completion_field=self.completion_field)


@dataclass(frozen=True, config=SECTION)
class GenerateCommand(RenamedKeys):
    """`genesys generate`: its TOML file and flags."""

    renamed: ClassVar[dict[str, str]] = {
        "tasks": "data.tasks",
        "mix": "data.mix",
        "max_tasks": "data.max_tasks",
        "system_prompt": "data.system_prompt",
        "target_lengths": "data.target_lengths",
        "target_length_prompt": "data.target_length_prompt",
    }

    model: str = setting(help="model path or name (for openai: the served model name)", flags=("--model",))
    output: str = setting(help=OUTPUT_HELP, flags=("-o", "--output"))
    backend: str = _backend("generation backend (auto: vllm when installed with a GPU, else transformers)")
    progress: bool = _progress()
    overwrite: bool = _overwrite()
    retry_errors: bool = _retry_errors(RETRY_ERRORS_HELP + " (with --verify); their completions are kept")
    data: GenerateData = Field(default_factory=GenerateData)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    style: PromptStyle = Field(default_factory=PromptStyle)
    backend_options: BackendOptions = Field(default_factory=BackendOptions)
    verify: GenerateVerifySettings = Field(default_factory=GenerateVerifySettings)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    proofs: GenerateProofSettings = Field(default_factory=GenerateProofSettings)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        if not self.data.tasks:
            raise ValueError("'data.tasks' (--tasks) is required")
        if self.retry_errors and not self.verify.enabled:
            raise ValueError(
                "retry_errors (--retry-errors) verifies rows again: it needs verify.enabled (--verify)"
            )
        _one_of_overwrite_and_retry(self)

    def build(self, backend: str) -> GenerateConfig:
        """The generation run's settings, for the resolved `backend`."""
        data = self.data
        return GenerateConfig(
            tasks=data.tasks or [],
            model=self.model,
            output=self.output,
            backend=backend,
            sampling=self.sampling,
            style=self.style,
            system_prompt=data.system_prompt,
            target_lengths=data.target_lengths,
            target_length_prompt=data.target_length_prompt,
            mix=data.mix,
            max_tasks=data.max_tasks,
            backend_options=self.backend_options.for_backend(backend),
            verify=verify_config(self) if self.verify.enabled else None,
            proofs=self.proofs.for_backend(backend),
            progress=self.progress,
            cluster=self.cluster,
            overwrite=self.overwrite,
            retry_errors=self.retry_errors,
        )


def _one_of_overwrite_and_retry(command: Any) -> None:
    if command.overwrite and command.retry_errors:
        raise ValueError(
            "give one of overwrite (--overwrite: start over) and retry_errors (--retry-errors: keep the output, "
            "redo its errors)"
        )


@dataclass(frozen=True, config=SECTION)
class FilterCommand:
    """`genesys filter`: its TOML file and flags."""

    inputs: list[str] = setting(
        help="rollout files, directories or globs", positional=True, metavar="ROLLOUTS", min_length=1
    )
    output: str = setting(
        help="output tasks: .jsonl, .parquet, or - for JSON lines on stdout", flags=("-o", "--output")
    )
    overwrite: bool = _overwrite("replace an existing output (without it, an existing output is refused)")
    filter: FilterConfig = Field(default_factory=FilterConfig)
    data: FilterData = Field(default_factory=FilterData)
    proofs: TrustSettings = Field(default_factory=TrustSettings)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.data.tasks and not self.filter.require_proofs:
            raise ValueError("data.tasks (--tasks) is the trusted task set of --require-proofs; give both")


@dataclass(frozen=True, config=SECTION)
class ValidateCommand(RenamedKeys):
    """`genesys validate`: its TOML file and flags."""

    renamed: ClassVar[dict[str, str]] = {
        "batch_size": "backend_options.batch_size",
        "device": "backend_options.device",
        "dtype": "backend_options.dtype",
        "engine_args": "backend_options.args",
    }

    inputs: list[str] = setting(
        help="rollout files, directories or globs", positional=True, metavar="ROLLOUTS", min_length=1
    )
    model: str = setting(help="the model the rollouts claim: path or hub name", flags=("--model",))
    output: str = setting(help=OUTPUT_HELP, flags=("-o", "--output"))
    model_name: str | None = setting(
        None, "the model_name rows must carry (default: --model)", flags=("--model-name",)
    )
    backend: str = _backend(
        "what recomputes the rows: transformers (CPU or GPU) or vllm (its engine, with the capture of "
        "generate --proofs); auto: vllm when installed with a GPU, else transformers",
        choices=VALIDATE_BACKENDS,
    )
    progress: bool = _progress()
    data: ValidateData = Field(default_factory=ValidateData)
    style: PromptStyle = Field(default_factory=PromptStyle)
    overwrite: bool = _overwrite()
    retry_errors: bool = _retry_errors(
        "validate again the rows of the output that were not found valid (toploc_reason set), replacing them"
    )
    backend_options: BackendOptions = Field(default_factory=BackendOptions)
    proofs: ProofPolicy = Field(default_factory=ProofPolicy)
    thresholds: ProofThresholds = Field(default_factory=ProofThresholds)
    expect: ExpectedSampling = Field(default_factory=ExpectedSampling)

    def __post_init__(self) -> None:
        _one_of_overwrite_and_retry(self)
        if self.backend not in VALIDATE_BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(VALIDATE_BACKENDS)}, got {self.backend!r}")
        if self.backend != DEFAULT_BACKEND:
            self.check_backend(self.backend)

    def check_backend(self, backend: str) -> None:
        """Refuse settings of `[backend_options]` that `backend` (transformers or vllm) does not take."""
        options = self.backend_options
        if backend == "vllm" and (options.device is not None or options.dtype is not None):
            raise ValueError(
                "--device and --dtype apply to the transformers backend; give vLLM's dtype as -B dtype=..."
            )
        if backend == "transformers" and options.args:
            raise ValueError("-B engine arguments apply to the vllm backend")
        options.for_backend(backend)

    @property
    def batch_size(self) -> int:
        """Rows per prefill (transformers) or per engine call (vllm): `backend_options.batch_size`, default 8."""
        return self.backend_options.batch_size or 8


@dataclass(frozen=True, config=SECTION)
class TrainConfig(RenamedKeys):
    """`genesys train`: everything a training run needs; the shape of its TOML file."""

    renamed: ClassVar[dict[str, str]] = {
        "seed": "sampling.seed",
        "rollout.backend": "backend",
        "rollout.samples_per_prompt": "sampling.n",
        "rollout.max_tokens": "sampling.max_tokens",
        "rollout.temperature": "sampling.temperature",
        "rollout.top_p": "sampling.top_p",
    }

    model: str = _model_to_train()
    output_dir: str = _run_dir()
    backend: str = _backend(
        "generation backend; it must take new weights in place (transformers, vllm). "
        "auto: vllm when installed with a GPU, else transformers"
    )
    report_to: list[str] = _report_to()
    precision: Literal["fp32", "bf16"] = _precision()
    gradient_checkpointing: bool = _gradient_checkpointing()
    disable_dropout: bool = setting(
        True,
        "train with every dropout of the model at 0, so the trainer's policy is the sampler's "
        "(the saved model keeps its config)",
    )
    progress: bool = _progress()
    data: TrainData = Field(default_factory=lambda: TrainData(tasks=None, rollouts=None))
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    style: PromptStyle = Field(default_factory=PromptStyle)
    backend_options: BackendOptions = Field(default_factory=BackendOptions)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")  # `async` is a Python keyword
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    proofs: TrustSettings = Field(default_factory=TrustSettings)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        _check_trackers(self.report_to)
        if not self.offline and self.sampling.n < 2:
            raise ValueError(
                f"sampling.n (-n) is the group size and must be at least 2 to train online, got {self.sampling.n}: "
                "GRPO compares the samples of one task"
            )
        if self.sampling.temperature <= 0:
            raise ValueError(
                "sampling.temperature (--temperature) must be above 0 to train: the trainer's logprobs divide by it"
            )
        if self.async_.max_staleness and not self.cluster.ray:
            raise ValueError(
                "async.max_staleness > 0 needs rollout workers apart from the trainer: set cluster.backend = 'ray'"
            )
        if self.cluster.ray and (self.optim.updates_per_batch > 1 or self.optim.mini_batches > 1):
            raise ValueError(
                "cluster.backend = 'ray' takes one optimizer step per generated batch "
                "(optim.updates_per_batch = 1, optim.mini_batches = 1)"
            )
        if self.eval.tasks and (self.offline or self.cluster.ray):
            raise ValueError(
                "eval.tasks evaluates with the trainer's own generation backend: online training "
                "(data.tasks) with cluster.backend = 'local'"
            )
        if (
            self.optim.micro_batch_tokens
            and not self.offline
            and self.optim.micro_batch_tokens <= self.sampling.max_tokens
        ):
            raise ValueError(
                f"optim.micro_batch_tokens ({self.optim.micro_batch_tokens}) must exceed sampling.max_tokens "
                f"({self.sampling.max_tokens}): a sequence (its prompt and completion) never spans two micro-batches"
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
        """The verification settings, as every command builds them (`verify_config`)."""
        return verify_config(self)

    def as_dict(self) -> dict[str, Any]:
        """The resolved config as plain data, keyed as in TOML (None values left out, as TOML has no null)."""
        data = asdict(self)
        data["async"] = data.pop("async_")
        return _drop_none(data)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """The config of a TOML file with `overrides` (nested tables) laid over it, validated."""
        return _load(cls, path, overrides)


@dataclass(frozen=True, config=SECTION)
class SftConfig(RenamedKeys):
    """`genesys sft`: supervised fine-tuning on worked solutions or verified rollouts; the shape of its
    TOML file. The model, run directory, trackers, precision, [optim], [checkpoint], [parallel] and
    [lora] are `genesys train`'s; [data] and [style] say what is learnt and how prompts are rendered, as in generation."""

    renamed: ClassVar[dict[str, str]] = {}

    model: str = _model_to_train()
    output_dir: str = _run_dir()
    report_to: list[str] = _report_to()
    precision: Literal["fp32", "bf16"] = _precision()
    gradient_checkpointing: bool = _gradient_checkpointing()
    progress: bool = _progress()
    data: SftData = Field(default_factory=lambda: SftData(tasks=None, rollouts=None))
    sft: SftSettings = Field(default_factory=SftSettings)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    style: PromptStyle = Field(default_factory=PromptStyle)
    backend_options: BackendOptions = Field(default_factory=BackendOptions)

    def __post_init__(self) -> None:
        _check_trackers(self.report_to)

    def as_dict(self) -> dict[str, Any]:
        """The resolved config as plain data, keyed as in TOML (None values left out)."""
        return _drop_none(asdict(self))

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> SftConfig:
        """The config of a TOML file with `overrides` (nested tables) laid over it, validated."""
        return _load(cls, path, overrides)


def _load(cls: Any, path: str | Path | None, overrides: dict[str, Any] | None) -> Any:
    data = upgrade(load_toml(path), cls.renamed) if path is not None else {}
    return validate(cls, merge(data, upgrade(overrides or {}, cls.renamed)))


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
