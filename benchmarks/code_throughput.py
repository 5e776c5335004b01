"""Code-verification throughput: tests per second through `genesys verify`, against a baseline.

1,000 Python submissions x 3 stdin/stdout tests go through `genesys verify --sandbox KIND` on each
backend that works here (wall clock of the whole command, start-up included). The baseline, timed
in the same run on the same machine, runs every test the way GENESYS's code verifier does: one
fresh sandboxed interpreter per test (a `docker exec` of python into a warm container with the same
hardening, or a fresh `bwrap ... python3` with the same binds), as many at once as there are workers.
The baseline runs a sample of the tests (--baseline-tests) and is reported in tests/s.

    python benchmarks/code_throughput.py [--submissions 1000] [--workers N] [--baseline-tests 600]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GENESYS = str(Path(sys.executable).with_name("genesys"))
PROGRAM = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums[1:1 + nums[0]]))  # submission {index}\n"


def make_rollouts(path: Path, count: int, seed: int = 0) -> list[tuple[str, str]]:
    """Write `count` rollouts of 3 tests each; return every (program, stdin) pair."""
    rng = random.Random(seed)
    pairs = []
    with path.open("w") as handle:
        for index in range(count):
            program = PROGRAM.format(index=index)
            tests = []
            for _ in range(3):
                nums = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 20))]
                stdin = f"{len(nums)}\n{' '.join(map(str, nums))}\n"
                tests.append({"type": "stdin_stdout", "input": stdin, "output": f"{sum(nums)}\n"})
                pairs.append((program, stdin))
            row = {
                "problem_id": f"sum-{index}",
                "task_type": "verifiable_code",
                "prompt": "Print the sum of the numbers.",
                "verification_info": json.dumps({"language": "python", "test_cases": tests}),
                "llm_response": f"```python\n{program}```\n",
                "response_id": f"sum-{index}-0",
            }
            handle.write(json.dumps(row) + "\n")
    return pairs


def time_genesys(inputs: Path, kind: str, workers: int, reuse: int | None = None) -> tuple[float, float]:
    """Seconds for `genesys verify` on `inputs`, and the mean score it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "out.jsonl"
        started = time.perf_counter()
        done = subprocess.run(
            [GENESYS, "verify", str(inputs), "-o", str(output), "--sandbox", kind, "--workers", str(workers), "--no-progress"]
            + (["-O", f"runner_reuse={reuse}"] if reuse else []),
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        scores = [json.loads(line)["score"] for line in output.read_text().splitlines()]
    return seconds, sum(s or 0.0 for s in scores) / len(scores)


# --- baselines: one fresh sandboxed interpreter per test --------------------------------------------


def docker_baseline(pairs: list[tuple[str, str]], workers: int) -> float:
    """Seconds to run every pair as its own `docker exec python3 -c PROGRAM` (stdin attached)."""
    from genesys.sandbox.docker_backend import DockerSandbox, ExecTransport

    sandbox = DockerSandbox(pool_size=1)
    try:
        slot = sandbox._new_slot()  # a warm container with the backend's own hardening
        api, python = sandbox.client.api, sandbox.toolchains["python"]["run"]

        def one(pair: tuple[str, str]) -> bytes:
            program, stdin = pair
            exec_id = api.exec_create(slot.container.id, [python, "-I", "-c", program], stdin=True, workdir="/tmp")
            transport = ExecTransport(api.exec_start(exec_id["Id"], socket=True))
            transport.write(stdin.encode())
            transport._sock.shutdown(1)  # end of stdin
            out = b""
            while chunk := transport.read(30):
                out += chunk
            transport.close()
            return out

        return _timed(one, pairs, workers)
    finally:
        sandbox.close()


def bwrap_baseline(pairs: list[tuple[str, str]], workers: int) -> float:
    """Seconds to run every pair in its own fresh `bwrap ... python3 -c PROGRAM`."""
    from genesys.sandbox.bwrap import BwrapSandbox
    from genesys.sandbox.host import host_toolchains

    python_only = {"python": host_toolchains().toolchains["python"]}
    argv = BwrapSandbox(python_only).command()
    interpreter = argv.index(python_only["python"].commands["run"], argv.index("--chdir"))
    prefix = [arg for arg in argv[: interpreter + 1] if not arg.startswith("CAP_") and arg not in ("--cap-add",)]

    def one(pair: tuple[str, str]) -> bytes:
        program, stdin = pair
        done = subprocess.run([*prefix, "-I", "-c", program], input=stdin.encode(), capture_output=True, check=True)
        return done.stdout

    return _timed(one, pairs, workers)


def _timed(one, pairs: list[tuple[str, str]], workers: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        outputs = list(pool.map(one, pairs))
    seconds = time.perf_counter() - started
    assert all(out.strip() for out in outputs), "a baseline run printed nothing"
    return seconds


BASELINES = {"docker": docker_baseline, "bwrap": bwrap_baseline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--baseline-tests", type=int, default=600, help="tests the per-test baseline runs (a sample)")
    parser.add_argument("--backends", default="docker,bwrap")
    parser.add_argument("--runner-reuse", type=int, help="also time genesys with this many submissions per runner (1: a runner per submission)")
    args = parser.parse_args()

    from genesys.sandbox.backends import check_backend

    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "rollouts.jsonl"
        pairs = make_rollouts(inputs, args.submissions)
        tests = len(pairs)
        sample = random.Random(1).sample(pairs, min(args.baseline_tests, tests))
        print(f"{args.submissions} Python submissions x 3 tests = {tests} tests, {args.workers} workers, {os.cpu_count()} cores")
        for kind in args.backends.split(","):
            check = check_backend(kind)
            if not check.available or check.languages.get("python") != "ok":
                print(f"{kind:>8}: skipped ({check.note or check.languages.get('python')})")
                continue
            seconds, mean_score = time_genesys(inputs, kind, args.workers)
            ours = tests / seconds
            baseline = len(sample) / BASELINES[kind](sample, args.workers)
            print(
                f"{kind:>8}: genesys verify {ours:7.1f} tests/s ({seconds:.1f}s, mean score {mean_score:.3f}); "
                f"one interpreter per test {baseline:6.1f} tests/s ({len(sample)} tests); speed-up {ours / baseline:.1f}x"
            )
            if args.runner_reuse:
                seconds, _ = time_genesys(inputs, kind, args.workers, args.runner_reuse)
                print(f"{'':>8}  with runner_reuse={args.runner_reuse}: {tests / seconds:7.1f} tests/s ({tests / seconds / baseline:.1f}x)")


if __name__ == "__main__":
    main()
