"""`genesys sft`: supervised fine-tuning on worked solutions or verified rollouts."""

from __future__ import annotations

from genesys.cli.flags import config_command
from genesys.config import SftConfig


@config_command(
    "sft",
    SftConfig,
    config_argument=True,
    short_help="fine-tune a model on worked solutions or verified rollouts (rejection sampling)",
    help="Supervised fine-tuning: learn the completions of tasks' gold_standard_solution (data.tasks) and/or of "
    "rollouts whose score reaches data.min_score (data.rollouts), with the loss on completion tokens only and "
    "prompts rendered as generation renders them. Settings come from CONFIG.toml; any key can be overridden as "
    "a dotted flag (--optim.lr 1e-4). Writes metrics.jsonl, checkpoints/ and final/ into output_dir; rerunning "
    "the same command resumes from the last checkpoint. For several processes: torchrun --nproc-per-node N "
    "-m genesys.cli sft CONFIG.toml.",
)
def command(config: SftConfig) -> int:
    from genesys.train.sft import sft

    result = sft(config)
    if result.already_complete:
        print(
            f"{result.output_dir} already holds this run's {len(result.metrics)} steps and its final model {result.final_dir}; nothing to do"
        )
    elif result.metrics:
        last = result.metrics[-1]
        print(
            f"fine-tuned {last['step']} steps ({last['epoch']:.2f} epochs); last loss {last['loss']:.4f}; final model in {result.final_dir}"
        )
    return 0
