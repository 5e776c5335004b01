"""Playing environment tasks on any generation backend: the model turns of every rollout in play are
gathered into batches for the backend's `generate`, so a token backend (transformers, vLLM) samples
the turns of many conversations together.

A backend with a `play` of its own (the openai backend, which sends each turn as a chat request) uses
that instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from genesys.generate.backend import Backend, Completion, GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from genesys.environments import ChatFunction, Environment, Trajectory
    from genesys.schema import Task

TURN_SEED_STRIDE = 1_000_003  # turn t of sample s is seeded request.seed + s + t * stride


class TurnBatcher:
    """Model turns asked by many rollouts at once, sent to `backend.generate` in batches of at most
    `max_batch`; one batch at a time, so a backend never runs two `generate`s together."""

    def __init__(self, backend: Backend, max_batch: int = 256) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self._waiting: list[tuple[GenerationRequest, asyncio.Future[Completion]]] = []
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    async def ask(self, request: GenerationRequest) -> Completion:
        """The completion of one single-sample request, sampled in the next batch."""
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        self._wake.set()
        if self._runner is None:
            self._runner = asyncio.ensure_future(self._run())
        return await future

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(0)  # let every rollout that is ready ask its turn first
            batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
            if not self._waiting:
                self._wake.clear()
            if not batch:
                continue
            futures = {request.key: future for request, future in batch}
            try:
                async for result in self.backend.generate([request for request, _ in batch]):
                    future = futures.pop(result.request.key)
                    if not future.done():
                        future.set_result(result.completions[0])
            except Exception as exc:  # the backend failed: every turn of the batch hears it
                for future in futures.values():
                    if not future.done():
                        future.set_exception(exc)
            else:
                for key, future in futures.items():
                    if not future.done():
                        future.set_exception(RuntimeError(f"the backend returned no completion for {key}"))


def completion_of(trajectory: Trajectory) -> Completion:
    """A trajectory as a completion: the last answer as its text, the trajectory's columns with it."""
    return Completion(
        trajectory.final_answer, None, None, trajectory.finish_reason, trajectory=trajectory.columns()
    )


async def play_batched(
    backend: Backend,
    requests: Iterable[GenerationRequest],
    episodes: Mapping[str, tuple[type[Environment], Task]],
    max_batch: int = 256,
) -> AsyncIterator[GenerationResult]:
    """Play each request's samples in its environment (`episodes[request.key]`), every rollout at
    once, their model turns batched through `backend.generate`. Results as they finish."""
    from genesys.environments import play

    batcher = TurnBatcher(backend, max_batch)

    def chat(request: GenerationRequest, sample: int) -> ChatFunction:
        turns = 0

        async def ask(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
            nonlocal turns
            seed = request.seed + sample + turns * TURN_SEED_STRIDE
            turn = replace(
                request, key=f"{request.key}-{sample}-{turns}", messages=list(messages), sample_indices=[0],
                seed=seed, tools=tools or None,
            )  # fmt: skip
            turns += 1
            completion = await batcher.ask(turn)
            return {"role": "assistant", "content": completion.text}

        return ask

    async def one(request: GenerationRequest) -> GenerationResult:
        environment, task = episodes[request.key]
        trajectories = await asyncio.gather(
            *(play(environment, task, chat(request, sample)) for sample in request.sample_indices)
        )
        return GenerationResult(request, None, [completion_of(t) for t in trajectories])

    pending = [asyncio.ensure_future(one(request)) for request in requests]
    try:
        for finished in asyncio.as_completed(pending):
            yield await finished
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await batcher.close()
