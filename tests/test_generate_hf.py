"""The transformers backend on a tiny random-weight model with a locally trained tokenizer."""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path

import pytest
import torch

from genesys import models
from genesys.generate.backend import (
    GenerationRequest,
    PromptStyle,
    SamplingConfig,
    iterate,
)
from genesys.generate.decoding import TokenSampler
from genesys.generate.hf import TransformersBackend, make_completion
from genesys.generate.tiny_model import build_tiny_model
from genesys.tasks.prompts import build_messages, render_text


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    torch.set_num_threads(
        1
    )  # a tiny model gains nothing from threads, and loses a lot beside busy neighbours
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def _backend(model: str) -> TransformersBackend:
    return TransformersBackend(model, PromptStyle(continuation_prefix="<think>\n"), batch_size=4)


def _request(key: str, prompt: str, n: int, seed: int = 0, **sampling) -> GenerationRequest:
    settings = {"max_tokens": 12, "temperature": 0.8, "top_p": 0.9} | sampling
    return GenerationRequest(
        key, build_messages(prompt, "Be brief."), list(range(n)), seed, SamplingConfig(**settings)
    )


def _generate(backend: TransformersBackend, requests: list[GenerationRequest]) -> list:
    return list(iterate(backend.generate(requests)))


def test_n_samples_per_task_with_the_chat_template_and_prefix(tiny_model):
    backend = _backend(tiny_model)
    results = {
        r.request.key: r
        for r in _generate(backend, [_request("a", "What is 1 + 1?", 3), _request("b", "Name a prime.", 2)])
    }
    assert sorted(results) == ["a", "b"]
    assert len(results["a"].completions) == 3 and len(results["b"].completions) == 2
    prompt_text = backend.tokenizer.decode(results["a"].prompt_ids)
    assert (
        prompt_text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    for completion in results["a"].completions:
        assert 1 <= len(completion.completion_ids) <= 12
        assert completion.finish_reason in ("stop", "length")
        assert completion.text == backend.tokenizer.decode(
            completion.completion_ids, skip_special_tokens=True
        )


def _sampled_logprobs(
    model, prompt_ids: list[int], completion_ids: list[int], temperature: float, top_p: float
) -> list[float]:
    """The logprobs of `completion_ids` under the model's logits divided by `temperature` and cut to
    the top-p nucleus (the tokens whose more likely tokens hold less than `top_p` of the mass)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0].float()
    logprobs = []
    for k, token in enumerate(completion_ids):
        probs = torch.softmax(logits[len(prompt_ids) - 1 + k] / temperature, dim=-1)
        ordered, order = probs.sort(descending=True)
        nucleus = order[(ordered.cumsum(0) - ordered) < top_p]
        assert token in nucleus.tolist()  # a token outside the nucleus cannot have been sampled
        logprobs.append(math.log(probs[token] / probs[nucleus].sum()))
    return logprobs


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.8)])
def test_logprobs_are_those_of_the_sampled_tokens_even_with_left_padding(tiny_model, temperature, top_p):
    backend = _backend(tiny_model)
    prompts = ["Hi.", "Compute the sum of the first 100 positive integers, then explain it twice over."]
    requests = [
        _request(f"k{i}", p, 2, seed=i, max_tokens=16, temperature=temperature, top_p=top_p)
        for i, p in enumerate(prompts)
    ]
    results = _generate(backend, requests)
    lengths = {len(r.prompt_ids) for r in results}
    assert len(lengths) == 2  # the short prompt was left-padded in the batch
    for result in results:
        for completion in result.completions:
            assert len(completion.logprobs) == len(completion.completion_ids)
            expected = _sampled_logprobs(
                backend.model, result.prompt_ids, completion.completion_ids, temperature, top_p
            )
            assert completion.logprobs == pytest.approx(expected, abs=1e-4)
            assert all(lp <= 0 for lp in completion.logprobs)
            untempered = _sampled_logprobs(
                backend.model, result.prompt_ids, completion.completion_ids, 1.0, 1.0
            )
            assert (completion.logprobs == pytest.approx(untempered, abs=1e-4)) == (
                temperature == 1.0 and top_p == 1.0
            )


def test_each_request_samples_with_its_own_settings_in_one_call(tiny_model):
    backend = _backend(tiny_model)
    greedy = _request("greedy", "Tell me a story.", 2, max_tokens=3, temperature=0.0)
    nucleus = _request("nucleus", "Tell me a story.", 2, max_tokens=6, temperature=1.5, top_p=0.5)
    results = {r.request.key: r for r in _generate(backend, [greedy, nucleus])}
    first, second = results["greedy"].completions
    assert first.completion_ids == second.completion_ids and len(first.completion_ids) <= 3
    assert first.logprobs == pytest.approx(
        _sampled_logprobs(backend.model, results["greedy"].prompt_ids, first.completion_ids, 1.0, 1.0),
        abs=1e-4,
    )
    for completion in results["nucleus"].completions:
        assert len(completion.completion_ids) <= 6
        expected = _sampled_logprobs(
            backend.model, results["nucleus"].prompt_ids, completion.completion_ids, 1.5, 0.5
        )
        assert completion.logprobs == pytest.approx(expected, abs=1e-4)


def test_stop_tokens_end_completions_with_finish_reason_stop(tiny_model):
    backend = _backend(tiny_model)
    backend.stop_ids = set(range(len(backend.tokenizer)))  # every token stops: one-token completions
    [result] = _generate(backend, [_request("a", "Hello", 2)])
    for completion in result.completions:
        assert len(completion.completion_ids) == 1 and len(completion.logprobs) == 1
        assert completion.finish_reason == "stop"


def test_length_limit_gives_finish_reason_length(tiny_model):
    tokenizer = _backend(tiny_model).tokenizer
    eos = tokenizer.eos_token_id
    whole = make_completion(tokenizer, {eos}, [7, 8, 9, 10, 11], [-1.0] * 5)
    assert whole.finish_reason == "length" and whole.completion_ids == [7, 8, 9, 10, 11]
    cut = make_completion(tokenizer, {eos}, [7, eos, eos, eos, eos], [-1.0, -2.0, -3.0, -3.0, -3.0])
    assert cut.finish_reason == "stop" and cut.completion_ids == [7, eos] and cut.logprobs == [-1.0, -2.0]


def test_seeded_sampling_repeats_and_greedy_is_deterministic(tiny_model):
    first = _generate(_backend(tiny_model), [_request("a", "Tell me a story.", 2, seed=5)])[0]
    again = _generate(_backend(tiny_model), [_request("a", "Tell me a story.", 2, seed=5)])[0]
    assert [c.completion_ids for c in first.completions] == [c.completion_ids for c in again.completions]
    greedy = _generate(_backend(tiny_model), [_request("a", "Tell me a story.", 2, temperature=0.0)])[0]
    assert greedy.completions[0].completion_ids == greedy.completions[1].completion_ids


def test_raw_prompts_without_chat_template(tiny_model):
    backend = TransformersBackend(tiny_model, PromptStyle(chat_template=False))
    messages = build_messages("Just this text.")
    assert render_text(backend.tokenizer, messages, backend.style) == "Just this text."
    [result] = _generate(backend, [GenerationRequest("a", messages, [0], 0, SamplingConfig(max_tokens=4))])
    assert backend.tokenizer.decode(result.prompt_ids) == "Just this text."


def _perturbed_copy(model_dir: str, target: Path) -> dict[str, torch.Tensor]:
    """A copy of the model with noise added to every weight, saved to `target`; its state dict."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(target)
    return model.state_dict()


def test_update_weights_loads_into_the_live_model_and_stamps_the_results(tiny_model, tmp_path):
    backend = _backend(tiny_model)
    request = _request("a", "Tell me a story.", 2, seed=3, max_tokens=8, temperature=1.0, top_p=1.0)
    fixed = backend.tokenizer("a fixed sequence of words")["input_ids"]
    before = _generate(backend, [request])[0]
    before_fixed = _sampled_logprobs(backend.model, fixed[:2], fixed[2:], 1.0, 1.0)
    weights = _perturbed_copy(tiny_model, tmp_path / "perturbed")
    asyncio.run(backend.update_weights(weights))
    fresh = _backend(str(tmp_path / "perturbed"))
    after, reference = _generate(backend, [request])[0], _generate(fresh, [request])[0]
    assert (before.weights_version, after.weights_version, reference.weights_version) == (0, 1, 0)
    after_fixed = _sampled_logprobs(backend.model, fixed[:2], fixed[2:], 1.0, 1.0)
    assert after_fixed != pytest.approx(before_fixed, abs=1e-3)
    assert after_fixed == pytest.approx(
        _sampled_logprobs(fresh.model, fixed[:2], fixed[2:], 1.0, 1.0), abs=1e-5
    )
    for mine, theirs in zip(after.completions, reference.completions):
        assert mine.completion_ids == theirs.completion_ids and mine.logprobs == pytest.approx(
            theirs.logprobs, abs=1e-5
        )
    assert [c.logprobs for c in after.completions] != [c.logprobs for c in before.completions]


def test_update_weights_versions_and_refusals_leave_the_model_unchanged(tiny_model):
    backend = _backend(tiny_model)
    name, parameter = next(iter(backend.model.named_parameters()))
    asyncio.run(backend.update_weights([(name, parameter + 1.0)], version=5))
    assert backend.weights_version == 5
    snapshot = {k: v.clone() for k, v in backend.model.state_dict().items()}
    with pytest.raises(ValueError, match="not newer"):
        asyncio.run(backend.update_weights([(name, parameter)], version=5))
    with pytest.raises(ValueError, match="no parameter 'no.such.weight'"):
        asyncio.run(backend.update_weights({name: parameter * 0, "no.such.weight": parameter}))
    with pytest.raises(ValueError, match="has shape"):
        asyncio.run(backend.update_weights({name: parameter[:1] * 0}))
    assert all(torch.equal(v, snapshot[k]) for k, v in backend.model.state_dict().items())
    assert backend.weights_version == 5
    asyncio.run(backend.update_weights({}))
    assert backend.weights_version == 6


def test_a_template_without_system_role_gets_the_system_text_in_the_user_message(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    text = render_text(
        tokenizer,
        build_messages("Solve it.", "Think for 100 tokens."),
        PromptStyle(continuation_prefix="<think>"),
    )
    assert text == "<user>Think for 100 tokens.\n\nSolve it.<assistant><think>"


def _threads_used(backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of the threads that run the model's batches and weight updates from now on."""
    threads: list[int] = []
    for name in ("generate_batch", "_load_weights"):
        method = getattr(backend, name)

        def recorded(*args, _method=method):
            threads.append(threading.get_ident())
            return _method(*args)

        monkeypatch.setattr(backend, name, recorded)
    return threads


def test_the_worker_thread_loads_and_runs_the_model_and_without_it_the_caller_does_with_the_same_samples(
    tiny_model, monkeypatch
):
    loaded_in: list[int] = []
    load = models.AutoModelForCausalLM.from_pretrained

    def recorded_load(*args, **kwargs):
        loaded_in.append(threading.get_ident())
        return load(*args, **kwargs)

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", recorded_load)
    request = _request("a", "Tell me a story.", 3, seed=4)
    threaded, inline = (
        _backend(tiny_model),
        TransformersBackend(
            tiny_model, PromptStyle(continuation_prefix="<think>\n"), batch_size=4, worker_thread=False
        ),
    )
    used = {backend.worker_thread: _threads_used(backend, monkeypatch) for backend in (threaded, inline)}
    results = []
    for backend in (threaded, inline):
        results.append(_generate(backend, [request])[0])
        asyncio.run(backend.update_weights({}))
        results.append(_generate(backend, [request])[0])
    caller = threading.get_ident()
    assert used[False] == [caller] * 3  # two batches and the weight update
    # torch builds a thread pool per thread that runs it: the worker is one thread, which also loaded the model
    assert len(used[True]) == 3 and len(set(used[True])) == 1
    assert loaded_in == [used[True][0], caller]
    assert caller not in used[True]
    assert all(
        [c.completion_ids for c in r.completions] == [c.completion_ids for c in results[0].completions]
        for r in results
    )
    assert all(
        [c.logprobs for c in r.completions] == [c.logprobs for c in results[0].completions] for r in results
    )


def test_the_sampler_draws_from_the_processed_distribution_and_never_a_token_of_probability_zero():
    draws = 40_000
    row = torch.tensor([2.0, 1.0, 0.0, float("-inf"), 0.5, float("-inf")])
    scores = row.expand(draws, -1).contiguous()
    sampler = TokenSampler(torch.Generator().manual_seed(0))
    tokens = sampler.draw(scores)
    frequencies = torch.bincount(tokens, minlength=len(row)) / draws
    expected = row.softmax(dim=-1)
    assert frequencies[3] == frequencies[5] == 0
    assert torch.allclose(frequencies, expected, atol=0.01)  # 4 standard deviations at 40k draws
    assert torch.allclose(sampler.logprobs().squeeze(1), expected.log()[tokens])
    again = TokenSampler(torch.Generator().manual_seed(0)).draw(scores)
    assert torch.equal(again, tokens)


def test_the_sampler_without_a_generator_takes_the_most_likely_token():
    sampler = TokenSampler(None)
    tokens = sampler.draw(torch.tensor([[0.1, 3.0, 0.2], [5.0, float("-inf"), 1.0]]))
    assert tokens.tolist() == [1, 0]


def test_the_worker_thread_measures_its_cpu_thread_count_every_few_batches_and_the_caller_keeps_its_own(
    tiny_model, monkeypatch
):
    from genesys.generate import hf

    tuned: list[tuple[int, int]] = []  # (thread, batches run) at each call

    class RecordingTuner:
        @classmethod
        def for_device(cls, device, probe, every):
            assert device.type == "cpu" and every == hf.TUNE_EVERY
            probe()  # the probe runs the model
            return cls()

        def maybe_tune(self, batches: int) -> None:
            tuned.append((threading.get_ident(), batches))

    monkeypatch.setattr(hf, "ThreadTuner", RecordingTuner)
    threaded = _backend(tiny_model)
    worker = threaded._worker.submit(threading.get_ident).result()
    _generate(threaded, [_request("a", "Tell me a story.", 10)])  # 3 batches of at most 4
    assert tuned == [(worker, 0), (worker, 1), (worker, 2)]
    tuned.clear()
    inline = TransformersBackend(tiny_model, PromptStyle(), batch_size=4, worker_thread=False)
    _generate(inline, [_request("a", "Tell me a story.", 10)])
    assert inline._threads is None and tuned == []


class _AsLogitsProcessor:
    """A `TokenSampler` as `generate`'s last logits processor: scores -inf everywhere but at the drawn
    token, which `generate`, decoding greedily, then takes."""

    def __init__(self, sampler: TokenSampler) -> None:
        self.sampler = sampler

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tokens = self.sampler.draw(scores)
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)


def _generate_reference(
    backend: TransformersBackend, prompts: list[list[int]], seed: int, sampling: SamplingConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What transformers' own `model.generate` samples with the backend's warpers and sampler:
    (new tokens, their logprobs, the final hidden state of each step)."""
    from transformers import LogitsProcessorList

    from genesys.proofs.hf_capture import FinalHiddenStates

    encoded = backend.tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")
    generator = torch.Generator().manual_seed(seed) if sampling.temperature > 0 else None
    sampler = TokenSampler(generator)
    with torch.inference_mode(), FinalHiddenStates(backend.model, last_only=True) as capture:
        sequences = backend.model.generate(
            **encoded,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            repetition_penalty=1.0,
            max_new_tokens=sampling.max_tokens,
            eos_token_id=sorted(backend.stop_ids),
            pad_token_id=backend.tokenizer.pad_token_id,
            logits_processor=LogitsProcessorList(
                [*models.sampling_warpers(sampling), _AsLogitsProcessor(sampler)]
            ),
        )
    return sequences[:, encoded["input_ids"].shape[1] :], sampler.logprobs(), capture.per_step()


@pytest.mark.parametrize(
    ("texts", "temperature", "top_p"),
    [
        (["Hi.", "Compute the sum of the first 100 positive integers."], 0.7, 0.9),  # left padding
        (["Tell me a story.", "Tell me a story."], 1.0, 1.0),  # no padding: no attention mask
        (["Hi.", "Name a prime number."], 0.0, 1.0),  # greedy
    ],
)
@pytest.mark.parametrize("steps", ["forward", "layers"])
def test_decoding_samples_what_generate_samples_bit_for_bit(tiny_model, texts, temperature, top_p, steps):
    from genesys.generate.decoding import TokenPicker, decode, layers_step, left_padded
    from genesys.proofs.hf_capture import FinalHiddenStates

    backend = _backend(tiny_model)
    stops = {*backend.stop_ids, 40, 41}  # frequent enough that some rows stop early
    backend.stop_ids = stops
    prompts = [
        backend.tokenizer(render_text(backend.tokenizer, build_messages(t), PromptStyle()))["input_ids"]
        for t in texts
        for _ in range(4)
    ]
    sampling = SamplingConfig(max_tokens=24, temperature=temperature, top_p=top_p)
    for seed in (0, 1, 2):
        want_tokens, want_logprobs, want_hidden = _generate_reference(backend, prompts, seed, sampling)
        generator = torch.Generator().manual_seed(seed) if temperature > 0 else None
        sampler = TokenSampler(generator)
        pick = TokenPicker(
            sampler,
            models.sampling_warpers(sampling),
            stops,
            backend.tokenizer.pad_token_id,
            len(prompts),
            "cpu",
        )
        ids, mask = left_padded(prompts, backend.tokenizer.pad_token_id, "cpu")
        step = layers_step(backend.model) if steps == "layers" else None
        with torch.inference_mode(), FinalHiddenStates(backend.model, last_only=True) as capture:
            tokens = decode(backend.model, ids, mask, sampling.max_tokens, pick, step)
        assert torch.equal(tokens, want_tokens)
        assert torch.equal(sampler.logprobs(), want_logprobs)
        if steps == "forward":  # the layers' steps skip the base model's forward, and its hook
            assert torch.equal(capture.per_step(), want_hidden)  # what TOPLOC proofs are built from


def _tiny_llama(path: Path, tokenizer_from: str) -> str:
    """A random-weight Llama (another decoder family) with the tiny model's tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(path)
    return str(path)


def test_decode_steps_call_the_layers_directly_only_where_that_gives_the_forward_bit_for_bit(
    tiny_model, tmp_path
):
    from genesys.generate.decoding import _same_logits, forward_step, layers_step, step_function

    qwen = models.load_causal_lm(tiny_model, "cpu")[2]
    llama = models.load_causal_lm(_tiny_llama(tmp_path / "llama", tiny_model), "cpu")[2]
    for model in (qwen, llama):
        assert _same_logits(model, layers_step(model))
    # A model whose base forward does more than its modules (as Gemma scales its embeddings) steps
    # through that forward: here a hook on it stands for the extra work.
    qwen.base_model.register_forward_hook(
        lambda module, args, output: output.__class__(
            last_hidden_state=output.last_hidden_state * 2.0, past_key_values=output.past_key_values
        )
    )
    assert not _same_logits(qwen, layers_step(qwen))
    step = step_function(qwen)
    from transformers import DynamicCache

    ids = torch.tensor([[3, 4, 5]])
    positions = torch.arange(3)[None]
    with torch.inference_mode():
        got = step(ids, None, positions, DynamicCache(config=qwen.config))
        want = forward_step(qwen)(ids, None, positions, DynamicCache(config=qwen.config))
    assert torch.equal(got, want)


def test_the_backend_pads_prompts_as_the_tokenizer_does(tiny_model):
    from genesys.generate.decoding import left_padded

    backend = _backend(tiny_model)
    prompts = [[5, 6, 7], [8], [9, 10]]
    ids, mask = left_padded(prompts, backend.tokenizer.pad_token_id, "cpu")
    encoded = backend.tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")
    assert torch.equal(ids, encoded["input_ids"]) and torch.equal(mask, encoded["attention_mask"])
