"""Run Python tests forked from a zygote in a fresh interpreter, as the runner has one.

A zygote forked from the pytest process would carry that process's state into every test: its
address space (far past a test's memory limit once torch is loaded) and its atexit hooks. Here
the zygote comes from an interpreter that has loaded only the runner, as in a sandbox.

    python fresh_zygote.py REQUEST_JSON  ->  one reply per line on stdout

REQUEST_JSON: {"source": ..., "runs": N, "limits": {...}, "workdir": ..., "before": code run before
the zygote is made}.
"""

from __future__ import annotations

import json
import os
import sys

from genesys.sandbox import runner


def main(request: dict) -> None:
    replies = os.dup(1)  # _prepare_python_tests gives sys.stdout to the tests
    exec(request["before"], {})
    runner._prepare_python_tests()
    zygote = runner.Zygote(request["workdir"])
    code = compile(request["source"], "main.py", "exec")
    test = {"type": "stdin_stdout", "input": ""}
    try:
        for _ in range(request["runs"]):
            reply = runner.run_test("python", code, test, request["workdir"], request["limits"], zygote)
            os.write(replies, (json.dumps(reply) + "\n").encode())
    finally:
        zygote.lose()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    os._exit(0)  # as the runner exits: no hooks of its own run
