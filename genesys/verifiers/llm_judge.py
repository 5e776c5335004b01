"""`llm_judgeable_groundtruth_similarity`: a judge model compares a response with a reference answer.

The judge is any OpenAI-compatible chat endpoint. Options (`genesys verify -O key=value`, see
`JudgeOptions`) or environment variables choose it; a judge model must be named one way or the other.

The reference is `verification_info["ground_truth"]`, else `gold_standard_solution`. The judge
rates the match from 0 to 10; the score is that rating / 10. A judge that cannot be reached or
answers without a rating gives an error verdict, never a 0.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic.dataclasses import dataclass

import genesys
from genesys.config.sections import SECTION, setting

TASK_TYPE = "llm_judgeable_groundtruth_similarity"
RATING_RE = re.compile(r"RATING:\s*(\d+(?:\.\d+)?)", re.IGNORECASE)
THINK_END = "</think>"

JUDGE_INSTRUCTIONS = """You grade answers against a reference answer.
Judge only whether the response reaches the same substance as the reference: the same facts,
conclusions and key steps. Ignore style, length and formatting.

QUESTION:
{question}

REFERENCE ANSWER:
{reference}

RESPONSE TO GRADE:
{response}

Rate how well the response matches the reference from 0 (unrelated or wrong) to 10 (equivalent).
Explain briefly, then end with a line of the form "RATING: <number from 0 to 10>"."""


def final_answer(completion: str) -> str:
    """The part of a completion after its reasoning (`</think>`), or all of it."""
    return completion.rsplit(THINK_END, 1)[-1].strip()


def parse_rating(reply: str) -> float | None:
    """The last `RATING: x` of a judge reply as a score in [0, 1], or None."""
    ratings = RATING_RE.findall(reply)
    if not ratings:
        return None
    return min(10.0, max(0.0, float(ratings[-1]))) / 10.0


@dataclass(frozen=True, config=SECTION)
class JudgeOptions:
    """The options of the LLM judge: which OpenAI-compatible server and model judge, and how hard to retry."""

    judge_base_url: str | None = setting(
        None, "the judge's server, ending in /v1 (unset: $GENESYS_JUDGE_BASE_URL, else $OPENAI_BASE_URL)"
    )
    judge_model: str | None = setting(None, "the judge model's name (unset: $GENESYS_JUDGE_MODEL)")
    judge_api_key: str | None = setting(
        None, "the judge server's API key (unset: $GENESYS_JUDGE_API_KEY, else $OPENAI_API_KEY)"
    )
    judge_max_retries: int = setting(
        8, "retries of a request on 429, 5xx or connection errors, with exponential backoff", ge=0
    )


class LLMJudge(genesys.Verifier):
    """Scores a response by asking a judge model how well it matches the reference answer."""

    task_type = TASK_TYPE
    timeout = 300.0
    max_parallel = 32
    options_model = JudgeOptions

    def _setting(self, option: str, *env_vars: str) -> str | None:
        value = getattr(self.settings, option)
        if value:
            return str(value)
        return next((os.environ[v] for v in env_vars if os.environ.get(v)), None)

    def setup(self) -> None:
        self.base_url = self._setting("judge_base_url", "GENESYS_JUDGE_BASE_URL", "OPENAI_BASE_URL")
        self.model = self._setting("judge_model", "GENESYS_JUDGE_MODEL")
        self.api_key = self._setting("judge_api_key", "GENESYS_JUDGE_API_KEY", "OPENAI_API_KEY")
        self._client: Any = None

    def judge_prompt(self, rollout: genesys.Rollout) -> str | None:
        reference = rollout.verification_info.get("ground_truth") or rollout.gold_standard_solution
        if not reference:
            return None
        return JUDGE_INSTRUCTIONS.format(
            question=rollout.prompt, reference=reference, response=final_answer(rollout.completion)
        )

    async def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        from genesys.openai_client import APIError, OpenAIClient

        if not self.model:
            return genesys.Verdict.failed(
                "judge_not_configured: set -O judge_model=NAME or $GENESYS_JUDGE_MODEL"
            )
        prompt = self.judge_prompt(rollout)
        if prompt is None:
            return genesys.Verdict.failed(
                "invalid_row: no reference answer in verification_info.ground_truth or gold_standard_solution"
            )
        if self._client is None:  # created inside the worker's event loop, kept for its lifetime
            self._client = OpenAIClient(
                self.base_url,
                self.api_key,
                concurrency=self.max_parallel or 32,
                max_retries=self.settings.judge_max_retries,
            )
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0,
            "max_tokens": 1024,
        }
        try:
            reply = await self._client.chat(body)
        except APIError as exc:
            return genesys.Verdict.failed(f"judge_unavailable: {exc}")
        text = ((reply.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
        score = parse_rating(text)
        if score is None:
            return genesys.Verdict.failed(
                "judge_unparseable: the judge reply has no 'RATING: x' line", judge_reply=text[-2000:]
            )
        return genesys.Verdict(score=score, details={"judge_model": self.model, "judge_reply": text[-2000:]})


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [LLMJudge]
