"""The token ids of a conversation played on a token backend, with the mask of the model's tokens.

A `TokenTrajectory` grows turn by turn as `genesys.generate.episodes` plays a rollout:

- the opening messages are rendered with the chat template, generation prompt included
  (`render_ids`, as a single-turn prompt is): the trajectory's `prompt_ids`;
- each model turn appends the token ids the model sampled, exactly (mask 1, with their logprobs);
  they are never decoded and encoded again, so the trainer scores the very tokens the sampler drew;
- the messages the environment or the tools append are rendered by the chat template as it renders
  them after the conversation so far (mask 0, logprob 0): the end of the model's turn the template
  writes and the model did not sample (e.g. the newline after `<|im_end|>`, or the whole end-of-turn
  marker of a turn cut at the token limit), the new messages, and the generation prompt of the
  next turn. The next turn's prompt is these tokens, sent as `GenerationRequest.prompt_ids`, so
  the model is conditioned on exactly the tokens the trainer sees.

What the template writes for the appended messages is read off two renderings of the conversation
with the last model message's content replaced by a placeholder: without the new messages (no
generation prompt) and with them. The first must be the start of the second; a template that
renders earlier messages differently once later ones follow is refused (`TemplateMismatch`),
since no token sequence would then be both what the model saw and what the template writes.

`play_on_tokens` plays a rollout this way with any source of model turns: a backend sampling them
(`genesys.generate.episodes`), or the row a validator replays (`genesys.environments.replay`).
Model turn t of sample s of a request seeded `seed` is sampled with the seed `turn_seed(seed, s, t)`
(and sample index 0), so no two turns of a rollout, nor of two samples of a task, share their
sampling keys (`genesys.proofs.sampling`: keyed by seed, sample index and position).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from genesys.config import PromptStyle
from genesys.tasks.prompts import render_ids, render_text

if TYPE_CHECKING:
    from genesys.environments.rollout import Trajectory
    from genesys.plugins.specs import Environment
    from genesys.schema import Task

# The content given to the last model message when the template renders what follows it.
PLACEHOLDER = "GENESYS_MODEL_TURN_PLACEHOLDER"
TURN_SEED_STRIDE = 1_000_003  # above any sample count: turn seeds of a task never coincide


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The sampling seed of model turn `turn` (from 0) of sample `sample` of a request seeded `seed`."""
    if not 0 <= sample < TURN_SEED_STRIDE:
        raise ValueError(f"sample index {sample} is outside 0..{TURN_SEED_STRIDE - 1}")
    return seed + sample + turn * TURN_SEED_STRIDE


def model_spans(mask: list[int]) -> list[tuple[int, int]]:
    """The (start, end) of each run of 1s in a completion mask: the model turns' tokens."""
    spans: list[tuple[int, int]] = []
    for position, bit in enumerate(mask):
        if bit == 1 and spans and spans[-1][1] == position:
            spans[-1] = (spans[-1][0], position + 1)
        elif bit == 1:
            spans.append((position, position + 1))
    return spans


class TemplateMismatch(ValueError):
    """The chat template does not render appended messages as a continuation of the conversation."""


class TokenTrajectory:
    """The tokens of one conversation (see the module's docstring): `prompt_ids`, then
    `completion_ids` with `completion_mask` (1: sampled by the model) and `logprobs` (0 where the
    mask is 0)."""

    def __init__(self, tokenizer: Any, style: PromptStyle) -> None:
        self.tokenizer = tokenizer
        self.style = style
        self.prompt_ids: list[int] = []
        self.completion_ids: list[int] = []
        self.completion_mask: list[int] = []
        self.logprobs: list[float] = []
        self._rendered = 0  # how many messages the tokens hold
        self._closed_by_model = False  # the last model turn ended with the template's end-of-turn token

    @property
    def ids(self) -> list[int]:
        """Every token of the conversation so far."""
        return self.prompt_ids + self.completion_ids

    def next_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The prompt of the next model turn, `messages` being the conversation so far: the opening
        rendered on the first turn, afterwards the tokens so far and the appended messages."""
        if not self.prompt_ids:
            self.prompt_ids = render_ids(self.tokenizer, messages, self.style, tools)
            self._rendered = len(messages)
        else:
            self._append(messages, tools, generation_prompt=True)
        return self.ids

    def add_model_turn(
        self, completion_ids: list[int], logprobs: list[float], finish_reason: str | None
    ) -> None:
        """Append a model turn's sampled tokens and their logprobs (its message is the next one)."""
        if len(completion_ids) != len(logprobs):
            raise ValueError(
                f"a model turn of {len(completion_ids)} tokens came with {len(logprobs)} logprobs"
            )
        self.completion_ids += completion_ids
        self.completion_mask += [1] * len(completion_ids)
        self.logprobs += [float(value) for value in logprobs]
        self._rendered += 1
        self._closed_by_model = finish_reason == "stop" and bool(completion_ids)

    def finish(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        """Append the messages that followed the last model turn (no generation prompt after them)."""
        if self.completion_ids and len(messages) > self._rendered:
            self._append(messages, tools, generation_prompt=False)

    def _append(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation_prompt: bool
    ) -> None:
        before = [*messages[: self._rendered - 1], _placeholder(messages[self._rendered - 1])]
        after = [*before, *messages[self._rendered :]]
        head = render_text(self.tokenizer, before, self.style, tools, generation_prompt=False)
        full = render_text(self.tokenizer, after, self.style, tools, generation_prompt=generation_prompt)
        if not full.startswith(head) or PLACEHOLDER not in head:
            raise TemplateMismatch(
                "the chat template renders the earlier messages differently once "
                f"{', '.join(repr(m['role']) for m in messages[self._rendered :])} messages follow them; "
                "a token trajectory cannot be both what the model saw and what the template writes"
            )
        close = head[head.rindex(PLACEHOLDER) + len(PLACEHOLDER) :]
        if self._closed_by_model:  # the model wrote the end-of-turn token itself
            written = self.tokenizer.decode(self.completion_ids[-1:], skip_special_tokens=False)
            close = close.removeprefix(written)
        ids = list(self.tokenizer(close + full[len(head) :], add_special_tokens=False)["input_ids"])
        self.completion_ids += ids
        self.completion_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self._rendered = len(messages)
        self._closed_by_model = False

    def columns(self) -> dict[str, Any]:
        """The token fields of the trajectory's row; all None when no model turn was taken."""
        if not self.completion_ids:
            return {"prompt_ids": None, "completion_ids": None, "logprobs": None, "completion_mask": None}
        return {
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            "logprobs": self.logprobs,
            "completion_mask": self.completion_mask,
        }


@dataclass
class ModelTurn:
    """A model turn sampled on tokens: its ids, their logprobs, why it ended and its text."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    text: str


# The model on tokens: (the turn's prompt ids, the messages so far, the tools' schemas) -> its turn.
TurnFunction = Callable[[list[int], list[dict[str, Any]], list[dict[str, Any]]], Awaitable[ModelTurn]]


async def play_on_tokens(
    environment: type[Environment], task: Task, tokens: TokenTrajectory, model_turn: TurnFunction
) -> Trajectory:
    """Play `task` in `environment` (`genesys.environments.play`), each model turn asked of
    `model_turn` after the trajectory's tokens so far, which `tokens` keeps; the messages after the
    last model turn are rendered too, or the trajectory ends in an error saying why they cannot be."""
    from genesys.environments.rollout import play
    from genesys.environments.tools import tools_of

    async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        turn = await model_turn(tokens.next_prompt(messages, tools or None), messages, tools)
        tokens.add_model_turn(turn.ids, turn.logprobs, turn.finish_reason)
        return {"role": "assistant", "content": turn.text}

    trajectory = await play(environment, task, chat)
    if trajectory.error is None:
        schemas = [item.schema for item in tools_of(environment.tools).values()]
        try:
            tokens.finish(trajectory.messages, schemas or None)
        except ValueError as exc:  # the closing messages cannot be rendered as appended
            trajectory.finish_reason = "error"
            trajectory.error = f"turn {trajectory.turns}: {exc}"
    return trajectory


def _placeholder(message: dict[str, Any]) -> dict[str, Any]:
    """The model's message with its content replaced by the placeholder (and no structured tool
    calls: the model's tokens hold its calls as it wrote them)."""
    replaced = {key: value for key, value in message.items() if key != "tool_calls"}
    replaced["content"] = PLACEHOLDER
    return replaced
