"""The `code_output_prediction` verifier: did the model predict what a program prints?

The completion answers with a JSON object holding an `output` field (bare, or in a ```json block);
it is compared with `verification_info["ground_truth"]`. Strings must match exactly apart from
leading and trailing whitespace; other values are compared as JSON values (numbers within 1e-6,
except that an integer ground truth needs a number of exactly its value). A non-string prediction of a string ground truth is compared as its JSON text.
"""

from __future__ import annotations

import json
from typing import Any

import genesys
from genesys.schema import Rollout, Verdict
from genesys.verifiers.code_compare import values_match

_MISSING = object()


def extract_prediction(completion: str) -> Any:
    """The `output` of the last JSON object in the completion that has one (or _MISSING)."""
    decoder = json.JSONDecoder()
    position = completion.rfind("{")
    while position != -1:
        try:
            value, _ = decoder.raw_decode(completion, position)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict) and "output" in value:
            return value["output"]
        position = completion.rfind("{", 0, position)
    return _MISSING


def prediction_matches(predicted: Any, truth: Any) -> bool:
    if isinstance(truth, str):
        text = predicted if isinstance(predicted, str) else json.dumps(predicted)
        return text.strip() == truth.strip()
    return values_match(predicted, truth)


class CodeOutputVerifier(genesys.Verifier):
    """Scores `code_output_prediction` rollouts: 1.0 when the predicted output equals the ground truth."""

    task_type = "code_output_prediction"
    accepted_options = frozenset()
    timeout = 5.0

    def verify(self, rollout: Rollout) -> Verdict:
        info = rollout.verification_info
        if "ground_truth" not in info:
            return Verdict.failed("invalid_verification_info: verification_info.ground_truth is missing")
        predicted = extract_prediction(rollout.completion)
        if predicted is _MISSING:
            return Verdict(0.0, {"status": "no_output"})
        correct = prediction_matches(predicted, info["ground_truth"])
        shown = predicted if isinstance(predicted, str) else json.dumps(predicted)
        return Verdict(
            float(correct), {"status": "correct" if correct else "wrong", "predicted": shown[:500]}
        )


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [CodeOutputVerifier]
