"""What every generation backend takes and returns, how a backend is picked by name, and the bridge
from their async interface to synchronous code.

A backend is found through the `genesys_backends` plugin hook (the built-in ones too), registered as a
`BackendSpec` (`genesys.plugins.specs`, importable from here too), so this module knows no
implementation by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from genesys.config import PromptStyle, SamplingConfig
from genesys.errors import InputError
from genesys.plugins.registry import backend_specs
from genesys.plugins.specs import AUTO, BackendSpec

if TYPE_CHECKING:
    import pluggy

T = TypeVar("T")

# New weights for a backend: a state dict, or (parameter name, tensor) pairs as `named_parameters` gives.
Weights = Mapping[str, Any] | Iterable[tuple[str, Any]]


@dataclass
class GenerationRequest:
    """The missing samples of one task: `sample_indices` says which samples they are.

    `seed` is this request's sampling seed (backends derive its samples' randomness from it);
    `sampling` gives the temperature, top-p and token limit of this request. `tools`: the OpenAI-format
    schemas of the tools the model may call (a turn of an environment), handed to the chat template.
    `prompt_ids`: the prompt's token ids when the caller built them (a later turn of an environment
    played on tokens, `genesys.environments.tokens`); a token backend then samples after exactly these
    tokens, and `messages` only record the conversation.
    """

    key: str
    messages: list[dict[str, Any]]
    sample_indices: list[int]
    seed: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    tools: list[dict[str, Any]] | None = None
    prompt_ids: list[int] | None = None

    @property
    def n(self) -> int:
        return len(self.sample_indices)

    def prompt_token_ids(self, tokenizer: Any, style: PromptStyle) -> list[int]:
        """The token ids a token backend samples after: `prompt_ids` when given, else the messages
        (and tools) rendered with the chat template (`genesys.tasks.prompts.render_ids`)."""
        if self.prompt_ids is not None:
            return list(self.prompt_ids)
        from genesys.tasks.prompts import render_ids

        return render_ids(tokenizer, self.messages, style, self.tools)


@dataclass
class Completion:
    """One sampled completion. `logprobs[i]` is the logprob of `completion_ids[i]` under the
    distribution it was sampled from (temperature and top-p applied). A backend writing TOPLOC
    proofs sets `proofs` (base64) and `proof_settings` (their shape, the model and its weights' hash);
    one that drew the tokens with a sampler a validator can check names it in `sampler`
    (`genesys.proofs.sampling.SAMPLER`, keyed by the request's seed and the sample's index).

    A trajectory (a task played in an environment) carries its columns in `trajectory` (messages,
    turns, error); played on a token backend, its `completion_ids` are every token after its own
    opening `prompt_ids`, model turns and the environment's messages alike, and `completion_mask`
    says which the model sampled (1) and which the chat template rendered from the environment's or
    tools' messages (0, with logprob 0). Without a mask every completion token is the model's.
    """

    text: str
    completion_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    proofs: list[str] | None = None
    proof_settings: dict[str, Any] | None = None
    sampler: str | None = None
    trajectory: dict[str, Any] | None = None
    prompt_ids: list[int] | None = None
    completion_mask: list[int] | None = None

    @property
    def sampled_tokens(self) -> int:
        """How many tokens the model sampled for this completion (the environment's not counted)."""
        if self.completion_mask is not None:
            return sum(self.completion_mask)
        return len(self.completion_ids or self.logprobs or ())


@dataclass
class GenerationResult:
    """The completions of one request, in the order of its `sample_indices`.

    `weights_version` is the backend's `weights_version` when the completions were sampled (the
    oldest one, should new weights arrive between two of them).
    """

    request: GenerationRequest
    prompt_ids: list[int] | None
    completions: list[Completion] = field(default_factory=list)
    weights_version: int = 0


class Backend(Protocol):
    """A generation backend, built as `Backend(model, style, **options)`.

    `generate` yields results as they finish, in any order. `update_weights` loads new weights into
    the running model and stamps the results sampled after it with a new `weights_version`.
    A backend that can play multi-turn environments also has `play(requests, episodes)` (see the
    openai backend): `generate`'s results, each completion carrying its trajectory. A token backend
    (one sampling token ids, as transformers and vLLM do) has the `tokenizer` and prompt `style` it
    renders prompts with, and honours `GenerationRequest.prompt_ids`: environments played on it
    (`genesys.generate.episodes`) then get token trajectories. One with a context length gives it as
    `max_model_len`: a conversation that fills it ends its own rollout in an error, not its batch.
    """

    name: str
    weights_version: int

    def generate(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]: ...

    async def update_weights(self, weights: Weights, version: int | None = None) -> None: ...

    def info(self) -> dict[str, Any]:
        """Versions and devices, for the rollouts' `machine_info`."""
        ...

    def close(self) -> None: ...


def next_weights_version(current: int, version: int | None) -> int:
    """The version new weights get: `version` when given (it must be newer), else `current + 1`."""
    if version is None:
        return current + 1
    if version <= current:
        raise ValueError(f"weights version {version} is not newer than the backend's version {current}")
    return version


def iterate(results: AsyncIterator[T]) -> Iterator[T]:
    """Iterate an async iterator (e.g. `backend.generate(...)`) from synchronous code, on a private
    event loop. Leaving the loop early closes the async iterator and waits for its threads."""
    loop = asyncio.new_event_loop()
    step: asyncio.Future[T] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(results), loop=loop)
            try:
                item = loop.run_until_complete(step)
            except StopAsyncIteration:
                return
            yield item
    finally:
        if step is not None and not step.done():  # interrupted (e.g. Ctrl-C) while a step was running
            step.cancel()
            loop.run_until_complete(asyncio.gather(step, return_exceptions=True))
        aclose = getattr(results, "aclose", None)
        if aclose is not None:
            loop.run_until_complete(aclose())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


# --- picking a backend by name ----------------------------------------------------------------


def _by_priority(specs: Iterable[BackendSpec]) -> list[BackendSpec]:
    return sorted(specs, key=lambda spec: (-spec.priority, spec.name))


def backend_names(pm: pluggy.PluginManager | None = None) -> list[str]:
    """Every name `--backend` accepts: `auto`, then the registered backends, highest priority first."""
    return [AUTO, *(spec.name for spec in _by_priority(backend_specs(pm).values()))]


def resolve_backend_name(name: str, pm: pluggy.PluginManager | None = None) -> str:
    """A registered backend's name; `auto` becomes the usable backend of highest priority."""
    specs = backend_specs(pm)
    if not specs:
        raise InputError(
            "no generation backend is registered; reinstall genesys (pip install -e .) so its entry points, the built-in backends among them, are current"
        )
    if name != AUTO and name not in specs:
        raise InputError(f"--backend must be one of {', '.join(backend_names(pm))}, got {name!r}")
    if name != AUTO:
        return name
    for spec in _by_priority(specs.values()):
        if spec.usable is not None and spec.usable():
            return spec.name
    candidates = [spec.name for spec in _by_priority(specs.values()) if spec.usable is not None]
    raise InputError(
        f"--backend auto: no backend can run here (tried: {', '.join(candidates) or 'none'}); install one or name a --backend"
    )


def create_backend(
    name: str, model: str, style: PromptStyle, options: dict[str, Any], pm: pluggy.PluginManager | None = None
) -> Backend:
    """Build the backend `name` (or `auto`'s choice) for `model`; `options` are its own settings."""
    spec = backend_specs(pm)[resolve_backend_name(name, pm)]
    return spec.load()(model, style, **options)
