"""The GRPO training loop: rollouts in, optimizer steps out, metrics and checkpoints along the way.

One step: take a batch of groups (generated, verified and rewarded now, or read from recorded
rollouts), compute group advantages, then run micro-batches of forward/backward passes whose
losses add up to the batch's mean loss (`[loss] type`, `genesys.train.loss`), clip the gradient norm
and step AdamW. The model is sharded over the processes by FSDP2 (`genesys.train.parallel`; one
process in fp32 trains it unwrapped, bit for bit the same), optionally with LoRA adapters
(`genesys.train.lora`); weights leave it through `genesys.train.export`. With
`optim.updates_per_batch = U` and `optim.mini_batches = M`, one batch serves U x M consecutive
optimizer steps: U passes over it, each in M slices. The ratio is taken
against the old policy's logprobs: the sampler's, or the trainer's own recomputed before the batch's
first step (`loss.recompute_logprobs`, implied by `loss.importance_correction`, which then weighs the
loss by trainer / sampler probability, `genesys.train.correction`). After the optimizer steps of a
batch the rollout source (`genesys.train.sources`) receives the new weights (gathered from the
shards, LoRA merged).

A batch with nothing to learn from (every group dropped, or every rollout failed) takes no
optimizer step and does not move the schedule: its step is logged with `skip_reason = "no_signal"`,
and after `rollout.max_no_signal_steps` of them in a row the run stops with a TrainingError.

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
import functools
import logging
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from genesys.errors import InputError, TrainingError
from genesys.schema import Row
from genesys.threads import ThreadTuner, forward_probe
from genesys.train import checkpoint as ckpt
from genesys.train import export, loading
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
from genesys.train.correction import importance_weights
from genesys.train.distributed import World, close_world, init_world
from genesys.train.dropout import disable_dropout
from genesys.train.logprobs import completion_logprobs
from genesys.train.lora import is_adapter_weight
from genesys.train.loss import (
    group_advantages,
    kl_estimate,
    loss_denominator,
    policy_token_loss,
    reduce_loss,
)
from genesys.train.metrics import MetricsLog, read_metrics
from genesys.train.parallel import clip_grad_norm, device_mesh, set_gradient_sync, shard_model
from genesys.train.schedule import lr_factor
from genesys.train.sources import open_source
from genesys.train.sources.base import (
    POLICY_STEP_COLUMN,
    RewardTally,
    StepRollouts,
    reshard_states,
    usable,
)
from genesys.verification.fork_server import refuse_in_main_script

log = logging.getLogger(__name__)
CONFIG_FILE = "config.toml"
# A rank's loss statistics that are summed over micro-batches and ranks.
SUMMED_TOTALS = (
    "loss",
    "tokens",
    "clip_low",
    "clip_high",
    "delta",
    "ratio_sum",
    "entropy_sum",
    "kl_sum",
    "is_weight_sum",
    "is_capped",
)
# Devices with torch's fused AdamW kernel: one pass over all parameters, 2.5-4.5x faster on CPU.
FUSED_ADAMW_DEVICES = frozenset({"cpu", "cuda"})
# Dotted config keys a resumed run may change without changing what it computes (optim.steps
# only with a constant schedule: a cosine schedule's shape depends on it, `_check_output_dir`).
RESUMABLE_CONFIG_KEYS = frozenset(
    {
        "optim.steps",
        "rollout.max_no_signal_steps",
        "eval.tasks",
        "eval.every",
        "eval.samples",
        "eval.max_tasks",
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
    slice_tokens: list[float] = field(default_factory=list)  # per mini-batch, over all ranks
    slice_sequences: list[float] = field(default_factory=list)
    used: int = 0  # optimizer steps taken on this batch so far
    slice_budgets: list[float] = field(default_factory=list)  # most model tokens (dr_grpo), per mini-batch


def train(config: Any, trainer: type[Trainer] | None = None) -> TrainResult:
    """Run (or resume) the training run `config` describes with `trainer` (default: GRPO's
    `Trainer`); see `genesys.train`. A run whose output_dir already holds its final model and all
    its steps is returned as it is."""
    refuse_in_main_script("a training run")
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
        self.resume = resume
        self.state = ckpt.load_state(resume) if resume else None
        self.step = self.state["step"] if self.state else 0
        self.skipped_steps = self.state.get("skipped_steps", 0) if self.state else 0
        self.nonfinite_in_a_row = self.state.get("nonfinite_in_a_row", 0) if self.state else 0
        self.no_signal_in_a_row = self.state.get("no_signal_in_a_row", 0) if self.state else 0
        torch.manual_seed(self._seed())
        self._load_inputs()  # checked before any model is loaded
        self.source_model = config.model  # engines then take the trainer's weights (`start`)
        self.tokenizer, self.model, self.peft = self._load_model(resume is not None)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id
        )
        self._prepare_model()
        self.threads = ThreadTuner.for_device(
            self.device, forward_probe(self.model, len(self.tokenizer), self.device)
        )
        self.steps_run = 0  # steps of this process (the thread count is measured from its first)
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
        self.evaluator = self._open_evaluator() if world.is_main else None

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
            old_steps = existing.get("optim", {}).get("steps")
            if self.config.optim.schedule == "cosine" and old_steps not in (None, self.config.optim.steps):
                raise InputError(
                    f"{self.output_dir} holds a run of optim.steps = {old_steps} with a cosine schedule; resuming it with "
                    f"optim.steps = {self.config.optim.steps} would reshape the schedule mid-run (the learning rate would jump). "
                    "Resume with the same optim.steps, or train further with schedule = 'constant'"
                )
        if self.world.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            write_config(path, self.config.as_dict())

    def _load_model(self, resuming: bool) -> tuple[Any, torch.nn.Module, Any]:
        """(tokenizer, the model sharded over the ranks, peft's wrapper of it or None), built without
        weights on every rank and given storage for its shards only (`genesys.train.loading`). The
        pretrained weights are read by rank 0 and sent out, unless the run resumes and trains every
        weight: then all come from the checkpoint's shards (`_restore`)."""
        from transformers import AutoConfig

        config = self.config
        try:
            self.model_dtype = export.declared_dtype(AutoConfig.from_pretrained(config.model))
        except (OSError, ValueError) as exc:
            raise InputError(f"model {config.model!r} cannot be loaded: {exc}") from None
        tokenizer, model = loading.empty_model(config.model, config.gradient_checkpointing)
        peft, prepare = None, None
        if config.lora.enabled:
            from genesys.train.lora import add_adapters

            prepare = functools.partial(_same_adapters, config.lora, torch.get_rng_state())
            peft = add_adapters(model, config.lora)
            if config.gradient_checkpointing:  # a frozen embedding would cut the recomputed graph
                model.enable_input_require_grads()
        mesh = device_mesh(self.world, config.parallel.strategy, self.device)
        model = shard_model(model, mesh, config.precision)
        loading.materialize(model, self.device)
        if not resuming or any(not parameter.requires_grad for parameter in model.parameters()):
            # adapters are initialised in fp32 on a base in fp32, as on the trained model: a base
            # read in bf16 would round their initial values
            dtype = torch.float32 if prepare is not None else "auto"
            loading.load_pretrained(model, config.model, self.world, prepare, dtype)
        return tokenizer, model, peft

    def _frozen_reference(self) -> torch.nn.Module:
        """The initial model, frozen and sharded like the trained one, for the KL term (always
        `config.model`, also when resuming)."""
        mesh = device_mesh(self.world, self.config.parallel.strategy, self.device)
        return loading.sharded_pretrained(
            self.config.model, self.world, mesh, self.config.precision, self.device, frozen=True
        )

    def _open_tracker(self) -> Any:
        if not self.config.report_to:
            return None
        from genesys.train.tracking import open_trackers

        return open_trackers(
            self.config.report_to,
            self.output_dir,
            self.config.as_dict(),
            self.output_dir.name,
            resume=self.state is not None,
        )

    def _open_evaluator(self) -> Any:
        if not self.config.eval.tasks:
            return None
        from genesys.train.evaluation import Evaluator

        return Evaluator.open(self.config, self.rollouts)

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
        """One optimizer step (generating a new batch first when the last one is used up); its
        `step_seconds` count all of it, the thread count's measuring included."""
        started = time.perf_counter()
        if self.threads is not None:
            self.threads.maybe_tune(self.steps_run)
        self.steps_run += 1
        first_update = self.batch is None
        if self.batch is None:
            self.batch = self._next_batch()
        batch = self.batch
        if batch.sequences_total == 0:
            return self._step_without_update(batch, started, "no_signal")
        self.no_signal_in_a_row = 0
        mismatch = self._before_update(batch) if first_update else None
        part = batch.used % self.config.optim.mini_batches
        if batch.slice_sequences[part] == 0:
            return self._step_without_update(batch, started, "empty_mini_batch")
        totals = self._accumulate_gradients(batch, part, record_mismatch=first_update and mismatch is None)
        if mismatch is not None:
            totals.update(mismatch)
        grad_norm, updated = self._optimizer_step(totals)
        self.step += 1
        self.nonfinite_in_a_row = 0 if updated else self.nonfinite_in_a_row + 1
        self.skipped_steps += not updated
        self._finish_batch_step(batch)
        metrics = self._metrics(batch, totals, grad_norm, time.perf_counter() - started, first_update)
        metrics["step_skipped"] = not updated
        metrics["skip_reason"] = None if updated else "nonfinite"
        metrics["skipped_steps"] = self.skipped_steps
        self._log(metrics)
        if not updated:
            self._nonfinite_step(metrics)
        return metrics

    def _finish_batch_step(self, batch: StepBatch) -> None:
        """Count a step on `batch`; when it has served all its steps, publish the weights."""
        batch.used += 1
        if batch.used >= self.config.optim.updates_per_batch * self.config.optim.mini_batches:
            self.batch = None
            self.rollouts.publish(export.full_parameters(self.model), self.step)

    def _step_without_update(self, batch: StepBatch, started: float, reason: str) -> dict[str, Any]:
        """A step with nothing to learn from: no forward pass, no optimizer step, the schedule stays.
        A batch without any sequence is used up at once; after `rollout.max_no_signal_steps` of
        them in a row the run stops."""
        self.step += 1
        self.skipped_steps += 1
        if reason == "no_signal":
            self.no_signal_in_a_row += 1
            batch.used = self.config.optim.updates_per_batch * self.config.optim.mini_batches - 1
        self._finish_batch_step(batch)
        metrics = self._metrics(batch, _zero_totals(), None, time.perf_counter() - started, True)
        metrics.update(step_skipped=True, skip_reason=reason, skipped_steps=self.skipped_steps)
        self._log(metrics)
        limit = self.config.rollout.max_no_signal_steps
        if reason == "no_signal" and self.no_signal_in_a_row >= limit:
            self.save_checkpoint()  # nothing learnt so far is lost: the run resumes from here
            raise TrainingError(
                f"step {self.step}: no group had a learning signal in {self.no_signal_in_a_row} steps in a row "
                f"({metrics['groups_dropped']} groups dropped, {metrics['rollout_errors']} rollout errors in the last; "
                f"reward_mean {metrics['reward_mean']}): every rollout of a task got the same reward (all solved, or "
                "none), or none was scored. The model is saved in checkpoint "
                f"{ckpt.step_dir(self.checkpoints, self.step)}. Check the rewards and the task difficulty "
                "(genesys filter), raise sampling.n, or raise rollout.max_no_signal_steps and resume"
            )
        if reason == "no_signal":
            log.warning(
                "step %d: no group with a learning signal, no optimizer step (%d in a row; the run stops at %d)",
                self.step,
                self.no_signal_in_a_row,
                limit,
            )
        return metrics

    def _log(self, metrics: dict[str, Any]) -> None:
        """Evaluate when due, then write the step's metrics to metrics.jsonl and the trackers."""
        if self.evaluator is not None and self.evaluator.due(self.step):
            metrics.update(self.evaluator.evaluate())
        if self.metrics is not None:
            self.metrics.write(metrics)
        if self.tracker is not None:
            self.tracker.log(metrics, self.step)

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

    def _loss_denominator(self, batch: StepBatch, part: int) -> float:
        """What the summed token losses of mini-batch `part` of a batch are divided by (over all ranks)."""
        loss = self.config.loss
        budget = (
            batch.slice_budgets[part]
            if batch.slice_budgets
            else batch.slice_sequences[part] * self.config.sampling.max_tokens  # a batch saved without
        )
        return loss_denominator(
            loss.type, loss.normalize, batch.slice_tokens[part], batch.slice_sequences[part], budget
        )

    def _prepare_model(self) -> None:
        """Set the loaded model up for training: dropout off (`disable_dropout`)."""
        if self.config.disable_dropout:
            disable_dropout(self.model)

    def _before_update(self, batch: StepBatch) -> dict[str, float] | None:
        """Work on a new batch before its first optimizer step: recompute the old policy's logprobs
        when the loss asks for them; returns their mismatch statistics (None when not recomputed)."""
        return self._recompute_old_logprobs(batch) if self.config.loss.recomputes else None

    def _describe(self, metrics: dict[str, Any]) -> str:
        """The progress bar's text after a step."""
        reward = metrics["reward_mean"]
        return f"training  reward {reward:.3f}" if reward is not None else "training"

    def _next_batch(self) -> StepBatch:
        per_rank = self.config.rollout.prompts_per_step // self.world.size
        step = self.rollouts.next_batch(per_rank)
        sequences, truncated = self._sequences(step)
        stats = _rollout_stats(step, sequences)
        stats["truncated_masked"] = float(truncated)
        if step.groups_seen and len(step.groups) < per_rank:
            log.warning(
                "step %d: only %d of %d groups with signal after %d generation rounds",
                self.step + 1,
                len(step.groups),
                per_rank,
                step.rounds,
            )
        return self._step_batch(sequences, stats, step.extra)

    def _sequences(self, step: StepRollouts) -> tuple[list[TrainingSequence], int]:
        """The batch's training sequences with their group advantages, shortest first (less padding),
        and how many truncated completions `loss.mask_truncated` left out (after they counted in
        their group's advantages)."""
        groups = [usable(group) for group in step.groups]
        groups = [group for group in groups if group]
        rows = [row for group in groups for row in group]
        rewards = torch.tensor([float(row["reward"]) for row in rows], dtype=torch.float32)
        advantages = group_advantages(
            rewards, [len(g) for g in groups], self.config.loss.scale_by_std
        ).tolist()
        _check_advantages(groups, advantages)
        kept = [
            (row, advantage)
            for row, advantage in zip(rows, advantages)
            if not (self.config.loss.mask_truncated and _truncated(row, self.config.sampling.max_tokens))
        ]
        sequences = [
            TrainingSequence(
                list(row["prompt_ids"]),
                list(row["completion_ids"]),
                [float(x) for x in row["completion_logprobs"]],
                advantage,
                staleness=_staleness(row, self.step),
                completion_mask=None if row.get("completion_mask") is None else list(row["completion_mask"]),
                max_model_tokens=_model_token_budget(row, self.config.sampling.max_tokens),
            )
            for row, advantage in kept
        ]
        ordered = sorted(sequences, key=_length)
        return ordered, len(rows) - len(kept)

    def _step_batch(
        self, sequences: list[TrainingSequence], stats: dict[str, float], extra: dict[str, Any] | None = None
    ) -> StepBatch:
        """A batch of this rank's `sequences`, with the model tokens and sequences of the whole batch
        and, for each of its `optim.mini_batches` interleaved slices, its model tokens, sequences and
        model-token budget (`TrainingSequence.max_model_tokens`), summed over all ranks."""
        parts = self.config.optim.mini_batches
        local = [float(sum(s.model_tokens for s in sequences)), float(len(sequences))]
        for part in range(parts):
            chunk = sequences[part::parts]
            local += [
                float(sum(s.model_tokens for s in chunk)),
                float(len(chunk)),
                float(sum(s.max_model_tokens or 0 for s in chunk)),
            ]
        summed = self.world.sum(local)
        return StepBatch(
            sequences,
            stats,
            summed[0],
            summed[1],
            extra or {},
            list(summed[2::3]),
            list(summed[3::3]),
            slice_budgets=list(summed[4::3]),
        )

    def _chunks(self, sequences: list[TrainingSequence]) -> list[list[TrainingSequence]]:
        """This rank's `sequences` cut into micro-batches: within `optim.micro_batch_tokens` tokens
        each when set, else `optim.micro_batch_size` sequences each."""
        budget = self.config.optim.micro_batch_tokens
        if not budget:
            return split(sequences, self.config.optim.micro_batch_size)
        try:
            return split_by_tokens(sequences, budget)
        except SequenceTooLong as exc:
            raise InputError(f"step {self.step + 1}: {exc}") from None

    def _micro_batches(self, sequences: list[TrainingSequence]) -> Iterator[MicroBatch]:
        """The micro-batches of `_chunks(sequences)`, padded with empty ones to the count of the rank
        with the most (every rank must take part in every gradient all-reduce): packed when
        `optim.micro_batch_tokens` is set, else padded."""
        budget = self.config.optim.micro_batch_tokens
        chunks = self._chunks(sequences)
        count = int(self.world.max([float(len(chunks))])[0])
        for index in range(count):
            if index >= len(chunks):
                yield _empty_micro_batch(self.pad_id, self.device)
            elif budget:
                yield pack(chunks[index], self.device)
            else:
                yield collate(chunks[index], self.pad_id, self.device)

    def _policy_logprobs(
        self, model: torch.nn.Module, micro: MicroBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The completion tokens' logprobs under `model` (at the sampling temperature and nucleus), and
        their positions' entropies."""
        sampling = self.config.sampling
        return completion_logprobs(model, micro, sampling.temperature, sampling.top_p)

    @torch.no_grad()
    def _recompute_old_logprobs(self, batch: StepBatch) -> dict[str, float]:
        """Give every sequence of `batch` the trainer's logprobs under the weights it starts from
        (the old policy); returns the largest gap to the sampler's logprobs, for fresh and for
        stale rollouts apart. Every rank runs as many forward passes as the rank with the most (a
        sharded or data-parallel model's forward is a collective)."""
        self.model.train()  # the mode of the update's forward passes (dropout is off)
        gaps = {"mismatch": 0.0, "mismatch_stale": 0.0}
        chunks = self._chunks(batch.sequences)
        recomputed: list[TrainingSequence] = []
        for index, micro in enumerate(self._micro_batches(batch.sequences)):
            logprobs, _ = self._policy_logprobs(self.model, micro)
            if index >= len(chunks):
                continue  # an empty micro-batch, run for the other ranks
            _record_mismatch(gaps, logprobs, micro)
            for row, sequence in enumerate(chunks[index]):
                values = logprobs[row, : len(sequence.completion_ids)].tolist()
                recomputed.append(replace(sequence, old_logprobs=values))
        batch.sequences = recomputed
        return gaps

    def _accumulate_gradients(self, batch: StepBatch, part: int, record_mismatch: bool) -> dict[str, float]:
        """Forward and backward over the micro-batches of mini-batch `part` of the batch; returns
        this rank's loss statistics."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        denominator = max(self._loss_denominator(batch, part), 1.0)
        totals = _zero_totals()
        sequences = batch.sequences[part :: self.config.optim.mini_batches]
        micro_batches = list(self._micro_batches(sequences))
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
        loss_config = config.loss
        logprobs, entropy = self._policy_logprobs(self.model, micro)
        if loss_config.entropy_coef == 0:
            entropy = entropy.detach()
        mask = micro.completion_mask
        clipped = policy_token_loss(
            loss_config.type,
            logprobs,
            micro.old_logprobs,
            micro.advantages,
            mask,
            eps_low=loss_config.eps_low,
            eps_high=loss_config.eps_high,
            delta=loss_config.delta,
        )
        token_loss = clipped.loss
        if loss_config.importance_correction != "none":
            weights = importance_weights(
                micro.old_logprobs,
                micro.behaviour_logprobs,
                mask,
                mode=loss_config.importance_correction,
                level=loss_config.importance_level,
                cap=loss_config.importance_cap,
            )
            token_loss = token_loss * weights.weights
            totals["is_weight_sum"] += float(weights.weights[mask].sum())
            totals["is_capped"] += float(weights.capped[mask].sum())
        if self.reference is not None:
            with torch.no_grad():
                reference, _ = self._policy_logprobs(self.reference, micro)
            kl = kl_estimate(logprobs, reference)
            token_loss = token_loss + loss_config.kl_beta * kl
            totals["kl_sum"] += float(kl.detach()[mask].sum())
        if loss_config.entropy_coef > 0:
            token_loss = token_loss - loss_config.entropy_coef * entropy
        loss = reduce_loss(token_loss, mask, loss_config.normalize, denominator)
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
                _record_mismatch(totals, logprobs.detach(), micro)
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
        self,
        batch: StepBatch,
        totals: dict[str, float],
        grad_norm: float | None,
        seconds: float,
        first_update: bool,
    ) -> dict[str, Any]:
        keys = sorted(batch.stats)
        summed = dict(zip(keys, self.world.sum([batch.stats[k] for k in keys])))
        losses = dict(zip(SUMMED_TOTALS, self.world.sum([totals[k] for k in SUMMED_TOTALS])))
        ratio_max, mismatch, mismatch_stale = self.world.max(
            [totals["ratio_max"], totals["mismatch"], totals["mismatch_stale"]]
        )
        tokens = max(losses["tokens"], 1.0)
        stale = summed.get("stale_sequences", 0.0)
        metrics: dict[str, Any] = {
            "step": self.step,
            "reward_mean": _mean(summed["reward_sum"], summed["rewarded"]),
            "reward_std": _std(summed["reward_sum"], summed["reward_sq_sum"], summed["rewarded"]),
            "reward_mean_kept": _mean(summed["kept_reward_sum"], summed["kept_rewarded"]),
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
            # the trainer's old policy against the sampler, on rollouts of the current weights
            # (engine mismatch) and of older ones (mismatch and staleness) apart
            "logprob_mismatch": mismatch if first_update and summed["sequences"] > stale else None,
            "logprob_mismatch_stale": mismatch_stale if first_update and stale else None,
            "tokens": losses["tokens"],
            "tokens_per_s": losses["tokens"] / seconds if seconds > 0 else None,
            "step_seconds": seconds,
        }
        if self.config.loss.mask_truncated:
            metrics["truncated_masked"] = int(summed["truncated_masked"])
        if self.config.loss.importance_correction != "none":
            metrics["is_weight_mean"] = losses["is_weight_sum"] / tokens
            metrics["is_capped_frac"] = losses["is_capped"] / tokens
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
        """Write the checkpoint of the current step (`genesys.train.checkpoint`): every rank its shards
        of the weights and optimizer state, rank 0 the model folder (gathered a file at a time) and
        the trainer state with every rank's data position."""
        directory = ckpt.step_dir(self.checkpoints, self.step)
        ckpt.check_finite(self.model, f"checkpoint {directory}", self.world)  # all ranks refuse together
        tensors, groups = self._sharded_state()

        def write_parts(path: Path) -> None:
            ckpt.save_shards(path / ckpt.SHARDS_DIR, tensors, self.world)
            export.write_model(path, self.model, self.model_dtype, self.tokenizer, self.world.is_main)

        def state() -> dict[str, Any]:
            ranks = self.world.gather(
                {"data": self.rollouts.state(), "batch": _batch_state(self.batch), "rng": ckpt.rng_states()}
            )
            return {
                "step": self.step,
                "world_size": self.world.size,
                "skipped_steps": self.skipped_steps,
                "nonfinite_in_a_row": self.nonfinite_in_a_row,
                "no_signal_in_a_row": self.no_signal_in_a_row,
                "optimizer_groups": groups,
                "scheduler": self.scheduler.state_dict(),
                "ranks": ranks,
            }

        ckpt.save_checkpoint(
            self.checkpoints, self.step, self.world, write_parts, state, self.config.checkpoint.keep
        )

    def _sharded_state(self) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
        """This rank's shards of what a checkpoint keeps, by name: `model.NAME` for the fp32 weights
        it trains and the persistent buffers (not the frozen weights of a LoRA base, which come from
        the pretrained model), `optimizer.NAME.KEY` for AdamW's moments and step counts; and the
        optimizer's parameter groups (hyperparameters, parameters by name). The tensors are the
        model's and optimizer's own. An optimizer without state yet gets it, all zeros: torch makes it
        by a step of learning rate 0 on zero gradients, whose step count is set back to 0 here (else the
        first real update would be AdamW's second, with another bias correction)."""
        fresh = not self.optimizer.state
        model_state, optimizer_state = get_state_dict(
            self.model, self.optimizer, options=StateDictOptions(ignore_frozen_params=True)
        )
        if fresh:
            for values in [*self.optimizer.state.values(), *optimizer_state["state"].values()]:
                values["step"] = torch.zeros_like(values["step"]) if torch.is_tensor(values["step"]) else 0
        own = {name for name, _ in self.model.named_parameters()} | {
            name for name, _ in self.model.named_buffers()
        }  # an output layer tied to the embeddings is kept once, under the embeddings' name
        tensors = {f"model.{name}": value for name, value in model_state.items() if name in own}
        for name, values in optimizer_state["state"].items():
            tensors.update({f"optimizer.{name}.{key}": value for key, value in values.items()})
        return tensors, optimizer_state["param_groups"]

    def _write_model(self, path: Path) -> None:
        export.write_model(path, self.model, self.model_dtype, self.tokenizer, self.world.is_main)

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
        self._write_model(final)

    def _restore(self, state: dict[str, Any]) -> None:
        """Continue from the checkpoint being resumed: the weights and optimizer state from its
        shards (resharded when it was written by another number of processes), the schedule, and this
        rank's data position, unfinished batch and RNG states (`_rank_state`)."""
        tensors, _ = self._sharded_state()
        ckpt.load_shards(self.resume, tensors)
        model_state: dict[str, torch.Tensor] = {}
        optimizer_state: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():  # the names of `_sharded_state`, taken apart
            part, _, name = key.partition(".")
            if part == "model":
                model_state[name] = value
            else:
                parameter, _, field = name.rpartition(".")
                optimizer_state.setdefault(parameter, {})[field] = value
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=model_state,
            optim_state_dict={"state": optimizer_state, "param_groups": state["optimizer_groups"]},
            options=StateDictOptions(strict=False),  # the tied output layer and a LoRA base are not in it
        )
        self.scheduler.load_state_dict(state["scheduler"])
        mine = self._rank_state(state)
        self.rollouts.load_state(mine["data"])
        self.batch = _batch_from_state(mine["batch"])
        if self.batch is not None and state["world_size"] != self.world.size:
            used = self.batch.used  # its sequences were dealt out anew: its slices' totals change
            self.batch = self._step_batch(
                sorted(self.batch.sequences, key=_length), self.batch.stats, self.batch.extra
            )
            self.batch.used = used
        ckpt.restore_rng_states(mine["rng"])

    def _rank_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """This rank's part of the checkpoint's `ranks`: its own when as many processes wrote it;
        otherwise the data position carried over (`reshard_states`), the unfinished batch's sequences
        dealt out in turn (its summed statistics on rank 0) and the RNG states of rank `rank % old`."""
        ranks, rank, size = state["ranks"], self.world.rank, self.world.size
        if state["world_size"] == size:
            return ranks[rank]
        log.warning(
            "resuming a checkpoint of %d processes with %d: the data position carries over", len(ranks), size
        )
        batch = None
        if ranks[0]["batch"] is not None:
            old = [part["batch"] for part in ranks]
            sequences = [sequence for part in old for sequence in part["sequences"]]
            stats = {
                key: sum(part["stats"][key] for part in old) if rank == 0 else 0.0 for key in old[0]["stats"]
            }
            batch = {**old[0], "sequences": sequences[rank::size], "stats": stats}
        return {
            "data": reshard_states([part["data"] for part in ranks], rank, size),
            "batch": batch,
            "rng": ranks[rank % len(ranks)]["rng"],
        }


def _same_adapters(lora_config: Any, rng: torch.Tensor, model: torch.nn.Module) -> None:
    """Add to `model` (rank 0's copy of the pretrained model) the adapters the trained model got,
    initialised from the same random state `rng`, without moving this process's random state."""
    from genesys.train.lora import add_adapters

    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(rng)
        add_adapters(model, lora_config)


def _length(sequence: TrainingSequence) -> int:
    return len(sequence.prompt_ids) + len(sequence.completion_ids)


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
    """This rank's sums for the step's metrics: the rewards of every generated rollout (dropped
    groups included, when the source says) and of the kept ones, scores, tokens, counts, timings."""
    kept = RewardTally()
    kept.add(row for group in step.groups for row in group)
    generated = step.generated_rewards if step.generated_rewards is not None else kept
    scores = [float(row["score"]) for group in step.groups for row in group if row.get("score") is not None]
    return {
        "reward_sum": generated.total,
        "reward_sq_sum": generated.squares,
        "rewarded": float(generated.count),
        "kept_reward_sum": kept.total,
        "kept_rewarded": float(kept.count),
        "score_sum": sum(scores),
        "scored": float(len(scores)),
        "tokens": float(sum(s.model_tokens for s in sequences)),
        "sequences": float(len(sequences)),
        "stale_sequences": float(sum(s.staleness > 0 for s in sequences)),
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
        "slice_tokens": batch.slice_tokens,
        "slice_sequences": batch.slice_sequences,
        "slice_budgets": batch.slice_budgets,
        "used": batch.used,
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
        state.get("slice_tokens", [state["tokens"]]),
        state.get("slice_sequences", [state["sequences_total"]]),
        state.get("used", 0),
        state.get("slice_budgets", []),
    )


def _zero_totals() -> dict[str, float]:
    """A rank's loss statistics before any micro-batch: sums, and maxima (ratio, mismatches)."""
    return dict.fromkeys((*SUMMED_TOTALS, "ratio_max", "mismatch", "mismatch_stale"), 0.0)


def _record_mismatch(totals: dict[str, float], logprobs: torch.Tensor, micro: MicroBatch) -> None:
    """Raise the largest |trainer - sampler| logprob gap seen, of fresh and of stale rollouts apart."""
    gap = torch.where(micro.completion_mask, (logprobs.detach() - micro.behaviour_logprobs).abs(), 0.0)
    per_sequence = gap.max(dim=1).values
    stale = micro.staleness > 0
    if (~stale).any():
        totals["mismatch"] = max(totals["mismatch"], float(per_sequence[~stale].max()))
    if stale.any():
        totals["mismatch_stale"] = max(totals["mismatch_stale"], float(per_sequence[stale].max()))


def _model_token_budget(row: Row, max_tokens: int) -> int:
    """The most model tokens `row` could hold: `max_tokens` for a completion; for a trajectory
    (`completion_mask`), `max_tokens` per turn of its environment's `max_turns` (of its model turns
    when no installed environment plays its task type)."""
    mask = row.get("completion_mask")
    if mask is None:
        return max_tokens
    from genesys.environments.tokens import model_spans
    from genesys.plugins.registry import environments

    environment = environments().get(row.get("task_type"))
    turns = environment.max_turns if environment is not None else len(model_spans(list(mask)))
    return max_tokens * max(turns, 1)


def _truncated(row: Row, max_tokens: int) -> bool:
    """Whether the rollout was cut: a completion at the token limit (its finish reason, else its
    length); a trajectory (`completion_mask`) at its environment's `max_turns`, or with its last model
    turn at the token limit (the answer the environment judged was cut)."""
    mask = row.get("completion_mask")
    if mask is not None:
        from genesys.environments.tokens import model_spans

        spans = model_spans(list(mask))
        last_turn = spans[-1][1] - spans[-1][0] if spans else 0
        return row.get("finish_reason") == "max_turns" or last_turn >= max_tokens
    reason = row.get("finish_reason")
    if reason is not None:
        return reason == "length"
    return len(row["completion_ids"]) >= max_tokens


def _staleness(row: Row, step: int) -> int:
    """How many optimizer steps older than the trainer's the weights that sampled `row` are."""
    version = row.get(POLICY_STEP_COLUMN)
    return max(0, step - int(version)) if version is not None else 0


def _mean(total: float, count: float) -> float | None:
    return total / count if count else None


def _std(total: float, squares: float, count: float) -> float | None:
    if not count:
        return None
    mean = total / count
    return math.sqrt(max(squares / count - mean * mean, 0.0))
