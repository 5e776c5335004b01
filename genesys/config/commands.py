"""The commands' settings: each command composes the sections it reads into one model.

A command's model (`VerifyCommand`, `GenerateCommand`, `FilterCommand`, `ValidateCommand`) has the shape
of its TOML file: top-level keys, then one table per section. `build()` turns it into what the run
takes (`VerifyConfig`, `GenerateConfig`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from genesys.config.sections import (
    DEFAULT_TARGET_LENGTH_PROMPT,
    SECTION,
    BackendOptions,
    ClusterConfig,
    ExpectedSampling,
    FilterConfig,
    GenerateProofSettings,
    GenerateVerifySettings,
    PromptStyle,
    ProofConfig,
    ProofPolicy,
    ProofThresholds,
    RewardConfig,
    SamplingConfig,
    SandboxConfig,
    VerifyConfig,
    VerifySettings,
    setting,
)


@dataclass(frozen=True, config=SECTION)
class GenerateConfig:
    """Everything a generation run needs; `GenerateCommand.build()` makes it from a TOML file and flags."""

    tasks: list[str]
    model: str
    output: str | Path
    backend: str = "auto"
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


@dataclass(frozen=True, config=SECTION)
class VerifyCommand:
    """`genesys verify`: its TOML file and flags."""

    inputs: list[str] = setting(
        help="rollout files, directories or globs", positional=True, metavar="INPUT", min_length=1
    )
    output: str = setting(
        help="output: .jsonl, .parquet, or a directory for parquet shards", flags=("-o", "--output")
    )
    rejects: str | None = setting(
        None, "where unreadable rows go (default: OUTPUT.rejects.jsonl)", flags=("--rejects",)
    )
    completion_field: str = setting(
        "llm_response",
        "the column holding each rollout's completion, written as llm_response",
        flags=("--completion-field",),
        metavar="NAME",
    )
    progress: bool = setting(True, "show a progress bar", switch=("--no-progress", False, "no progress bar"))
    verify: VerifySettings = Field(default_factory=VerifySettings)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    def build(self) -> VerifyConfig:
        """The verification run's settings."""
        return VerifyConfig(
            **asdict(self.verify),
            sandbox=self.sandbox,
            reward=self.reward,
            progress=self.progress,
            cluster=self.cluster,
            completion_field=self.completion_field,
        )


@dataclass(frozen=True, config=SECTION)
class GenerateCommand:
    """`genesys generate`: its TOML file and flags."""

    tasks: list[str] = setting(
        help="task sources: files/dirs (.jsonl, .parquet, saved datasets), hf:NAME[:split=S,...], or task sets (math-samples, code-samples, countdown:count=N)",
        flags=("--tasks",),
        metavar="SRC",
        min_length=1,
    )
    model: str = setting(help="model path or name (for openai: the served model name)", flags=("--model",))
    output: str = setting(
        help="output: .jsonl, .parquet, or a directory for parquet shards", flags=("-o", "--output")
    )
    backend: str = setting(
        "auto",
        "generation backend (auto: vllm when installed with a GPU, else transformers)",
        flags=("--backend",),
    )
    mix: list[float] | None = setting(
        None, "ratios of the task sources, one per --tasks source", flags=("--mix",), metavar="R1,R2,..."
    )
    max_tasks: int | None = setting(None, "use at most this many tasks", flags=("--max-tasks",), ge=1)
    system_prompt: str | None = setting(
        None, "system message put before every task", flags=("--system-prompt",)
    )
    target_lengths: list[int] | None = setting(
        None,
        "give each task one of these thinking lengths, asked for in the system message and stored as target_length",
        flags=("--target-lengths",),
        metavar="N1,N2,...",
    )
    target_length_prompt: str = setting(
        DEFAULT_TARGET_LENGTH_PROMPT,
        "the target-length instruction, with {target_length}",
        flags=("--target-length-prompt",),
        metavar="TEMPLATE",
    )
    progress: bool = setting(True, "show a progress bar", switch=("--no-progress", False, "no progress bar"))
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    style: PromptStyle = Field(default_factory=PromptStyle)
    backend_options: BackendOptions = Field(default_factory=BackendOptions)
    verify: GenerateVerifySettings = Field(default_factory=GenerateVerifySettings)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    proofs: GenerateProofSettings = Field(default_factory=GenerateProofSettings)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    def build(self, backend: str) -> GenerateConfig:
        """The generation run's settings, for the resolved `backend`."""
        verify = None
        if self.verify.enabled:
            settings = {k: v for k, v in asdict(self.verify).items() if k != "enabled"}
            verify = VerifyConfig(
                **settings, sandbox=self.sandbox, reward=self.reward, progress=False, cluster=self.cluster
            )
        return GenerateConfig(
            tasks=self.tasks,
            model=self.model,
            output=self.output,
            backend=backend,
            sampling=self.sampling,
            style=self.style,
            system_prompt=self.system_prompt,
            target_lengths=self.target_lengths,
            target_length_prompt=self.target_length_prompt,
            mix=self.mix,
            max_tasks=self.max_tasks,
            backend_options=self.backend_options.for_backend(backend),
            verify=verify,
            proofs=self.proofs.for_backend(backend),
            progress=self.progress,
            cluster=self.cluster,
        )


@dataclass(frozen=True, config=SECTION)
class FilterCommand:
    """`genesys filter`: its TOML file and flags."""

    inputs: list[str] = setting(
        help="rollout files, directories or globs", positional=True, metavar="ROLLOUTS", min_length=1
    )
    output: str = setting(help="output tasks: .jsonl or .parquet", flags=("-o", "--output"))
    filter: FilterConfig = Field(default_factory=FilterConfig)


@dataclass(frozen=True, config=SECTION)
class ValidateCommand:
    """`genesys validate`: its TOML file and flags."""

    inputs: list[str] = setting(
        help="rollout files, directories or globs", positional=True, metavar="ROLLOUTS", min_length=1
    )
    model: str = setting(help="the model the rollouts claim: path or hub name", flags=("--model",))
    output: str = setting(
        help="output: .jsonl, .parquet, or a directory for parquet shards", flags=("-o", "--output")
    )
    model_name: str | None = setting(
        None, "the model_name rows must carry (default: --model)", flags=("--model-name",)
    )
    backend: Literal["transformers", "vllm"] = setting(
        "transformers",
        "what recomputes the rows: transformers (CPU or GPU) or vllm (its engine, with the capture of generate --proofs)",
        flags=("--backend",),
        choices=("transformers", "vllm"),
    )
    batch_size: int = setting(
        8, "rows per prefill (transformers) or per engine call (vllm)", flags=("--batch-size",), ge=1
    )
    device: str | None = setting(
        None, "transformers: torch device (default: cuda when available, else cpu)", flags=("--device",)
    )
    dtype: str | None = setting(
        None,
        "transformers: torch dtype of the weights (default: the checkpoint's on GPU, float32 on CPU)",
        flags=("--dtype",),
    )
    engine_args: dict[str, Any] = setting(
        help="vllm: vllm.LLM engine arguments (dtype, max_model_len, ...)",
        flags=("-B", "--backend-arg"),
        metavar="KEY=VALUE",
        default_factory=dict,
    )
    progress: bool = setting(True, "show a progress bar", switch=("--no-progress", False, "no progress bar"))
    proofs: ProofPolicy = Field(default_factory=ProofPolicy)
    thresholds: ProofThresholds = Field(default_factory=ProofThresholds)
    expect: ExpectedSampling = Field(default_factory=ExpectedSampling)

    def __post_init__(self) -> None:
        if self.backend == "vllm" and (self.device is not None or self.dtype is not None):
            raise ValueError(
                "--device and --dtype apply to the transformers backend; give vLLM's dtype as -B dtype=..."
            )
        if self.backend == "transformers" and self.engine_args:
            raise ValueError("-B engine arguments apply to the vllm backend")
