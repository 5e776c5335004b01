"""`genesys train`: GRPO on genesys tasks, verifiers and rewards (or on recorded rollouts)."""

from __future__ import annotations

import click

from genesys.cli.flags import config_command
from genesys.train.config import TrainConfig

DRY_RUN = click.Option(
    ["--dry-run", "dry_run"],
    is_flag=True,
    help="print the resolved config and the estimated memory per rank (from the model's config, no weights "
    "loaded), then stop; exits with status 1 when the run would not fit the devices this process sees",
)


@config_command(
    "train",
    TrainConfig,
    config_argument=True,
    options=[DRY_RUN],
    short_help="train a model with GRPO on verified rewards (online, or offline from rollout files)",
    help="Train with GRPO: sample groups of completions for tasks, verify and reward them, and update the model "
    "(or, with data.rollouts, learn from recorded rollouts). Settings come from CONFIG.toml; any key can be "
    "overridden as a dotted flag (--optim.lr 3e-6). Writes metrics.jsonl, checkpoints/ and final/ into output_dir; "
    "rerunning the same command resumes from the last checkpoint. For several processes: torchrun --nproc-per-node N "
    "-m genesys.cli train CONFIG.toml. A run whose estimated memory exceeds its device is refused before it starts; "
    "--dry-run shows the estimate.",
)
def command(config: TrainConfig, dry_run: bool = False) -> int:
    if dry_run:
        return _dry_run(config)
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


def _dry_run(config: TrainConfig) -> int:
    """Print the resolved config and the memory plan of one rank; 1 when it does not fit."""
    import os

    import tomli_w

    from genesys.train.memory_plan import plan_memory, size

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    plan = plan_memory(config, world_size)
    print("# resolved config")
    print(tomli_w.dumps(config.as_dict()))
    print(plan.table())
    if plan.fits:
        print("fits: yes")
        return 0
    print(f"fits: no: about {size(plan.peak)} per rank, {plan.device} has {size(plan.capacity or 0)}")
    return 1
