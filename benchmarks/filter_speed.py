"""`genesys filter` against the same pass-rate filtering done with HF `datasets`, on synthetic rollouts.

Both sides run as fresh processes, so start-up and imports count: `genesys filter` through its
console script, the `datasets` baseline through this script's `--datasets-baseline` mode (load the
parquet with `Dataset.from_parquet`, aggregate pass rates in Python, `Dataset.filter` to one row per
kept task, write parquet). Both write the same kept tasks; the script checks they agree.

    python benchmarks/filter_speed.py                 # 1M rollouts (62,500 tasks x 16 samples)
    python benchmarks/filter_speed.py --rollouts 200000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIN_RATE, MAX_RATE = 0.1, 0.9
SAMPLES_PER_TASK = 16
ERROR_RATE = 0.01
RESPONSE_COLUMNS = ("llm_response", "response_id", "score", "reward", "error", "completion_ids")


def make_rollouts(path: Path, rollouts: int, seed: int = 0) -> None:
    """Synthetic verified rollouts: each task has a hidden solve rate; 1% of rollouts are timeouts."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    tasks = rollouts // SAMPLES_PER_TASK
    task = np.repeat(np.arange(tasks), SAMPLES_PER_TASK)
    solve_rate = rng.random(tasks)[task]
    correct = rng.random(task.size) < solve_rate
    failed = rng.random(task.size) < ERROR_RATE
    score = pa.array(np.where(correct, 1.0, 0.0), mask=failed)
    problem_id = np.char.add("task-", task.astype(str))
    sources = np.array(["synthetic-math", "synthetic-code", "synthetic-logic"])
    lengths = rng.integers(10, 2000, task.size)
    words = np.array("so the sum is then we get x y and therefore by induction it follows that".split())
    paragraphs = np.array([" ".join(rng.choice(words, 60)) for _ in range(4096)])
    ids_per_row = np.minimum(lengths, 32)
    table = pa.table(
        {
            "problem_id": problem_id,
            "source": sources[task % 3],
            "task_type": np.where(task % 3 == 1, "verifiable_code", "verifiable_math"),
            "prompt": np.char.add(
                "Solve the following problem and put the final answer in a box. Problem number ",
                task.astype(str),
            ),
            "verification_info": np.char.add(
                np.char.add('{"ground_truth": "', (task % 97).astype(str)), '"}'
            ),
            "metadata": np.full(task.size, '{"difficulty": "medium"}'),
            "llm_response": np.char.add(
                paragraphs[rng.integers(0, paragraphs.size, task.size)],
                np.char.add(" \\boxed{", np.char.add(lengths.astype(str), "}")),
            ),
            "response_id": np.char.add(
                problem_id, np.char.add("-", (np.arange(task.size) % SAMPLES_PER_TASK).astype(str))
            ),
            "score": score,
            "reward": score,
            "error": pa.array(np.where(failed, "timeout: exceeded 10s", None)),
            "completion_ids": pa.ListArray.from_arrays(
                np.concatenate([[0], np.cumsum(ids_per_row)]),
                rng.integers(0, 150_000, int(ids_per_row.sum())),
            ),
        }
    )
    pq.write_table(table, path, row_group_size=128_000)


def datasets_baseline(source: str, output: str) -> None:
    """Pass-rate filtering the `datasets` way: Python aggregation, then `Dataset.filter`."""
    from collections import defaultdict

    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    dataset = Dataset.from_parquet(source)
    totals: dict[str, float] = defaultdict(float)
    scored: dict[str, int] = defaultdict(int)
    errors: dict[str, int] = defaultdict(int)
    for problem_id, score in zip(dataset["problem_id"], dataset["score"]):
        if score is None:
            errors[problem_id] += 1
        else:
            totals[problem_id] += score
            scored[problem_id] += 1
    rates = {pid: totals[pid] / n for pid, n in scored.items()}
    seen: set[str] = set()

    def first_kept(problem_ids: list[str]) -> list[bool]:
        keep = []
        for pid in problem_ids:
            rate = rates.get(pid)
            keep.append(rate is not None and MIN_RATE <= rate <= MAX_RATE and pid not in seen)
            if keep[-1]:
                seen.add(pid)
        return keep

    kept = dataset.filter(first_kept, input_columns="problem_id", batched=True)
    kept = kept.remove_columns([c for c in RESPONSE_COLUMNS if c in kept.column_names])
    kept = kept.add_column("pass_rate", [rates[pid] for pid in kept["problem_id"]])
    kept = kept.add_column("n_samples", [scored[pid] for pid in kept["problem_id"]])
    kept = kept.add_column("n_errors", [errors[pid] for pid in kept["problem_id"]])
    kept.to_parquet(output)


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of a child process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            raise SystemExit(f"{' '.join(command)} failed:\n{log.read().decode(errors='replace')}")
    return elapsed, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--datasets-baseline", nargs=2, metavar=("SOURCE", "OUTPUT"), help=argparse.SUPPRESS)
    parser.add_argument("--make", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.datasets_baseline:
        datasets_baseline(*args.datasets_baseline)
        return
    if args.make:
        make_rollouts(Path(args.make), args.rollouts)
        return

    genesys = Path(sys.executable).with_name("genesys")
    with tempfile.TemporaryDirectory() as tmp:
        # Every step is a child process: this one stays small, so each child's peak RSS is its own.
        data = Path(tmp) / "rollouts.parquet"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--make", str(data), "--rollouts", str(args.rollouts)], check=True
        )
        size_mb = data.stat().st_size / 2**20
        print(
            f"{args.rollouts:,} rollouts ({args.rollouts // SAMPLES_PER_TASK:,} tasks x {SAMPLES_PER_TASK}), "
            f"parquet {size_mb:.0f} MiB, made in {time.perf_counter() - start:.1f}s"
        )
        bounds = ["--min-pass-rate", str(MIN_RATE), "--max-pass-rate", str(MAX_RATE)]
        ours_out, theirs_out = Path(tmp) / "genesys.parquet", Path(tmp) / "datasets.parquet"
        ours, ours_rss = timed([str(genesys), "filter", str(data), "-o", str(ours_out), *bounds])
        theirs, theirs_rss = timed(
            [sys.executable, __file__, "--datasets-baseline", str(data), str(theirs_out)]
        )
        import polars as pl

        mine, base = pl.read_parquet(ours_out), pl.read_parquet(theirs_out)
        columns = ["problem_id", "pass_rate", "n_samples", "n_errors"]
        if not mine.select(columns).sort("problem_id").equals(base.select(columns).sort("problem_id")):
            raise SystemExit("the two filters disagree")
        print(f"kept {mine.height:,} tasks with pass rate in [{MIN_RATE}, {MAX_RATE}] (both agree)")
        print(f"genesys filter (CLI, start-up included): {ours:6.2f}s  peak RSS {ours_rss:,.0f} MiB")
        print(
            f"datasets baseline (process, imports included): {theirs:6.2f}s  peak RSS {theirs_rss:,.0f} MiB"
        )
        print(f"speed-up: {theirs / ours:.1f}x")


if __name__ == "__main__":
    main()
