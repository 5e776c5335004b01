"""Supervised fine-tuning (`genesys sft`): learn completions token by token, through the trainer's loop.

The objective is the mean negative log-likelihood of the completion tokens of a batch: each
completion token's loss is `-log p(token | everything before it)` (at temperature 1), prompt and
padding positions count for nothing, and the sum over the batch's micro-batches (and ranks) is
divided by the batch's completion tokens, so the loss does not depend on how the batch is split.

`SFTTrainer` is the GRPO `Trainer` with its objective methods replaced: examples instead of rollout
groups (`genesys.train.sources.examples`), this loss instead of the clipped one, and its own
metrics. Model loading, precision, data parallel, micro-batching, non-finite step skipping,
checkpoints, resuming, metrics.jsonl and trackers are the trainer's own.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from genesys.config import SftConfig
from genesys.errors import InputError
from genesys.train.batch import MicroBatch
from genesys.train.logprobs import completion_logprobs
from genesys.train.loss import reduce_loss
from genesys.train.trainer import StepBatch, Trainer, TrainResult, train

log = logging.getLogger(__name__)


def sft_token_loss(model: torch.nn.Module, micro: MicroBatch) -> torch.Tensor:
    """The negative log-likelihood of each completion token of `micro` (batch, completion_len), padded
    or packed alike (`genesys.train.logprobs.completion_logprobs`); 0 where the completion mask is false."""
    logprobs, _ = completion_logprobs(model, micro, 1.0)
    return -logprobs


class SFTTrainer(Trainer):
    """The trainer's loop with the supervised objective (see the module's docstring)."""

    config: SftConfig

    def _check_setup(self) -> None:
        per_step = self.config.sft.examples_per_step
        if per_step % self.world.size:
            raise InputError(
                f"sft.examples_per_step ({per_step}) must be divisible by the number of processes ({self.world.size})"
            )

    def _seed(self) -> int:
        return self.config.sft.seed

    def _load_inputs(self) -> None:
        from genesys.train.sources.examples import load_examples

        self.examples, self.example_counts = load_examples(self.config)
        if self.world.is_main:
            log.info("sft: %s", self.example_counts.describe())

    def _open_source(self) -> Any:
        from genesys.train.sources.examples import SftExamples

        return SftExamples(self.examples, self.tokenizer, self.config, self.world)

    def _reference_model(self) -> None:
        return None

    def _loss_denominator(self, batch: StepBatch, part: int) -> float:
        return batch.slice_tokens[part]

    def _prepare_model(self) -> None:
        pass

    def _before_update(self, batch: StepBatch) -> None:
        return None

    def _open_evaluator(self) -> None:
        return None

    def _describe(self, metrics: dict[str, Any]) -> str:
        return f"sft  loss {metrics['loss']:.3f}"

    def _next_batch(self) -> StepBatch:
        sequences = self.rollouts.next_batch(self.config.sft.examples_per_step // self.world.size)
        tokens = float(sum(s.model_tokens for s in sequences))
        return self._step_batch(sequences, {"tokens": tokens})

    def _micro_batch_loss(
        self, micro: MicroBatch, denominator: float, totals: dict[str, float], record_mismatch: bool
    ) -> torch.Tensor:
        token_loss = sft_token_loss(self.model, micro)
        loss = reduce_loss(token_loss, micro.completion_mask, "token", denominator)
        totals["loss"] += float(loss.detach())
        totals["tokens"] += float(micro.completion_mask.sum())
        return loss

    def _metrics(
        self, batch: StepBatch, totals: dict[str, float], grad_norm: float, seconds: float, first_update: bool
    ) -> dict[str, Any]:
        loss, tokens = self.world.sum([totals["loss"], totals["tokens"]])
        return {
            "step": self.step,
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "epoch": self.rollouts.epoch,
            "examples": int(batch.sequences_total),
            "completion_len_mean": batch.tokens / max(batch.sequences_total, 1.0),
            "tokens": tokens,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            "step_seconds": seconds,
        }


def sft(config: SftConfig) -> TrainResult:
    """Run (or resume) the fine-tuning run `config` describes; a finished run is returned as it is."""
    return train(config, SFTTrainer)
