"""Token trajectories: the token ids of a conversation played on a token backend are the model's sampled
ids and the chat template's rendering of everything else, each turn is sampled after exactly those
tokens, and the mask and logprobs say which tokens the model produced and how likely they were."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import read_jsonl  # noqa: E402

import genesys  # noqa: E402
from genesys.config import PromptStyle, SamplingConfig  # noqa: E402
from genesys.environments.tokens import TemplateMismatch, TokenTrajectory  # noqa: E402
from genesys.generate.backend import Completion, GenerationRequest, GenerationResult  # noqa: E402
from genesys.generate.episodes import play_batched  # noqa: E402
from genesys.tasks.prompts import render_ids, render_text  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class Twice(genesys.Environment):
    """Two model turns, the environment answering the first."""

    task_type = "twice"
    max_turns = 2

    def step(self, task, messages):
        turns = sum(m["role"] == "assistant" for m in messages)
        return genesys.Step([{"role": "user", "content": f"reply {turns}"}], done=turns == 2)

    def score(self, task, messages):
        return genesys.Verdict(score=1.0)


class ScriptedTokens:
    """A token backend without a model: it answers each turn with the next of `replies` (token ids,
    a finish reason), logprob -0.5 per token, and records the prompt ids of every turn."""

    name = "scripted-tokens"
    weights_version = 0

    def __init__(self, tokenizer, replies: list[tuple[list[int], str]]) -> None:
        self.tokenizer, self.style = tokenizer, PromptStyle()
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    async def generate(self, requests):
        for request in requests:
            prompt = request.prompt_token_ids(self.tokenizer, self.style)
            self.prompts.append(prompt)
            tokens, finish = self.replies.pop(0)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            yield GenerationResult(request, prompt, [Completion(text, tokens, [-0.5] * len(tokens), finish)])


def play_one(backend, environment, task: genesys.Task | None = None) -> Completion:
    task = task or genesys.Task(task_type=environment.task_type, prompt="start")
    request = GenerationRequest("k", [], [0], seed=1, sampling=SamplingConfig(max_tokens=8))

    async def collect():
        return [result async for result in play_batched(backend, [request], {"k": (environment, task)})]

    [result] = asyncio.run(collect())
    return result.completions[0]


def segments(completion: Completion) -> list[tuple[int, list[int]]]:
    """The completion's tokens as runs of (mask value, ids)."""
    runs: list[tuple[int, list[int]]] = []
    for token, bit in zip(completion.completion_ids, completion.completion_mask):
        if runs and runs[-1][0] == bit:
            runs[-1][1].append(token)
        else:
            runs.append((bit, [token]))
    return runs


def test_model_tokens_are_the_sampled_ids_and_the_rest_is_the_templates_rendering(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first = ids(tokenizer, "4 2") + [im_end]
    # Characters one token each, which the tokenizer would merge when encoding the text again.
    second = [tokenizer.convert_tokens_to_ids(c) for c in "the"] + [im_end]
    assert ids(tokenizer, "the") != second[:-1]
    backend = ScriptedTokens(tokenizer, [(first, "stop"), (second, "stop")])
    completion = play_one(backend, Twice)

    opening = [{"role": "user", "content": "start"}]
    assert completion.prompt_ids == render_ids(tokenizer, opening, PromptStyle())
    model_runs = [run for bit, run in segments(completion) if bit]
    assert model_runs == [first, second]  # exactly the sampled ids, never encoded again
    # Everything else is what the chat template writes: the whole conversation, token for token.
    messages = completion.trajectory["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    text = tokenizer.decode(completion.prompt_ids + completion.completion_ids, skip_special_tokens=False)
    assert text == render_text(tokenizer, messages, PromptStyle(), generation_prompt=False)
    # The second turn was sampled after exactly the trajectory's tokens before it.
    everything = completion.prompt_ids + completion.completion_ids
    before = len(backend.prompts[1])
    assert backend.prompts[1] == everything[:before] and everything[before : before + len(second)] == second
    assert completion.logprobs == [-0.5 if bit else 0.0 for bit in completion.completion_mask]
    assert completion.sampled_tokens == len(first) + len(second)


def test_a_turn_cut_at_the_token_limit_is_closed_by_the_template_not_by_the_model(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first, second = ids(tokenizer, "4 2"), ids(tokenizer, "7") + [im_end]
    completion = play_one(ScriptedTokens(tokenizer, [(first, "length"), (second, "stop")]), Twice)
    runs = segments(completion)
    assert [bit for bit, _ in runs] == [1, 0, 1, 0]
    assert runs[0][1] == first
    assert runs[1][1][0] == im_end  # the end of the cut turn, written by the template
    assert tokenizer.decode(runs[1][1]).startswith("<|im_end|>\n<|im_start|>user\nreply 1")


def test_tool_results_are_environment_tokens_between_the_model_turns(tokenizer):
    from genesys_toolenv import Calculator

    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = ids(tokenizer, '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>') + [im_end]
    answer = ids(tokenizer, "It is 5") + [im_end]
    task = genesys.Task(task_type="calculator", prompt="What is 2 + 3?", verification_info={"a": 2, "b": 3})
    completion = play_one(ScriptedTokens(tokenizer, [(call, "stop"), (answer, "stop")]), Calculator, task)
    assert [m["role"] for m in completion.trajectory["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    runs = segments(completion)
    assert [bit for bit, _ in runs] == [1, 0, 1]
    assert [runs[0][1], runs[2][1]] == [call, answer]
    assert tokenizer.decode(runs[1][1]) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_renders_earlier_turns_anew_ends_the_rollout_with_an_error(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        "{{ messages | length }}" + tokenizer.chat_template
    )  # every turn changes the start
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedTokens(tokenizer, [(ids(tokenizer, "1") + [im_end], "stop")] * 2)
    completion = play_one(backend, Twice)
    assert completion.finish_reason == "error"
    assert completion.trajectory["trajectory_error"].startswith("turn 2: ")
    assert "renders the earlier messages differently" in completion.trajectory["trajectory_error"]
    with pytest.raises(TemplateMismatch):
        trajectory = TokenTrajectory(tokenizer, PromptStyle())
        trajectory.next_prompt([{"role": "user", "content": "a"}], None)
        trajectory.add_model_turn([im_end], [-1.0], "stop")
        trajectory.next_prompt(
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": "b"},
            ],
            None,
        )


def test_the_transformers_backend_samples_each_turn_after_the_trajectory_and_its_logprobs_recompute(
    tiny_model,
):
    """Recomputing the whole conversation in one forward pass gives the sampled logprobs of every model
    token: each turn was sampled after exactly the tokens the trajectory holds before it."""
    from genesys.generate.hf import TransformersBackend

    backend = TransformersBackend(tiny_model, PromptStyle(), worker_thread=False)
    task = genesys.Task(task_type="twice", prompt="Write digits 3")
    sampling = SamplingConfig(max_tokens=6, temperature=1.0)
    requests = [GenerationRequest(f"t{i}", [], [0, 1, 2], seed=i, sampling=sampling) for i in range(2)]

    async def collect():
        return [r async for r in play_batched(backend, requests, {r.key: (Twice, task) for r in requests})]

    completions = [c for result in asyncio.run(collect()) for c in result.completions]
    assert len(completions) == 6
    for completion in completions:
        assert completion.trajectory["turns"] == 2 and completion.trajectory["trajectory_error"] is None
        mask = torch.tensor(completion.completion_mask, dtype=torch.bool)
        assert 2 <= int(mask.sum()) <= 12 and not mask.all()
        sequence = torch.tensor([completion.prompt_ids + completion.completion_ids])
        with torch.no_grad():
            logits = backend.model(sequence).logits[0, len(completion.prompt_ids) - 1 : -1].float()
        recomputed = logits.log_softmax(-1).gather(1, torch.tensor(completion.completion_ids)[:, None])[:, 0]
        sampled = torch.tensor(completion.logprobs)
        assert torch.allclose(recomputed[mask], sampled[mask], atol=1e-4)
        assert (sampled[~mask] == 0).all()


def test_generate_writes_the_token_columns_of_trajectories(tiny_model, tmp_path, plugin_env):
    from genesys.generate.runner import GenerateConfig, run_generation
    from genesys.testing.digits import digit_tasks

    output = tmp_path / "out.jsonl"
    config = GenerateConfig(
        tasks=[str(digit_tasks(tmp_path / "tasks.jsonl", count=2, task_type="digit_turns"))],
        model=tiny_model,
        output=output,
        backend="transformers",
        sampling=SamplingConfig(n=2, max_tokens=5),
        progress=False,
    )
    run_generation(config)
    rows = read_jsonl(output)
    assert len(rows) == 4
    for row in rows:
        assert row["turns"] == 2 and row["finish_reason"] == "done"
        assert len(row["completion_ids"]) == len(row["completion_logprobs"]) == len(row["completion_mask"])
        assert set(row["completion_mask"]) == {0, 1} and row["completion_mask"][0] == 1
        assert row["prompt_ids"] and all(isinstance(t, int) for t in row["completion_ids"])


class ContextOf(ScriptedTokens):
    """A scripted token backend with a context length that, like vLLM, fails its whole batch when
    one prompt fills the context."""

    def __init__(self, tokenizer, replies, max_model_len: int) -> None:
        super().__init__(tokenizer, replies)
        self.max_model_len = max_model_len

    async def generate(self, requests):
        requests = list(requests)
        longest = max(len(r.prompt_token_ids(self.tokenizer, self.style)) for r in requests)
        if longest >= self.max_model_len:
            raise ValueError(f"a prompt of {longest} tokens is longer than the maximum model length")
        async for result in super().generate(requests):
            yield result


def test_a_conversation_that_fills_the_context_ends_its_rollout_alone(tokenizer):
    long_prompt = "many words " * 40
    opening = render_ids(tokenizer, [{"role": "user", "content": long_prompt}], PromptStyle())
    limit = len(opening) + 2  # its first turn fits, its second does not; a short task's both do
    backend = ContextOf(tokenizer, [(ids(tokenizer, "hi"), "length")] * 4, limit)
    sampling = SamplingConfig(max_tokens=8)
    requests = [GenerationRequest(key, [], [0], seed=1, sampling=sampling) for key in ("short", "long")]
    episodes = {
        "short": (Twice, genesys.Task(task_type="twice", prompt="start")),
        "long": (Twice, genesys.Task(task_type="twice", prompt=long_prompt)),
    }

    async def collect():
        return {r.request.key: r.completions[0] async for r in play_batched(backend, requests, episodes)}

    played = asyncio.run(collect())
    assert played["short"].trajectory["trajectory_error"] is None and played["short"].finish_reason == "done"
    error = played["long"].trajectory["trajectory_error"]
    assert error.startswith("turn 2: ") and f"max_model_len) holds {limit}" in error
    assert sum(played["long"].completion_mask) == len(ids(tokenizer, "hi"))  # its first turn kept
