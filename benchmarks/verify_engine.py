"""Throughput of the verification engine and start-up time of the CLI.

Runs `genesys verify` end to end (read, dispatch to workers, hard deadlines, write) on 100k
rollouts whose verifier does no work, so the figure is the engine's own overhead.

    python benchmarks/verify_engine.py [--rows 100000] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

GENESYS = str(Path(sys.executable).with_name("genesys"))

TRIVIAL_PLUGIN = textwrap.dedent(
    """
    import genesys

    class Constant(genesys.Verifier):
        task_type = "constant"
        timeout = 5.0
        def verify(self, rollout):
            return genesys.Verdict(score=1.0)

    @genesys.hookimpl
    def genesys_verifiers():
        return [Constant]
    """
)


def write_rows(path: Path, n: int) -> None:
    with open(path, "w") as handle:
        for i in range(n):
            row = {
                "problem_id": f"p{i // 8}",
                "task_type": "constant",
                "prompt": "Compute the sum of the first ten primes.",
                "verification_info": json.dumps({"ground_truth": "129"}),
                "metadata": "{}",
                "llm_response": f"The answer is \\boxed{{129}} ({i})",
                "response_id": f"r{i}",
            }
            handle.write(json.dumps(row) + "\n")


def time_command(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "bench_constant_plugin.py").write_text(TRIVIAL_PLUGIN)
        path = os.pathsep.join(
            filter(None, [tmp, os.environ.get("PYTHONPATH")])
        )  # keeps a PYTHONPATH checkout first
        env = {**os.environ, "GENESYS_PLUGINS": "bench_constant_plugin", "PYTHONPATH": path}
        inputs = tmp_path / "rows.jsonl"
        write_rows(inputs, args.rows)

        startup = [time_command([GENESYS, "verify", "--help"], env) for _ in range(7)]
        print(
            f"startup  `genesys verify --help`: median {statistics.median(startup) * 1000:.0f} ms, best {min(startup) * 1000:.0f} ms (goal < 500 ms)"
        )

        for output in ("out.jsonl", "out-shards"):
            seconds = time_command(
                [
                    GENESYS,
                    "verify",
                    str(inputs),
                    "-o",
                    str(tmp_path / output),
                    "--workers",
                    str(args.workers),
                    "--no-progress",
                ],
                env,
            )
            print(
                f"verify   {args.rows:,} rows -> {output:<10} {args.workers} workers: {seconds:.2f} s, {args.rows / seconds:,.0f} rows/s end to end (goal >= 5,000)"
            )

        seconds = time_command(
            [GENESYS, "verify", str(inputs), "-o", str(tmp_path / "out.jsonl"), "--no-progress"], env
        )
        print(f"resume   rerun over a finished output (all {args.rows:,} rows skipped): {seconds:.2f} s")


if __name__ == "__main__":
    main()
