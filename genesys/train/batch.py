"""Training sequences and their collation into padded micro-batch tensors.

A micro-batch lays each sequence out as its prompt, left-padded to the longest prompt, then its
completion, right-padded to the longest completion. Every completion then starts at the same
column, so the logits that predict completion tokens are the last `completion_len + 1` columns
(`logits_to_keep`), and no prompt position ever reaches the vocabulary projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainingSequence:
    """One completion to learn from: token ids, the behaviour (sampler's) logprobs, its advantage;
    the old policy's logprobs when the trainer recomputed them, and how many optimizer steps older
    than the trainer's the policy that sampled it was."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    old_logprobs: list[float] | None = None
    staleness: int = 0

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.behaviour_logprobs):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.behaviour_logprobs)} logprobs"
            )
        if self.old_logprobs is not None and len(self.old_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.old_logprobs)} old logprobs"
            )
        if not self.prompt_ids:
            raise ValueError("a training sequence needs at least one prompt token")


@dataclass
class MicroBatch:
    """Padded tensors of a few sequences; `completion_mask` marks real completion tokens."""

    input_ids: torch.Tensor  # (batch, prompt_len + completion_len)
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor  # (batch, completion_len)
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor  # (batch,)
    old_logprobs: torch.Tensor  # the trainer's recomputed ones, else the behaviour logprobs
    staleness: torch.Tensor  # (batch,)

    @property
    def completion_len(self) -> int:
        return self.completion_ids.shape[1]

    @property
    def tokens(self) -> int:
        """Real completion tokens in this micro-batch."""
        return int(self.completion_mask.sum())


def collate(
    sequences: Sequence[TrainingSequence], pad_id: int, device: torch.device | str = "cpu"
) -> MicroBatch:
    """The micro-batch of `sequences`, padded as the module describes."""
    prompt_len = max(len(s.prompt_ids) for s in sequences)
    completion_len = max(
        1, max(len(s.completion_ids) for s in sequences)
    )  # one masked column when all are empty
    size = len(sequences)
    input_ids = torch.full((size, prompt_len + completion_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    completion_ids = torch.full((size, completion_len), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((size, completion_len), dtype=torch.bool)
    behaviour = torch.zeros((size, completion_len), dtype=torch.float32)
    old = torch.zeros((size, completion_len), dtype=torch.float32)
    for i, s in enumerate(sequences):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        input_ids[i, prompt_len - p : prompt_len] = torch.tensor(s.prompt_ids)
        attention_mask[i, prompt_len - p : prompt_len + c] = 1
        if c:
            input_ids[i, prompt_len : prompt_len + c] = torch.tensor(s.completion_ids)
            completion_ids[i, :c] = torch.tensor(s.completion_ids)
            completion_mask[i, :c] = True
            behaviour[i, :c] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
            old[i, :c] = torch.tensor(
                s.behaviour_logprobs if s.old_logprobs is None else s.old_logprobs, dtype=torch.float32
            )
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    advantages = torch.tensor([s.advantage for s in sequences], dtype=torch.float32)
    staleness = torch.tensor([s.staleness for s in sequences], dtype=torch.long)
    tensors = (
        input_ids,
        attention_mask,
        position_ids,
        completion_ids,
        completion_mask,
        behaviour,
        advantages,
        old,
        staleness,
    )
    return MicroBatch(*(t.to(device) for t in tensors))


def split(sequences: Sequence[TrainingSequence], size: int) -> list[list[TrainingSequence]]:
    """Consecutive chunks of at most `size` sequences."""
    return [list(sequences[start : start + size]) for start in range(0, len(sequences), size)]
