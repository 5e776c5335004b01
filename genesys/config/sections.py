"""The sections of the settings: one name, one default, one validation and one help text for every setting.

Each concern is a section, and a command that reads a concern reads its section, under the same table
name: `[data]` (`DataConfig`: where tasks come from), `[sampling]` (`SamplingConfig`), `[style]`
(`PromptStyle`), `[backend_options]` (`BackendOptions`), `[verify]` (`VerifySettings`), `[sandbox]`
(`SandboxConfig`, its limits made from `Limits`), `[reward]` (`RewardConfig`), `[proofs]` (`ProofConfig`)
and `[cluster]` (`ClusterConfig`); then the sections one command owns (`FilterConfig`, `ProofThresholds`,
`ExpectedSampling`, train's `RolloutConfig`, `OptimConfig`, `LossConfig`, `CheckpointConfig`,
`ParallelConfig`, `LoraConfig`, `AsyncConfig`, and sft's `SftSettings`). They are pydantic dataclasses, so they are built like plain dataclasses (keywords or
positions) and check their types and ranges when built. A field's command-line spelling is declared
here with `setting(..., flags=...)`; the commands that compose the sections are in
`genesys.config.commands`.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticUndefined

from genesys.config.loading import RenamedKeys
from genesys.errors import InputError

SECTION = ConfigDict(
    extra="forbid", defer_build=True
)  # built on first use: a command validates only its own models
LENGTH_PENALTIES = ("none", "exact", "max", "clip", "overlong")
DEFAULT_LENGTH_COEF = 0.0003
DEFAULT_TARGET_LENGTH_PROMPT = "Think for {target_length} tokens before giving a response."
SANDBOXES = ("auto", "docker", "bwrap", "subprocess")
METRICS = ("score", "correct")
# What `genesys filter` writes: one row per kept task, or every rollout of the kept tasks.
FILTER_EMITS = ("tasks", "rollouts")
TRACKERS = ("tensorboard", "wandb", "trackio")
SIGNALS = ("reward", "score", "correct")
PARALLEL_STRATEGIES = ("fsdp2", "ddp")
LORA_SAVES = ("merged", "adapter")
PRECISIONS = ("fp32", "bf16")
# Reward terms (computed in genesys.rewards): name -> (needs the completion length, needs a target length).
REWARD_TERMS = {
    "score": (False, False),
    "exact": (True, True),
    "max": (True, True),
    "clip": (True, True),
    "overlong": (True, False),
}


def setting(
    default: Any = PydanticUndefined,
    help: str = "",
    *,
    flags: Sequence[str] = (),
    switch: tuple[str, Any, str] | None = None,
    metavar: str | None = None,
    choices: Sequence[str] | None = None,
    positional: bool = False,
    default_factory: Any = None,
    **constraints: Any,
) -> Any:
    """A field with its command-line spelling.

    `flags`: aliases that take a value (`--max-tokens N`). `switch`: a flag that takes no value and
    sets a constant (`("--no-chat-template", False, "its help")`). `choices`: the values the flags offer.
    `positional`: the command's arguments.
    """
    extra = {
        "flags": list(flags),
        "switch": list(switch) if switch else None,
        "metavar": metavar,
        "choices": list(choices) if choices else None,
        "positional": positional,
    }
    if default_factory is not None:
        return Field(
            default_factory=default_factory, description=help, json_schema_extra=extra, **constraints
        )
    return Field(default, description=help, json_schema_extra=extra, **constraints)


# --- tasks ---------------------------------------------------------------------------------------

REQUIRE_PROOFS_HELP = (
    "use only rollouts `genesys validate --tasks` marked valid and attested under the trust key; "
    "the others are dropped and counted"
)


TASKS_HELP = "task sources: files/dirs (.jsonl, .parquet, saved datasets), hf:NAME[:split=S,...], or task sets (math-samples, code-samples, countdown:count=N)"
TRUSTED_TASKS_HELP = (
    "the trusted task set the rollouts were made from (task sources, as for generate): each rollout's prompt, "
    "gold, task type, metadata and sampling settings come from its task here, never from its row"
)


def _tasks(help: str) -> Any:
    return setting(None, help, flags=("--tasks",), metavar="SRC")


def _system_prompt() -> Any:
    return setting(None, "system message put before every task", flags=("--system-prompt",))


def _target_lengths() -> Any:
    return setting(
        None,
        "give each task one of these thinking lengths, asked for in the system message and stored as target_length",
        flags=("--target-lengths",),
        metavar="N1,N2,...",
    )


def _target_length_prompt() -> Any:
    return setting(
        DEFAULT_TARGET_LENGTH_PROMPT,
        "the target-length instruction, with {target_length}",
        flags=("--target-length-prompt",),
        metavar="TEMPLATE",
    )


@dataclass(frozen=True, config=SECTION)
class DataConfig:
    """Where the tasks come from and how they are put to the model ([data])."""

    tasks: list[str] | None = _tasks(TASKS_HELP)
    mix: list[float] | None = setting(
        None, "ratios of the task sources, one per data.tasks source", flags=("--mix",), metavar="R1,R2,..."
    )
    system_prompt: str | None = _system_prompt()


@dataclass(frozen=True, config=SECTION)
class GenerateData(DataConfig):
    """[data] of `genesys generate`: the tasks, how many, and the thinking lengths asked for."""

    max_tasks: int | None = setting(None, "use at most this many tasks", flags=("--max-tasks",), ge=1)
    target_lengths: list[int] | None = _target_lengths()
    target_length_prompt: str = _target_length_prompt()


@dataclass(frozen=True, config=SECTION)
class ValidateData:
    """[data] of `genesys validate`: the trusted task set, and how `genesys generate` put its prompts
    to the model (system prompt, target lengths), so each row's prompt tokens can be rendered again."""

    tasks: list[str] | None = _tasks(TRUSTED_TASKS_HELP)
    system_prompt: str | None = _system_prompt()
    target_lengths: list[int] | None = _target_lengths()
    target_length_prompt: str = _target_length_prompt()


@dataclass(frozen=True, config=SECTION)
class FilterData:
    """[data] of `genesys filter`: with --require-proofs, the trusted task set rollouts must belong to."""

    tasks: list[str] | None = _tasks(TRUSTED_TASKS_HELP + " (with --require-proofs)")


@dataclass(frozen=True, config=SECTION)
class TrainData(DataConfig):
    """[data] of `genesys train`: task sources (online), or rollout files (offline); offline with
    `require_proofs`, `tasks` is the trusted task set the rollouts must belong to."""

    rollouts: list[str] | None = setting(
        None, "rollout files from `genesys generate --verify` (offline mode)", metavar="FILE"
    )
    require_proofs: bool = setting(
        False,
        REQUIRE_PROOFS_HELP + " (offline mode)",
        switch=("--require-proofs", True, REQUIRE_PROOFS_HELP + " (offline mode)"),
    )
    keep_tasks: str | None = setting(
        None,
        "a task file (e.g. genesys filter's output): train only on the rollouts of its tasks, matched by "
        "problem_id, or prompt without one (offline mode)",
        metavar="FILE",
    )

    def __post_init__(self) -> None:
        if self.keep_tasks is not None and not self.rollouts:
            raise ValueError("data.keep_tasks picks among recorded rollouts: give data.rollouts too")
        if not self.tasks and not self.rollouts:
            raise ValueError("give data.tasks (online training) or data.rollouts (offline training)")
        if self.tasks and self.rollouts and not self.require_proofs:
            raise ValueError(
                "give one of data.tasks (online training) and data.rollouts (offline training); both only "
                "with data.require_proofs, where data.tasks is the trusted task set of the rollouts"
            )
        if self.require_proofs and not self.rollouts:
            raise ValueError(
                "data.require_proofs applies to recorded rollouts (data.rollouts checked by genesys validate)"
            )
        if self.mix is not None and (self.rollouts or not self.tasks or len(self.mix) != len(self.tasks)):
            raise ValueError("data.mix needs one ratio per data.tasks source (online training)")


@dataclass(frozen=True, config=SECTION)
class SftData(DataConfig):
    """[data] of `genesys sft`: tasks with worked solutions, and/or verified rollouts to imitate."""

    rollouts: list[str] | None = setting(
        None,
        "rollout files from `genesys generate --verify`: those scoring at least data.min_score are learnt",
        metavar="FILE",
    )
    min_score: float = setting(
        1.0, "rollouts whose score reaches this are kept (rejection sampling)", ge=0, le=1
    )

    def __post_init__(self) -> None:
        if not self.tasks and not self.rollouts:
            raise ValueError(
                "give data.tasks (tasks with a gold_standard_solution) or data.rollouts (verified rollouts), or both"
            )
        if self.mix is not None and (not self.tasks or len(self.mix) != len(self.tasks)):
            raise ValueError("data.mix needs one ratio per data.tasks source")


# --- generation ------------------------------------------------------------------------------------


@dataclass(frozen=True, config=SECTION)
class SamplingConfig:
    """How completions are sampled ([sampling])."""

    n: int = setting(
        1, "samples per task (train: the group size, at least 2)", flags=("-n", "--samples"), ge=1
    )
    max_tokens: int = setting(1024, "completion tokens at most", flags=("--max-tokens",), ge=1)
    temperature: float = setting(
        1.0,
        "sampling temperature; 0 is greedy (train: above 0, and its logprobs use the same)",
        flags=("--temperature",),
        ge=0,
    )
    top_p: float = setting(
        1.0,
        "nucleus sampling mass (train: the trainer's logprobs apply the same nucleus, renormalised as the sampler did)",
        flags=("--top-p",),
        gt=0,
        le=1,
    )
    seed: int = setting(
        0,
        "the run's seed: sampling, task order and mixing, target lengths (train: initialisation too)",
        flags=("--seed",),
    )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, config=SECTION)
class PromptStyle:
    """How task prompts become model input ([style]).

    `chat_template`: render the messages with the model's chat template (else the raw text is
    used). `continuation_prefix` is appended after the generation prompt (e.g. `"<think>\\n"`), so
    the model continues from it; it is part of `prompt_ids`, not of `llm_response`.
    """

    chat_template: bool = setting(
        True,
        "render prompts with the model's chat template",
        switch=("--no-chat-template", False, "send the raw task prompt instead of the chat template"),
    )
    continuation_prefix: str = setting(
        "",
        r"text the response starts with, after the chat template (e.g. '<think>\n'; \n and \t are escapes)",
        flags=("--continuation-prefix",),
        metavar="TEXT",
    )

    def __post_init__(self) -> None:
        unescaped = self.continuation_prefix.replace("\\n", "\n").replace("\\t", "\t")
        object.__setattr__(self, "continuation_prefix", unescaped)


@dataclass(frozen=True, config=SECTION)
class BackendOptions:
    """A generation backend's own settings ([backend_options]); each applies to the backends named in its help."""

    batch_size: int | None = setting(
        None,
        "transformers: sequences per batch (default 32); pipeline: sequences per micro-batch (default 8); "
        "vllm: tasks per engine call (default 1024); "
        "genesys validate: rows per prefill or engine call (default 8)",
        flags=("--batch-size",),
        ge=1,
    )
    tensor_parallel_size: int | None = setting(
        None, "vllm: GPUs per model replica", flags=("--tensor-parallel-size",), ge=1
    )
    device: str | None = setting(
        None,
        "transformers, pipeline: torch device (default: cuda when available, else cpu)",
        flags=("--device",),
    )
    dtype: str | None = setting(
        None,
        "transformers, pipeline: torch dtype of the weights (default: the checkpoint's on GPU, float32 on CPU)",
        flags=("--dtype",),
    )
    base_url: str | None = setting(
        None,
        "openai: server URL ending in /v1 (default: $OPENAI_BASE_URL or http://127.0.0.1:8000/v1)",
        flags=("--base-url",),
    )
    api_key: str | None = setting(None, "openai: API key (default: $OPENAI_API_KEY)", flags=("--api-key",))
    concurrency: int | None = setting(
        None, "openai: requests in flight at most (default 64)", flags=("--concurrency",), ge=1
    )
    max_retries: int | None = setting(
        None,
        "openai: retries of a request on 429, 5xx or connection errors, with exponential backoff (default 8)",
        flags=("--max-retries",),
        ge=0,
    )
    logprobs: bool | None = setting(
        None,
        "openai: ask for logprobs (false for servers and models that refuse them)",
        switch=(
            "--no-logprobs",
            False,
            "openai: do not ask for logprobs (for servers and models that refuse them)",
        ),
    )
    split_samples: bool | None = setting(
        None,
        "openai: one request per sample, for servers that do not support n > 1",
        switch=(
            "--split-samples",
            True,
            "openai: one request per sample, for servers that do not support n > 1",
        ),
    )
    stages: int | None = setting(
        None,
        "pipeline: processes the model's layers are split across, this one the first (default 2)",
        ge=1,
    )
    latency_ms: float | None = setting(
        None, "pipeline: one-way latency injected on every hop between stages, in ms (default 0)", ge=0
    )
    micro_batches: int | None = setting(
        None,
        "pipeline: micro-batches in the ring at once; 1 is the synchronous schedule, more the interleaved one (default 1)",
        ge=1,
    )
    peers: list[str] | None = setting(
        None,
        "pipeline: HOST:PORT of stages 1..N-1 in ring order, each started with `genesys pipeline-stage --listen "
        "HOST:PORT` and the same GENESYS_PIPELINE_SECRET as this process (default: start them as local processes)",
        metavar="HOST:PORT,...",
    )
    listen: str | None = setting(
        None,
        "pipeline: HOST:PORT at which this first stage accepts the last stage's connection; the last stage is "
        "told HOST unless it is 0.0.0.0 (default: 0.0.0.0 and a free port, told as the address stage 1 is "
        "reached from; 127.0.0.1 without peers)",
        metavar="HOST:PORT",
    )
    stage_timeout_s: float | None = setting(
        None,
        "pipeline: seconds a stage may send nothing (no step, no heartbeat) or take one step before the run "
        "fails naming it as stopped or hung; also the longest one message may take to send (default 120)",
        gt=0,
    )
    args: dict[str, Any] = setting(
        help="passed to the backend: vllm.LLM engine arguments, transformers from_pretrained arguments, openai request fields, or a plugin backend's settings",
        flags=("-B", "--backend-arg"),
        metavar="KEY=VALUE",
        default_factory=dict,
    )

    def for_backend(self, backend: str) -> dict[str, Any]:
        """The settings given, as the keyword arguments of `backend`; one that another backend owns is an InputError."""
        options = {
            name: value for name, value in asdict(self).items() if name != "args" and value is not None
        }
        for name in options:
            owners = BACKEND_OPTION_OWNERS[name]
            if backend not in owners:
                raise InputError(
                    f"{_flag(name)} applies to the {' and '.join(owners)} backend, not to {backend} (backend_options.{name})"
                )
        if self.args and backend in BACKEND_ARGS_KEYWORD:
            options[BACKEND_ARGS_KEYWORD[backend]] = dict(self.args)
        elif self.args:  # a plugin's backend takes its settings as keyword arguments
            options.update(self.args)
        return options


def _flag(name: str) -> str:
    """The command-line flag of a BackendOptions field."""
    extra = BackendOptions.__pydantic_fields__[name].json_schema_extra  # type: ignore[attr-defined]
    return (extra.get("flags") or [extra["switch"][0]])[0]


# Which built-in backends take each BackendOptions field, and the keyword their `args` go to.
BACKEND_OPTION_OWNERS = {
    "batch_size": ("vllm", "transformers", "pipeline"),
    "tensor_parallel_size": ("vllm",),
    "device": ("transformers", "pipeline"),
    "dtype": ("transformers", "pipeline"),
    "stages": ("pipeline",),
    "latency_ms": ("pipeline",),
    "micro_batches": ("pipeline",),
    "peers": ("pipeline",),
    "listen": ("pipeline",),
    "stage_timeout_s": ("pipeline",),
    "base_url": ("openai",),
    "api_key": ("openai",),
    "concurrency": ("openai",),
    "max_retries": ("openai",),
    "logprobs": ("openai",),
    "split_samples": ("openai",),
}
BACKEND_ARGS_KEYWORD = {"vllm": "engine_args", "transformers": "model_kwargs", "openai": "request_fields"}


# --- TOPLOC proofs ---------------------------------------------------------------------------------

PROOF_BACKENDS = ("transformers", "vllm")  # those that also recompute rows for `genesys validate`
PROOF_WRITING_BACKENDS = (*PROOF_BACKENDS, "pipeline")
PROOFS_HELP = "write TOPLOC proofs into every row (transformers, vllm and pipeline backends)"
DEFAULT_PROOF_TOPK = 128  # the TOPLOC paper's; a model with a smaller hidden size gets its hidden size
DEFAULT_PROOF_CHUNK = 32
DEFAULT_SAMPLING_MARGIN = 0.05  # see ProofThresholds
SAMPLING_PROOFS_HELP = (
    "with proofs, draw tokens with the seeded sampler a validator can check (genesys.proofs.sampling)"
)


@dataclass(frozen=True, config=SECTION)
class ProofConfig:
    """The shape of TOPLOC proofs ([proofs]): one proof per `decode_batching_size` completion tokens,
    committing to the `topk` largest last-layer hidden-state values of those tokens (`genesys.proofs`).
    An unset `topk` is resolved against the model (`genesys.proofs.toploc.proof_settings_for`)."""

    topk: int | None = setting(
        None,
        f"hidden-state values each proof commits to, at most the model's hidden size (default: {DEFAULT_PROOF_TOPK}, or the hidden size when smaller)",
        flags=("--proof-topk",),
        ge=1,
    )
    decode_batching_size: int = setting(
        DEFAULT_PROOF_CHUNK, "completion tokens per proof", flags=("--proof-chunk",), ge=1
    )
    sampling: bool = setting(
        True,
        SAMPLING_PROOFS_HELP,
        switch=("--no-sampling-proofs", False, "write TOPLOC proofs only: tokens drawn by the usual sampler"),
    )


@dataclass(frozen=True, config=SECTION)
class GenerateProofSettings(ProofConfig):
    """[proofs] of `genesys generate`: the proofs' shape, and whether to write proofs at all."""

    enabled: bool = setting(False, PROOFS_HELP, switch=("--proofs", True, PROOFS_HELP))

    def for_backend(self, backend: str) -> ProofConfig | None:
        """The proof settings `backend` is given, or None when proofs are off; transformers, vLLM and the pipeline capture them."""
        if not self.enabled:
            return None
        if backend not in PROOF_WRITING_BACKENDS:
            raise InputError(
                f"--proofs needs a backend that captures hidden states ({', '.join(PROOF_WRITING_BACKENDS)}), not {backend}"
            )
        return ProofConfig(self.topk, self.decode_batching_size, self.sampling)


TRUST_KEY_HELP = (
    "the secret key file genesys validate signs rows with and --require-proofs checks them with "
    "(default: $GENESYS_TRUST_KEY, else ~/.config/genesys/trust.key; validate creates it when missing)"
)


@dataclass(frozen=True, config=SECTION)
class TrustSettings:
    """[proofs] of the commands that read validated rows (verify, filter, train): the trust key."""

    trust_key: str | None = setting(None, TRUST_KEY_HELP, flags=("--trust-key",), metavar="FILE")


@dataclass(frozen=True, config=SECTION)
class ProofPolicy(TrustSettings):
    """Which proof settings `genesys validate` accepts, and the key it signs rows with ([proofs]).

    Each row is checked with the topk and chunk size its `toploc_config` recorded, when allowed: a topk of at least `min_topk`
    (or the model's hidden size, when smaller) and at most the hidden size, chunks of at most
    `max_decode_batching_size` tokens. `topk` or `decode_batching_size`, when set, must be matched exactly."""

    topk: int | None = setting(
        None,
        "the topk rows must have recorded (default: any from --min-proof-topk up to the model's hidden size)",
        flags=("--proof-topk",),
        ge=1,
    )
    decode_batching_size: int | None = setting(
        None,
        "the tokens per proof rows must have recorded (default: any up to --max-proof-chunk)",
        flags=("--proof-chunk",),
        ge=1,
    )
    min_topk: int = setting(
        DEFAULT_PROOF_TOPK,
        "the smallest topk accepted (a model with a smaller hidden size: its hidden size)",
        flags=("--min-proof-topk",),
        ge=1,
    )
    max_decode_batching_size: int = setting(
        DEFAULT_PROOF_CHUNK,
        "the most completion tokens one proof may cover",
        flags=("--max-proof-chunk",),
        ge=1,
    )
    require_sampling: bool = setting(
        True,
        "rows must carry a sampling proof (rows without one are invalid)",
        switch=(
            "--allow-unsampled",
            False,
            "accept rows without a sampling proof: their tokens may be any the worker chose",
        ),
    )


@dataclass(frozen=True, config=SECTION)
class ProofThresholds:
    """When `genesys validate` accepts a row ([thresholds]).

    A TOPLOC chunk passes when, over its top-k values, the exponent mismatches, and the mean and the
    median of the mantissa differences where exponents match, are all at most these. The defaults are
    the TOPLOC paper's for bf16 with topk 128 (they tolerate GPU nondeterminism); calibrate them per
    model, dtype and hardware (`benchmarks/validate_cost.py` prints honest and tampered errors).
    `logprob_tolerance` bounds |claimed - recomputed| of every completion token's logprob, and
    `sampling_margin` how far below the seeded sampler's pick a token's perturbed score may lie (the
    numerical difference between the generating and the validating machine's logits, divided by the
    temperature; `genesys.proofs.sampling`).
    """

    max_exp_mismatches: int = setting(
        38, "exponent mismatches per chunk at most", flags=("--max-exp-mismatches",), ge=0
    )
    max_mant_err_mean: float = setting(
        10.0, "mean mantissa difference per chunk at most", flags=("--max-mant-err-mean",), ge=0
    )
    max_mant_err_median: float = setting(
        8.0, "median mantissa difference per chunk at most", flags=("--max-mant-err-median",), ge=0
    )
    logprob_tolerance: float = setting(
        0.05,
        "largest |claimed - recomputed| logprob of a completion token",
        flags=("--logprob-tolerance",),
        ge=0,
    )
    sampling_margin: float = setting(
        DEFAULT_SAMPLING_MARGIN,
        "largest amount a completion token's perturbed score may lie below the seeded sampler's pick",
        flags=("--max-sampling-margin",),
        ge=0,
    )


@dataclass(frozen=True, config=SECTION)
class ExpectedSampling:
    """The sampling settings rows must have been generated with ([expect]); unset: not checked."""

    temperature: float | None = setting(
        None, "the temperature rows must name", flags=("--temperature",), ge=0
    )
    top_p: float | None = setting(None, "the top-p rows must name", flags=("--top-p",), gt=0, le=1)
    max_tokens: int | None = setting(None, "the token limit rows must name", flags=("--max-tokens",), ge=1)
    seed: int | None = setting(
        None,
        "the run seed (generate --seed): each row's sampling seed is derived from it (unset: the row's own)",
        flags=("--seed",),
    )
    n: int | None = setting(
        None,
        "samples per task: sampling proofs of a higher sample index are invalid",
        flags=("-n", "--samples"),
        ge=1,
    )


# --- scale-out ------------------------------------------------------------------------------------


@dataclass(frozen=True, config=SECTION)
class ClusterConfig:
    """Where the work runs ([cluster]): processes on this machine, or Ray actors on a Ray cluster."""

    backend: Literal["local", "ray"] = setting(
        "local",
        "local: processes on this machine; ray: Ray actors (pip install 'genesys-rl[ray]')",
        choices=("local", "ray"),
    )
    address: str | None = setting(
        None,
        "Ray cluster to join (e.g. ray://head:10001 or auto); unset: start a Ray instance on this machine",
    )
    rollout_workers: int = setting(
        2, "generation actors (train and generate), each with its own copy of the model", ge=1
    )
    verifier_workers: int = setting(1, "verification actors, each running the verification engine", ge=1)
    rollout_cpus: float = setting(1.0, "CPUs one generation actor declares", ge=0)
    rollout_gpus: float = setting(
        0.0, "GPUs one generation actor declares (Ray assigns them through CUDA_VISIBLE_DEVICES)", ge=0
    )
    verifier_cpus: float = setting(1.0, "CPUs one verification actor declares", ge=0)

    @property
    def ray(self) -> bool:
        return self.backend == "ray"


# --- verification ---------------------------------------------------------------------------------


@dataclass(frozen=True, config=SECTION)
class Limits(RenamedKeys):
    """What one test (or one compilation) may use inside the sandbox.

    The one definition of the limits: their names, defaults, ranges and help make the `[sandbox]`
    keys, their flags (`--time-limit`, ...), the code verifier's options (`-O time_limit=...`) and the
    documentation. The in-sandbox runner reads them under the same names (`to_runner`). `time_limit`
    is CPU time of all the test's processes together; the wall-clock limit is `wall_limit`, unset
    `2 * time_limit + 1`. `output_limit` caps stdout (a test that prints more fails with
    `output_limit`); `disk_limit` caps any file the program writes.
    """

    renamed: ClassVar[dict[str, str]] = {
        "time_s": "time_limit",
        "memory_mb": "memory_limit",
        "processes": "process_limit",
        "output_bytes": "output_limit",
        "disk_mb": "disk_limit",
        "wall_s": "wall_limit",
    }

    time_limit: float = setting(2.0, "CPU seconds per test", flags=("--time-limit",), gt=0)
    memory_limit: int = setting(
        512, "MB of memory per test, all its processes together", flags=("--memory-limit",), gt=0
    )
    process_limit: int = setting(64, "processes and threads per test", flags=("--process-limit",), gt=0)
    output_limit: int = setting(8 << 20, "bytes of stdout per test", flags=("--output-limit",), gt=0)
    disk_limit: int = setting(64, "MB per file a test writes", flags=("--disk-limit",), gt=0)
    wall_limit: float | None = setting(
        None, "wall-clock seconds per test (unset: 2 x time_limit + 1)", flags=("--wall-limit",), gt=0
    )

    @property
    def wall_seconds(self) -> float:
        """The wall-clock limit in force: `wall_limit`, or `2 * time_limit + 1` when unset."""
        return self.wall_limit if self.wall_limit is not None else 2 * self.time_limit + 1.0

    def to_runner(self) -> dict[str, Any]:
        """The limits as the in-sandbox runner reads them (the wall-clock limit resolved)."""
        data = {name: getattr(self, name) for name in LIMIT_NAMES}
        data["wall_limit"] = self.wall_seconds
        return data

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Limits:
        """The limits among verifier options (`time_limit`, ...); the others are left out."""
        return cls(**{name: options[name] for name in LIMIT_NAMES if options.get(name) is not None})


LIMIT_NAMES = tuple(Limits.__pydantic_fields__)  # type: ignore[attr-defined]


def _limit(name: str) -> Any:
    """The `[sandbox]` key of the limit `name`: Limits' range, flags and help, and its default in the help.

    Unset (None) means "the verifier's default", which for the code verifier is the Limits default;
    so a limit given as `-O` and not in `[sandbox]` is not overridden.
    """
    info = Limits.__pydantic_fields__[name]  # type: ignore[attr-defined]
    extra = info.json_schema_extra
    bounds = {
        bound: getattr(item, bound)
        for item in info.metadata
        for bound in ("gt", "ge", "lt", "le")
        if getattr(item, bound, None) is not None
    }
    default = info.default
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    help_text = info.description + ("" if default is None else f" (default {shown})")
    return setting(None, help_text, flags=extra["flags"], **bounds)


@dataclass(frozen=True, config=SECTION)
class SandboxConfig:
    """Where and under which per-test limits code verifiers run programs ([sandbox]); unset: the verifier's default.

    The limits are those of `Limits` (same names, ranges and help); each given one becomes the verifier
    option of the same name, `backend` the option `sandbox` and `image` the option `sandbox_image`.
    """

    backend: Literal["auto", "docker", "bwrap", "subprocess"] | None = setting(
        None,
        "backend (default auto: docker if a daemon answers and the image exists, else bwrap)",
        flags=("--sandbox",),
        choices=SANDBOXES,
    )
    image: str | None = setting(
        None,
        "docker image (default genesys-sandbox:latest, made by `genesys sandbox build`)",
        flags=("--sandbox-image",),
    )
    time_limit: float | None = _limit("time_limit")
    memory_limit: int | None = _limit("memory_limit")
    process_limit: int | None = _limit("process_limit")
    output_limit: int | None = _limit("output_limit")
    disk_limit: int | None = _limit("disk_limit")
    wall_limit: float | None = _limit("wall_limit")
    runner_reuse: int | None = setting(
        None, "submissions one in-sandbox runner serves before a fresh one starts (default 1000)", ge=1
    )

    def as_options(self) -> dict[str, Any]:
        """The settings given, as verifier options (`sandbox`, `sandbox_image`, `time_limit`, ...)."""
        renamed = {"backend": "sandbox", "image": "sandbox_image"}
        return {renamed.get(name, name): value for name, value in asdict(self).items() if value is not None}


@dataclass(frozen=True, config=SECTION)
class RewardConfig:
    """How `reward` is derived from `score` ([reward]): a weighted sum of terms, see `genesys.rewards`."""

    length_penalty: str = setting(
        "none",
        "length term joining the score at weight 1 (none: reward = score)",
        flags=("--length-penalty",),
        choices=LENGTH_PENALTIES,
    )
    coef: float = setting(DEFAULT_LENGTH_COEF, "coefficient of exact/max", flags=("--length-coef",))
    target_length: int | None = setting(
        None,
        "target tokens for rows without a target_length column (exact, max, clip)",
        flags=("--target-length",),
    )
    max_length: int | None = setting(
        None, "overlong: the maximum completion length in tokens", flags=("--max-length",), ge=1
    )
    overlong_buffer: int | None = setting(
        None,
        "overlong: tokens before max_length where the penalty ramps up",
        flags=("--overlong-buffer",),
        ge=1,
    )
    overlong_penalty: float = setting(
        1.0, "overlong: the penalty at max_length and beyond", flags=("--overlong-penalty",), ge=0
    )
    tokenizer: str | None = setting(
        None,
        "tokenizer (name or path) counting tokens of rows without completion_ids",
        flags=("--tokenizer",),
    )
    weights: dict[str, float] = setting(
        help=f"reward term weights over the defaults (terms: {', '.join(REWARD_TERMS)}; 0 drops one)",
        flags=("--reward-weight",),
        metavar="TERM=WEIGHT",
        default_factory=dict,
    )

    def __post_init__(self) -> None:
        if self.length_penalty not in LENGTH_PENALTIES:
            raise ValueError(
                f"length_penalty must be one of {', '.join(LENGTH_PENALTIES)}, got {self.length_penalty!r}"
            )
        if self.coef < 0:
            raise ValueError(f"length coefficient must be >= 0, got {self.coef}")
        if self.target_length is not None and self.target_length < 0:
            raise ValueError(f"target length must be an integer >= 0, got {self.target_length!r}")
        for name, weight in self.weights.items():
            if name not in REWARD_TERMS:
                raise ValueError(
                    f"unknown reward term {name!r} in weights; the terms are {', '.join(REWARD_TERMS)}"
                )
            if not math.isfinite(weight):
                raise ValueError(
                    f"the weight of reward term {name!r} must be a finite number, got {weight!r}"
                )
        if not self.terms:
            raise ValueError("the weights leave no reward term: the reward would always be 0")
        if "overlong" in self.terms:
            if self.max_length is None or self.overlong_buffer is None:
                raise ValueError(
                    "the 'overlong' length term needs --max-length and --overlong-buffer (reward.max_length, reward.overlong_buffer)"
                )
            if not self.overlong_buffer <= self.max_length:
                raise ValueError(
                    f"overlong buffer must be in (0, max_length={self.max_length}], got {self.overlong_buffer}"
                )

    @functools.cached_property
    def terms(self) -> dict[str, float]:
        """The terms the reward sums, with their weights (terms weighted 0 left out)."""
        defaults = {"score": 1.0} | ({} if self.length_penalty == "none" else {self.length_penalty: 1.0})
        return {name: float(weight) for name, weight in (defaults | dict(self.weights)).items() if weight}

    @property
    def needs_length(self) -> bool:
        return any(REWARD_TERMS[name][0] for name in self.terms)

    @property
    def needs_target(self) -> bool:
        return any(REWARD_TERMS[name][1] for name in self.terms)

    def describe(self) -> str:
        """How this reward was asked for: the length penalty flag, or the weighted terms."""
        if not self.weights:
            return f"--length-penalty {self.length_penalty}"
        return "reward terms " + ", ".join(f"{name} x {weight:g}" for name, weight in self.terms.items())


@dataclass(frozen=True, config=SECTION)
class VerifySettings:
    """How verification runs ([verify])."""

    workers: int = setting(
        help="worker processes (default: all cores)",
        flags=("--workers",),
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
    )
    timeout: float | None = setting(
        None, "per-rollout deadline in seconds, overriding each verifier's own", flags=("--timeout",), gt=0
    )
    skip_unknown: bool = setting(
        False,
        "record rows of task types no verifier serves as errors instead of refusing the run",
        switch=(
            "--skip-unknown",
            True,
            "record rows of unknown task_type as errors instead of refusing the run",
        ),
    )
    options: dict[str, Any] = setting(
        help="an option passed to every verifier",
        flags=("-O", "--option"),
        metavar="KEY=VALUE",
        default_factory=dict,
    )
    max_rows_per_worker: int | None = setting(
        100_000,
        "replace each worker after this many rows, bounding leaks in verifiers",
        flags=("--max-rows-per-worker",),
        ge=1,
    )
    max_pending_rows: int = setting(
        20_000, "rows in flight at most before submitting waits for results", ge=1
    )


@dataclass(frozen=True, config=SECTION)
class VerifyConfig(VerifySettings):
    """Everything a verification run needs: the [verify] settings, the sandbox, the reward, progress."""

    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    progress: bool = True
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    completion_field: str = "llm_response"  # the column rollouts hold their completion in

    def verifier_options(self) -> dict[str, Any]:
        """The options every verifier receives: `options`, then the sandbox settings given."""
        return {**self.options, **self.sandbox.as_options()}


@dataclass(frozen=True, config=SECTION)
class GenerateVerifySettings(VerifySettings):
    """[verify] of `genesys generate`: the same settings, and whether to verify at all."""

    enabled: bool = setting(
        False,
        "verify rollouts while generating; rows gain score and reward",
        switch=("--verify", True, "verify rollouts while generating; rows gain score and reward"),
    )


@dataclass(frozen=True, config=SECTION)
class FilterConfig:
    """Which tasks `genesys filter` keeps: pass rate within [min_pass_rate, max_pass_rate] ([filter]).

    `metric` is "score" (the mean score) or "correct" (the fraction with score == 1).
    With `pass_rate_column`, the input is a task set already holding a solve rate in that column.
    `require_proofs` counts only rollouts `genesys validate` marked valid (`toploc_valid` true).
    `emit` = "rollouts" writes the (distinct, proven) rollouts of the kept tasks instead of task rows.
    """

    min_pass_rate: float = setting(0.0, "lowest pass rate kept", flags=("--min-pass-rate",))
    max_pass_rate: float = setting(1.0, "highest pass rate kept", flags=("--max-pass-rate",))
    metric: str = setting(
        "score",
        "pass rate as mean score, or as the fraction with score == 1",
        flags=("--metric",),
        choices=METRICS,
    )
    pass_rate_column: str | None = setting(
        None,
        "the input is a task set with a solve rate in COLUMN: filter on it",
        flags=("--pass-rate-column",),
        metavar="COLUMN",
    )
    require_proofs: bool = setting(
        False, REQUIRE_PROOFS_HELP, switch=("--require-proofs", True, REQUIRE_PROOFS_HELP)
    )
    emit: str = setting(
        "tasks",
        "what to write: one row per kept task, or the rollouts of the kept tasks (to train on offline)",
        flags=("--emit",),
        choices=FILTER_EMITS,
    )

    def __post_init__(self) -> None:
        if self.emit not in FILTER_EMITS:
            raise ValueError(f"emit must be one of {', '.join(FILTER_EMITS)}, got {self.emit!r}")
        if self.emit == "rollouts" and self.pass_rate_column is not None:
            raise ValueError("emit = 'rollouts' needs rollouts, not a task set with a pass_rate_column")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if self.require_proofs and self.pass_rate_column is not None:
            raise ValueError("require_proofs needs rollouts, not a task set with a pass_rate_column")
        if not 0.0 <= self.min_pass_rate <= self.max_pass_rate <= 1.0:
            raise ValueError(
                f"pass-rate bounds must satisfy 0 <= min <= max <= 1, got min={self.min_pass_rate}, max={self.max_pass_rate}"
            )


# --- training ---------------------------------------------------------------------------------------


@dataclass(frozen=True, config=SECTION)
class RolloutConfig:
    """How a step's groups are made ([rollout]): how many, and which are kept; the sampling is [sampling]."""

    prompts_per_step: int = setting(4, "tasks (groups) per optimizer batch", ge=1)
    filter_groups: bool = setting(True, "drop groups whose rollouts all have the same signal, and refill")
    filter_signal: Literal["reward", "score", "correct"] = setting(
        "reward", "what a group must vary in to be kept", choices=SIGNALS
    )
    max_refill_rounds: int = setting(
        4, "generation rounds per step at most when refilling dropped groups", ge=1
    )
    max_no_signal_steps: int = setting(
        5,
        "steps in a row with no group to learn from (each taking no optimizer step) before the run stops with an error",
        ge=1,
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
    micro_batch_size: int = setting(
        8, "sequences per forward/backward pass, padded to the longest (when micro_batch_tokens is 0)", ge=1
    )
    micro_batch_tokens: int = setting(
        0,
        "tokens (prompts and completions) per forward/backward pass, sequences packed without padding; "
        "bounds activation memory (0: micro_batch_size padded sequences instead)",
        ge=0,
    )
    updates_per_batch: int = setting(1, "optimizer steps on each generated batch (PPO-style epochs)", ge=1)
    mini_batches: int = setting(
        1,
        "slices of each generated batch, one optimizer step each (PPO-style mini-batches; with updates_per_batch, per epoch)",
        ge=1,
    )
    weight_decay: float = setting(0.0, "AdamW weight decay", ge=0)
    beta1: float = setting(0.9, "AdamW beta1", ge=0, lt=1)
    beta2: float = setting(0.999, "AdamW beta2", ge=0, lt=1)
    adam_eps: float = setting(1e-8, "AdamW epsilon", gt=0)
    max_nonfinite_steps: int = setting(
        3,
        "steps in a row whose loss or gradient is not finite (each skipped, without an update) before the run stops with an error",
        ge=1,
    )


LOSS_TYPES = ("grpo", "dr_grpo", "gspo", "cispo")
IMPORTANCE_CORRECTIONS = ("none", "tis", "mis")


@dataclass(frozen=True, config=SECTION)
class LossConfig:
    """The policy-gradient loss ([loss]); see `genesys.train.loss` and `genesys.train.correction`."""

    type: Literal["grpo", "dr_grpo", "gspo", "cispo"] = setting(
        "grpo",
        "grpo: two-sided clipped token ratio; dr_grpo: the same with a constant normaliser and no std scaling; "
        "gspo: clipped sequence ratio; cispo: clipped, stop-gradient importance weight times the logprob",
        choices=LOSS_TYPES,
    )
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
    mask_truncated: bool = setting(
        False, "leave completions cut at sampling.max_tokens out of the loss (DAPO's overlong filtering)"
    )
    recompute_logprobs: bool = setting(
        False,
        "recompute the old policy's logprobs with the trainer (one forward pass per batch) instead of "
        "taking the sampler's; implied by importance_correction",
    )
    importance_correction: Literal["none", "tis", "mis"] = setting(
        "none",
        "weight each token's loss by trainer-old / sampler probability, correcting sampler mismatch and staleness: "
        "tis truncates the weight at importance_cap, mis drops tokens (or sequences) above it",
        choices=IMPORTANCE_CORRECTIONS,
    )
    importance_level: Literal["token", "sequence"] = setting(
        "token",
        "importance weights per token, or one per sequence (the product of its tokens')",
        choices=("token", "sequence"),
    )
    importance_cap: float = setting(
        2.0, "the largest importance weight kept (tis) or not dropped (mis)", gt=0
    )

    def __post_init__(self) -> None:
        if self.type in ("grpo", "dr_grpo") and self.delta <= 1 + self.eps_high:
            raise ValueError(
                f"loss.delta must exceed 1 + eps_high = {1 + self.eps_high:g}, got {self.delta:g}"
            )
        if self.type == "dr_grpo" and (self.scale_by_std or self.normalize != "token"):
            raise ValueError(
                "loss.type = 'dr_grpo' divides by a constant and never by the group's std: "
                "leave loss.scale_by_std false and loss.normalize 'token'"
            )

    @property
    def recomputes(self) -> bool:
        """Whether the trainer recomputes the old policy's logprobs (asked, or needed by a correction)."""
        return self.recompute_logprobs or self.importance_correction != "none"


@dataclass(frozen=True, config=SECTION)
class CheckpointConfig:
    """Checkpoints ([checkpoint])."""

    every: int = setting(10, "save every this many steps (0: only the final model)", ge=0)
    keep: int = setting(2, "checkpoints kept (the newest)", ge=1)


@dataclass(frozen=True, config=SECTION)
class SftSettings:
    """Supervised fine-tuning ([sft]): examples per optimizer step and their order."""

    examples_per_step: int = setting(32, "examples (prompt and completion) per optimizer batch", ge=1)
    seed: int = setting(0, "the run's seed: initialisation and the order of the examples", flags=("--seed",))


@dataclass(frozen=True, config=SECTION)
class ParallelConfig:
    """How the trained model is spread over the processes ([parallel]); see `genesys.train.parallel`.

    Both strategies run torch's FSDP2 (`fully_shard`): `fsdp2` shards parameters, gradients and
    optimizer state over the processes; `ddp` keeps a full replica on each and all-reduces gradients
    (FSDP2 on a mesh whose shard dimension is 1). With one process they are the same (in fp32 the
    model is trained unwrapped, bit for bit what FSDP2 would compute).
    """

    strategy: Literal["fsdp2", "ddp"] = setting(
        "fsdp2",
        "fsdp2: parameters, gradients and optimizer state sharded over the processes; ddp: a full replica on each",
        choices=PARALLEL_STRATEGIES,
    )


@dataclass(frozen=True, config=SECTION)
class LoraConfig:
    """Low-rank adapters ([lora]), built with peft; `rank = 0` trains every weight (full fine-tuning).

    `target_modules` names the adapted layers (module names such as `q_proj`, or `all-linear`: every
    linear layer but the output layer). Generation backends receive the merged weights; `save` says
    whether `final/` holds the merged model or the adapter alone.
    """

    rank: int = setting(0, "adapter rank (0: full fine-tuning, no adapter)", ge=0)
    alpha: float = setting(16.0, "adapter scaling numerator: updates are scaled by alpha / rank", gt=0)
    dropout: float = setting(0.0, "dropout on the adapter's input", ge=0, lt=1)
    target_modules: list[str] = setting(
        help="the layers adapted: module names (q_proj, v_proj, ...) or all-linear",
        metavar="NAME",
        default_factory=lambda: ["all-linear"],
    )
    save: Literal["merged", "adapter"] = setting(
        "merged", "final/: the model with the adapter merged in, or the adapter alone", choices=LORA_SAVES
    )

    def __post_init__(self) -> None:
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module (or all-linear)")
        if "all-linear" in self.target_modules and len(self.target_modules) > 1:
            raise ValueError(
                "lora.target_modules: all-linear stands alone; it already names every linear layer"
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True, config=SECTION)
class AsyncConfig:
    """Asynchronous training ([async]): generation runs ahead of the trainer by a bounded number of steps."""

    max_staleness: int = setting(
        0, "train on rollouts of a policy at most this many steps old (0: synchronous)", ge=0
    )


@dataclass(frozen=True, config=SECTION)
class EvalConfig:
    """Evaluation during training ([eval]): held-out task sources, scored with the training verifiers."""

    tasks: list[str] = setting(
        help="held-out task sources (as data.tasks), each reported apart; none: no evaluation",
        metavar="SRC",
        default_factory=list,
    )
    every: int = setting(10, "evaluate every this many steps (and after the last)", ge=1)
    samples: int = setting(
        4, "sampled completions per task (k of pass@k and avg@k), beside one greedy completion", ge=1
    )
    max_tasks: int | None = setting(None, "use at most this many tasks of each source", ge=1)
