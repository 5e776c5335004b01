"""HumanEval- and MBPP-style records as genesys `assert` tests, and how often genesys's verdicts agree
with a plain reference harness.

The conversion (the recipe the README gives):
- HumanEval `{task_id, prompt, canonical_solution, test, entry_point}`: the program is the prompt
  plus the completion's body (or a whole completion), and the task has one test,
  `{"type": "assert", "code": test + "\\ncheck(" + entry_point + ")\\n"}`.
- MBPP `{task_id, text, code, test_list, test_setup_code}`: one test per `test_list` line,
  `{"type": "assert", "code": test_setup_code + "\\n" + line}`.

The sample is built here from the records shipped in benchmarks/data (made for genesys, in those
datasets' shapes; point --humaneval / --mbpp at real files to measure those): each record's reference
solution, the wrong solution the record carries (`wrong_solution` / `wrong_code`, where there is
one), and a stub whose functions return None. The reference harness runs each test the plain way,
program and test code exec'd in one namespace in a fresh interpreter, passing when it exits 0;
genesys runs the converted rows in its sandbox. (The reference harness runs programs with no
sandbox at all: give it the records' own solutions, never a model's.) Printed: agreement per dataset, and every test the two
disagree on.

    python benchmarks/code_kinds_agreement.py [--sandbox bwrap] [--humaneval FILE] [--mbpp FILE]
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
REFERENCE_TIMEOUT_S = 10.0
# The reference harness: program and test in one namespace, as HumanEval's own harness runs them.
REFERENCE = "import sys\nnamespace = {}\nexec(sys.stdin.read(), namespace)\n"


def humaneval_tests(record: dict[str, Any]) -> list[dict[str, str]]:
    """The genesys tests of a HumanEval-style record: its `test` plus `check(entry_point)`."""
    return [{"type": "assert", "code": f"{record['test']}\ncheck({record['entry_point']})\n"}]


def mbpp_tests(record: dict[str, Any]) -> list[dict[str, str]]:
    """The genesys tests of an MBPP-style record: one per `test_list` line, setup code first."""
    setup = record.get("test_setup_code") or ""
    return [{"type": "assert", "code": f"{setup}\n{line}\n"} for line in record["test_list"]]


def stub(program: str) -> str:
    """`program` with every top-level function returning None (classes and imports kept)."""
    tree = ast.parse(program)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            node.body = [ast.Return(ast.Constant(None))]
    return ast.unparse(tree)


def candidates(kind: str, record: dict[str, Any]) -> dict[str, str]:
    """The programs the sample checks for one record, by name."""
    if kind == "humaneval":
        programs = {"reference": record["prompt"] + record["canonical_solution"]}
        if record.get("wrong_solution"):
            programs["wrong"] = record["prompt"] + record["wrong_solution"]
    else:
        programs = {"reference": record["code"]}
        if record.get("wrong_code"):
            programs["wrong"] = record["wrong_code"]
    programs["stub"] = stub(programs["reference"])
    return programs


def row(kind: str, record: dict[str, Any], name: str, program: str) -> dict[str, Any]:
    """A genesys `verifiable_code` rollout row for one candidate program."""
    tests = humaneval_tests(record) if kind == "humaneval" else mbpp_tests(record)
    return {
        "problem_id": f"{kind}-{record['task_id']}",
        "source": kind,
        "task_type": "verifiable_code",
        "prompt": record.get("prompt") or record.get("text") or "",
        "verification_info": {"language": "python", "test_cases": tests},
        "llm_response": f"```python\n{program}\n```\n",
        "response_id": f"{kind}-{record['task_id']}-{name}",
    }


def reference_passes(program: str, code: str) -> bool:
    """The plain harness: program and test code exec'd together in a fresh interpreter."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", REFERENCE],
            input=f"{program}\n{code}",
            capture_output=True,
            text=True,
            timeout=REFERENCE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def agreement(kind: str, records: list[dict[str, Any]], sandbox: str) -> tuple[int, int, list[str]]:
    """(tests agreed on, tests, what disagreed) for one dataset's records."""
    from genesys.schema import Rollout
    from genesys.verifiers.code import CodeVerifier

    verifier = CodeVerifier({"sandbox": sandbox})
    verifier.setup()
    agreed, total, disagreements = 0, 0, []
    try:
        for record in records:
            for name, program in candidates(kind, record).items():
                rollout_row = row(kind, record, name, program)
                verdict = verifier.verify(Rollout.from_row(rollout_row))
                if verdict.error:
                    raise RuntimeError(f"{rollout_row['response_id']}: {verdict.error}")
                tests = rollout_row["verification_info"]["test_cases"]
                for index, (test, judged) in enumerate(zip(tests, verdict.details["tests"])):
                    ours = judged["status"] == "passed"
                    theirs = reference_passes(program, test["code"])
                    total += 1
                    agreed += ours == theirs
                    if ours != theirs:
                        disagreements.append(
                            f"{rollout_row['response_id']} test {index}: genesys {judged['status']} "
                            f"({judged.get('message', '')}), reference {'passed' if theirs else 'failed'}"
                        )
    finally:
        verifier.teardown()
    return agreed, total, disagreements


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sandbox", default="bwrap", help="genesys sandbox backend (docker, bwrap)")
    parser.add_argument("--humaneval", type=Path, default=DATA / "humaneval_style.jsonl")
    parser.add_argument("--mbpp", type=Path, default=DATA / "mbpp_style.jsonl")
    args = parser.parse_args(argv)
    disagreed = 0
    for kind, path in (("humaneval", args.humaneval), ("mbpp", args.mbpp)):
        agreed, total, disagreements = agreement(kind, read_records(path), args.sandbox)
        print(f"{kind:>9}: genesys and the reference harness agree on {agreed}/{total} tests ({path.name})")
        for line in disagreements:
            print(f"           {line}")
        disagreed += len(disagreements)
    return 1 if disagreed else 0


if __name__ == "__main__":
    sys.exit(main())
