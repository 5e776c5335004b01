"""Accuracy of the `verifiable_math` verifier against plain math-verify on three labeled sets.

- `written`: benchmarks/data/math_labeled.jsonl, completions written for this project (answer forms
  and reward hacks), each with its expected verdict;
- `math-verify suite`: benchmarks/data/math_verify_suite.json, every (gold, prediction, verdict)
  that Math-Verify's own test suite asserts (Apache-2.0, see the file's notice). A pair the suite
  asserts both ways under different options (same gold and prediction, opposite verdicts) has no
  single label, and verdicts that are mathematically false are marked `disputed` (1 - 1/e = 1 + 1/e,
  and five false chains such as `x = 5+5+1 = 7 = 11` accepted as 11): those rows are listed but left
  out of the labeled count; the last column counts every asserted verdict. Its predictions are mostly
  bare answers, not completions, so it measures the lenient policy's comparison;
- `realistic`: benchmarks/data/math_realistic.jsonl, golds in the formats of public datasets
  (GSM8K solutions with `#### 72`, MATH answers and boxed solutions, AIME's `042`, NuminaMath's
  labelled and multi-part answers, Omni-MATH's text answers) against model answers in the usual
  output styles (boxes, R1 think blocks, Minerva, "The answer is:", bare answers), right ones and
  near misses.

The graders see the same rows in the same run:
- genesys under each extraction policy: `genesys.verifiers.math_grade.grade` with `answer_format`
  `boxed` (the default: only boxes, Minerva sentences and an explicit answer on the last line) and
  `lenient` (also bare answers and the last number of a concluding sentence); score 1.0 is accepted;
- math-verify: `verify(parse(gold), parse(completion))` with the library's defaults, and, for the
  `written` set, also with a gold lacking math delimiters wrapped in `$...$` first (as
  math-verify's documentation writes golds).

Prints accuracy, false positives (wrong answers accepted) and false negatives (right answers
rejected) per set and grader, then every row where a grader is wrong (`--all` lists every row);
`--plot FILE.png` draws accuracy per set.

A last table measures what a random-weight model would earn: `--noise N` completions (400 by
default, seeded) drawn from words, punctuation, answer phrases and numbers, each graded against
the last number it holds (the one a last-number fallback reads); it counts how many each grader
pays. The words include pieces of answer phrases (`Answer`, `:`, `####`) but no `\\boxed`. Exit code 1 when genesys has a false positive under either policy, or pays noise under the
default policy.

    .venv/bin/python benchmarks/math_accuracy.py [--set realistic] [--plot math_accuracy.png]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

DATA = Path(__file__).parent / "data"
WRITTEN = DATA / "math_labeled.jsonl"
SUITE = DATA / "math_verify_suite.json"
REALISTIC = DATA / "math_realistic.jsonl"


@dataclass(frozen=True)
class Row:
    """One labeled pair. `asserted` is the verdict its source gives; `expected` is the label it is
    counted against, None when the source asserts both verdicts for it or the verdict is disputed."""

    id: str
    category: str
    gold: str
    completion: str
    asserted: bool
    expected: bool | None
    note: str = ""


def load_jsonl(path: Path) -> list[Row]:
    """Rows of a JSONL set with id, category, gold, completion, expected and note."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        Row(
            r["id"],
            r["category"],
            r["gold"],
            r["completion"],
            r["expected"],
            r["expected"],
            r.get("note", ""),
        )
        for r in rows
    ]


def load_suite(path: Path) -> list[Row]:
    """Math-Verify's asserted pairs; a (gold, prediction) asserted with both verdicts, or with a
    disputed verdict, is unlabeled."""
    pairs = json.loads(path.read_text())["pairs"]
    verdicts: dict[tuple[str, str], set[bool]] = {}
    for pair in pairs:
        verdicts.setdefault((pair["gold"], pair["pred"]), set()).add(pair["expected"])
    rows = []
    for number, pair in enumerate(pairs, 1):
        both_ways = len(verdicts[(pair["gold"], pair["pred"])]) > 1
        options = ", ".join(f"{k}={v}" for k, v in pair["options"].items() if k != "boxed_match_priority")
        note = (
            ("asserted both ways: " if both_ways else "")
            + options
            + (f"disputed: {pair['disputed']}" if "disputed" in pair else "")
        )
        expected = None if both_ways or "disputed" in pair else pair["expected"]
        rows.append(
            Row(
                f"mv{number:03d}",
                pair["test"].split("::")[-1],
                pair["gold"],
                pair["pred"],
                pair["expected"],
                expected,
                note,
            )
        )
    return rows


def grade_genesys(answer_format: str) -> Callable[[str, str], bool]:
    def accepted(gold: str, completion: str) -> bool:
        from genesys.verifiers.math_grade import grade

        return grade(gold, completion, answer_format).score == 1.0

    return accepted


# No `\boxed`: a box around the right number is an answer under every policy.
NOISE_WORDS = (
    "the is are so we get blah x y of total and Numbers Answer answer : , . = + - $ ( ) #### "
    "therefore value final"
).split()


def noise_rows(count: int, seed: int = 0) -> list[Row]:
    """Completions a random-weight model might write: 3 to 40 tokens of words, punctuation, pieces of
    answer phrases (`Answer`, `:`, `####`) and numbers, on one to three lines; each gold is the last
    number of its completion."""
    rnd = random.Random(seed)
    rows = []
    while len(rows) < count:
        tokens = [
            str(rnd.randint(0, 99)) if rnd.random() < 0.3 else rnd.choice(NOISE_WORDS)
            for _ in range(rnd.randint(3, 40))
        ]
        for _ in range(rnd.randint(0, 2)):
            tokens.insert(rnd.randrange(len(tokens)), "\n")
        numbers = [token for token in tokens if token.isdigit()]
        if numbers:
            completion = " ".join(tokens).replace(" \n ", "\n")
            rows.append(Row(f"noise{len(rows):03d}", "noise", numbers[-1], completion, False, False))
    return rows


def grade_math_verify(gold: str, completion: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse(gold), parse(completion)))


def grade_math_verify_wrapped(gold: str, completion: str) -> bool:
    if "$" not in gold and "\\boxed" not in gold:
        gold = f"${gold}$"
    return grade_math_verify(gold, completion)


Grader = tuple[str, Callable[[str, str], bool]]
GENESYS_BOXED: Grader = ("genesys, boxed", grade_genesys("boxed"))
GENESYS_LENIENT: Grader = ("genesys, lenient", grade_genesys("lenient"))
GENESYS = (GENESYS_BOXED, GENESYS_LENIENT)
MATH_VERIFY: Grader = ("math-verify", grade_math_verify)
MATH_VERIFY_WRAPPED: Grader = ("math-verify, gold in $...$", grade_math_verify_wrapped)
SETS: dict[str, tuple[Callable[[], list[Row]], tuple[Grader, ...]]] = {
    "written": (lambda: load_jsonl(WRITTEN), (*GENESYS, MATH_VERIFY, MATH_VERIFY_WRAPPED)),
    "math-verify suite": (lambda: load_suite(SUITE), (*GENESYS, MATH_VERIFY)),
    "realistic": (lambda: load_jsonl(REALISTIC), (*GENESYS, MATH_VERIFY)),
}


def tally(rows: list[Row], verdicts: list[bool]) -> Counter:
    """Right verdicts, false positives and false negatives over the labeled rows."""
    counts: Counter = Counter()
    for row, accepted in zip(rows, verdicts):
        counts["asserted"] += 1
        counts["as_asserted"] += accepted == row.asserted
        if row.expected is None:
            continue
        counts["labeled"] += 1
        counts["correct"] += accepted == row.expected
        counts["fp"] += accepted and not row.expected
        counts["fn"] += row.expected and not accepted
    return counts


def plot_by_set(results: dict[str, list[tuple[str, Counter]]], path: Path) -> None:
    """Horizontal bars: the share of labeled rows each grader gets right, per set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(name for graded in results.values() for name, _ in graded))
    height = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(8, 1.2 * len(results) + 1.5))
    for k, name in enumerate(names):
        shares = [
            next((c["correct"] / c["labeled"] for n, c in graded if n == name), 0.0)
            for graded in results.values()
        ]
        ax.barh(
            [i + k * height for i in range(len(results))],
            shares,
            height=height,
            label=name.replace("$", r"\$"),
        )
    ax.set_yticks([i + height * (len(names) - 1) / 2 for i in range(len(results))], list(results))
    ax.invert_yaxis()
    ax.set_xlabel("share of labeled rows graded as labeled")
    ax.set_xlim(0, 1)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(names), fontsize=8, frameon=False)
    ax.set_title("verifiable_math accuracy by labeled set", pad=24)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def detail_table(title: str, rows: list[Row], graded: list[tuple[str, list[bool]]], show_all: bool) -> Table:
    """Rows where a grader is wrong (or every row), with each grader's verdict."""
    table = Table(title=title)
    for column in ("id", "category", "expected", *(name for name, _ in graded), "note"):
        table.add_column(column)
    for i, row in enumerate(rows):
        verdicts = [v[i] for _, v in graded]
        if show_all or row.expected is None or any(v != row.expected for v in verdicts):
            marks = [
                ("[green]" if v == row.expected else "[red]" if row.expected is not None else "")
                + ("accept" if v else "reject")
                for v in verdicts
            ]
            table.add_row(
                row.id, row.category, "-" if row.expected is None else str(row.expected), *marks, row.note
            )
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", choices=list(SETS), action="append", help="only these sets (default: all)")
    parser.add_argument("--all", action="store_true", help="list every row, not only the interesting ones")
    parser.add_argument("--plot", type=Path, help="write a bar chart of accuracy per set to this PNG")
    parser.add_argument("--noise", type=int, default=400, help="random completions to grade (0: none)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # math-verify logs every timeout and parse failure

    console = Console()
    summary = Table(title="verifiable_math accuracy: genesys and plain math-verify on the same rows")
    for column in (
        "set",
        "grader",
        "accuracy",
        "false positives",
        "false negatives",
        "every asserted verdict",
    ):
        summary.add_column(column, justify="left" if column in ("set", "grader") else "right")
    results: dict[str, list[tuple[str, Counter]]] = {}
    details = []
    for set_name in args.set or list(SETS):
        load, graders = SETS[set_name]
        rows = load()
        graded = [(name, [grade(row.gold, row.completion) for row in rows]) for name, grade in graders]
        results[set_name] = [(name, tally(rows, verdicts)) for name, verdicts in graded]
        for name, counts in results[set_name]:
            n = counts["labeled"]
            summary.add_row(
                set_name,
                name,
                f"{counts['correct'] / n:.1%} ({counts['correct']}/{n})",
                str(counts["fp"]),
                str(counts["fn"]),
                f"{counts['as_asserted']}/{counts['asserted']}",
            )
        unlabeled = sum(row.expected is None for row in rows)
        title = f"{set_name}: rows where a grader is wrong" + (
            f" ({unlabeled} unlabeled rows, not counted)" if unlabeled else ""
        )
        details.append(
            detail_table(title if not args.all else f"{set_name}: all rows", rows, graded, args.all)
        )
    console.print(summary)
    for table in details:
        console.print(table)
    if args.plot:
        plot_by_set(results, args.plot)
        console.print(f"plot: {args.plot}")
    paid_noise = print_noise(console, args.noise) if args.noise else {}
    false_positives = sum(
        counts["fp"] for graded in results.values() for name, counts in graded if name.startswith("genesys")
    )
    return 1 if false_positives or paid_noise.get(GENESYS_BOXED[0]) else 0


def print_noise(console: Console, count: int) -> dict[str, int]:
    """Grade `count` noise completions with every grader; print and return how many each pays."""
    rows = noise_rows(count)
    table = Table(title=f"random completions paid ({count}, seeded; gold: the last number in each)")
    for column in ("grader", "paid", "share"):
        table.add_column(column, justify="left" if column == "grader" else "right")
    paid = {}
    for name, grade in (*GENESYS, MATH_VERIFY):
        paid[name] = sum(grade(row.gold, row.completion) for row in rows)
        table.add_row(name, str(paid[name]), f"{paid[name] / len(rows):.1%}")
    console.print(table)
    return paid


if __name__ == "__main__":
    sys.exit(main())
