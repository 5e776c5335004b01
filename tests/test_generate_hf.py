"""The transformers backend on a tiny random-weight model with a locally trained tokenizer."""

from __future__ import annotations

import pytest
import torch

from genesys.generate.backend import GenerationRequest, PromptStyle, SamplingConfig
from genesys.generate.hf import TransformersBackend
from genesys.generate.prompts import build_messages, render_text
from genesys.generate.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    torch.set_num_threads(1)  # a tiny model gains nothing from threads, and loses a lot beside busy neighbours
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def _backend(model: str, **sampling) -> TransformersBackend:
    settings = {"n": 1, "max_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 0} | sampling
    return TransformersBackend(model, SamplingConfig(**settings), PromptStyle(continuation_prefix="<think>\n"), batch_size=4)


def _request(key: str, prompt: str, n: int, seed: int = 0) -> GenerationRequest:
    return GenerationRequest(key, build_messages(prompt, "Be brief."), list(range(n)), seed)


def test_n_samples_per_task_with_the_chat_template_and_prefix(tiny_model):
    backend = _backend(tiny_model)
    results = {r.request.key: r for r in backend.generate([_request("a", "What is 1 + 1?", 3), _request("b", "Name a prime.", 2)])}
    assert sorted(results) == ["a", "b"]
    assert len(results["a"].completions) == 3 and len(results["b"].completions) == 2
    prompt_text = backend.tokenizer.decode(results["a"].prompt_ids)
    assert prompt_text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    for completion in results["a"].completions:
        assert 1 <= len(completion.completion_ids) <= 12
        assert completion.finish_reason in ("stop", "length")
        assert completion.text == backend.tokenizer.decode(completion.completion_ids, skip_special_tokens=True)


def test_logprobs_are_those_of_the_sampled_tokens_even_with_left_padding(tiny_model):
    backend = _backend(tiny_model, max_tokens=16)
    prompts = ["Hi.", "Compute the sum of the first 100 positive integers, then explain it twice over."]
    results = list(backend.generate([_request(f"k{i}", p, 2, seed=i) for i, p in enumerate(prompts)]))
    lengths = {len(r.prompt_ids) for r in results}
    assert len(lengths) == 2  # the short prompt was left-padded in the batch
    for result in results:
        for completion in result.completions:
            assert len(completion.logprobs) == len(completion.completion_ids)
            ids = torch.tensor([result.prompt_ids + completion.completion_ids])
            with torch.no_grad():
                reference = torch.log_softmax(backend.model(ids).logits[0].float(), dim=-1)
            start = len(result.prompt_ids) - 1
            expected = [reference[start + k, token].item() for k, token in enumerate(completion.completion_ids)]
            assert completion.logprobs == pytest.approx(expected, abs=1e-4)
            assert all(lp <= 0 for lp in completion.logprobs)


def test_stop_tokens_end_completions_with_finish_reason_stop(tiny_model):
    backend = _backend(tiny_model)
    backend.stop_ids = set(range(len(backend.tokenizer)))  # every token stops: one-token completions
    [result] = backend.generate([_request("a", "Hello", 2)])
    for completion in result.completions:
        assert len(completion.completion_ids) == 1 and len(completion.logprobs) == 1
        assert completion.finish_reason == "stop"


def test_length_limit_gives_finish_reason_length(tiny_model):
    backend = _backend(tiny_model, max_tokens=5)
    backend.stop_ids = {backend.tokenizer.eos_token_id}
    completion = backend._completion([7, 8, 9, 10, 11], [-1.0] * 5)
    assert completion.finish_reason == "length" and completion.completion_ids == [7, 8, 9, 10, 11]
    eos = backend.tokenizer.eos_token_id
    cut = backend._completion([7, eos, eos, eos, eos], [-1.0, -2.0, -3.0, -3.0, -3.0])
    assert cut.finish_reason == "stop" and cut.completion_ids == [7, eos] and cut.logprobs == [-1.0, -2.0]


def test_seeded_sampling_repeats_and_greedy_is_deterministic(tiny_model):
    first = list(_backend(tiny_model, seed=5).generate([_request("a", "Tell me a story.", 2, seed=5)]))[0]
    again = list(_backend(tiny_model, seed=5).generate([_request("a", "Tell me a story.", 2, seed=5)]))[0]
    assert [c.completion_ids for c in first.completions] == [c.completion_ids for c in again.completions]
    greedy = list(_backend(tiny_model, temperature=0.0).generate([_request("a", "Tell me a story.", 2)]))[0]
    assert greedy.completions[0].completion_ids == greedy.completions[1].completion_ids


def test_raw_prompts_without_chat_template(tiny_model):
    backend = TransformersBackend(tiny_model, SamplingConfig(max_tokens=4), PromptStyle(chat_template=False))
    messages = build_messages("Just this text.")
    assert render_text(backend.tokenizer, messages, backend.style) == "Just this text."
    [result] = backend.generate([GenerationRequest("a", messages, [0], 0)])
    assert backend.tokenizer.decode(result.prompt_ids) == "Just this text."


def test_a_template_without_system_role_gets_the_system_text_in_the_user_message(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    text = render_text(tokenizer, build_messages("Solve it.", "Think for 100 tokens."), PromptStyle(continuation_prefix="<think>"))
    assert text == "<user>Think for 100 tokens.\n\nSolve it.<assistant><think>"
