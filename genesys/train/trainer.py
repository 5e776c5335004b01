"""The GRPO training loop: rollouts in, optimizer steps out, metrics and checkpoints along the way.

One step: take a batch of groups (generated, verified and rewarded now, or read from recorded
rollouts), compute group advantages, then run micro-batches of forward/backward passes whose
losses add up to the batch's mean loss, clip the gradient norm and step AdamW. The model is sharded
over the processes by FSDP2 (`genesys.train.parallel`, also for one process), optionally with LoRA
adapters (`genesys.train.lora`); weights leave it through `genesys.train.export`. With
`optim.updates_per_batch = U`, one batch serves U consecutive optimizer steps, the ratio always
taken against the logprobs recorded at sampling. After the optimizer steps of a batch the rollout
source (`genesys.train.sources`) receives the new weights (gathered from the shards, LoRA merged).

A step whose loss or gradient norm is not finite (on any rank) takes no optimizer update: its
gradients are dropped, the step is counted (`step_skipped`, `skipped_steps` in the metrics) and the
run goes on; after `optim.max_nonfinite_steps` such steps in a row it stops with a TrainingError.
A model with a non-finite weight is never written (`genesys.train.checkpoint.check_finite`).

The loop (model, optimizer, micro-batches, checkpoints, metrics) knows nothing of GRPO beyond the
few methods under "the objective" below: what the run reads, where batches come from, the loss of a
micro-batch and the metrics of a step. `genesys.train.sft.SFTTrainer` overrides exactly those to
run supervised fine-tuning through the same loop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from genesys.errors import InputError, TrainingError
from genesys.models import load_trainable_lm
from genesys.train import checkpoint as ckpt
from genesys.train import export
from genesys.train.batch import (
    MicroBatch,
    SequenceTooLong,
    TrainingSequence,
    collate,
    pack,
    split,
    split_by_tokens,
)
from genesys.train.config import TrainConfig
from genesys.train.distributed import World, close_world, init_world
from genesys.train.logprobs import completion_logprobs
from genesys.train.lora import is_adapter_weight
from genesys.train.loss import clipped_token_loss, group_advantages, kl_estimate, reduce_loss
from genesys.train.metrics import MetricsLog, read_metrics
from genesys.train.parallel import clip_grad_norm, device_mesh, set_gradient_sync, shard_model
from genesys.train.schedule import lr_factor
from genesys.train.sources import open_source
from genesys.train.sources.base import StepRollouts, usable

log = logging.getLogger(__name__)
CONFIG_FILE = "config.toml"
# Devices with torch's fused AdamW kernel: one pass over all parameters, 2.5-4.5x faster on CPU.
FUSED_ADAMW_DEVICES = frozenset({"cpu", "cuda"})
# Dotted config keys a resumed run may change without changing what it computes.
RESUMABLE_CONFIG_KEYS = frozenset(
    {
        "optim.steps",
        "optim.max_nonfinite_steps",
        "progress",
        "report_to",
        "checkpoint.every",
        "checkpoint.keep",
        "verify.workers",
        "cluster.address",
        "cluster.rollout_workers",
        "cluster.verifier_workers",
        "cluster.rollout_cpus",
        "cluster.rollout_gpus",
        "cluster.verifier_cpus",
    }
)


@dataclass
class TrainResult:
    """What a finished run leaves: its directory, the final model and every step's metrics."""

    output_dir: Path
    final_dir: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    already_complete: bool = False  # the run had finished before; nothing was trained now


@dataclass
class StepBatch:
    """One generated (or recorded) batch on this rank, ready for one or more optimizer steps."""

    sequences: list[TrainingSequence]
    stats: dict[str, float]  # this rank's sums, reduced over ranks when logged
    tokens: float  # completion tokens over all ranks
    sequences_total: float  # sequences over all ranks
    extra: dict[str, Any] = field(default_factory=dict)  # metrics logged as they are (asynchronous mode)


def train(config: Any, trainer: type[Trainer] | None = None) -> TrainResult:
    """Run (or resume) the training run `config` describes with `trainer` (default: GRPO's
    `Trainer`); see `genesys.train`. A run whose output_dir already holds its final model and all
    its steps is returned as it is."""
    finished = finished_run(config)
    if finished is not None:
        return finished
    world = init_world()
    try:
        with (trainer or Trainer)(config, world) as running:
            return running.run()
    finally:
        close_world(world)


def finished_run(config: Any) -> TrainResult | None:
    """The result of a run that already completed `optim.steps` in `output_dir`, else None."""
    output_dir = Path(config.output_dir)
    final = output_dir / "final"
    records = read_metrics(output_dir / "metrics.jsonl")
    saved = (final / "config.json").is_file() or (final / "adapter_config.json").is_file()
    if saved and records and records[-1]["step"] >= config.optim.steps:
        return TrainResult(output_dir, final, records, already_complete=True)
    return None


class Trainer:
    """Owns the model, optimizer, rollout source and run directory of one rank."""

    def __init__(self, config: Any, world: World) -> None:
        self.config = config
        self.world = world
        self._check_setup()
        self.output_dir = Path(config.output_dir)
        self.checkpoints = self.output_dir / "checkpoints"
        self.device = world.device(config.backend_options.device)
        _check_memory(config, world, self.device)
        self._stack = contextlib.ExitStack()
        resume = ckpt.latest_checkpoint(self.checkpoints)
        self._check_output_dir(resume is not None)
        self.state = ckpt.load_state(resume) if resume else None
        if self.state and self.state["world_size"] != world.size:
            raise InputError(
                f"{resume} was written by {self.state['world_size']} processes; resume it with as many (this run has {world.size})"
            )
        self.step = self.state["step"] if self.state else 0
        self.skipped_steps = self.state.get("skipped_steps", 0) if self.state else 0
        self.nonfinite_in_a_row = self.state.get("nonfinite_in_a_row", 0) if self.state else 0
        torch.manual_seed(self._seed())
        self._load_inputs()  # checked before any model is loaded
        self.source_model = str(resume) if resume else config.model
        self.tokenizer, self.model, self.peft = self._load_model(resume)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id
        )
        self.reference = self._reference_model()
        self.optimizer = torch.optim.AdamW(
            [parameter for parameter in self.model.parameters() if parameter.requires_grad],
            lr=config.optim.lr,
            betas=(config.optim.beta1, config.optim.beta2),
            eps=config.optim.adam_eps,
            weight_decay=config.optim.weight_decay,
            fused=self.device.type in FUSED_ADAMW_DEVICES,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda update: lr_factor(update, config.optim)
        )
        self.rollouts = self._open_source()
        self._stack.callback(self.rollouts.close)
        self.batch: StepBatch | None = None
        try:
            if self.state:
                self._restore(self.state)
            self.rollouts.start(export.full_parameters(self.model), self.step)
        except BaseException:
            self._stack.close()  # e.g. a backend that cannot take weights in place: stop what was started
            raise
        self.metrics = MetricsLog(self.output_dir / "metrics.jsonl", self.step) if world.is_main else None
        self.tracker = self._open_tracker() if world.is_main else None

    # --- setup ------------------------------------------------------------------------------------

    def _check_output_dir(self, resuming: bool) -> None:
        """Refuse an output_dir that holds a run with other settings; write the resolved config."""
        from genesys.config.loading import upgrade
        from genesys.train.resolved_config import changed_keys, read_config, write_config

        path = self.output_dir / CONFIG_FILE
        existing = read_config(path)
        if existing is not None:  # a run written before keys were renamed compares by the new names
            existing = upgrade(existing, type(self.config).renamed, warn=False)
        if existing is not None and resuming:
            changed = [
                key
                for key in changed_keys(existing, self.config.as_dict())
                if key not in RESUMABLE_CONFIG_KEYS
            ]
            if changed:
                raise InputError(
                    f"{self.output_dir} holds a run with other settings ({', '.join(changed)}); use the same settings to resume it, or another output_dir"
                )
        if self.world.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            write_config(path, self.config.as_dict())

    def _load_model(self, resume: Path | None) -> tuple[Any, torch.nn.Module, Any]:
        """(tokenizer, the model sharded over the ranks, peft's wrapper of it or None). The weights
        come from the checkpoint when resuming (LoRA: the base model and the adapter's weights from
        the trainer state), with their fp32 master values when the checkpoint's folder is not exact."""
        from transformers import AutoConfig

        config = self.config
        path = config.model if resume is None or config.lora.enabled else str(resume)
        try:
            self.model_dtype = export.declared_dtype(AutoConfig.from_pretrained(path))
        except (OSError, ValueError) as exc:
            raise InputError(f"model {path!r} cannot be loaded: {exc}") from None
        tokenizer, model = load_trainable_lm(  # on the CPU: sharding moves each rank's shards to its device
            path,
            torch.device("cpu"),
            config.gradient_checkpointing,
            use_safetensors=True if path != config.model else None,  # a checkpoint's weights: never a pickle
        )
        peft = None
        if config.lora.enabled:
            from genesys.train.lora import add_adapters

            peft = add_adapters(model, config.lora)
            if config.gradient_checkpointing:  # a frozen embedding would cut the recomputed graph
                model.enable_input_require_grads()
        if self.state is not None and "master_weights" in self.state:
            _load_master_weights(model, self.state["master_weights"], resume)
        mesh = device_mesh(self.world, config.parallel.strategy, self.device)
        return tokenizer, shard_model(model, mesh, config.precision), peft

    def _frozen_reference(self) -> torch.nn.Module:
        """The initial model, frozen and sharded like the trained one, for the KL term (always
        `config.model`, also when resuming)."""
        _, reference = load_trainable_lm(self.config.model, torch.device("cpu"))
        reference.eval().requires_grad_(False)
        mesh = device_mesh(self.world, self.config.parallel.strategy, self.device)
        return shard_model(reference, mesh, self.config.precision)

    @property
    def keeps_master_weights(self) -> bool:
        """Whether checkpoints carry the fp32 trainable weights in the trainer state: when the model
        folder holds them in a narrower dtype, or holds merged weights (LoRA)."""
        return self.peft is not None or self.model_dtype != torch.float32

    def _open_tracker(self) -> Any:
        if not self.config.report_to:
            return None
        from genesys.train.tracking import open_trackers

        return open_trackers(
            self.config.report_to, self.output_dir, self.config.as_dict(), self.output_dir.name
        )

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.tracker is not None:
            self.tracker.close()
        self._stack.close()

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Train until `optim.steps`, checkpointing as configured; returns the run's result."""
        from genesys.ui.progress import RunProgress

        config = self.config
        final = self.output_dir / "final"
        with RunProgress(
            config.optim.steps,
            "training",
            "steps",
            rated=("steps", "tokens"),
            enabled=config.progress and self.world.is_main,
        ) as progress:
            progress.skip(self.step)
            while self.step < config.optim.steps:
                metrics = self.train_step()
                progress.advance(1, tokens=int(metrics["tokens"]))
                progress.describe(self._describe(metrics))
                if (
                    config.checkpoint.every
                    and self.step % config.checkpoint.every == 0
                    and self.step < config.optim.steps
                ):
                    self.save_checkpoint()
        ckpt.check_finite(self.model, f"the final model {final}", self.world)
        self._save_final(final)
        self.world.barrier()
        return TrainResult(self.output_dir, final, self.metrics.records if self.metrics else [])

    def train_step(self) -> dict[str, Any]:
        """One optimizer step (generating a new batch first when the last one is used up)."""
        started = time.perf_counter()
        first_update = self.batch is None
        if self.batch is None:
            self.batch = self._next_batch()
        batch = self.batch
        totals = self._accumulate_gradients(batch, record_mismatch=first_update)
        grad_norm, updated = self._optimizer_step(totals)
        self.step += 1
        self.nonfinite_in_a_row = 0 if updated else self.nonfinite_in_a_row + 1
        self.skipped_steps += not updated
        if self.step % self.config.optim.updates_per_batch == 0:
            self.batch = None
            self.rollouts.publish(export.full_parameters(self.model), self.step)
        metrics = self._metrics(batch, totals, grad_norm, time.perf_counter() - started, first_update)
        metrics["step_skipped"] = not updated
        metrics["skipped_steps"] = self.skipped_steps
        if self.metrics is not None:
            self.metrics.write(metrics)
        if self.tracker is not None:
            self.tracker.log(metrics, self.step)
        if not updated:
            self._nonfinite_step(metrics)
        return metrics

    def _nonfinite_step(self, metrics: dict[str, Any]) -> None:
        """Say that step `self.step` was skipped; stop the run after too many in a row."""
        limit = self.config.optim.max_nonfinite_steps
        what = f"loss {metrics['loss']}, gradient norm {metrics['grad_norm']}"
        if self.nonfinite_in_a_row >= limit:
            raise TrainingError(
                f"step {self.step}: the loss or gradient was not finite in {self.nonfinite_in_a_row} steps in a row ({what}); "
                f"those steps were skipped without an update, the model is that of step {self.step - self.nonfinite_in_a_row}. "
                "Check the rollouts' logprobs and rewards, lower optim.lr, or raise optim.max_nonfinite_steps"
            )
        log.warning(
            "step %d skipped: %s (%d in a row; the run stops at %d)",
            self.step,
            what,
            self.nonfinite_in_a_row,
            limit,
        )

    # --- the objective: GRPO (genesys.train.sft.SFTTrainer overrides these) --------------------------

    def _check_setup(self) -> None:
        """Refuse settings this objective cannot run with, before anything is loaded."""
        config, world = self.config, self.world
        if config.cluster.ray and world.distributed:
            raise InputError(
                "cluster.backend = 'ray' trains in one process (its rollout workers are Ray actors); run it without torchrun"
            )
        if config.rollout.prompts_per_step % world.size:
            raise InputError(
                f"rollout.prompts_per_step ({config.rollout.prompts_per_step}) must be divisible by the number of processes ({world.size})"
            )

    def _seed(self) -> int:
        """The run's seed (initialisation, data order)."""
        return self.config.sampling.seed

    def _load_inputs(self) -> None:
        """Read and check what the run learns from, before any model is loaded: the tasks (online)."""
        self.tasks = None
        if not self.config.offline:
            from genesys.train.sources.base import load_tasks

            self.tasks = load_tasks(self.config)

    def _open_source(self) -> Any:
        """Where batches come from, once the model is loaded (a `RolloutSource`)."""
        return open_source(self.config, self.world, self.tasks, self.source_model, self.device)

    def _reference_model(self) -> torch.nn.Module | None:
        """The frozen model of the KL term, or None without one."""
        return self._frozen_reference() if self.config.loss.kl_beta > 0 else None

    def _loss_denominator(self, batch: StepBatch) -> float:
        """What the summed token losses of a batch are divided by (over all ranks)."""
        return batch.tokens if self.config.loss.normalize == "token" else batch.sequences_total

    def _describe(self, metrics: dict[str, Any]) -> str:
        """The progress bar's text after a step."""
        reward = metrics["reward_mean"]
        return f"training  reward {reward:.3f}" if reward is not None else "training"

    def _next_batch(self) -> StepBatch:
        per_rank = self.config.rollout.prompts_per_step // self.world.size
        step = self.rollouts.next_batch(per_rank)
        sequences = self._sequences(step)
        stats = _rollout_stats(step, sequences)
        tokens, count = self.world.sum([float(stats["tokens"]), float(len(sequences))])
        if step.groups_seen and len(step.groups) < per_rank:
            log.warning(
                "step %d: only %d of %d groups with signal after %d generation rounds",
                self.step + 1,
                len(step.groups),
                per_rank,
                step.rounds,
            )
        return StepBatch(sequences, stats, tokens, count, step.extra)

    def _sequences(self, step: StepRollouts) -> list[TrainingSequence]:
        """The batch's training sequences with their group advantages, shortest first (less padding)."""
        groups = [usable(group) for group in step.groups]
        groups = [group for group in groups if group]
        rows = [row for group in groups for row in group]
        rewards = torch.tensor([float(row["reward"]) for row in rows], dtype=torch.float32)
        advantages = group_advantages(
            rewards, [len(g) for g in groups], self.config.loss.scale_by_std
        ).tolist()
        _check_advantages(groups, advantages)
        sequences = [
            TrainingSequence(
                list(row["prompt_ids"]),
                list(row["completion_ids"]),
                [float(x) for x in row["completion_logprobs"]],
                advantage,
            )
            for row, advantage in zip(rows, advantages)
        ]
        return sorted(sequences, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))

    def _micro_batches(self, batch: StepBatch) -> Iterator[MicroBatch]:
        """This rank's micro-batches, padded with empty ones to the count of the rank with the most
        (every rank must take part in every gradient all-reduce): packed within
        `optim.micro_batch_tokens` tokens each when set, else `optim.micro_batch_size` padded sequences."""
        budget = self.config.optim.micro_batch_tokens
        if budget:
            try:
                chunks = split_by_tokens(batch.sequences, budget)
            except SequenceTooLong as exc:
                raise InputError(f"step {self.step + 1}: {exc}") from None
        else:
            chunks = split(batch.sequences, self.config.optim.micro_batch_size)
        count = int(self.world.max([float(len(chunks))])[0])
        for index in range(count):
            if index >= len(chunks):
                yield _empty_micro_batch(self.pad_id, self.device)
            elif budget:
                yield pack(chunks[index], self.device)
            else:
                yield collate(chunks[index], self.pad_id, self.device)

    def _accumulate_gradients(self, batch: StepBatch, record_mismatch: bool) -> dict[str, float]:
        """Forward and backward over the batch's micro-batches; returns this rank's loss statistics."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        denominator = max(self._loss_denominator(batch), 1.0)
        totals = dict.fromkeys(
            ("loss", "tokens", "clip_low", "clip_high", "delta", "ratio_sum", "entropy_sum", "kl_sum"), 0.0
        )
        totals["ratio_max"] = 0.0
        totals["mismatch"] = 0.0
        micro_batches = list(self._micro_batches(batch))
        for index, micro in enumerate(micro_batches):
            set_gradient_sync(self.model, self.config.parallel.strategy, index == len(micro_batches) - 1)
            loss = self._micro_batch_loss(micro, denominator, totals, record_mismatch)
            # FSDP2 averages gradients over the ranks; the loss is already the global batch's mean
            (loss * self.world.size).backward()
        return totals

    def _micro_batch_loss(
        self, micro: MicroBatch, denominator: float, totals: dict[str, float], record_mismatch: bool
    ) -> torch.Tensor:
        config = self.config
        logprobs, entropy = completion_logprobs(self.model, micro, config.sampling.temperature)
        if config.loss.entropy_coef == 0:
            entropy = entropy.detach()
        clipped = clipped_token_loss(
            logprobs,
            micro.behaviour_logprobs,
            micro.advantages,
            eps_low=config.loss.eps_low,
            eps_high=config.loss.eps_high,
            delta=config.loss.delta,
        )
        token_loss = clipped.loss
        mask = micro.completion_mask
        if self.reference is not None:
            with torch.no_grad():
                reference, _ = completion_logprobs(self.reference, micro, config.sampling.temperature)
            kl = kl_estimate(logprobs, reference)
            token_loss = token_loss + config.loss.kl_beta * kl
            totals["kl_sum"] += float(kl.detach()[mask].sum())
        if config.loss.entropy_coef > 0:
            token_loss = token_loss - config.loss.entropy_coef * entropy
        loss = reduce_loss(token_loss, mask, config.loss.normalize, denominator)
        totals["loss"] += float(loss.detach())
        totals["tokens"] += float(mask.sum())
        totals["clip_low"] += float(clipped.clipped_low[mask].sum())
        totals["clip_high"] += float(clipped.clipped_high[mask].sum())
        totals["delta"] += float(clipped.bounded_by_delta[mask].sum())
        totals["ratio_sum"] += float(clipped.ratio[mask].sum())
        totals["entropy_sum"] += float(entropy.detach()[mask].sum())
        if mask.any():
            totals["ratio_max"] = max(totals["ratio_max"], float(clipped.ratio[mask].max()))
            if record_mismatch:
                difference = (logprobs.detach() - micro.behaviour_logprobs)[mask].abs().max()
                totals["mismatch"] = max(totals["mismatch"], float(difference))
        return loss

    def _optimizer_step(self, totals: dict[str, float]) -> tuple[float, bool]:
        """Clip and step, unless the loss (on any rank) or the gradient norm is not finite: then the
        gradients are dropped and only the schedule moves on. Returns the gradient norm and whether
        the weights were updated."""
        max_norm = self.config.optim.max_grad_norm or math.inf
        grad_norm = clip_grad_norm(self.model.parameters(), max_norm)
        (nonfinite_loss,) = self.world.max([0.0 if math.isfinite(totals["loss"]) else 1.0])
        updated = not nonfinite_loss and math.isfinite(grad_norm)
        if updated:
            self.optimizer.step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped first step: the schedule still follows the step count
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()
        return grad_norm, updated

    def _metrics(
        self, batch: StepBatch, totals: dict[str, float], grad_norm: float, seconds: float, first_update: bool
    ) -> dict[str, Any]:
        keys = sorted(batch.stats)
        summed = dict(zip(keys, self.world.sum([batch.stats[k] for k in keys])))
        loss_keys = ("loss", "tokens", "clip_low", "clip_high", "delta", "ratio_sum", "entropy_sum", "kl_sum")
        losses = dict(zip(loss_keys, self.world.sum([totals[k] for k in loss_keys])))
        ratio_max, mismatch = self.world.max([totals["ratio_max"], totals["mismatch"]])
        tokens = max(losses["tokens"], 1.0)
        metrics: dict[str, Any] = {
            "step": self.step,
            "reward_mean": _mean(summed["reward_sum"], summed["rewarded"]),
            "reward_std": _std(summed["reward_sum"], summed["reward_sq_sum"], summed["rewarded"]),
            "score_mean": _mean(summed["score_sum"], summed["scored"]),
            "loss": losses["loss"],
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "clip_low_frac": losses["clip_low"] / tokens,
            "clip_high_frac": losses["clip_high"] / tokens,
            "delta_frac": losses["delta"] / tokens,
            "ratio_mean": losses["ratio_sum"] / tokens,
            "ratio_max": ratio_max,
            "entropy": losses["entropy_sum"] / tokens,
            "completion_len_mean": _mean(summed["tokens"], summed["sequences"]),
            "groups_kept": int(summed["groups_kept"]),
            "groups_dropped": int(summed["groups_dropped"]),
            "rollout_errors": int(summed["errors"]),
            "refill_rounds": int(summed["rounds"]),
            "logprob_mismatch": mismatch if first_update else None,
            "tokens": losses["tokens"],
            "tokens_per_s": losses["tokens"] / seconds if seconds > 0 else None,
            "step_seconds": seconds,
        }
        if first_update and "generate_seconds" in summed:
            metrics["generate_seconds"] = summed["generate_seconds"] / self.world.size
            metrics["verify_seconds"] = summed["verify_seconds"] / self.world.size
        if self.reference is not None:
            metrics["kl"] = losses["kl_sum"] / tokens
        if first_update:
            metrics.update(batch.extra)
        return metrics

    # --- checkpoints ------------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """Write the checkpoint of the current step: every rank gathers the weights and optimizer
        state from its shards, rank 0 writes them with every rank's data position."""
        directory = ckpt.step_dir(self.checkpoints, self.step)
        ckpt.check_finite(self.model, f"checkpoint {directory}", self.world)  # all ranks refuse together
        per_rank = {
            "data": self.rollouts.state(),
            "batch": _batch_state(self.batch),
            "rng": ckpt.rng_states(),
        }
        ranks = self.world.gather(per_rank)
        main = self.world.is_main
        weights = export.model_state(self.model, self.model_dtype, keep=main)
        optimizer = get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        master = export.trainable_state(self.model, keep=main) if self.keeps_master_weights else None
        if main:
            state = {
                "step": self.step,
                "world_size": self.world.size,
                "skipped_steps": self.skipped_steps,
                "nonfinite_in_a_row": self.nonfinite_in_a_row,
                "optimizer": optimizer,
                "scheduler": self.scheduler.state_dict(),
                "ranks": ranks,
            }
            if master is not None:
                state["master_weights"] = master
            ckpt.save_checkpoint(
                self.checkpoints,
                self.step,
                lambda path: self._write_model(path, weights),
                state,
                self.config.checkpoint.keep,
            )
        self.world.barrier()

    def _write_model(self, path: Path, weights: dict[str, torch.Tensor]) -> None:
        model = self.model
        export.save_model(
            path, weights, model.config, model.generation_config, self.tokenizer, self.model_dtype
        )

    def _save_final(self, final: Path) -> None:
        """`final/`: the model (LoRA merged into it), or with `lora.save = "adapter"` the adapter alone."""
        main = self.world.is_main
        if self.peft is not None and self.config.lora.save == "adapter":
            adapter = {
                name: tensor
                for name, tensor in export.trainable_state(self.model, keep=main).items()
                if is_adapter_weight(name)
            }
            if main:
                export.save_adapter(final, self.peft, adapter, self.tokenizer, self.model_dtype)
            return
        weights = export.model_state(self.model, self.model_dtype, keep=main)
        if main:
            self._write_model(final, weights)

    def _restore(self, state: dict[str, Any]) -> None:
        optimizer = _named_optimizer_state(state["optimizer"], self.model)
        set_optimizer_state_dict(
            self.model, self.optimizer, optimizer, options=StateDictOptions(full_state_dict=True)
        )
        self.scheduler.load_state_dict(state["scheduler"])
        mine = state["ranks"][self.world.rank]
        self.rollouts.load_state(mine["data"])
        self.batch = _batch_from_state(mine["batch"])
        ckpt.restore_rng_states(mine["rng"])


def _load_master_weights(
    model: torch.nn.Module, master: dict[str, torch.Tensor], resume: Path | None
) -> None:
    """Copy a checkpoint's fp32 master weights into the (not yet sharded) model; an InputError when
    they do not fit it."""
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    missing, unknown = sorted(trainable - master.keys()), sorted(master.keys() - trainable)
    if missing or unknown:
        raise InputError(
            f"{resume}: the master weights of the trainer state do not fit the model "
            f"(missing {missing[:3]}, unknown {unknown[:3]}); resume with the settings that wrote it"
        )
    with torch.no_grad():
        parameters = dict(model.named_parameters())
        for name, tensor in master.items():
            parameters[name].copy_(tensor)


def _named_optimizer_state(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """An optimizer state keyed by parameter name; one of an older genesys, keyed by position among
    the trained parameters (`torch.optim.Optimizer.state_dict`), is renamed."""
    if all(isinstance(name, str) for group in state["param_groups"] for name in group["params"]):
        return state
    names = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    return {
        "state": {names[index]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def _check_memory(config: TrainConfig, world: World, device: torch.device) -> None:
    """Refuse a run whose estimated memory (`genesys.train.memory_plan`) exceeds its device's; a model
    the estimate cannot read is left to fail, or not, as it loads."""
    from genesys.train.memory_plan import check_fits, plan_memory

    try:
        plan = plan_memory(config, world.size, device)
    except Exception as exc:  # an estimate that cannot be made is no reason to refuse the run
        log.warning("no memory estimate for this run: %s: %s", type(exc).__name__, exc)
        return
    check_fits(plan)


def _check_advantages(groups: list[list[Any]], advantages: list[float]) -> None:
    """An InputError naming the rollout whose reward makes its group's advantages non-finite (the
    group's largest reward in magnitude): rewards must be finite numbers of moderate size."""
    start = 0
    for group in groups:
        values = advantages[start : start + len(group)]
        start += len(group)
        if not all(math.isfinite(value) for value in values):
            row = max(group, key=lambda row: abs(float(row["reward"])))
            raise InputError(
                f"rollout {row.get('response_id')!r} (task {row.get('problem_id')!r}) has reward {row['reward']!r}: "
                "its group's advantages are not finite in float32; rewards must be finite numbers of moderate size"
            )


def _empty_micro_batch(pad_id: int, device: torch.device) -> MicroBatch:
    """A one-token micro-batch that counts for nothing (no completion token is real)."""
    micro = collate([TrainingSequence([pad_id], [pad_id], [0.0], 0.0)], pad_id, device)
    micro.completion_mask.zero_()
    return micro


def _rollout_stats(step: StepRollouts, sequences: list[TrainingSequence]) -> dict[str, float]:
    rows = [row for group in step.groups for row in usable(group)]
    rewards = [float(row["reward"]) for row in rows]
    scores = [float(row["score"]) for group in step.groups for row in group if row.get("score") is not None]
    return {
        "reward_sum": sum(rewards),
        "reward_sq_sum": sum(r * r for r in rewards),
        "rewarded": float(len(rewards)),
        "score_sum": sum(scores),
        "scored": float(len(scores)),
        "tokens": float(sum(len(s.completion_ids) for s in sequences)),
        "sequences": float(len(sequences)),
        "groups_kept": float(len(step.groups)),
        "groups_dropped": float(step.groups_dropped),
        "errors": float(step.errors),
        "rounds": float(step.rounds),
        **{name: float(value) for name, value in step.timings.items()},
    }


def _batch_state(batch: StepBatch | None) -> dict[str, Any] | None:
    if batch is None:
        return None
    return {
        "sequences": [vars(s) for s in batch.sequences],
        "stats": batch.stats,
        "tokens": batch.tokens,
        "sequences_total": batch.sequences_total,
        "extra": batch.extra,
    }


def _batch_from_state(state: dict[str, Any] | None) -> StepBatch | None:
    if state is None:
        return None
    return StepBatch(
        [TrainingSequence(**s) for s in state["sequences"]],
        state["stats"],
        state["tokens"],
        state["sequences_total"],
        state.get("extra", {}),
    )


def _mean(total: float, count: float) -> float | None:
    return total / count if count else None


def _std(total: float, squares: float, count: float) -> float | None:
    if not count:
        return None
    mean = total / count
    return math.sqrt(max(squares / count - mean * mean, 0.0))
