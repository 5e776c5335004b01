"""Run one submission's tests forked by a template made in a fresh interpreter, as the runner has
them (outside a sandbox: no namespaces of their own).

A template forked from the pytest process would carry that process's state into every test: its
address space (far past a test's memory limit once torch is loaded) and its atexit hooks. Here it
comes from an interpreter that has loaded only the runner, as in a sandbox.

    python fresh_template.py REQUEST_JSON  ->  one reply per line on stdout

REQUEST_JSON: {"source": Python source, or "argv": a program to exec, "runs": N, "limits": {...},
"workdir": ..., "stdin": text, "before": code run before the template is made}; or, instead of
"runs" and "stdin", "tests": true and the test dicts of one submission as JSON on stdin, read (as
the runner reads its requests) once the template is made, and run in order.
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
    workdir, limits = request["workdir"], request["limits"]
    template = runner.Template(workdir, sandboxed=False, uid=None, scratch_bytes=0)
    submission = template.submission()
    if "argv" in request:
        language, program = "cpp", request["argv"]
    else:
        language, program = "python", compile(request["source"], "main.py", "exec")
    if request.get("tests"):
        tests = json.loads(runner.read_to_end(0))
    else:
        tests = [{"type": "stdin_stdout", "input": request.get("stdin", "")}] * request["runs"]
    try:
        for test in tests:
            reply = runner.run_test(language, program, test, workdir, limits, submission)
            os.write(replies, (json.dumps(reply) + "\n").encode())
    finally:
        submission.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    os._exit(0)  # as the runner exits: no hooks of its own run
