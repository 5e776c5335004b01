"""The openai backend: generation through an OpenAI-compatible server (HTTP client in `genesys.openai_client`).

Works with any server speaking the protocol (vLLM, SGLang, hosted APIs). Logprobs are requested
and kept when the server returns them. Token ids are kept when the server returns them: vLLM does
with `--backend-arg return_token_ids=true` (ids in `token_ids`) or
`--backend-arg return_tokens_as_token_ids=true` (tokens written `token_id:N`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from genesys.generate.backend import Completion, GenerationRequest, GenerationResult, PromptStyle, Weights
from genesys.openai_client import APIError, OpenAIClient, resolve_base_url
from genesys.tasks.prompts import raw_text

if TYPE_CHECKING:
    from genesys.environments import ChatFunction, Environment
    from genesys.schema import Task

# --- mapping replies to completions ---------------------------------------------------------------


def _ids_from_tokens(tokens: list[str] | None) -> list[int] | None:
    """Token ids from tokens written as `token_id:N` (vLLM's return_tokens_as_token_ids)."""
    if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return None
    return [int(t.split(":", 1)[1]) for t in tokens]


def completion_from_chat_choice(choice: dict[str, Any]) -> Completion:
    """A Completion from one `choices[i]` of a chat completion reply."""
    message = choice.get("message") or {}
    text = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:  # servers that split the reasoning out: keep the whole response in llm_response
        text = f"<think>\n{reasoning}\n</think>\n\n{text}"
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = [float(t["logprob"]) for t in content] if content else None
    ids = choice.get("token_ids") or _ids_from_tokens([t.get("token") for t in content] if content else None)
    return Completion(
        text=text, completion_ids=ids, logprobs=logprobs, finish_reason=choice.get("finish_reason")
    )


def completion_from_text_choice(choice: dict[str, Any]) -> Completion:
    """A Completion from one `choices[i]` of a (legacy) completion reply."""
    block = choice.get("logprobs") or {}
    token_logprobs = block.get("token_logprobs")
    logprobs = [float(x) for x in token_logprobs] if token_logprobs else None
    ids = choice.get("token_ids") or _ids_from_tokens(block.get("tokens"))
    return Completion(
        text=choice.get("text") or "",
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason=choice.get("finish_reason"),
    )


def _choices_in_order(reply: dict[str, Any], n: int, where: str) -> list[dict[str, Any]]:
    choices = sorted(reply.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != n:
        raise APIError(f"{where}: asked for n={n} completions, the server returned {len(choices)}")
    return choices


# --- the backend -------------------------------------------------------------------------------


class OpenAIBackend:
    """Generation through an OpenAI-compatible server.

    With a chat template (the default) requests go to `chat/completions`; a continuation prefix
    is sent as a final assistant message with `continue_final_message` (a vLLM extension). With
    `PromptStyle(chat_template=False)` the raw prompt text goes to `completions`. A task's samples
    go in one request (`n`), or one request each with `split_samples` (for servers without `n`).
    `request_fields` are added to every request body (e.g. `top_k`, `return_token_ids`).
    The server owns its weights: `update_weights` is refused and `weights_version` stays 0.
    """

    name = "openai"

    def __init__(
        self,
        model: str,
        style: PromptStyle,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        concurrency: int = 64,
        max_retries: int = 8,
        logprobs: bool = True,
        split_samples: bool = False,
        request_fields: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.style = style
        self.client_options = {
            "base_url": base_url,
            "api_key": api_key,
            "concurrency": concurrency,
            "max_retries": max_retries,
        }
        self.concurrency = concurrency
        self.logprobs = logprobs
        self.split_samples = split_samples
        self.request_fields = dict(request_fields or {})
        self.weights_version = 0

    def info(self) -> dict[str, Any]:
        return {"backend": self.name, "endpoint": resolve_base_url(self.client_options["base_url"])}

    def close(self) -> None:
        pass

    async def update_weights(self, weights: Weights, version: int | None = None) -> None:
        raise NotImplementedError(
            f"the openai backend samples from the server at {resolve_base_url(self.client_options['base_url'])}, "
            "which cannot take weights from this process; use the transformers or vllm backend to generate with new weights"
        )

    def request_body(self, request: GenerationRequest, samples: list[int]) -> dict[str, Any]:
        """The JSON body asking for `samples` (sample indices) of the request's task."""
        sampling = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "n": len(samples),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": request.seed + samples[0],
        }
        if self.style.chat_template:
            messages = list(request.messages)
            if self.style.continuation_prefix:
                messages.append({"role": "assistant", "content": self.style.continuation_prefix})
                body.update(continue_final_message=True, add_generation_prompt=False)
            body["messages"] = messages
            if self.logprobs:
                body.update(logprobs=True, top_logprobs=0)
        else:
            body["prompt"] = raw_text(request.messages) + self.style.continuation_prefix
            if self.logprobs:
                body["logprobs"] = 0
        body.update(self.request_fields)
        return body

    async def _one(self, client: OpenAIClient, request: GenerationRequest) -> GenerationResult:
        if self.split_samples:
            parts = await asyncio.gather(
                *(self._ask(client, request, [sample]) for sample in request.sample_indices)
            )
            return GenerationResult(
                request, parts[0][0], [completion for _, completions in parts for completion in completions]
            )
        prompt_ids, completions = await self._ask(client, request, request.sample_indices)
        return GenerationResult(request, prompt_ids, completions)

    async def _ask(
        self, client: OpenAIClient, request: GenerationRequest, samples: list[int]
    ) -> tuple[list[int] | None, list[Completion]]:
        """One HTTP request for `samples` of the task: the prompt ids (when given) and the completions."""
        body = self.request_body(request, samples)
        where = f"task {request.key}"
        if self.style.chat_template:
            reply = await client.chat(body)
            completions = [
                completion_from_chat_choice(c) for c in _choices_in_order(reply, len(samples), where)
            ]
        else:
            reply = await client.complete(body)
            completions = [
                completion_from_text_choice(c) for c in _choices_in_order(reply, len(samples), where)
            ]
        return reply.get("prompt_token_ids"), completions

    async def generate(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]:
        """Results as they finish; at most twice `concurrency` requests are started ahead."""
        async with OpenAIClient(**self.client_options) as client:
            async for result in _as_finished(
                requests, lambda request: self._one(client, request), self.concurrency
            ):
                yield result

    async def play(
        self, requests: Iterable[GenerationRequest], episodes: Mapping[str, tuple[type[Environment], Task]]
    ) -> AsyncIterator[GenerationResult]:
        """Play each request's samples in its environment (`episodes[request.key]`: the environment
        and the task), all concurrently; each completion carries its trajectory. Results as they finish."""
        from genesys.environments import play
        from genesys.generate.episodes import completion_of

        async def one(request: GenerationRequest) -> GenerationResult:
            environment, task = episodes[request.key]
            trajectories = await asyncio.gather(
                *(
                    play(environment, task, self._chat(client, request, sample))
                    for sample in request.sample_indices
                )
            )
            return GenerationResult(request, None, [completion_of(t) for t in trajectories])

        async with OpenAIClient(**self.client_options) as client:
            async for result in _as_finished(requests, one, self.concurrency):
                yield result

    def _chat(self, client: OpenAIClient, request: GenerationRequest, sample: int) -> ChatFunction:
        """The model turns of one rollout: a chat request per turn (the tools' schemas shown to the
        chat template), the assistant's message back, its structured `tool_calls` kept."""

        async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
            sampling = request.sampling
            body: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "n": 1,
                "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "seed": request.seed + sample,
            }
            if tools:
                body["tools"] = tools
            body.update(self.request_fields)
            reply = await client.chat(body)
            choice = _choices_in_order(reply, 1, f"task {request.key}")[0]
            message: dict[str, Any] = {
                "role": "assistant",
                "content": completion_from_chat_choice(choice).text,
            }
            tool_calls = (choice.get("message") or {}).get("tool_calls")
            if tool_calls:
                message["tool_calls"] = tool_calls
            return message

        return chat


async def _as_finished(
    requests: Iterable[GenerationRequest],
    work: Callable[[GenerationRequest], Awaitable[GenerationResult]],
    concurrency: int,
) -> AsyncIterator[GenerationResult]:
    """`work` on each request, results as they finish; at most twice `concurrency` started ahead."""
    pending: set[asyncio.Future[GenerationResult]] = set()
    try:
        for request in requests:
            pending.add(asyncio.ensure_future(work(request)))
            while len(pending) >= 2 * concurrency:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    yield task.result()
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                yield task.result()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
