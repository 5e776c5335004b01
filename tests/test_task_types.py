"""Unknown task types: one census, one refusal, one wording for verify, generate --verify and skipped rows."""

from __future__ import annotations

import json

import pytest

from genesys.config import VerifyConfig
from genesys.errors import InputError
from genesys.generate.runner import GenerateConfig, run_generation
from genesys.verification.api import verify_files, verify_rollouts
from genesys.verification.task_types import TaskTypeCensus, refuse_unknown, unknown_type_error


def test_refusal_names_each_unknown_type_its_count_and_first_location():
    census = TaskTypeCensus()
    for location, task_type in [("f:1", "echo"), ("f:2", "mystery"), ("f:3", "mystery"), ("f:4", "riddle")]:
        census.add(task_type, location)
    refuse_unknown(census, {"echo", "mystery", "riddle"})  # all served: no error
    with pytest.raises(InputError) as caught:
        refuse_unknown(census, {"echo", "other"})
    assert str(caught.value).startswith(
        "unknown task_type 'mystery' (2 rows, first at f:2); 'riddle' (1 rows, first at f:4); known task types: echo, other. "
        "Install the plugin that serves it, or pass --skip-unknown"
    )


def test_verify_generate_and_skipped_rows_say_it_alike(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"task_type": "mystery", "prompt": "x", "llm_response": "y"}) + "\n")
    with pytest.raises(InputError) as verified:
        verify_files([str(path)], tmp_path / "out.jsonl", config=VerifyConfig(progress=False), verifiers={})
    generate = GenerateConfig(
        tasks=[str(path)],
        model="/nonexistent",
        output=tmp_path / "o.jsonl",
        verify=VerifyConfig(progress=False),
        progress=False,
    )
    with pytest.raises(InputError) as generated:
        run_generation(generate)
    assert str(verified.value).startswith(
        f"unknown task_type 'mystery' (1 rows, first at {path}:1); known task types: none."
    )
    assert str(generated.value).startswith(
        f"unknown task_type 'mystery' (1 rows, first at task 0 of {str(path)!r}); known task types: "
    )
    [row] = verify_rollouts(
        [{"task_type": "mystery"}], config=VerifyConfig(workers=1, progress=False), verifiers={}
    )
    assert (
        row["error"]
        == f"unknown_task_type: {unknown_type_error('mystery', ())}"
        == "unknown_task_type: unknown task_type 'mystery'; known task types: none"
    )
