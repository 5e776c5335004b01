"""What a rollout row is made of: the requests sent to a backend, their seeds, and the rows built
from what comes back. Shared by `genesys generate` (`genesys.generate.runner`) and the trainer's
online rollouts, so both write the same columns.

Every rollout's `response_id` is `<task key>-<sample index>`, the task key hashing what defines the
task (`genesys.data.identity`).
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from genesys.config import GenerateConfig
from genesys.data.identity import request_seed, response_id
from genesys.generate.backend import Backend, GenerationRequest, GenerationResult
from genesys.schema import VERDICT_COLUMNS
from genesys.tasks.prompts import build_messages, target_instruction


@dataclass
class PlannedTask:
    """A selected task and the sample indices the output still lacks."""

    key: str
    row: dict[str, Any]
    missing: list[int]
    target_length: int | None = None


def requests(plans: Sequence[PlannedTask], config: GenerateConfig) -> Iterator[GenerationRequest]:
    """One request per planned task: its messages (with the target-length instruction) and the
    samples it lacks, seeded per task."""
    for plan in plans:
        yield GenerationRequest(
            plan.key,
            request_messages(plan, config),
            plan.missing,
            request_seed(config.sampling.seed, plan.key),
            config.sampling,
        )


def request_messages(plan: PlannedTask, config: GenerateConfig) -> list[dict[str, str]]:
    """The messages a single-turn task is asked with: its prompt, the system prompt and the
    target-length instruction."""
    instruction = (
        target_instruction(config.target_length_prompt, plan.target_length)
        if plan.target_length is not None
        else None
    )
    return build_messages(plan.row["prompt"], config.system_prompt, instruction)


def generation_settings(config: GenerateConfig, backend_name: str) -> dict[str, Any]:
    """The `generation_config` column: what produced the rollouts."""
    settings = {
        "backend": backend_name,
        **config.sampling.as_dict(),
        "system_prompt": config.system_prompt,
        "chat_template": config.style.chat_template,
        "continuation_prefix": config.style.continuation_prefix,
    }
    if config.target_lengths:
        settings["target_length_prompt"] = config.target_length_prompt
    if config.proofs is not None:
        settings["proofs"] = asdict(config.proofs)
    return settings


def machine_info(backend: Backend) -> dict[str, Any]:
    """The `machine_info` column: where the rollouts were made (host, platform, versions, devices)."""
    from genesys import __version__

    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "genesys": __version__,
        **backend.info(),
    }


class RowBuilder:
    """Turns a generation result into rollout rows: every task column plus the response columns."""

    def __init__(self, model_name: str, generation_config: dict[str, Any], machine: dict[str, Any]) -> None:
        self.model_name = model_name
        self.generation_config = generation_config
        self.machine = machine

    def rows(self, plan: PlannedTask, result: GenerationResult) -> list[dict[str, Any]]:
        base = {k: v for k, v in plan.row.items() if k not in VERDICT_COLUMNS}
        rows = []
        for sample, completion in zip(result.request.sample_indices, result.completions):
            row = dict(base)
            row.update(
                llm_response=completion.text,
                response_id=response_id(plan.key, sample),
                model_name=self.model_name,
                generation_config=self.generation_config,
                machine_info=self.machine,
                prompt_ids=result.prompt_ids if completion.prompt_ids is None else completion.prompt_ids,
                completion_ids=completion.completion_ids,
                completion_logprobs=completion.logprobs,
                finish_reason=completion.finish_reason,
            )
            if plan.target_length is not None:
                row["target_length"] = plan.target_length
            if completion.trajectory is not None:
                row.update(completion.trajectory, completion_mask=completion.completion_mask)
            if completion.proofs is not None:
                row.update(
                    toploc_proofs=completion.proofs,
                    toploc_config=completion.proof_settings,
                    sampling_proof=None
                    if completion.sampler is None
                    else {"sampler": completion.sampler, "seed": result.request.seed, "sample": sample},
                )
            rows.append(row)
        return rows
