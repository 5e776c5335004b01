"""Speed of `genesys verify` on math rollouts against plain math-verify in a loop, same run.

The labeled pairs of benchmarks/data/math_labeled.jsonl become `verifiable_math` rollouts, each
task sampled `--samples` times as a generation run would (the completions differ in their text, not
in their final answer). Both
sides are timed end to end as separate processes, interpreter start and imports included:
- genesys: `genesys verify in.jsonl -o out.jsonl -O answer_format=lenient` (worker processes, hard
  deadlines, gold parsed once per task per worker; the lenient policy, so that both sides read every
  completion for an answer);
- math-verify: one process calling `verify(parse(gold), parse(completion))` in a loop with the
  library's defaults (gold wrapped in `$...$`).
Rows are timed at 1, 4 and 16 samples per task (16 is a usual GRPO group size) without the few
deliberately pathological answers (power towers, deep nesting), and once more at 1 sample with
them: math-verify spends its 5 s alarm on each of those.

A second table gives the time per pair in one process, each grader in a fresh interpreter warmed up
by one call, over the three labeled sets of math_accuracy.py (each pair graded once, nothing cached
yet): `grade(gold, completion, "lenient")` against `verify(parse(gold), parse(completion))`, the median of
`--repeats` alternating runs.

    .venv/bin/python benchmarks/math_speed.py [--samples 1 4 16] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "math_labeled.jsonl"
GENESYS = Path(sys.executable).parent / "genesys"
PATHOLOGICAL = {"hack_huge"}

PAIR_SETS = {
    "written": "benchmarks/data/math_labeled.jsonl",
    "math-verify suite": "benchmarks/data/math_verify_suite.json",
    "realistic": "benchmarks/data/math_realistic.jsonl",
}
PER_PAIR = """
import json, logging, sys, time
logging.disable(logging.WARNING)
path, grader = sys.argv[1], sys.argv[2]
if path.endswith(".json"):
    pairs = [(p["gold"], p["pred"]) for p in json.load(open(path))["pairs"]]
else:
    pairs = [(r["gold"], r["completion"]) for r in map(json.loads, open(path))]
if grader == "genesys":
    from genesys.verifiers.math_grade import grade
    check = lambda gold, completion: grade(gold, completion, "lenient")
else:
    from math_verify import parse, verify
    check = lambda gold, completion: verify(parse(gold), parse(completion))
check("x^2+1", "\\\\boxed{1 + x^2}")
start = time.perf_counter()
for gold, completion in pairs:
    check(gold, completion)
print(json.dumps({"pairs": len(pairs), "seconds": time.perf_counter() - start}))
"""

MATH_VERIFY_LOOP = """
import json, logging, sys, time
logging.disable(logging.WARNING)
start = time.perf_counter()
from math_verify import parse, verify
rows = [json.loads(line) for line in open(sys.argv[1])]
accepted = 0
for row in rows:
    gold = row["verification_info"]["ground_truth"]
    gold = gold if "$" in gold else "$" + gold + "$"
    accepted += bool(verify(parse(gold), parse(row["llm_response"])))
print(json.dumps({"accepted": accepted, "seconds_in_process": time.perf_counter() - start}))
"""


def rollouts(samples: int, skip: set[str]) -> list[dict]:
    """The labeled pairs as rollout rows, each task sampled `samples` times."""
    rows = []
    for line in DATA.read_text().splitlines():
        item = json.loads(line)
        if item["category"] in skip:
            continue
        for sample in range(samples):
            rows.append(
                {
                    "problem_id": item["id"],
                    "source": "math_labeled",
                    "task_type": "verifiable_math",
                    "prompt": f"Problem {item['id']}",
                    "verification_info": {"ground_truth": item["gold"]},
                    "metadata": {"category": item["category"]},
                    "llm_response": f"Attempt {sample + 1}. {item['completion']}",
                    "response_id": f"{item['id']}-{sample}",
                }
            )
    return rows


def time_genesys(path: Path, workers: int | None) -> tuple[float, int]:
    out = path.with_name(path.stem + ".verified.jsonl")
    command = [
        str(GENESYS),
        "verify",
        str(path),
        "-o",
        str(out),
        "--no-progress",
        "-O",
        "answer_format=lenient",
    ]
    if workers:
        command += ["--workers", str(workers)]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    accepted = sum(
        json.loads(line).get("score") == 1.0 for line in out.read_text().splitlines() if line.strip()
    )
    return seconds, accepted


def time_math_verify(path: Path) -> tuple[float, float, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MATH_VERIFY_LOOP, str(path)], check=True, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return seconds, result["seconds_in_process"], result["accepted"]


def time_per_pair(path: str, grader: str) -> tuple[int, float]:
    """(pairs, seconds) for one grader over one labeled set, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PER_PAIR, path, grader], check=True, capture_output=True, text=True, cwd=ROOT
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["pairs"], result["seconds"]


def per_pair_table(repeats: int) -> Table:
    """Median time per pair of `repeats` alternating runs of each grader on each labeled set."""
    table = Table(
        title=f"time per pair in one process (ms, median of {repeats} runs), each grader in a fresh interpreter"
    )
    for column in ("set", "pairs", "genesys", "math-verify", "ratio"):
        table.add_column(column, justify="right" if column != "set" else "left")
    for name, path in PAIR_SETS.items():
        runs = [(time_per_pair(path, "genesys"), time_per_pair(path, "math-verify")) for _ in range(repeats)]
        pairs = runs[0][0][0]
        ours = statistics.median(run[0][1] for run in runs)
        theirs = statistics.median(run[1][1] for run in runs)
        table.add_row(
            name,
            str(pairs),
            f"{1000 * ours / pairs:.1f}",
            f"{1000 * theirs / pairs:.1f}",
            f"{theirs / ours:.2f}x",
        )
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 4, 16], help="completions per task")
    parser.add_argument("--workers", type=int, help="genesys worker processes (default: all cores)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per grader and set for the time per pair"
    )
    args = parser.parse_args()

    table = Table(title=f"verifiable_math speed on {os.cpu_count()} cores, end to end")
    for column in ("samples", "rows", "genesys (s)", "math-verify (s)", "mv loop only (s)", "speed-up"):
        table.add_column(column, justify="right")
    runs = [(samples, PATHOLOGICAL) for samples in args.samples] + [(1, set())]
    with tempfile.TemporaryDirectory() as tmp:
        for samples, skip in runs:
            rows = rollouts(samples, skip)
            path = Path(tmp) / f"math-{samples}-{len(skip)}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            ours, _ = time_genesys(path, args.workers)
            theirs, theirs_loop, _ = time_math_verify(path)
            label = f"{len(rows)}" + ("" if skip else " (with pathological)")
            table.add_row(
                str(samples),
                label,
                f"{ours:.2f}",
                f"{theirs:.2f}",
                f"{theirs_loop:.2f}",
                f"{theirs / ours:.2f}x",
            )
    console = Console()
    console.print(table)
    console.print(per_pair_table(args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
