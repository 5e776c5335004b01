"""Proofs of trajectories: `generate --proofs` on environment tasks writes TOPLOC and sampling proofs of
every model turn, and `genesys validate` recomputes each turn after the conversation before it and
replays the environment side, accepting honest rows and rejecting each kind of tampering."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("toploc", reason="toploc is not installed (see the proofs extra in pyproject.toml)")
pytest.importorskip("transformers")

import genesys  # noqa: E402
from genesys.config import PromptStyle, SamplingConfig  # noqa: E402
from genesys.environments.replay import replay  # noqa: E402
from genesys.environments.tokens import model_spans, turn_seed  # noqa: E402
from genesys.generate.backend import Completion, GenerationRequest, GenerationResult  # noqa: E402
from genesys.generate.episodes import play_batched  # noqa: E402
from genesys.testing.digits import DigitTurns, digit_tasks  # noqa: E402
from genesys.testing.tampering import TINY_PROOFS, read_rows, validate_tiny  # noqa: E402

PLUGINS = "genesys.testing.digits"


@pytest.fixture(scope="module")
def digits_plugin():
    from genesys.plugins import default_plugin_manager

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GENESYS_PLUGINS", PLUGINS)
        default_plugin_manager.cache_clear()
        yield
    default_plugin_manager.cache_clear()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trajectory-proofs")


@pytest.fixture(scope="module")
def tokenizer(tiny_model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def honest(tiny_model: str, work: Path, digits_plugin: None) -> list[dict[str, Any]]:
    """digit_turns rows with proofs from the tiny model: 3 tasks x 2 samples, two turns of 6 tokens at most."""
    from genesys.generate.runner import GenerateConfig, run_generation

    output = work / "honest.jsonl"
    config = GenerateConfig(
        tasks=[str(digit_tasks(work / "tasks.jsonl", count=3, task_type="digit_turns"))],
        model=tiny_model,
        output=output,
        backend="transformers",
        backend_options={"batch_size": 8},
        sampling=SamplingConfig(n=2, max_tokens=6, seed=3),
        proofs=TINY_PROOFS,
        progress=False,
    )
    run_generation(config)
    return read_rows(output)


def validate(model: str, rows: list[dict[str, Any]], work: Path, name: str, **settings: Any) -> list[dict]:
    import orjson

    path = work / f"{name}.jsonl"
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return validate_tiny(model, path, work / f"{name}-validated.jsonl", **settings)


def assert_rejected(rows: list[dict[str, Any]], *categories: str) -> None:
    assert rows
    for row in rows:
        assert row["toploc_valid"] is False, row["toploc_errors"]
        assert set(categories) & set(row["toploc_problems"]), (row["toploc_problems"], row["toploc_reason"])


def turns_of(row: dict[str, Any]) -> list[tuple[int, int]]:
    return model_spans(row["completion_mask"])


def with_messages_of_tokens(row: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """The row with its assistant messages and llm_response decoded from its (edited) model turns, as a
    worker covering its tracks would write them."""
    texts = iter(
        tokenizer.decode(row["completion_ids"][start:end], skip_special_tokens=True)
        for start, end in turns_of(row)
    )
    for message in row["messages"]:
        if message["role"] == "assistant":
            message["content"] = next(texts)
    row["llm_response"] = [m for m in row["messages"] if m["role"] == "assistant"][-1]["content"]
    return row


# --- generation ---------------------------------------------------------------------------------------


def test_generate_proofs_covers_every_model_turn_of_a_trajectory(honest: list[dict[str, Any]]) -> None:
    from genesys.proofs.toploc import proof_count

    assert len(honest) == 6
    for row in honest:
        turns = turns_of(row)
        assert row["turns"] == len(turns) == 2 and row["finish_reason"] == "done"
        expected = sum(proof_count(end - start, TINY_PROOFS) for start, end in turns)
        assert len(row["toploc_proofs"]) == expected
        assert row["sampling_proof"]["sampler"] == "gumbel-v1"
        assert row["toploc_config"]["topk"] == TINY_PROOFS.topk


def test_turn_seeds_never_coincide_within_a_task() -> None:
    seeds = {turn_seed(7, sample, turn) for sample in range(50) for turn in range(50)}
    assert len(seeds) == 50 * 50
    with pytest.raises(ValueError, match="sample index"):
        turn_seed(7, 1_000_003, 0)


# --- validation: honest rows ----------------------------------------------------------------------------


def test_honest_trajectories_are_valid_and_sampling_proven(
    honest: list[dict[str, Any]], tiny_model: str, work: Path, digits_plugin: None
) -> None:
    rows = validate(tiny_model, honest, work, "honest")
    assert len(rows) == len(honest)
    for row in rows:
        assert row["toploc_valid"] is True, row["toploc_reason"]
        assert row["sampling_proven"] is True
        assert row["toploc_errors"]["failed_chunks"] == 0


def test_with_trusted_tasks_and_run_seed_honest_trajectories_stay_valid(
    honest: list[dict[str, Any]], tiny_model: str, work: Path, digits_plugin: None
) -> None:
    from genesys.config import ExpectedSampling

    rows = validate(
        tiny_model,
        honest,
        work,
        "trusted",
        data={"tasks": [str(work / "tasks.jsonl")]},
        expect=ExpectedSampling(seed=3, n=2, max_tokens=6),
    )
    for row in rows:
        assert row["toploc_valid"] is True, row["toploc_reason"]
        assert row["trusted_task"] is True and row["sampling_proven"] is True


# --- validation: tampered rows --------------------------------------------------------------------------


def test_a_tampered_model_token_is_rejected(honest, tiny_model, work, tokenizer, digits_plugin) -> None:
    tampered = []
    for row in copy.deepcopy(honest):
        start, end = turns_of(row)[1]  # the second turn, after the environment's message
        position = start + (end - start) // 2
        row["completion_ids"][position] = (row["completion_ids"][position] + 1) % 100 + 5
        tampered.append(with_messages_of_tokens(row, tokenizer))
    assert_rejected(validate(tiny_model, tampered, work, "model-token"), "proof", "sampling_proof")


def test_a_tampered_environment_reply_is_rejected(honest, tiny_model, work, tokenizer, digits_plugin) -> None:
    tampered = []
    for row in copy.deepcopy(honest):
        (_, end), _ = turns_of(row)
        reply = [i for i in range(end, len(row["completion_ids"])) if row["completion_mask"][i] == 0]
        row["completion_ids"][reply[len(reply) // 2]] = tokenizer.convert_tokens_to_ids("7")
        tampered.append(row)
    rows = validate(tiny_model, tampered, work, "environment-token")
    assert_rejected(rows, "environment")
    assert all("environment or tool" in row["toploc_reason"] for row in rows)

    edited = copy.deepcopy(honest)  # the reply's text in the messages only
    for row in edited:
        row["messages"][2]["content"] = "Now write letters."
    assert_rejected(validate(tiny_model, edited, work, "environment-message"), "environment")


@pytest.mark.parametrize("shift", [1, -1])
def test_a_mask_shifted_by_one_is_rejected(honest, tiny_model, work, digits_plugin, shift: int) -> None:
    tampered = []
    for row in copy.deepcopy(honest):
        mask = row["completion_mask"]
        row["completion_mask"] = mask[1:] + [mask[-1]] if shift > 0 else [mask[0]] + mask[:-1]
        row["completion_logprobs"] = [
            lp if bit else 0.0 for lp, bit in zip(row["completion_logprobs"], row["completion_mask"])
        ]
        tampered.append(row)
    assert_rejected(validate(tiny_model, tampered, work, f"mask{shift}"), "environment")


def test_an_environment_token_marked_as_the_models_is_rejected(
    honest, tiny_model, work, digits_plugin
) -> None:
    tampered = copy.deepcopy(honest)
    for row in tampered:
        (_, end), _ = turns_of(row)
        row["completion_mask"][end + 1] = 1
    rows = validate(tiny_model, tampered, work, "mask-env-as-model")
    assert_rejected(rows, "environment")


def test_swapped_turns_are_rejected(honest, tiny_model, work, tokenizer, digits_plugin) -> None:
    from genesys.proofs.toploc import proof_count

    tampered = []
    for row in copy.deepcopy(honest):
        (a0, a1), (b0, b1) = turns_of(row)
        ids, mask, lps = row["completion_ids"], row["completion_mask"], row["completion_logprobs"]
        first, second = ids[a0:a1], ids[b0:b1]
        row["completion_ids"] = second + ids[a1:b0] + first + ids[b1:]
        row["completion_logprobs"] = lps[b0:b1] + lps[a1:b0] + lps[a0:a1] + lps[b1:]
        row["completion_mask"] = mask[b0:b1] + mask[a1:b0] + mask[a0:a1] + mask[b1:]
        split = proof_count(a1 - a0, TINY_PROOFS)
        row["toploc_proofs"] = row["toploc_proofs"][split:] + row["toploc_proofs"][:split]
        tampered.append(with_messages_of_tokens(row, tokenizer))
    assert_rejected(validate(tiny_model, tampered, work, "swapped"), "proof", "sampling_proof", "environment")


def test_a_row_claiming_another_task_is_rejected(honest, tiny_model, work, digits_plugin) -> None:
    by_task = {}
    for row in honest:
        by_task.setdefault(row["problem_id"], row)
    first, second = list(by_task.values())[:2]
    claimed = copy.deepcopy(first)
    claimed.update({name: second[name] for name in ("problem_id", "prompt")})
    assert_rejected(validate(tiny_model, [claimed], work, "other-task"), "environment")


def test_an_environment_that_is_not_deterministic_is_refused_not_accepted(
    honest, tiny_model, work, monkeypatch, digits_plugin
) -> None:
    class Dice(DigitTurns):
        deterministic = False

    monkeypatch.setattr("genesys.proofs.validate.environments", lambda: {"digit_turns": Dice})
    rows = validate(tiny_model, honest[:2], work, "nondeterministic")
    assert_rejected(rows, "environment")
    assert all("not deterministic" in row["toploc_reason"] for row in rows)


# --- the replay of a trajectory with tool calls ------------------------------------------------------


class ScriptedTokens:
    """A token backend without a model: each turn answers with the next of `replies` (token ids)."""

    name = "scripted-tokens"
    weights_version = 0

    def __init__(self, tokenizer: Any, replies: list[list[int]], stop: int) -> None:
        self.tokenizer, self.style = tokenizer, PromptStyle()
        self.replies, self.stop = list(replies), stop

    async def generate(self, requests):
        for request in requests:
            prompt = request.prompt_token_ids(self.tokenizer, self.style)
            tokens = [*self.replies.pop(0), self.stop]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            yield GenerationResult(request, prompt, [Completion(text, tokens, [-0.5] * len(tokens), "stop")])


def test_a_python_tool_trajectory_replays_and_a_forged_tool_result_does_not(tokenizer) -> None:
    from genesys.environments.python_tool import python_tool
    from genesys.verifiers.math_python import PythonMath

    class Unsandboxed(PythonMath):
        tools = (python_tool("subprocess"),)

    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    backend = ScriptedTokens(tokenizer, [encode(call), encode("\\boxed{42}")], stop)
    task = genesys.Task(
        task_type="math_python", prompt="6 times 7?", verification_info={"ground_truth": "42"}
    )
    request = GenerationRequest("k", [], [0], seed=1, sampling=SamplingConfig(max_tokens=64))

    async def collect():
        return [r async for r in play_batched(backend, [request], {"k": (Unsandboxed, task)})]

    [result] = asyncio.run(collect())
    played = result.completions[0]
    assert (
        played.trajectory["messages"][3]["role"] == "tool"
        and "42" in played.trajectory["messages"][3]["content"]
    )
    row_tokens = (played.prompt_ids, played.completion_ids, played.completion_mask)

    honest = replay(Unsandboxed, task, tokenizer, PromptStyle(), row_tokens, {stop})
    assert honest.difference is None, honest.difference
    assert honest.trajectory.messages == played.trajectory["messages"]
    assert len(honest.turns) == 2

    ids = list(played.completion_ids)
    forged = ids.index(encode("42")[0], honest.turns[0][1])  # the tool's output, "42"
    ids[forged] = encode("9")[0]
    tampered = replay(
        Unsandboxed, task, tokenizer, PromptStyle(), (played.prompt_ids, ids, played.completion_mask), {stop}
    )
    assert tampered.difference is not None and f"completion position {forged}" in tampered.difference


def test_a_trajectory_changed_after_validation_loses_its_attestation(honest, tiny_model, work, digits_plugin):
    import orjson

    from genesys.data.attestation import TrustKey

    [row] = validate(tiny_model, honest[:1], work, "attested")
    key = TrustKey.load(None)
    assert key.problem(row) is None
    assert (
        key.problem({**row, "messages": orjson.dumps(row["messages"]).decode()}) is None
    )  # as parquet holds it
    answered = copy.deepcopy(row)
    answered["messages"][1]["content"] = "0123456789"  # what the environment's score reads
    for changed in (
        answered,
        {**row, "completion_mask": [1] * len(row["completion_mask"])},
        {**row, "trajectory_error": "turn 1: step raised ValueError"},
        {**row, "turns": 1},
        {key: value for key, value in row.items() if key != "messages"},
    ):
        assert key.problem(changed) is not None


def test_with_trusted_tasks_a_trajectory_claiming_another_task_or_target_length_is_rejected(
    honest, tiny_model, work, digits_plugin
) -> None:
    others = {row["response_id"].rpartition("-")[0] for row in honest}
    first = honest[0]
    other_task = next(key for key in others if not first["response_id"].startswith(key))
    moved = copy.deepcopy(first) | {"response_id": f"{other_task}-1"}  # another trusted task's id
    lengthened = copy.deepcopy(honest[1]) | {"target_length": 4000}
    rows = validate(
        tiny_model, [moved, lengthened], work, "trusted-claims", data={"tasks": [str(work / "tasks.jsonl")]}
    )
    by_id = {row["response_id"]: row for row in rows}
    assert_rejected([by_id[moved["response_id"]]], "environment")  # replayed on the trusted task
    assert_rejected([by_id[lengthened["response_id"]]], "task")
    assert by_id[lengthened["response_id"]].get("target_length") is None
