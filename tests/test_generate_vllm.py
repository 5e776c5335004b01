"""The vLLM backend's mapping of recorded engine outputs, how it drives the engine, and backend selection
(tests/test_vllm_engine.py runs it against a real engine)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from genesys.errors import InputError
from genesys.generate import builtin
from genesys.generate.backend import GenerationRequest, iterate, resolve_backend_name
from genesys.generate.vllm import reload_in_place, result_from_request_output, sampled_logprobs


# Shaped like vllm.logprobs.FlatLogprobs, vllm.outputs.CompletionOutput and vllm.outputs.RequestOutput.
@dataclass
class FlatLogprobs:
    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)
    decoded_tokens: list[str | None] = field(default_factory=list)


@dataclass
class CompletionOutput:
    index: int
    text: str  # empty: the backend asks for no detokenization
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: FlatLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


def _flat(*positions: tuple[int, float, dict[int, float]]) -> FlatLogprobs:
    """Positions as vLLM records them: at each, the sampled token first, then the top-k alternatives."""
    flat = FlatLogprobs()
    for sampled, logprob, others in positions:
        flat.start_indices.append(len(flat.logprobs))
        for rank, (token, value) in enumerate([(sampled, logprob), *others.items()]):
            flat.token_ids.append(token)
            flat.logprobs.append(value)
            flat.ranks.append(rank or 3)
            flat.decoded_tokens.append(None)
        flat.end_indices.append(len(flat.logprobs))
    return flat


@pytest.fixture(scope="module")
def tokenizer():
    from genesys.generate.tiny_model import train_tokenizer

    return train_tokenizer(
        ["a few words of text to learn from, yes and no", "and a few more"], vocab_size=300
    )


def test_request_output_maps_to_completions_in_index_order(tokenizer):
    yes, no = tokenizer.encode(" yes"), tokenizer.encode(" no") + [tokenizer.eos_token_id]
    recorded = RequestOutput(
        request_id="7",
        prompt=None,
        prompt_token_ids=[101, 102, 103],
        prompt_logprobs=None,
        outputs=[
            CompletionOutput(
                1,
                "",
                no,
                -3.5,
                _flat(*[(t, -1.0, {5: -0.1}) for t in no[:-1]], (no[-1], -0.5, {})),
                "stop",
                None,
            ),
            CompletionOutput(
                0,
                "",
                yes,
                -1.0,
                _flat(*[(t, -0.2 * (k + 1), {1: -0.05} if k else {}) for k, t in enumerate(yes)]),
                "length",
            ),
        ],
    )
    request = GenerationRequest("task", [{"role": "user", "content": "?"}], [2, 3], seed=1)
    result = result_from_request_output(request, recorded, tokenizer)
    assert result.request is request and result.prompt_ids == [101, 102, 103]
    first, second = result.completions
    assert (first.text, first.completion_ids, first.finish_reason) == (" yes", yes, "length")
    assert first.logprobs == pytest.approx(
        [-0.2 * (k + 1) for k in range(len(yes))]
    )  # the sampled token's, not the top alternative's
    assert (second.text, second.completion_ids, second.finish_reason) == (
        " no",
        no,
        "stop",
    )  # the stop token in the ids, not in the text
    assert second.logprobs == [-1.0] * (len(no) - 1) + [-0.5]


def test_missing_logprobs_stay_missing():
    assert sampled_logprobs(None) is None


def test_auto_picks_transformers_without_vllm_and_a_gpu(monkeypatch):
    monkeypatch.setattr(builtin, "vllm_usable", lambda: False)
    assert resolve_backend_name("auto") == "transformers"
    monkeypatch.setattr(builtin, "vllm_usable", lambda: True)
    assert resolve_backend_name("auto") == "vllm"
    assert resolve_backend_name("openai") == "openai"
    with pytest.raises(InputError, match="--backend"):
        resolve_backend_name("tgi")


def test_missing_vllm_is_a_clear_input_error(monkeypatch):
    import sys

    from genesys.generate.backend import PromptStyle
    from genesys.generate.vllm import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails, as on a machine without it
    with pytest.raises(InputError, match="needs vLLM"):
        VLLMBackend("some-model", PromptStyle())


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in `vllm` module whose engine records how the backend builds and drives it."""
    import sys

    from genesys.generate.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(["a few words of text to learn from", "and a few more"], vocab_size=300)
    calls: dict = {"generate": [], "rpc": [], "reset_prefix_cache": 0}

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LLM:
        platform_is_cpu = False

        def __init__(self, **kwargs):
            calls["init"] = kwargs

        def get_tokenizer(self):
            return tokenizer

        def generate(self, prompts, params, use_tqdm=True):
            calls["generate"].append((prompts, params, use_tqdm))
            return [
                RequestOutput(
                    str(i),
                    None,
                    p["prompt_token_ids"],
                    None,
                    [
                        CompletionOutput(k, "", [5, 6], -1.0, _flat((5, -0.5, {}), (6, -0.5, {})), "stop")
                        for k in range(sp.kwargs["n"])
                    ],
                )
                for i, (p, sp) in enumerate(zip(prompts, params))
            ]

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            calls["rpc"].append((method, args))
            return [None]

        def reset_prefix_cache(self):
            calls["reset_prefix_cache"] += 1

    monkeypatch.setitem(
        sys.modules, "vllm", SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, __version__="test")
    )
    monkeypatch.setitem(
        sys.modules,
        "vllm.platforms",
        SimpleNamespace(current_platform=SimpleNamespace(is_cpu=lambda: LLM.platform_is_cpu)),
    )
    # The stand-in's engine core runs nowhere: no process-wide state to share.
    monkeypatch.setattr("genesys.generate.vllm.share", lambda llm: None)
    calls["llm"] = LLM
    return calls, tokenizer


def test_backend_drives_the_offline_engine_as_documented(fake_vllm):
    from genesys.generate.backend import PromptStyle, SamplingConfig
    from genesys.generate.vllm import VLLMBackend
    from genesys.tasks.prompts import build_messages

    calls, tokenizer = fake_vllm
    backend = VLLMBackend(
        "org/model",
        PromptStyle(continuation_prefix="<think>\n"),
        tensor_parallel_size=2,
        batch_size=2,
        seed=4,
        engine_args={"gpu_memory_utilization": 0.8},
    )
    assert calls["init"] == {
        "model": "org/model",
        "tensor_parallel_size": 2,
        "enable_prefix_caching": True,
        "seed": 4,
        "gpu_memory_utilization": 0.8,
        "logprobs_mode": "processed_logprobs",
    }
    sampling = [SamplingConfig(n=3, max_tokens=99, temperature=0.7, top_p=0.9, seed=4)] * 2 + [
        SamplingConfig(max_tokens=5, temperature=0.2)
    ]
    requests = [
        GenerationRequest(
            f"t{i}",
            build_messages(f"question {i}"),
            [0, 1, 2] if i else [1],
            seed=10 + i,
            sampling=sampling[i],
        )
        for i in range(3)
    ]
    results = list(iterate(backend.generate(requests)))
    assert [len(call[0]) for call in calls["generate"]] == [2, 1]  # batch_size tasks per engine call
    prompts, params, use_tqdm = calls["generate"][0]
    assert use_tqdm is False
    assert tokenizer.decode(prompts[0]["prompt_token_ids"]).endswith(
        "question 0<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    fast = {
        "logprobs": 0,
        "flat_logprobs": True,
        "detokenize": False,
    }  # the sampled token's logprob, no detokenizing in the engine
    unmarked = {"extra_args": None}  # no TOPLOC proofs asked for: no hidden states captured
    assert params[0].kwargs == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 99,
        "seed": 10,
        **fast,
        **unmarked,
    }
    assert params[1].kwargs["n"] == 3
    assert calls["generate"][1][1][0].kwargs == {
        "n": 3,
        "temperature": 0.2,
        "top_p": 1.0,
        "max_tokens": 5,
        "seed": 12,
        **fast,
        **unmarked,
    }
    assert [r.request.key for r in results] == ["t0", "t1", "t2"]
    assert [len(r.completions) for r in results] == [1, 3, 3]
    assert (
        results[1].completions[0].logprobs == [-0.5, -0.5]
        and results[0].prompt_ids == prompts[0]["prompt_token_ids"]
    )
    assert results[1].completions[0].text == tokenizer.decode([5, 6])


def test_on_cpu_chunked_prefill_is_off_unless_asked_for(fake_vllm):
    from genesys.generate.backend import PromptStyle
    from genesys.generate.vllm import VLLMBackend

    calls, _ = fake_vllm
    calls["llm"].platform_is_cpu = True
    VLLMBackend("org/model", PromptStyle(), engine_args={"kv_cache_memory_bytes": 1 << 20})
    assert calls["init"]["enable_chunked_prefill"] is False
    VLLMBackend(
        "org/model",
        PromptStyle(),
        engine_args={"enable_chunked_prefill": True, "kv_cache_memory_bytes": 1 << 20},
    )
    assert calls["init"]["enable_chunked_prefill"] is True


@pytest.fixture
def model_config(tmp_path):
    """A model directory holding only a config: 2 layers, 1 key/value head of 64, float32 (1 KiB of
    KV cache per token), a context of 2,048."""
    from transformers import Qwen2Config

    Qwen2Config(
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=2,
        max_position_embeddings=2048,
        dtype="float32",
    ).save_pretrained(tmp_path)
    return str(tmp_path)


def test_on_cpu_the_kv_cache_is_sized_for_the_run_not_for_the_machine(fake_vllm, model_config, monkeypatch):
    from genesys.generate.backend import PromptStyle
    from genesys.generate.vllm import KV_CACHE_ENV, VLLMBackend

    calls, _ = fake_vllm
    calls["llm"].platform_is_cpu = True
    monkeypatch.delenv(KV_CACHE_ENV, raising=False)
    VLLMBackend(model_config, PromptStyle(), engine_args={"max_model_len": 512})
    # 256 sequences (vLLM's max_num_seqs on CPU) of 512 tokens at 1 KiB each, not 92% of the machine
    assert calls["init"]["kv_cache_memory_bytes"] == 256 * 512 * 1024
    assert "gpu_memory_utilization" not in calls["init"]
    VLLMBackend(model_config, PromptStyle(), engine_args={"max_model_len": 512, "max_num_seqs": 8})
    assert calls["init"]["kv_cache_memory_bytes"] == 8 * 512 * 1024
    # a size the run names, a share of the memory it asks for, or vLLM's own variable wins
    for named in ({"kv_cache_memory_bytes": 3 << 20}, {"gpu_memory_utilization": 0.5}):
        VLLMBackend(model_config, PromptStyle(), engine_args=named)
        assert calls["init"].get("kv_cache_memory_bytes") == named.get("kv_cache_memory_bytes")
    monkeypatch.setenv(KV_CACHE_ENV, "2")
    VLLMBackend(model_config, PromptStyle())
    assert "kv_cache_memory_bytes" not in calls["init"]
    # on a GPU vLLM's own sizing stands
    monkeypatch.delenv(KV_CACHE_ENV)
    calls["llm"].platform_is_cpu = False
    VLLMBackend(model_config, PromptStyle())
    assert "kv_cache_memory_bytes" not in calls["init"]


def test_the_cpu_kv_cache_is_capped_and_holds_one_full_sequence(model_config, tmp_path):
    from genesys.generate.vllm import CPU_KV_CACHE_CAP, cpu_kv_cache_bytes

    plenty = 1 << 40
    assert cpu_kv_cache_bytes(model_config, {}, available=plenty) == 256 * 2048 * 1024
    assert cpu_kv_cache_bytes(model_config, {"max_num_seqs": 4096}, available=plenty) == CPU_KV_CACHE_CAP
    assert cpu_kv_cache_bytes(model_config, {"max_num_seqs": 4}, available=plenty) == 4 * 2048 * 1024
    assert cpu_kv_cache_bytes(model_config, {"dtype": "bfloat16", "max_num_seqs": 4}, available=plenty) == (
        4 * 2048 * 512
    )
    assert cpu_kv_cache_bytes(model_config, {}, available=200 << 20) == 100 << 20  # half of what is free
    assert cpu_kv_cache_bytes(model_config, {}, available=1 << 20) == 2048 * 1024  # one sequence at least
    assert cpu_kv_cache_bytes(str(tmp_path / "no-model"), {}, available=plenty) == CPU_KV_CACHE_CAP


def test_a_colocated_engine_takes_new_weights_and_drops_the_prefix_cache(fake_vllm, monkeypatch):
    import asyncio

    import torch

    from genesys.generate.backend import PromptStyle
    from genesys.generate.vllm import VLLMBackend
    from genesys.tasks.prompts import build_messages

    calls, _ = fake_vllm
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    backend = VLLMBackend("org/model", PromptStyle(), colocate=True)
    assert calls["init"]["distributed_executor_backend"] == "uni"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the engine core in this process too
    weights = {"model.embed_tokens.weight": torch.ones(2, 2, requires_grad=True)}
    asyncio.run(backend.update_weights(weights))
    asyncio.run(backend.update_weights(weights.items(), version=7))
    assert [method for method, _ in calls["rpc"]] == [reload_in_place] * 2 and calls[
        "reset_prefix_cache"
    ] == 2
    [(name, sent)] = calls["rpc"][0][1][0]
    assert (
        name == "model.embed_tokens.weight"
        and not sent.requires_grad
        and sent.data_ptr() == weights[name].data_ptr()
    )  # no copy
    with pytest.raises(ValueError, match="not newer"):
        asyncio.run(backend.update_weights(weights, version=7))
    [result] = iterate(backend.generate([GenerationRequest("t", build_messages("q"), [0], seed=0)]))
    assert result.weights_version == backend.weights_version == 7


def test_an_engine_in_its_own_processes_refuses_new_weights(fake_vllm):
    import asyncio

    from genesys.generate.backend import PromptStyle
    from genesys.generate.vllm import VLLMBackend

    calls, _ = fake_vllm
    backend = VLLMBackend("org/model", PromptStyle())
    assert "distributed_executor_backend" not in calls["init"]
    with pytest.raises(NotImplementedError, match="colocated"):
        asyncio.run(backend.update_weights({}))
    assert calls["rpc"] == [] and backend.weights_version == 0


def test_a_colocated_engine_is_one_replica(fake_vllm):
    from genesys.generate.backend import PromptStyle
    from genesys.generate.vllm import VLLMBackend

    with pytest.raises(InputError, match="tensor_parallel_size must be 1"):
        VLLMBackend("org/model", PromptStyle(), colocate=True, tensor_parallel_size=2)
