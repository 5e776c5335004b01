"""Playing environment tasks on any generation backend: the model turns of every rollout in play are
gathered into batches for the backend's `generate`, so a token backend (transformers, vLLM) samples
the turns of many conversations together.

On a token backend (one with a `tokenizer`, see `genesys.generate.backend.Backend`) each rollout
keeps its `genesys.environments.tokens.TokenTrajectory`: every turn's prompt is the conversation's
tokens so far (`GenerationRequest.prompt_ids`), and the trajectory's row carries them with the mask
of the model's tokens and their logprobs. A backend with a `play` of its own (the openai backend,
which sends each turn as a chat request) uses that instead. `generate_and_play` sends each request
where its task belongs: to `generate`, or played in its environment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from genesys.generate.backend import Backend, Completion, GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from genesys.environments import Environment, Trajectory
    from genesys.environments.tokens import ModelTurn, TokenTrajectory
    from genesys.schema import Row, Task


LINGER_S = 0.05  # how long a batch waits for the turns of rollouts whose environment is still stepping


class ContextFull(RuntimeError):
    """A conversation has grown to the model's context length: no room for another model turn."""


class TurnBatcher:
    """Model turns asked by many rollouts at once, sent to `backend.generate` in batches of at most
    `max_batch`; one batch at a time, so a backend never runs two `generate`s together.

    A batch goes once every rollout in play (those between `join` and `leave`) is waiting for its
    turn, or `max_batch` turns wait, or `linger_s` has passed since the batcher began gathering it:
    a rollout whose environment step is still running (in a thread or a process of its own) is
    waited for that long, never more, instead of missing the batch and waiting for the next one.

    A turn whose prompt fills the backend's context (`max_model_len`, where a token backend has one)
    fails on its own with `ContextFull` (its rollout ends in an error naming the turn) and never
    goes to the engine, where it would fail the whole batch."""

    def __init__(self, backend: Backend, max_batch: int = 256, linger_s: float = LINGER_S) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.linger_s = linger_s
        self._waiting: list[tuple[GenerationRequest, asyncio.Future[tuple[Completion, int]]]] = []
        self._in_play = 0
        self._changed = asyncio.Event()  # set when a turn is asked or a rollout leaves
        self._runner: asyncio.Task[None] | None = None

    def join(self) -> None:
        """A rollout is in play: batches wait for its turns (see the class docstring)."""
        self._in_play += 1

    def leave(self) -> None:
        """A rollout has ended: batches no longer wait for it."""
        self._in_play -= 1
        self._changed.set()

    async def ask(self, request: GenerationRequest) -> tuple[Completion, int]:
        """The completion of one single-sample request, sampled in the next batch, and the weights
        version that sampled it."""
        future: asyncio.Future[tuple[Completion, int]] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        self._changed.set()
        if self._runner is None:
            self._runner = asyncio.ensure_future(self._run())
        return await future

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            while not self._waiting:
                self._changed.clear()
                await self._changed.wait()
            await self._gather()
            batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
            batch = [(request, future) for request, future in batch if self._fits(request, future)]
            if not batch:
                continue
            futures = {request.key: future for request, future in batch}
            try:
                async for result in self.backend.generate([request for request, _ in batch]):
                    future = futures.pop(result.request.key)
                    if not future.done():
                        future.set_result((result.completions[0], result.weights_version))
            except Exception as exc:  # the backend failed: every turn of the batch hears it
                for future in futures.values():
                    if not future.done():
                        future.set_exception(exc)
            else:
                for key, future in futures.items():
                    if not future.done():
                        future.set_exception(RuntimeError(f"the backend returned no completion for {key}"))

    async def _gather(self) -> None:
        """Wait until every rollout in play waits for its turn (or `max_batch` turns wait), at most
        `linger_s`; always one turn of the event loop, for rollouts ready to ask at once."""
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger_s
        while len(self._waiting) < min(self._in_play, self.max_batch):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return

    def _fits(self, request: GenerationRequest, future: asyncio.Future[Any]) -> bool:
        """Whether the turn's prompt leaves room for a token in the backend's context; if not, its
        future hears why."""
        limit = getattr(self.backend, "max_model_len", None)
        if limit is None or request.prompt_ids is None or len(request.prompt_ids) < limit:
            return True
        future.set_exception(
            ContextFull(
                f"the conversation has {len(request.prompt_ids)} tokens, the model's context "
                f"(max_model_len) holds {limit}: no room for another model turn"
            )
        )
        return False


def completion_of(
    trajectory: Trajectory, tokens: TokenTrajectory | None = None, turns: list[Completion] | None = None
) -> Completion:
    """A trajectory as a completion: the last answer as its text, the trajectory's columns with it,
    and with `tokens` its token ids, mask and logprobs. With proofs, the model `turns` (as the
    backend returned them) give theirs: every turn's TOPLOC proofs in turn order, each turn's tokens
    chunked on their own, and the seeded sampler when every turn was drawn by it."""
    completion = Completion(
        trajectory.final_answer, None, None, trajectory.finish_reason, trajectory=trajectory.columns()
    )
    if tokens is not None:
        columns = tokens.columns()
        completion.prompt_ids = columns["prompt_ids"]
        completion.completion_ids = columns["completion_ids"]
        completion.logprobs = columns["logprobs"]
        completion.completion_mask = columns["completion_mask"]
    if turns and all(turn.proofs is not None for turn in turns):
        completion.proofs = [proof for turn in turns for proof in turn.proofs or ()]
        completion.proof_settings = turns[-1].proof_settings
        samplers = {turn.sampler for turn in turns}
        completion.sampler = samplers.pop() if len(samplers) == 1 else None
    return completion


class _Rollout:
    """One sample of a request played: its model turns asked through the batcher, each seeded apart
    (`turn_seed`), and on a token backend its tokens kept (`TokenTrajectory`)."""

    def __init__(self, batcher: TurnBatcher, request: GenerationRequest, sample: int) -> None:
        self.batcher, self.request, self.sample = batcher, request, sample
        self.turns: list[Completion] = []  # the backend's completion of each model turn
        self.version: int | None = None  # the oldest weights version that sampled one of its turns
        self.tokens: TokenTrajectory | None = None
        backend = batcher.backend
        if getattr(backend, "tokenizer", None) is not None:
            from genesys.environments.tokens import TokenTrajectory

            self.tokens = TokenTrajectory(backend.tokenizer, backend.style)  # type: ignore[attr-defined]

    async def _sample(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], prompt_ids: list[int] | None
    ) -> Completion:
        from genesys.environments.tokens import turn_seed

        request = self.request
        turn = replace(
            request, key=f"{request.key}-{self.sample}-{len(self.turns)}", messages=list(messages),
            sample_indices=[0], seed=turn_seed(request.seed, self.sample, len(self.turns)),
            tools=tools or None, prompt_ids=prompt_ids,
        )  # fmt: skip
        completion, version = await self.batcher.ask(turn)
        self.turns.append(completion)
        self.version = version if self.version is None else min(self.version, version)
        return completion

    async def ask(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """The model's next message (`genesys.environments.ChatFunction`), on a backend without tokens."""
        completion = await self._sample(messages, tools, None)
        return {"role": "assistant", "content": completion.text}

    async def turn_on_tokens(
        self, prompt_ids: list[int], messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> ModelTurn:
        """The model's next turn after `prompt_ids` (`genesys.environments.tokens.TurnFunction`)."""
        from genesys.environments.tokens import ModelTurn

        completion = await self._sample(messages, tools, prompt_ids)
        if completion.completion_ids is None or completion.logprobs is None:
            raise RuntimeError(
                f"backend {self.batcher.backend.name!r} returned a turn without token ids or logprobs"
            )
        return ModelTurn(
            completion.completion_ids, completion.logprobs, completion.finish_reason, completion.text
        )

    async def play(self, environment: type[Environment], task: Task) -> Completion:
        """The whole rollout, as a completion carrying its trajectory (and tokens, and proofs)."""
        from genesys.environments import play
        from genesys.environments.tokens import play_on_tokens

        self.batcher.join()
        try:
            if self.tokens is None:
                return completion_of(await play(environment, task, self.ask))
            trajectory = await play_on_tokens(environment, task, self.tokens, self.turn_on_tokens)
        finally:
            self.batcher.leave()
        return completion_of(trajectory, self.tokens, self.turns)


async def play_batched(
    backend: Backend,
    requests: Iterable[GenerationRequest],
    episodes: Mapping[str, tuple[type[Environment], Task]],
    max_batch: int = 256,
    linger_s: float = LINGER_S,
) -> AsyncIterator[GenerationResult]:
    """Play each request's samples in its environment (`episodes[request.key]`), every rollout at
    once, their model turns batched through `backend.generate` (on token ids with a token backend;
    `max_batch` and `linger_s` as in `TurnBatcher`). Results as they finish, stamped with the oldest
    weights version that sampled one of their turns."""
    batcher = TurnBatcher(backend, max_batch, linger_s)

    async def one(request: GenerationRequest) -> GenerationResult:
        environment, task = episodes[request.key]
        rollouts = [_Rollout(batcher, request, sample) for sample in request.sample_indices]
        completions = await asyncio.gather(*(rollout.play(environment, task) for rollout in rollouts))
        versions = [r.version for r in rollouts if r.version is not None]
        return GenerationResult(
            request, None, list(completions), min(versions, default=getattr(backend, "weights_version", 0))
        )

    pending = [asyncio.ensure_future(one(request)) for request in requests]
    try:
        for finished in asyncio.as_completed(pending):
            yield await finished
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await batcher.close()


async def generate_and_play(
    backend: Backend, requests: Iterable[GenerationRequest], rows: Mapping[str, Row]
) -> AsyncIterator[GenerationResult]:
    """The results of `requests`, each for the task `rows[request.key]`: generated once, or played in
    the environment of the task's type (by the backend's own `play`, else `play_batched`)."""
    from genesys.plugins.registry import environments
    from genesys.schema import Task

    played = environments()
    requests = list(requests)
    single = [r for r in requests if rows[r.key]["task_type"] not in played]
    episodes = {
        r.key: (played[rows[r.key]["task_type"]], Task.from_row(rows[r.key]))
        for r in requests
        if rows[r.key]["task_type"] in played
    }
    if single:
        async for result in backend.generate(single):
            yield result
    if episodes:
        turns = [r for r in requests if r.key in episodes]
        own_play = getattr(backend, "play", None)
        results = (
            own_play(turns, episodes) if own_play is not None else play_batched(backend, turns, episodes)
        )
        async for result in results:
            yield result
