"""`genesys train`: GRPO on genesys tasks, verifiers and rewards (or on recorded rollouts)."""

from __future__ import annotations

from genesys.cli.flags import config_command
from genesys.train.config import TrainConfig


@config_command(
    "train",
    TrainConfig,
    config_argument=True,
    short_help="train a model with GRPO on verified rewards (online, or offline from rollout files)",
    help="Train with GRPO: sample groups of completions for tasks, verify and reward them, and update the model "
    "(or, with data.rollouts, learn from recorded rollouts). Settings come from CONFIG.toml; any key can be "
    "overridden as a dotted flag (--optim.lr 3e-6). Writes metrics.jsonl, checkpoints/ and final/ into output_dir; "
    "rerunning the same command resumes from the last checkpoint. For several processes: torchrun --nproc-per-node N "
    "-m genesys.cli train CONFIG.toml.",
)
def command(config: TrainConfig) -> int:
    from genesys.train.trainer import train

    result = train(config)
    if result.already_complete:
        print(
            f"{result.output_dir} already holds this run's {len(result.metrics)} steps and its final model {result.final_dir}; nothing to do"
        )
    elif result.metrics:
        last = result.metrics[-1]
        reward = last.get("reward_mean")
        skipped = last.get("skipped_steps") or 0
        skipped_note = f" ({skipped} skipped: non-finite loss or gradient)" if skipped else ""
        print(
            f"trained {last['step']} steps{skipped_note}; last reward_mean {reward if reward is None else round(reward, 4)}; final model in {result.final_dir}"
        )
    return 0
