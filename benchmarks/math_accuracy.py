"""Accuracy of the `verifiable_math` verifier against plain math-verify on a labeled set.

Each row of benchmarks/data/math_labeled.jsonl holds a gold answer, a realistic completion and the
expected verdict. Both graders see the same rows in the same run:
- genesys: `genesys.verifiers.math_grade.grade` (score 1.0 counts as accepted);
- math-verify: `verify(parse(gold), parse(completion))` with the library's defaults, twice: with the
  gold exactly as stored, and with a gold lacking math delimiters wrapped in `$...$` first (as
  math-verify's documentation writes golds).

Prints accuracy, false positives (wrong answers accepted) and false negatives (right answers
rejected) side by side, then every row where the two disagree or either is wrong (`--all` lists
every row); `--plot FILE.png` also draws accuracy per category for each grader. Exit code 1 when
genesys has a false positive.

    .venv/bin/python benchmarks/math_accuracy.py [--plot math_accuracy.png]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

DATA = Path(__file__).parent / "data" / "math_labeled.jsonl"


def grade_genesys(gold: str, completion: str) -> bool:
    from genesys.verifiers.math_grade import grade

    return grade(gold, completion).score == 1.0


def grade_math_verify(gold: str, completion: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse(gold), parse(completion)))


def grade_math_verify_wrapped(gold: str, completion: str) -> bool:
    if "$" not in gold and "\\boxed" not in gold:
        gold = f"${gold}$"
    return grade_math_verify(gold, completion)


def tally(rows: list[dict], verdicts: list[bool]) -> Counter:
    counts: Counter = Counter()
    for row, accepted in zip(rows, verdicts):
        expected = row["expected"]
        counts["correct"] += accepted == expected
        counts["fp"] += accepted and not expected
        counts["fn"] += expected and not accepted
    return counts


def plot_by_category(rows: list[dict], graders: tuple, path: Path) -> None:
    """Horizontal bars: the share of rows each grader gets right, per category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = sorted({r["category"] for r in rows})
    height = 0.8 / len(graders)
    fig, ax = plt.subplots(figsize=(8, 0.12 * len(categories) * len(graders) + 1.5))
    for k, (name, verdicts) in enumerate(graders):
        shares = []
        for category in categories:
            hits = [v == r["expected"] for r, v in zip(rows, verdicts) if r["category"] == category]
            shares.append(sum(hits) / len(hits))
        ax.barh([i + k * height for i in range(len(categories))], shares, height=height, label=name.replace("$", r"\$"))
    ax.set_yticks([i + height * (len(graders) - 1) / 2 for i in range(len(categories))], categories)
    ax.invert_yaxis()
    ax.set_xlabel("share of rows graded as labeled")
    ax.set_xlim(0, 1)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(graders), fontsize=8, frameon=False)
    ax.set_title(f"verifiable_math accuracy by category ({len(rows)} labeled rows)", pad=24)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--all", action="store_true", help="list every row, not only the interesting ones")
    parser.add_argument("--plot", type=Path, help="write a bar chart of accuracy per category to this PNG")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # math-verify logs every timeout and parse failure

    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    ours = [grade_genesys(r["gold"], r["completion"]) for r in rows]
    theirs = [grade_math_verify(r["gold"], r["completion"]) for r in rows]
    theirs_wrapped = [grade_math_verify_wrapped(r["gold"], r["completion"]) for r in rows]

    console = Console()
    n, n_false = len(rows), sum(not r["expected"] for r in rows)
    summary = Table(title=f"verifiable_math accuracy on {n} labeled rows ({n - n_false} correct, {n_false} wrong answers)")
    for column in ("grader", "accuracy", "false positives", "false negatives"):
        summary.add_column(column, justify="right" if column != "grader" else "left")
    graders = (("genesys", ours), ("math-verify, gold as stored", theirs), ("math-verify, gold in $...$", theirs_wrapped))
    for name, verdicts in graders:
        counts = tally(rows, verdicts)
        summary.add_row(name, f"{counts['correct'] / n:.1%} ({counts['correct']}/{n})", str(counts["fp"]), str(counts["fn"]))
    console.print(summary)

    detail = Table(title="rows where a grader is wrong" if not args.all else "all rows")
    for column in ("id", "category", "expected", "genesys", "mv as stored", "mv in $...$", "note"):
        detail.add_column(column)
    for row, *verdicts in zip(rows, ours, theirs, theirs_wrapped):
        if args.all or any(v != row["expected"] for v in verdicts):
            marks = [("[green]" if v == row["expected"] else "[red]") + ("accept" if v else "reject") for v in verdicts]
            detail.add_row(row["id"], row["category"], str(row["expected"]), *marks, row.get("note", ""))
    console.print(detail)
    if args.plot:
        plot_by_category(rows, graders, args.plot)
        console.print(f"plot: {args.plot}")
    return 1 if tally(rows, ours)["fp"] else 0


if __name__ == "__main__":
    sys.exit(main())
