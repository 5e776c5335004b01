"""The OpenAI-compatible client, backend and LLM judge against a local server speaking the protocol."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import genesys
from genesys.config import VerifyConfig
from genesys.generate.backend import GenerationRequest, PromptStyle, SamplingConfig, iterate
from genesys.generate.openai import OpenAIBackend
from genesys.openai_client import APIError, OpenAIClient
from genesys.tasks.prompts import build_messages
from genesys.verifiers.llm_judge import LLMJudge, final_answer, parse_rating

GENESYS = str(Path(sys.executable).with_name("genesys"))


class FakeServer:
    """A small OpenAI-compatible server: chat and text completions with logprobs, scripted failures."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.failures: deque[int] = deque()  # statuses to answer with before succeeding
        self.requests: list[tuple[str, dict, dict]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append((self.path, body, dict(self.headers)))
                    failure = server.failures.popleft() if server.failures else None
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay)
                    if failure is not None:
                        self._send(
                            failure,
                            {"error": {"message": "try later"}},
                            {"Retry-After": "0"} if failure == 429 else {},
                        )
                    elif self.path == "/v1/chat/completions":
                        self._send(200, server.chat_reply(body))
                    elif self.path == "/v1/completions":
                        self._send(200, server.text_reply(body))
                    else:
                        self._send(404, {"error": {"message": "no such route"}})
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _send(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        return Handler

    @staticmethod
    def _tokens(index: int) -> list[int]:
        return [10 + index, 20 + index, 30 + index]

    def chat_reply(self, body: dict) -> dict:
        prompt = body["messages"][-1]["content"]
        if "RESPONSE TO GRADE:" in prompt:
            graded = prompt.split("RESPONSE TO GRADE:", 1)[1]
            text = (
                "No idea."
                if "mumble" in graded
                else ("Matches. RATING: 8" if "42" in graded else "Wrong. RATING: 1")
            )
            return {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ]
            }
        choices = []
        for index in reversed(range(body.get("n", 1))):  # out of order on purpose
            ids = self._tokens(index)
            tokens = [f"token_id:{t}" if body.get("return_tokens_as_token_ids") else f"t{t}" for t in ids]
            choice = {
                "index": index,
                "message": {"role": "assistant", "content": f"answer {index}: <answer>1 + 2</answer>"},
                "finish_reason": "length" if index else "stop",
                "logprobs": {
                    "content": [
                        {"token": tok, "logprob": -0.1 * (k + 1), "bytes": None, "top_logprobs": []}
                        for k, tok in enumerate(tokens)
                    ]
                }
                if body.get("logprobs")
                else None,
            }
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
            choices.append(choice)
        reply = {"id": "x", "object": "chat.completion", "model": body["model"], "choices": choices}
        if body.get("return_token_ids"):
            reply["prompt_token_ids"] = [1, 2, 3, 4]
        return reply

    def text_reply(self, body: dict) -> dict:
        choices = [
            {
                "index": i,
                "text": f"continued {i}",
                "finish_reason": "stop",
                "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25]}
                if body.get("logprobs") is not None
                else None,
            }
            for i in range(body.get("n", 1))
        ]
        return {"id": "y", "object": "text_completion", "choices": choices}

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    with FakeServer() as fake:
        yield fake


def _requests(count: int, n: int, sampling: SamplingConfig | None = None) -> list[GenerationRequest]:
    sampling = sampling or SamplingConfig()
    return [
        GenerationRequest(
            f"task{i}",
            build_messages(f"question {i}", "system words"),
            list(range(n)),
            seed=i,
            sampling=sampling,
        )
        for i in range(count)
    ]


def _generate(backend: OpenAIBackend, requests: list[GenerationRequest]) -> list:
    return list(iterate(backend.generate(requests)))


def test_chat_backend_maps_text_logprobs_and_token_ids(server):
    backend = OpenAIBackend(
        "served-model",
        PromptStyle(),
        base_url=server.base_url,
        api_key="sekret",
        request_fields={"return_token_ids": True},
    )
    results = {
        r.request.key: r
        for r in _generate(
            backend, _requests(3, 2, SamplingConfig(max_tokens=64, temperature=0.6, top_p=0.95))
        )
    }
    assert sorted(results) == ["task0", "task1", "task2"]
    for result in results.values():
        assert result.prompt_ids == [1, 2, 3, 4]
        first, second = result.completions  # put back in index order
        assert (
            first.text.startswith("answer 0")
            and first.finish_reason == "stop"
            and second.finish_reason == "length"
        )
        assert first.completion_ids == [10, 20, 30] and second.completion_ids == [11, 21, 31]
        assert first.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    path, body, headers = server.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sekret"
    assert body["model"] == "served-model" and body["n"] == 2 and body["max_tokens"] == 64
    assert body["temperature"] == 0.6 and body["top_p"] == 0.95 and body["logprobs"] is True
    assert (
        body["messages"][0] == {"role": "system", "content": "system words"}
        and body["return_token_ids"] is True
    )


def test_token_ids_written_as_tokens_are_parsed(server):
    backend = OpenAIBackend(
        "m", PromptStyle(), base_url=server.base_url, request_fields={"return_tokens_as_token_ids": True}
    )
    [result] = _generate(backend, _requests(1, 1))
    assert result.completions[0].completion_ids == [10, 20, 30] and result.prompt_ids is None


def test_without_logprobs_from_the_server_fields_stay_empty(server):
    backend = OpenAIBackend("m", PromptStyle(), base_url=server.base_url, logprobs=False)
    [result] = _generate(backend, _requests(1, 1))
    assert result.completions[0].logprobs is None and result.completions[0].completion_ids is None
    assert "logprobs" not in server.requests[0][1]


def test_continuation_prefix_continues_an_assistant_message(server):
    backend = OpenAIBackend("m", PromptStyle(continuation_prefix="<think>\n"), base_url=server.base_url)
    _generate(backend, _requests(1, 1))
    body = server.requests[0][1]
    assert body["messages"][-1] == {"role": "assistant", "content": "<think>\n"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_raw_prompts_use_the_completions_endpoint(server):
    backend = OpenAIBackend(
        "m", PromptStyle(chat_template=False, continuation_prefix=">>"), base_url=server.base_url
    )
    [result] = _generate(backend, _requests(1, 2, SamplingConfig(n=2)))
    path, body, _ = server.requests[0]
    assert path == "/v1/completions" and body["prompt"] == "system words\n\nquestion 0>>"
    assert [c.text for c in result.completions] == ["continued 0", "continued 1"]
    assert result.completions[0].logprobs == [-0.5, -0.25]


def test_retries_429_and_5xx_then_succeeds(server):
    server.failures.extend([429, 503, 500])
    backend = OpenAIBackend("m", PromptStyle(), base_url=server.base_url)

    async def call():
        async with OpenAIClient(server.base_url, max_retries=4, backoff=0.01) as client:
            return await client.chat(backend.request_body(_requests(1, 1)[0], [0]))

    reply = asyncio.run(call())
    assert reply["choices"][0]["message"]["content"].startswith("answer 0")
    assert len(server.requests) == 4


def test_gives_up_after_the_retries_and_at_once_on_a_client_error(server):
    async def call(max_retries):
        async with OpenAIClient(server.base_url, max_retries=max_retries, backoff=0.01) as client:
            return await client.chat({"model": "m", "messages": []})

    server.failures.extend([503, 503, 503])
    with pytest.raises(APIError, match="failed after 3 attempts: HTTP 503"):
        asyncio.run(call(2))
    server.requests.clear()
    server.failures.extend([400])
    with pytest.raises(APIError, match="refused the request: HTTP 400") as error:
        asyncio.run(call(5))
    assert error.value.status == 400 and len(server.requests) == 1


def test_concurrency_is_bounded():
    with FakeServer(delay=0.05) as slow:
        backend = OpenAIBackend("m", PromptStyle(), base_url=slow.base_url, concurrency=3)
        results = _generate(backend, _requests(15, 1))
        assert len(results) == 15
        assert 2 <= slow.max_in_flight <= 3


def test_iterate_stops_the_generator_when_abandoned():
    closed = []

    async def numbers():
        try:
            for i in range(10):
                yield i
        finally:
            closed.append(True)

    iterator = iterate(numbers())
    assert [next(iterator), next(iterator)] == [0, 1]
    iterator.close()
    assert closed == [True]


def test_generate_command_with_the_openai_backend_and_verification(server, tmp_path):
    output = tmp_path / "rollouts.jsonl"
    result = subprocess.run(
        [
            GENESYS,
            "generate",
            "--tasks",
            "countdown:count=3",
            "--model",
            "served",
            "-o",
            str(output),
            "--backend",
            "openai",
            "--base-url",
            server.base_url,
            "-n",
            "2",
            "-B",
            "return_token_ids=true",
            "--verify",
            "--workers",
            "1",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 6 and len({r["response_id"] for r in rows}) == 6
    for row in rows:
        assert row["model_name"] == "served" and row["generation_config"]["backend"] == "openai"
        assert (
            row["prompt_ids"] == [1, 2, 3, 4]
            and len(row["completion_ids"]) == len(row["completion_logprobs"]) == 3
        )
        assert row["score"] == 0.0 and row["error"] is None  # "1 + 2" does not use the puzzle's numbers
        assert row["machine_info"]["endpoint"] == server.base_url


# --- the LLM judge ---------------------------------------------------------------------------------


def _judged(completion: str, **row) -> genesys.Rollout:
    return genesys.Rollout.from_row(
        {
            "task_type": "llm_judgeable_groundtruth_similarity",
            "prompt": "What is six times seven?",
            "gold_standard_solution": "42",
            "llm_response": completion,
            **row,
        }
    )


def _verify_all(judge: LLMJudge, rollouts: list[genesys.Rollout]) -> list[genesys.Verdict]:
    async def run():
        return [await judge.verify(r) for r in rollouts]

    judge.setup()
    return asyncio.run(run())


def test_rating_parsing_and_final_answer():
    assert parse_rating("reasons... RATING: 7\nmore RATING: 10") == 1.0
    assert (
        parse_rating("rating: 2.5") == 0.25
        and parse_rating("RATING: 30") == 1.0
        and parse_rating("none") is None
    )
    assert final_answer("<think>hmm 41</think>\n It is 42.") == "It is 42."


def test_judge_scores_errors_and_configuration(server):
    judge = LLMJudge({"judge_base_url": server.base_url, "judge_model": "judge", "judge_max_retries": 0})
    good, bad, mumble, no_reference = _verify_all(
        judge,
        [
            _judged("<think>6*7</think> 42"),
            _judged("41"),
            _judged("mumble"),
            _judged("42", gold_standard_solution=None),
        ],
    )
    assert good.score == 0.8 and good.error is None and "RATING: 8" in good.details["judge_reply"]
    assert bad.score == 0.1
    assert mumble.score is None and mumble.error.startswith("judge_unparseable")
    assert no_reference.score is None and no_reference.error.startswith("invalid_row")
    judged_prompt = server.requests[0][1]["messages"][0]["content"]
    assert "REFERENCE ANSWER:\n42" in judged_prompt and "6*7" not in judged_prompt


def test_judge_unreachable_or_unconfigured_is_an_error_not_a_zero(monkeypatch):
    monkeypatch.delenv("GENESYS_JUDGE_MODEL", raising=False)
    [unconfigured] = _verify_all(LLMJudge({}), [_judged("42")])
    assert unconfigured.score is None and unconfigured.error.startswith("judge_not_configured")
    with FakeServer() as gone:
        url = gone.base_url
    [down] = _verify_all(
        LLMJudge({"judge_base_url": url, "judge_model": "j", "judge_max_retries": 0}), [_judged("42")]
    )
    assert down.score is None and down.error.startswith("judge_unavailable")


def test_judge_in_the_verification_engine(server):
    options = {"judge_base_url": server.base_url, "judge_model": "judge"}
    rows = [
        {
            "task_type": "llm_judgeable_groundtruth_similarity",
            "prompt": "6*7?",
            "verification_info": {"ground_truth": "42"},
            "llm_response": answer,
        }
        for answer in ("42", "41", "the answer is 42")
    ]
    out = genesys.verify_rollouts(
        rows,
        config=VerifyConfig(workers=1, options=options, progress=False),
        verifiers={"llm_judgeable_groundtruth_similarity": LLMJudge},
    )
    assert [(r["score"], r["error"]) for r in out] == [(0.8, None), (0.1, None), (0.8, None)]


def test_generate_command_stops_with_one_line_when_the_server_keeps_failing(tmp_path):
    with FakeServer() as gone:
        url = gone.base_url
    result = subprocess.run(
        [
            GENESYS,
            "generate",
            "--tasks",
            "math-samples",
            "--max-tasks",
            "1",
            "--model",
            "m",
            "-o",
            str(tmp_path / "o.jsonl"),
            "--backend",
            "openai",
            "--base-url",
            url,
            "--max-retries",
            "1",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        "failed after 2 attempts" in result.stderr
        and "rerun the same command" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_split_samples_sends_one_request_per_sample(server):
    backend = OpenAIBackend(
        "m",
        PromptStyle(),
        base_url=server.base_url,
        split_samples=True,
        request_fields={"return_token_ids": True},
    )
    request = GenerationRequest("t", build_messages("q"), [1, 3, 4], seed=100)
    [result] = _generate(backend, [request])
    bodies = sorted((body for _, body, _ in server.requests), key=lambda b: b["seed"])
    assert [(b["n"], b["seed"]) for b in bodies] == [(1, 101), (1, 103), (1, 104)]
    assert len(result.completions) == 3 and result.prompt_ids == [1, 2, 3, 4]


def test_each_request_is_sent_with_its_own_sampling_settings(server):
    backend = OpenAIBackend("m", PromptStyle(), base_url=server.base_url)
    cold, hot = (
        _requests(1, 1, SamplingConfig(temperature=0.0, max_tokens=8))[0],
        _requests(2, 1, SamplingConfig(temperature=1.3, top_p=0.5))[1],
    )
    _generate(backend, [cold, hot])
    bodies = {body["messages"][-1]["content"]: body for _, body, _ in server.requests}
    assert (bodies["question 0"]["temperature"], bodies["question 0"]["max_tokens"]) == (0.0, 8)
    assert (
        bodies["question 1"]["temperature"],
        bodies["question 1"]["top_p"],
        bodies["question 1"]["max_tokens"],
    ) == (1.3, 0.5, 1024)


def test_a_server_cannot_take_new_weights(server):
    backend = OpenAIBackend("m", PromptStyle(), base_url=server.base_url)
    with pytest.raises(NotImplementedError, match="cannot take weights"):
        asyncio.run(backend.update_weights({}))
    assert backend.weights_version == 0
