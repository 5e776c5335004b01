"""Training sequences and their layout as micro-batch tensors: padded, or packed by a token budget.

Padded (`collate`): each sequence is a row, its prompt left-padded to the longest prompt, its
completion right-padded to the longest completion, an attention mask marking the real tokens.

Packed (`pack`, chosen by `optim.micro_batch_tokens`): the sequences lie end to end in one row of at
most the budget's tokens, with no padding. Position ids restart at 0 with every sequence and no
attention mask is passed: transformers then tells the sequences apart by their position ids (a
block-diagonal causal mask for sdpa and eager attention, variable-length kernels for flash
attention), so attention never crosses from one sequence into another.

A sequence's completion is everything after its prompt. For a single completion every token is the
model's; for a multi-turn trajectory the tokens of the environment's and tools' messages lie between
the model's turns, and the sequence's `completion_mask` says which tokens the model sampled.
`completion_mask` of the micro-batch is true only at real model tokens: the environment's tokens are
inputs the model reads, never tokens it is scored on.

Either way the micro-batch names, in `targets`, the flat positions of the input whose hidden states
predict a model token, in the order of `completion_mask`'s true entries (row by row). Only those
positions reach the vocabulary projection (`genesys.train.logprobs`), and the loss sees the same
`(sequences, completion_len)` tensors in both layouts, so packing changes nothing in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainingSequence:
    """One completion or trajectory to learn from: token ids, the behaviour (sampler's) logprobs, its
    advantage; the old policy's logprobs when the trainer recomputed them, how many optimizer steps
    older than the trainer's the policy that sampled it was, and which completion tokens the model
    sampled (`completion_mask`, 1 or 0 per token; None: all of them, a single completion). Logprobs
    are kept for every completion token; those of the environment's tokens are never read."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    old_logprobs: list[float] | None = None
    staleness: int = 0
    completion_mask: list[int] | None = None
    max_model_tokens: int | None = None  # the most model tokens it could hold (dr_grpo's constant)

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.behaviour_logprobs):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.behaviour_logprobs)} logprobs"
            )
        if self.old_logprobs is not None and len(self.old_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.old_logprobs)} old logprobs"
            )
        if self.completion_mask is not None and len(self.completion_mask) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but a mask of {len(self.completion_mask)}"
            )
        if not self.prompt_ids:
            raise ValueError("a training sequence needs at least one prompt token")

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def model_tokens(self) -> int:
        """How many completion tokens the model sampled (those the loss is taken over)."""
        return (
            len(self.completion_ids) if self.completion_mask is None else sum(map(bool, self.completion_mask))
        )

    def model_positions(self) -> list[int]:
        """The indices of the completion tokens the model sampled."""
        if self.completion_mask is None:
            return list(range(len(self.completion_ids)))
        return [k for k, sampled in enumerate(self.completion_mask) if sampled]


@dataclass
class MicroBatch:
    """The model's inputs for a few sequences, and their completions laid out for the loss."""

    input_ids: torch.Tensor  # (rows, length)
    attention_mask: torch.Tensor | None  # None when packed: the position ids separate the sequences
    position_ids: torch.Tensor  # (rows, length)
    targets: torch.Tensor  # (completion tokens,) flat indices into (rows * length) predicting them
    completion_ids: torch.Tensor  # (sequences, completion_len)
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor  # (sequences,)
    old_logprobs: torch.Tensor  # the trainer's recomputed ones, else the behaviour logprobs
    staleness: torch.Tensor  # (sequences,)

    @property
    def completion_len(self) -> int:
        return self.completion_ids.shape[1]

    @property
    def tokens(self) -> int:
        """Model tokens in this micro-batch (those the loss is taken over)."""
        return int(self.completion_mask.sum())

    @property
    def input_tokens(self) -> int:
        """Positions the model runs over (padding included)."""
        return self.input_ids.numel()


def _completions(sequences: Sequence[TrainingSequence]) -> tuple[torch.Tensor, ...]:
    """(completion_ids, completion_mask, behaviour_logprobs, advantages, old_logprobs, staleness),
    right-padded with 0; the mask true at model tokens only."""
    size = len(sequences)
    completion_len = max(1, max(len(s.completion_ids) for s in sequences))  # one masked column when all empty
    completion_ids = torch.zeros((size, completion_len), dtype=torch.long)
    completion_mask = torch.zeros((size, completion_len), dtype=torch.bool)
    behaviour = torch.zeros((size, completion_len), dtype=torch.float32)
    old = torch.zeros((size, completion_len), dtype=torch.float32)
    for i, s in enumerate(sequences):
        c = len(s.completion_ids)
        if c:
            completion_ids[i, :c] = torch.tensor(s.completion_ids)
            completion_mask[i, :c] = (
                True if s.completion_mask is None else torch.tensor(s.completion_mask) != 0
            )
            behaviour[i, :c] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
            recomputed = s.behaviour_logprobs if s.old_logprobs is None else s.old_logprobs
            old[i, :c] = torch.tensor(recomputed, dtype=torch.float32)
    advantages = torch.tensor([s.advantage for s in sequences], dtype=torch.float32)
    staleness = torch.tensor([s.staleness for s in sequences], dtype=torch.long)
    return completion_ids, completion_mask, behaviour, advantages, old, staleness


def collate(
    sequences: Sequence[TrainingSequence], pad_id: int, device: torch.device | str = "cpu"
) -> MicroBatch:
    """The padded micro-batch of `sequences`, as the module describes."""
    prompt_len = max(len(s.prompt_ids) for s in sequences)
    completion_ids, completion_mask, *completions = _completions(sequences)
    length = prompt_len + completion_ids.shape[1]
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    targets = []
    for i, s in enumerate(sequences):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        input_ids[i, prompt_len - p : prompt_len] = torch.tensor(s.prompt_ids)
        input_ids[i, prompt_len : prompt_len + c] = completion_ids[i, :c]
        attention_mask[i, prompt_len - p : prompt_len + c] = 1
        targets.extend(i * length + prompt_len - 1 + k for k in s.model_positions())
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    tensors = (input_ids, attention_mask, position_ids, torch.tensor(targets, dtype=torch.long))
    return MicroBatch(
        *(t.to(device) for t in tensors),
        *(t.to(device) for t in (completion_ids, completion_mask, *completions)),
    )


def pack(sequences: Sequence[TrainingSequence], device: torch.device | str = "cpu") -> MicroBatch:
    """The packed micro-batch of `sequences`: one row, end to end, position ids restarting per sequence."""
    completion_ids, completion_mask, *completions = _completions(sequences)
    input_ids: list[int] = []
    position_ids: list[int] = []
    targets: list[int] = []
    for s in sequences:
        start, p, c = len(input_ids), len(s.prompt_ids), len(s.completion_ids)
        input_ids += s.prompt_ids + s.completion_ids
        position_ids += range(p + c)
        targets += (start + p - 1 + k for k in s.model_positions())
    tensors = (
        torch.tensor([input_ids], dtype=torch.long),
        torch.tensor([position_ids], dtype=torch.long),
        torch.tensor(targets, dtype=torch.long),
        completion_ids,
        completion_mask,
        *completions,
    )
    input_ids_t, position_ids_t, *rest = (t.to(device) for t in tensors)
    return MicroBatch(input_ids_t, None, position_ids_t, *rest)


class SequenceTooLong(ValueError):
    """A sequence longer than the micro-batch token budget (it could never be trained within it)."""


def split(sequences: Sequence[TrainingSequence], size: int) -> list[list[TrainingSequence]]:
    """Consecutive chunks of at most `size` sequences."""
    return [list(sequences[start : start + size]) for start in range(0, len(sequences), size)]


def split_by_tokens(sequences: Sequence[TrainingSequence], budget: int) -> list[list[TrainingSequence]]:
    """Groups of sequences of at most `budget` tokens (prompt and completion) each, as few as
    first-fit-decreasing finds; a SequenceTooLong error names a sequence that alone exceeds it.
    The groups are ordered longest first, each keeping its sequences in their given order."""
    bins: list[list[int]] = []  # indices into sequences
    room: list[int] = []
    for index in sorted(range(len(sequences)), key=lambda i: -len(sequences[i])):
        length = len(sequences[index])
        if length > budget:
            s = sequences[index]
            raise SequenceTooLong(
                f"sequence {index} of the batch has {length} tokens (prompt {len(s.prompt_ids)} + completion "
                f"{len(s.completion_ids)}), more than optim.micro_batch_tokens = {budget}; raise the budget to at "
                "least the longest prompt plus sampling.max_tokens"
                + (
                    ""
                    if s.completion_mask is None
                    else " for every turn of a trajectory, and the messages between them"
                )
            )
        for slot, free in enumerate(room):
            if length <= free:
                bins[slot].append(index)
                room[slot] -= length
                break
        else:
            bins.append([index])
            room.append(budget - length)
    return [[sequences[i] for i in sorted(members)] for members in bins]
