"""Multi-turn environments: the contract and its registration, tools and their calls, the rollout loop
under deadlines, and `genesys generate`/`verify` playing environments through an OpenAI-compatible
server whose answers are scripted."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import GENESYS, REPO, SUPPORT, read_jsonl, write_jsonl
from scripted_chat import ScriptedChatServer

import genesys
from genesys.environments import parse_tool_calls, play, tool
from genesys.environments.python_tool import python_tool
from genesys.errors import PluginError
from genesys.plugins import environments, new_plugin_manager, plugin_infos
from genesys.plugins.registry import verifier_entries
from genesys.plugins.specs import environment_verifier
from genesys.schema import Rollout

PLUGIN_DIR = REPO / "plugins" / "genesys-guess-number"


@pytest.fixture
def guess_number():
    """The example plugin's module (not installed in the test environment: imported from its folder)."""
    import sys

    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        import genesys_guess_number

        yield genesys_guess_number
    finally:
        sys.path.remove(str(PLUGIN_DIR))


@pytest.fixture
def toolenv():
    import genesys_toolenv

    return genesys_toolenv


def scripted(*replies: str | dict[str, Any]):
    """A chat function answering with `replies` in order; it records the messages it was shown."""
    seen: list[list[dict[str, Any]]] = []
    queue = list(replies)

    async def chat(messages, tools):
        seen.append([dict(m) for m in messages])
        reply = queue.pop(0)
        return {"role": "assistant", **({"content": reply} if isinstance(reply, str) else reply)}

    chat.seen = seen  # type: ignore[attr-defined]
    return chat


def task(task_type: str, **info: Any) -> genesys.Task:
    return genesys.Task(task_type=task_type, prompt="play", verification_info=info)


# --- registration -------------------------------------------------------------------------------


def test_environments_register_through_their_hook_and_are_scored_as_verifiers(guess_number):
    pm = new_plugin_manager(load_entry_points=False, extra_plugins=[guess_number])
    assert environments(pm) == {"guess_number": guess_number.GuessNumber}
    scorer = verifier_entries(pm)["guess_number"].cls
    assert issubclass(scorer, genesys.Verifier) and scorer.task_type == "guess_number"
    assert pickle.loads(pickle.dumps(scorer)) is scorer  # workers get it by its environment
    infos = {info.name: info for info in plugin_infos(pm)}
    assert any(i.task_types == ["guess_number (environment)"] for i in infos.values())


def test_a_task_type_claimed_by_a_verifier_and_an_environment_is_refused(toolenv):
    class Clash(genesys.Verifier):
        task_type = "calculator"

        def verify(self, rollout):
            return genesys.Verdict(score=1.0)

    class Other:
        @genesys.hookimpl
        def genesys_verifiers(self):
            return [Clash]

    pm = new_plugin_manager(load_entry_points=False, extra_plugins=[toolenv, Other()])
    with pytest.raises(PluginError, match="'calculator' is claimed by two plugins.*environment"):
        verifier_entries(pm)


def test_an_environment_without_task_type_is_refused():
    class Nameless(genesys.Environment):
        pass

    class Plugin:
        @genesys.hookimpl
        def genesys_environments(self):
            return [Nameless]

    pm = new_plugin_manager(load_entry_points=False, extra_plugins=[Plugin()])
    with pytest.raises(PluginError, match="environment .*Nameless.* has no task_type"):
        environments(pm)


def test_the_scorer_keeps_a_trajectory_error_and_reads_messages_as_json(guess_number):
    scorer = environment_verifier(guess_number.GuessNumber)()
    row = {
        "task_type": "guess_number",
        "prompt": "p",
        "verification_info": {"secret": 7},
        "llm_response": "<guess>7</guess>",
    }
    messages = [{"role": "user", "content": "p"}, {"role": "assistant", "content": "<guess>7</guess>"}]
    assert scorer.verify(Rollout.from_row({**row, "messages": json.dumps(messages)})).score == 1.0
    failed = scorer.verify(
        Rollout.from_row({**row, "messages": messages, "trajectory_error": "turn 2: boom"})
    )
    assert failed.score is None and failed.error == "turn 2: boom"
    assert scorer.verify(Rollout.from_row(row)).error.startswith("the row has no 'messages'")


# --- tools --------------------------------------------------------------------------------------


def test_a_tool_schema_comes_from_type_hints_and_docstring(toolenv):
    schema = tool(toolenv.add).schema
    assert schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "the first number"},
                    "b": {"type": "integer", "description": "the second number"},
                },
                "required": ["a", "b"],
            },
        },
    }


def test_tool_calls_are_read_from_hermes_blocks_and_structured_calls():
    text = 'let me add <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> and <tool_call>{oops'
    calls = parse_tool_calls({"content": text})
    assert [(c.name, c.arguments, c.problem) for c in calls[:1]] == [("add", {"a": 1, "b": 2}, None)]
    assert "not valid JSON" in calls[1].problem  # the unclosed, cut-off call is reported, not dropped
    structured = {
        "content": "",
        "tool_calls": [
            {"id": "c7", "type": "function", "function": {"name": "add", "arguments": '{"a": 4}'}}
        ],
    }
    assert (
        parse_tool_calls(structured)[0].arguments == {"a": 4} and parse_tool_calls(structured)[0].id == "c7"
    )
    assert parse_tool_calls({"content": "<tool_call>[1, 2]</tool_call>"})[0].problem.startswith(
        "a tool call must"
    )
    assert parse_tool_calls({"content": '<tool_call>{"arguments": {}}</tool_call>'})[0].problem == (
        'the tool call has no "name"'
    )
    assert parse_tool_calls({"content": "no calls here"}) == []


# --- the rollout loop ---------------------------------------------------------------------------


def test_guess_number_is_played_to_the_end_and_scored(guess_number):
    chat = scripted("<guess>50</guess>", "<guess>25</guess>", "hmm", "<guess>30</guess>")
    trajectory = asyncio.run(play(guess_number.GuessNumber, task("guess_number", secret=30), chat))
    assert trajectory.finish_reason == "done" and trajectory.turns == 4 and trajectory.error is None
    replies = [m["content"] for m in trajectory.messages if m["role"] == "user"][1:]
    assert replies == ["lower", "higher", "Give your guess inside <guess></guess>.", "correct"]
    verdict = guess_number.GuessNumber().score(task("guess_number", secret=30), trajectory.messages)
    assert verdict.score == pytest.approx(0.8)  # found on the third guess


def test_an_episode_stops_after_max_turns(guess_number):
    chat = scripted(*["<guess>1</guess>"] * 20)
    trajectory = asyncio.run(play(guess_number.GuessNumber, task("guess_number", secret=30), chat))
    assert trajectory.finish_reason == "max_turns" and trajectory.turns == guess_number.GuessNumber.max_turns


def test_tool_results_bad_calls_and_unknown_tools_become_messages(toolenv):
    chat = scripted(
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 2,</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": "two", "b": 3}}</tool_call>'
        '<tool_call>{"name": "multiply", "arguments": {}}</tool_call>',
        "The answer is 5",
    )
    trajectory = asyncio.run(play(toolenv.Calculator, task("calculator", a=2, b=3), chat))
    assert trajectory.error is None and trajectory.finish_reason == "done" and trajectory.turns == 4
    tools = [m for m in trajectory.messages if m["role"] == "tool"]
    assert tools[0] == {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "5"}
    assert tools[1]["content"].startswith("error: the tool call is not valid JSON")
    assert tools[2]["content"].startswith("error: ValidationError") and "a" in tools[2]["content"]
    assert tools[3]["content"].startswith("error: there is no tool 'multiply'; the tools are add, hang")
    assert chat.seen[1][-1] == tools[0]  # the model saw the tool's result before its next turn


def test_a_hanging_tool_ends_the_rollout_with_an_error_naming_its_turn(toolenv):
    chat = scripted(
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>',
        '<tool_call>{"name": "hang", "arguments": {"seconds": 600}}</tool_call>',
    )
    trajectory = asyncio.run(play(toolenv.Calculator, task("calculator", a=1, b=1), chat))
    assert trajectory.finish_reason == "error" and trajectory.turns == 2
    assert trajectory.error == "turn 2: tool 'hang' passed its 1 s deadline"


def test_a_failing_step_and_a_hanging_async_step_are_errors_naming_their_turn(toolenv):
    broken = asyncio.run(play(toolenv.Broken, task("broken_env"), scripted("hi")))
    assert broken.error == "turn 1: step raised RuntimeError: the environment broke"

    class Slow(genesys.Environment):
        task_type = "slow"
        step_timeout = 0.2

        async def step(self, task, messages):
            if len(messages) > 2:
                await asyncio.sleep(600)
            return genesys.Step([{"role": "user", "content": "again"}])

    slow = asyncio.run(play(Slow, task("slow"), scripted("one", "two")))
    assert slow.error == "turn 2: step passed its 0.2 s deadline" and slow.turns == 2


def test_each_rollout_has_its_own_environment_state():
    class Counter(genesys.Environment):
        task_type = "counter"
        max_turns = 5

        async def reset(self, task):
            self.seen = 0
            return [{"role": "user", "content": "count"}]

        def step(self, task, messages):
            self.seen += 1
            return genesys.Step([{"role": "user", "content": str(self.seen)}], done=self.seen == 3)

    async def both():
        return await asyncio.gather(
            *(play(Counter, task("counter"), scripted("a", "b", "c")) for _ in range(2))
        )

    for trajectory in asyncio.run(both()):
        assert [m["content"] for m in trajectory.messages if m["role"] == "user"] == ["count", "1", "2", "3"]


def test_the_python_tool_runs_code_in_the_sandbox():
    class PythonMath(genesys.Environment):
        task_type = "python_math"
        tools = (python_tool("subprocess"),)
        tool_timeout = 60.0

    chat = scripted(
        '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>',
        '<tool_call>{"name": "python", "arguments": {"code": "raise SystemExit(3)"}}</tool_call>',
        "42",
    )
    trajectory = asyncio.run(play(PythonMath, task("python_math"), chat))
    tools = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert tools[0].strip() == "42"
    assert tools[1].startswith("[runtime_error]")


# --- through genesys generate and verify --------------------------------------------------------

SECRETS = (37, 1, 100)
CALCULATOR_MODES = ("ok", "malformed", "hang")


def policy(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted model: binary search for guess-the-number; for the calculator, what the task's mode says."""
    messages = body["messages"]
    prompt = messages[0]["content"]
    if prompt.startswith("I am thinking"):
        low, high = 1, 100
        for said, answer in zip(messages[1::2], messages[2::2]):
            guess = int(re.search(r"<guess>(\d+)</guess>", said["content"]).group(1))
            low, high = (guess + 1, high) if answer["content"] == "higher" else (low, guess - 1)
        return {"content": f"<guess>{(low + high) // 2}</guess>"}
    if not prompt.startswith("What is"):
        return {"content": "hello"}  # broken_env: its step raises whatever the model says
    mode = prompt.split()[-1]
    assert [t["function"]["name"] for t in body["tools"]] == ["add", "hang"]
    last = messages[-1]
    if last["role"] == "tool" and not last["content"].startswith("error"):
        return {"content": f"The answer is {last['content']}"}
    if mode == "malformed" and last["role"] == "user":
        return {"content": '<tool_call>{"name": "add", "arguments": {"a": 2,</tool_call>'}
    if mode == "hang":
        return {"content": '<tool_call>{"name": "hang", "arguments": {"seconds": 600}}</tool_call>'}
    return {"content": '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'}


def environment_tasks(path: Path, guess_number) -> Path:
    rows = [row for row in guess_number.guess_number_tasks(count=3)]
    for row, secret in zip(rows, SECRETS):
        row["verification_info"] = {"secret": secret, "low": 1, "high": 100}
        row["problem_id"] = f"guess-{secret}"
    for mode in CALCULATOR_MODES:
        rows.append(
            {
                "problem_id": f"calc-{mode}",
                "task_type": "calculator",
                "prompt": f"What is 2 + 3? {mode}",
                "verification_info": {"a": 2, "b": 3},
            }
        )
    rows.append({"problem_id": "broken", "task_type": "broken_env", "prompt": "x", "verification_info": {}})
    return write_jsonl(path, rows)


@pytest.fixture
def environment_env(monkeypatch):
    """Environment for `genesys` subprocesses that loads the example plugin and the tool environment."""
    monkeypatch.setenv("GENESYS_PLUGINS", "genesys_guess_number,genesys_toolenv")
    path = [str(SUPPORT), str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    return dict(os.environ)


def genesys_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GENESYS, *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_generate_plays_environments_through_an_openai_server_and_verify_rescores(
    tmp_path, guess_number, environment_env
):
    tasks = environment_tasks(tmp_path / "tasks.jsonl", guess_number)
    output = tmp_path / "out.jsonl"
    with ScriptedChatServer(policy) as server:
        command = [
            "generate",
            "--tasks",
            str(tasks),
            "--model",
            "scripted",
            "-o",
            str(output),
            "--backend",
            "openai",
            "--base-url",
            server.base_url,
            "-n",
            "2",
            "--verify",
            "--no-progress",
        ]
        result = genesys_cli(*command, env=environment_env)
        assert result.returncode == 0, result.stderr
        rows = {row["response_id"]: row for row in read_jsonl(output)}
        assert len(rows) == 14
        by_problem: dict[str, list[dict[str, Any]]] = {}
        for row in rows.values():
            by_problem.setdefault(row["problem_id"], []).append(row)
        expected_guesses = {37: 3, 1: 6, 100: 7}  # binary search over 1..100
        for secret, guesses in expected_guesses.items():
            for row in by_problem[f"guess-{secret}"]:
                assert row["turns"] == guesses and row["error"] is None
                assert row["score"] == pytest.approx(1.0 - 0.1 * (guesses - 1))
                assert row["messages"][-1] == {"role": "user", "content": "correct"}
                assert row["llm_response"] == f"<guess>{secret}</guess>"
        for row in by_problem["calc-ok"]:
            assert row["score"] == 1.0 and row["llm_response"] == "The answer is 5"
            assert {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "5"} in row[
                "messages"
            ]
        for row in by_problem["calc-malformed"]:
            assert row["score"] == 1.0 and row["turns"] == 3
            assert row["messages"][2]["content"].startswith("error: the tool call is not valid JSON")
        for row in by_problem["calc-hang"]:
            assert row["score"] is None and row["error"] == "turn 1: tool 'hang' passed its 1 s deadline"
        for row in by_problem["broken"]:
            assert (
                row["score"] is None
                and row["error"] == "turn 1: step raised RuntimeError: the environment broke"
            )

        # The same command again: nothing is missing, nothing is played twice.
        asked = len(server.requests)
        again = genesys_cli(*command, env=environment_env)
        assert again.returncode == 0, again.stderr
        assert len(server.requests) == asked and len(read_jsonl(output)) == 14

    rescored = tmp_path / "rescored.jsonl"
    result = genesys_cli("verify", str(output), "-o", str(rescored), "--no-progress", env=environment_env)
    assert result.returncode == 0, result.stderr
    again = {row["response_id"]: row for row in read_jsonl(rescored)}
    assert {k: (r["score"], r["error"]) for k, r in again.items()} == {
        k: (r["score"], r["error"]) for k, r in rows.items()
    }


def test_a_backend_without_play_of_its_own_plays_with_batched_turns(tmp_path, guess_number, environment_env):
    """The test plugins' scripted backend answers with the prompt's last words, never a guess nor a tool call."""
    tasks = environment_tasks(tmp_path / "tasks.jsonl", guess_number)
    environment_env["GENESYS_PLUGINS"] += ",genesys_testplugins"
    output = tmp_path / "o.jsonl"
    result = genesys_cli(
        "generate", "--tasks", str(tasks), "--model", "m", "-o", str(output), "--backend", "scripted",
        "--verify", "--no-progress", env=environment_env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {row["problem_id"]: row for row in read_jsonl(output)}
    for secret in SECRETS:
        row = rows[f"guess-{secret}"]
        assert row["turns"] == guess_number.GuessNumber.max_turns and row["finish_reason"] == "max_turns"
        assert row["score"] == 0.0 and row["error"] is None
        assert [m["role"] for m in row["messages"]] == ["user"] + ["assistant", "user"] * 8
        assert row["messages"][1]["content"] == " or correct. #0"  # what the scripted backend says
    assert rows["calc-ok"]["turns"] == 1 and rows["calc-ok"]["score"] == 0.0


def test_the_turn_batcher_samples_the_turns_of_many_rollouts_together(guess_number):
    from genesys.generate.backend import Completion, GenerationRequest, GenerationResult
    from genesys.generate.episodes import play_batched

    class Recorder:
        name = "recorder"
        batches: list[int] = []

        async def generate(self, requests):
            requests = list(requests)
            self.batches.append(len(requests))
            for request in requests:
                yield GenerationResult(request, None, [Completion("<guess>50</guess>", None, None, "stop")])

    rows = guess_number.guess_number_tasks(count=5)
    episodes = {str(i): (guess_number.GuessNumber, genesys.Task.from_row(row)) for i, row in enumerate(rows)}
    requests = [GenerationRequest(key, [], [0, 1, 2], seed=1) for key in episodes]

    async def collect():
        return [result async for result in play_batched(Recorder(), requests, episodes, linger_s=60)]

    results = asyncio.run(collect())
    assert sorted(r.request.key for r in results) == sorted(episodes)
    assert all(len(r.completions) == 3 for r in results)
    assert Recorder.batches[0] == 15  # every rollout's first turn in one batch
    assert sum(Recorder.batches) == sum(c.trajectory["turns"] for r in results for c in r.completions)


SLOW_RESET_DONE = threading.Event()


class SlowToOpen(genesys.Environment):
    """One model turn; the task whose prompt is "slow" resets (in its thread) only once
    SLOW_RESET_DONE is set."""

    task_type = "slow_to_open"
    max_turns = 1

    def reset(self, task):
        if task.prompt == "slow":
            SLOW_RESET_DONE.wait(30)
        return [{"role": "user", "content": task.prompt}]

    def step(self, task, messages):
        return genesys.Step([], done=True)

    def score(self, task, messages):
        return genesys.Verdict(score=1.0)


@pytest.mark.parametrize("linger_s", [60, 0.05])
def test_a_batch_waits_for_a_rollout_whose_environment_is_still_resetting_up_to_the_linger(linger_s):
    """With a linger that outlasts the slow reset (done after 0.3 s), the first batch holds every
    rollout's turn. With a short one, the first batch goes without the slow rollout's turn (its
    reset is done only once that batch reached the backend), which then comes in a later batch."""
    from genesys.generate.backend import Completion, GenerationRequest, GenerationResult
    from genesys.generate.episodes import play_batched

    batches: list[list[str]] = []
    SLOW_RESET_DONE.clear()

    class Recorder:
        name = "recorder"

        async def generate(self, requests):
            requests = list(requests)
            batches.append([request.messages[-1]["content"] for request in requests])
            SLOW_RESET_DONE.set()
            for request in requests:
                yield GenerationResult(request, None, [Completion("done", None, None, "stop")])

    prompts = ["quick", "quick", "slow", "quick"]
    episodes = {
        str(i): (SlowToOpen, genesys.Task(task_type="slow_to_open", prompt=p)) for i, p in enumerate(prompts)
    }
    requests = [GenerationRequest(key, [], [0], seed=1) for key in episodes]

    async def collect():
        return [r async for r in play_batched(Recorder(), requests, episodes, linger_s=linger_s)]

    timer = threading.Timer(0.3, SLOW_RESET_DONE.set) if linger_s == 60 else None
    if timer is not None:
        timer.start()
    try:
        results = asyncio.run(collect())
    finally:
        if timer is not None:
            timer.cancel()
    assert all(r.completions[0].trajectory["trajectory_error"] is None for r in results)
    if linger_s == 60:
        assert sorted(batches[0]) == sorted(prompts)
    else:
        assert "slow" not in batches[0] and len(batches) >= 2
    assert sorted(prompt for batch in batches for prompt in batch) == sorted(prompts)


@pytest.mark.slow
def test_the_transformers_backend_plays_an_environment(tmp_path, tiny_model, guess_number, environment_env):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", guess_number.guess_number_tasks(count=2))
    output = tmp_path / "o.jsonl"
    result = genesys_cli(
        "generate", "--tasks", str(tasks), "--model", tiny_model, "-o", str(output), "--backend", "transformers",
        "-n", "2", "--max-tokens", "6", "--verify", "--no-progress", env=environment_env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = read_jsonl(output)
    assert len(rows) == 4
    for row in rows:
        assert row["error"] is None and row["score"] is not None
        assert 1 <= row["turns"] <= guess_number.GuessNumber.max_turns
        assert sum(m["role"] == "assistant" for m in row["messages"]) == row["turns"]


def test_the_built_in_python_math_environment_grades_the_final_answer_with_the_math_verifier():
    from genesys.verifiers import math_python
    from genesys.verifiers.math_python import PythonMath

    # A built-in plugin (entry point math_python); registered here by hand, so the test does not
    # depend on the installed entry points being current.
    pm = new_plugin_manager(load_entry_points=False, extra_plugins=[math_python])
    assert environments(pm) == {"math_python": PythonMath}

    class Unsandboxed(PythonMath):
        tools = (python_tool("subprocess"),)

    chat = scripted(
        '<tool_call>{"name": "python", "arguments": {"code": "print(sum(range(101)))"}}</tool_call>',
        "The sum is \\boxed{5050}.",
    )
    math_task = genesys.Task(
        task_type="math_python", prompt="Sum 0..100.", verification_info={"ground_truth": "5050"}
    )
    trajectory = asyncio.run(play(Unsandboxed, math_task, chat))
    assert trajectory.messages[0]["role"] == "system" and trajectory.messages[3]["content"].strip() == "5050"
    assert PythonMath().score(math_task, trajectory.messages).score == 1.0
    wrong = [*trajectory.messages[:-1], {"role": "assistant", "content": "\\boxed{5051}"}]
    assert PythonMath().score(math_task, wrong).score == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("output_name", ["out.jsonl", "shards"])
def test_playing_resumes_after_sigkill_without_playing_a_rollout_twice(
    tmp_path, guess_number, environment_env, output_name
):
    import signal
    import time

    from genesys.data.inputs import resolve_inputs
    from genesys.data.io import iter_rows

    tasks = write_jsonl(tmp_path / "tasks.jsonl", guess_number.guess_number_tasks(count=24, seed=5))
    output = tmp_path / output_name

    def slow_policy(body):
        time.sleep(0.02)
        return policy(body)

    def written_rows():
        return [item.row for item in iter_rows(resolve_inputs([str(output)]))] if output.exists() else []

    with ScriptedChatServer(slow_policy) as server:
        command = [GENESYS, "generate", "--tasks", str(tasks), "--model", "scripted", "-o", str(output),
                   "--backend", "openai", "--base-url", server.base_url, "-n", "2", "--concurrency", "2",
                   "--no-progress"]  # fmt: skip
        first = subprocess.Popen(
            command, env=environment_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
            if output_name == "out.jsonl" and output.exists() and output.stat().st_size > 0:
                break
            if output_name == "shards" and list(output.glob("*.parquet")):
                break
        first.send_signal(signal.SIGKILL)
        first.wait()
        before = len(written_rows())
        assert 0 < before < 48, "the first run should be killed midway"
        finished = subprocess.run(command, env=environment_env, capture_output=True, text=True, timeout=600)
        assert finished.returncode == 0, finished.stderr
    rows = written_rows()
    ids = [row["response_id"] for row in rows]
    assert len(ids) == 48 and len(set(ids)) == 48
    for row in rows:
        messages = row["messages"] if isinstance(row["messages"], list) else json.loads(row["messages"])
        assert messages[-1] == {"role": "user", "content": "correct"}
        assert row["turns"] == sum(m["role"] == "assistant" for m in messages)


def test_an_environment_returning_no_messages_or_failing_to_start_is_an_error_not_a_crash():
    class Mute(genesys.Environment):
        task_type = "mute"

        def reset(self, task):
            return "hello"

    class Talkative(genesys.Environment):
        task_type = "talkative"

        def step(self, task, messages):
            return genesys.Step(["not a message"])

    class Unstartable(genesys.Environment):
        task_type = "unstartable"

        def __init__(self):
            raise OSError("no database")

    assert asyncio.run(play(Mute, task("mute"), scripted())).error == (
        "turn 0: reset returned 'hello', not a list of chat messages with a role"
    )
    assert asyncio.run(play(Talkative, task("talkative"), scripted("hi"))).error.startswith(
        "turn 1: step returned"
    )
    assert asyncio.run(play(Unstartable, task("unstartable"), scripted())).error == (
        "turn 0: Unstartable() raised OSError: no database"
    )


def test_an_async_tool_is_awaited_and_cancelled_at_its_deadline():
    async def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: what to look up
        """
        if key == "slow":
            await asyncio.sleep(600)
        return key.upper()

    class Lookup(genesys.Environment):
        task_type = "lookup"
        tools = (lookup,)
        tool_timeout = 0.3

    chat = scripted(
        '<tool_call>{"name": "lookup", "arguments": {"key": "fast"}}</tool_call>',
        '<tool_call>{"name": "lookup", "arguments": {"key": "slow"}}</tool_call>',
    )
    trajectory = asyncio.run(play(Lookup, task("lookup"), chat))
    assert trajectory.messages[2]["content"] == "FAST"
    assert trajectory.error == "turn 2: tool 'lookup' passed its 0.3 s deadline"


# --- isolation = "process": a hard kill for sync code --------------------------------------------


def _gone(pid: int, within: float = 30.0) -> bool:
    """Whether process `pid` has exited (and been reaped) within `within` seconds."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_an_isolated_environment_keeps_its_state_in_a_process_of_its_own(toolenv):
    trajectory = asyncio.run(play(toolenv.Stubborn, task("stubborn"), scripted("a", "b", "c", "d")))
    assert trajectory.error is None and trajectory.finish_reason == "max_turns"
    replies = [m["content"].split() for m in trajectory.messages if m["role"] == "user"][1:]
    assert [steps for _, steps in replies] == ["1", "2", "3", "4"]  # one instance, its state kept
    pids = {int(pid) for pid, _ in replies}
    assert len(pids) == 1 and os.getpid() not in pids
    assert _gone(pids.pop())  # the process ends with its rollout


@pytest.mark.parametrize(
    "move, error",
    [
        ("spin", "turn 2: step passed its 1 s deadline"),
        (
            '<tool_call>{"name": "hang", "arguments": {"seconds": 600}}</tool_call>',
            "turn 2: tool 'hang' passed its 1 s deadline",
        ),
        ("exit", "turn 2: step: the environment's process died (exit code 3)"),
        ("raise", "turn 2: step raised ValueError: a bad move"),
    ],
)
def test_sync_code_of_an_isolated_environment_that_hangs_is_killed_at_its_deadline(toolenv, move, error):
    """A spinning step or a sleeping tool is stopped: its process is killed, so nothing of it runs on."""
    trajectory = asyncio.run(play(toolenv.Stubborn, task("stubborn"), scripted("first", move)))
    assert trajectory.error == error and trajectory.turns == 2
    pid = int(trajectory.messages[2]["content"].split()[0])
    assert _gone(pid)
