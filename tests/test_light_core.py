"""The light core: verifying with the built-in math verifier and the CLI's verify path import no extra."""

from __future__ import annotations

import subprocess
import sys

EXTRAS = ("torch", "transformers", "docker", "matplotlib", "datasets", "vllm", "ray")

PROBE = """
import sys
import genesys
from genesys.config import VerifyConfig
from genesys.cli.flags import ConfigCommand
from genesys.config import VerifyCommand
ConfigCommand("verify", VerifyCommand, lambda c: c)
row = {"task_type": "verifiable_math", "prompt": "1+1?", "verification_info": {"ground_truth": "2"}, "llm_response": "\\\\boxed{2}"}
[out] = genesys.verify_rollouts([row], config=VerifyConfig(workers=1, progress=False))
assert out["score"] == 1.0, out
print(",".join(sorted(name for name in %r if name in sys.modules)))
"""


def test_verifying_math_imports_no_extra():
    done = subprocess.run(
        [sys.executable, "-c", PROBE % (EXTRAS,)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported extras: {done.stdout.strip()}"
