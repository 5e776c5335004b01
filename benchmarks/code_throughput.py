"""Code-verification throughput: tests per second through `genesys verify`, against a baseline.

1,000 Python submissions x 3 stdin/stdout tests go through `genesys verify --sandbox KIND` on each
backend that works here (wall clock of the whole command, start-up included). The baseline, timed
in the same run on the same machine, runs every test the way GENESYS's code verifier does: one
fresh sandboxed interpreter per test (a `docker exec` of python into a warm container with the same
hardening, or a fresh `bwrap ... python3` on the same root file system), as many at once as there are workers.
The baseline runs a sample of the tests (--baseline-tests) and is reported in tests/s. The two
sides alternate for --rounds rounds, and the speed-up of each round and their median are printed:
on a shared machine one round can be 30% off the next.

Where this process can make a cgroup of its own (root, cgroup v1 `cpuacct` or v2), it also reports
the CPU time per test of both sides (every process of the run, the sandboxes included; docker's
containers run outside it, so for bwrap only): on a machine that other jobs share, a ratio of CPU
times moves much less than one of wall-clock rates.

For bwrap it also prints the floor of any design that forks a warm interpreter per test: the CPU
time of forking the sandbox's interpreter (with the runner's modules loaded, as its template has
them) and letting the child exit at once, or run one test's program first. Against the baseline's
CPU per test, that bounds the speed-up such a design can reach on this machine, whatever else it
does well. And the floor of this design, which the sandbox's isolation asks for: in a bwrap
sandbox started as the runner's is, each submission entering namespaces made fresh for it (the
template's own `SubmissionSetup`: mount, IPC, UTS and pid namespaces, fresh mounts, an init) and
each of its tests forked into them, dropped to the programs' uid and running the program, with no
runner, no host and no start-up: per submission and per test, fitted from submissions of 1 and 6
tests, in every round beside the baseline (the figures of one machine move together).

Before timing, the modules of genesys and of its plugins are byte-compiled, as `pip install` leaves
an installed package: an editable install under PYTHONDONTWRITEBYTECODE (which many container images
set) otherwise compiles every one of them from source in every process of every run.

--parts splits the CPU time of a bwrap run into its three parts: the run's start-up, each
submission's own (its fresh namespaces, the runner's and the host's handling of it) and each test's.
`genesys verify` runs one submission of 3 tests, and --submissions submissions of 1, 3 and 6 tests
each (the same programs), alternating for --rounds rounds; from the medians, with S submissions of T
tests each, CPU = start-up + S x per submission + S x T x per test.

Then, per backend, assert tests against function_call tests (--kinds-only runs just this part):
the same Python function checked by 3 `function_call` tests or by 3 `assert` tests (one `assert`
each) per submission, both through `genesys verify`, alternating for --rounds rounds; printed are
tests/s of each, their ratio per round and its median (an assert test runs the program in a process
of its own beside the judge, see docs/verifiers/sandbox-security.md, so it costs more).

    python benchmarks/code_throughput.py [--submissions 1000] [--workers N] [--baseline-tests 600] [--rounds 3]
    python benchmarks/code_throughput.py --kinds-only [--submissions 300]
    python benchmarks/code_throughput.py --parts [--submissions 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import compileall
import functools
import importlib.metadata
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

GENESYS = str(Path(sys.executable).with_name("genesys"))
CGROUP_ROOT = "/sys/fs/cgroup"
PROGRAM = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums[1:1 + nums[0]]))  # submission {index}\n"


def byte_compile_plugins() -> list[str]:
    """Byte-compile genesys and every module its entry points name (its plugins), each whole
    top-level package; the packages compiled."""
    packages = {"genesys"} | {
        point.module.split(".")[0] for point in importlib.metadata.entry_points(group="genesys")
    }
    compiled = []
    for package in sorted(packages):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.origin:
            continue
        path = os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin
        done = (
            compileall.compile_dir(path, quiet=1)
            if os.path.isdir(path)
            else compileall.compile_file(path, quiet=1)
        )
        if done:
            compiled.append(package)
    return compiled


def make_rollouts(path: Path, count: int, seed: int = 0, tests_each: int = 3) -> list[tuple[str, str]]:
    """Write `count` rollouts of `tests_each` tests each; return every (program, stdin) pair."""
    rng = random.Random(seed)
    pairs = []
    with path.open("w") as handle:
        for index in range(count):
            program = PROGRAM.format(index=index)
            tests = []
            for _ in range(tests_each):
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


CALL_PROGRAM = "def total(nums):\n    return sum(nums)  # submission {index}\n"


def make_kind_rollouts(path: Path, count: int, kind: str, seed: int = 0) -> int:
    """Write `count` rollouts of one function checked by 3 tests of `kind` (function_call or
    assert) with the same arguments and answers; return the number of tests."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for index in range(count):
            tests = []
            for _ in range(3):
                nums = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 20))]
                if kind == "assert":
                    tests.append({"type": "assert", "code": f"assert total({nums!r}) == {sum(nums)}"})
                else:
                    tests.append(
                        {"type": "function_call", "fn_name": "total", "input": [nums], "output": sum(nums)}
                    )
            row = {
                "problem_id": f"total-{index}",
                "task_type": "verifiable_code",
                "prompt": "Sum the list.",
                "verification_info": json.dumps({"language": "python", "test_cases": tests}),
                "llm_response": f"```python\n{CALL_PROGRAM.format(index=index)}```\n",
                "response_id": f"total-{index}-0",
            }
            handle.write(json.dumps(row) + "\n")
    return 3 * count


def compare_kinds(args: argparse.Namespace, meter: CpuMeter, kind: str) -> None:
    """assert tests against function_call tests on one backend, per test, alternating rounds."""
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: Path(tmp) / f"{name}.jsonl" for name in ("function_call", "assert")}
        tests = {name: make_kind_rollouts(path, args.submissions, name) for name, path in files.items()}
        ratios, cpu_ratios = [], []
        for round_number in range(1, args.rounds + 1):
            rates, cpu = {}, {}
            for name, path in files.items():
                (seconds, mean_score), spent = cpu_spent(
                    meter, functools.partial(time_genesys, path, kind, args.workers)
                )
                if mean_score != 1.0:
                    raise RuntimeError(f"{name} tests scored {mean_score}, not 1.0")
                rates[name] = tests[name] / seconds
                cpu[name] = None if spent is None else spent / tests[name] * 1e3
            ratios.append(rates["function_call"] / rates["assert"])
            line = (
                f"{kind:>8} round {round_number}: function_call {rates['function_call']:7.1f} tests/s, "
                f"assert {rates['assert']:7.1f} tests/s: assert costs {ratios[-1]:.2f}x per test"
            )
            if kind == "bwrap" and None not in cpu.values():
                cpu_ratios.append(cpu["assert"] / cpu["function_call"])
                line += (
                    f" (CPU {cpu['function_call']:.2f} vs {cpu['assert']:.2f} ms/test: {cpu_ratios[-1]:.2f}x)"
                )
            print(line)
        summary = f"median over {args.rounds} rounds: assert {statistics.median(ratios):.2f}x function_call's time per test"
        if cpu_ratios:
            summary += f", {statistics.median(cpu_ratios):.2f}x its CPU time"
        print(f"{kind:>8}: {summary}")


def cost_parts(args: argparse.Namespace, meter: CpuMeter) -> None:
    """Split a bwrap run's CPU time into start-up, per submission and per test (see the module
    docstring)."""
    if meter.seconds() is None:
        print("   parts: skipped (no cgroup to count CPU time in)")
        return
    count = args.submissions
    shapes = {
        "1 x 3": (1, 3),
        f"{count} x 1": (count, 1),
        f"{count} x 3": (count, 3),
        f"{count} x 6": (count, 6),
    }
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, (submissions, tests_each) in shapes.items():
            files[name] = Path(tmp) / f"{submissions}x{tests_each}.jsonl"
            make_rollouts(files[name], submissions, tests_each=tests_each)
        spent: dict[str, list[float]] = {name: [] for name in shapes}
        for round_number in range(1, args.rounds + 1):
            for name, path in files.items():
                (_, mean_score), cpu = cpu_spent(
                    meter, functools.partial(time_genesys, path, "bwrap", args.workers)
                )
                if mean_score != 1.0:
                    raise RuntimeError(f"{name} scored {mean_score}, not 1.0")
                spent[name].append(cpu)
            print(f"   parts round {round_number}: " + ", ".join(f"{n} {spent[n][-1]:.2f} s" for n in shapes))
    one, c1, c3, c6 = (statistics.median(spent[name]) for name in shapes)
    per_test = (c6 - c1) / (5 * count)
    per_submission = (c1 - one - (count - 3) * per_test) / (count - 1)
    start_up = one - per_submission - 3 * per_test
    at_three = start_up / (3 * count) + per_submission / 3 + per_test
    print(
        f"   bwrap: CPU of a run (medians of {args.rounds}): start-up {start_up:.2f} s, "
        f"{per_submission * 1e3:.2f} ms per submission, {per_test * 1e3:.2f} ms per test "
        f"({at_three * 1e3:.2f} ms per test with {count} submissions of 3; measured {c3 / (3 * count) * 1e3:.2f} ms)"
    )


def time_genesys(inputs: Path, kind: str, workers: int, reuse: int | None = None) -> tuple[float, float]:
    """Seconds for `genesys verify` on `inputs`, and the mean score it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "out.jsonl"
        started = time.perf_counter()
        done = subprocess.run(
            [
                GENESYS,
                "verify",
                str(inputs),
                "-o",
                str(output),
                "--sandbox",
                kind,
                "--workers",
                str(workers),
                "--no-progress",
            ]
            + (["-O", f"runner_reuse={reuse}"] if reuse else []),
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        rows = [json.loads(line) for line in output.read_text().splitlines()]
    errors = [row["error"] for row in rows if row.get("error")]
    if errors:  # not a score: the run itself failed there
        raise RuntimeError(f"{len(errors)} of {len(rows)} rows could not be verified; the first: {errors[0]}")
    return seconds, sum(row["score"] for row in rows) / len(rows)


class CpuMeter:
    """The CPU time of this process and everything it starts, from a cgroup it moves itself into."""

    def __init__(self) -> None:
        self.directory: str | None = None
        self.parent = ""
        for parent, counter in _cpu_hierarchies():
            directory = os.path.join(parent, f"code-throughput-{os.getpid()}")
            try:
                os.makedirs(directory, exist_ok=True)
                with open(os.path.join(directory, "cgroup.procs"), "w") as handle:
                    handle.write(str(os.getpid()))
            except OSError:
                continue
            self.directory, self.parent, self.counter = directory, parent, counter
            return

    def seconds(self) -> float | None:
        """CPU seconds used so far, or None where no cgroup could be made."""
        if self.directory is None:
            return None
        with open(os.path.join(self.directory, self.counter)) as handle:
            text = handle.read()
        if self.counter == "cpu.stat":
            return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6
        return int(text) / 1e9

    def close(self) -> None:
        if self.directory is not None:
            with open(os.path.join(self.parent, "cgroup.procs"), "w") as handle:
                handle.write(str(os.getpid()))
            os.rmdir(self.directory)


def _cpu_hierarchies() -> list[tuple[str, str]]:
    """(our cgroup directory, its CPU counter file) for cgroup v2 and v1's cpuacct."""
    found = []
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                found.append((os.path.join(CGROUP_ROOT, path.lstrip("/")), "cpu.stat"))
            elif "cpuacct" in controllers.split(","):
                found.append((os.path.join(CGROUP_ROOT, controllers, path.lstrip("/")), "cpuacct.usage"))
    return [(parent, counter) for parent, counter in found if os.path.exists(os.path.join(parent, counter))]


def cpu_spent(meter: CpuMeter, run: Callable[[], Any]) -> tuple[Any, float | None]:
    """`run()`'s result and the CPU seconds spent meanwhile (None where they cannot be measured)."""
    before = meter.seconds()
    result = run()
    after = meter.seconds()
    return result, (None if before is None or after is None else after - before)


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
            exec_id = api.exec_create(
                slot.container.id, [python, "-I", "-c", program], stdin=True, workdir="/tmp"
            )
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
    prefix = [*BwrapSandbox(python_only).sandbox_argv(), python_only["python"].commands["run"]]

    def one(pair: tuple[str, str]) -> bytes:
        program, stdin = pair
        done = subprocess.run(
            [*prefix, "-I", "-c", program], input=stdin.encode(), capture_output=True, check=True
        )
        return done.stdout

    return _timed(one, pairs, workers)


FLOOR_PROGRAM = r"""
import gc, importlib.util, io, os, resource, sys
spec = importlib.util.spec_from_file_location("runner", sys.argv[1])
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)
program, stdin, rounds, mode = compile(sys.argv[2], "main.py", "exec"), sys.argv[3], int(sys.argv[4]), sys.argv[5]
setup = uid = None
if mode != "fork":  # in a sandbox as the runner's: fresh namespaces per submission, tests as uid `mode`
    uid = None if mode == "-" else int(mode)
    runner._mount(None, "/", None, runner.MS_REC | runner.MS_PRIVATE)  # as the runner does, once
    scratch = os.statvfs("/tmp").f_blocks * os.statvfs("/tmp").f_frsize
    setup = runner.SubmissionSetup("/tmp/genesys/work", True, uid, scratch)
devnull = os.open(os.devnull, os.O_WRONLY)
gc.freeze()

def test(run_program):
    pid = os.fork()
    if pid == 0:
        if setup is not None:
            setup.in_test()
            if uid is not None:
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
        if run_program:
            os.dup2(devnull, 1)
            sys.stdin = io.StringIO(stdin)
            exec(program, {"__name__": "__main__"})
            sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    if setup is not None and setup.mount_proc:
        setup.proc_mounted()  # as the template does: only a submission's first test mounts /proc

def cost(tests, run_program=True):
    who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    before = [resource.getrusage(w) for w in who]
    for _ in range(rounds):
        if setup is not None:
            setup.enter()
        for _ in range(tests):
            test(run_program)
    if setup is not None:
        setup.end_init()
    after = [resource.getrusage(w) for w in who]
    spent = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before))
    return spent / rounds * 1e3

print(*((cost(1, False), cost(1)) if setup is None else (cost(1), cost(6))))
"""


def _floor(
    prefix: list[str], python: str, runner: str, pair: tuple[str, str], rounds: int, mode: str
) -> tuple[float, float]:
    """FLOOR_PROGRAM's two figures, run by `python` after `prefix` (a sandbox's argv, or nothing)."""
    program, stdin = pair
    done = subprocess.run(
        [*prefix, python, "-I", "-S", "-c", FLOOR_PROGRAM, runner, program, stdin, str(rounds), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    first, second = map(float, done.stdout.split())
    return first, second


def fork_floor(pair: tuple[str, str], rounds: int = 2000) -> tuple[float, float]:
    """ms of CPU (parent and child) to fork the sandbox's interpreter, runner modules loaded, and
    have the child exit at once; and to have it run `pair`'s program on its input first."""
    from genesys.sandbox.host import host_toolchains
    from genesys.sandbox.process import RUNNER_PATH

    python = host_toolchains().toolchains["python"].commands["run"]
    return _floor([], python, RUNNER_PATH, pair, rounds, "fork")


def design_floor(pair: tuple[str, str], rounds: int = 400) -> tuple[float, float]:
    """(ms of CPU per submission, per test) of fresh namespaces per submission and a fork per test
    alone, in a bwrap sandbox as the runner's (see the module docstring). The kernel's work in its
    own threads (freeing namespaces, RCU) is not counted: the true floor is higher."""
    from genesys.sandbox.bwrap import BwrapSandbox
    from genesys.sandbox.host import host_toolchains

    sandbox = BwrapSandbox({"python": host_toolchains().toolchains["python"]})
    try:
        argv = sandbox.command()
        start = argv.index("-B") - 3  # the interpreter, -I -S -B, then the runner and its arguments
        uid = argv[argv.index("--uid") + 1] if "--uid" in argv else "-"
        one, six = _floor(argv[:start], argv[start], argv[start + 4], pair, rounds, uid)
    finally:
        sandbox.close()
    per_test = (six - one) / 5
    return one - per_test, per_test


def print_design_floor(pair: tuple[str, str], baseline_ms: float, bounds: list[float]) -> None:
    """Print `design_floor` for one round and the speed-up it allows against that round's
    `baseline_ms` per test, which joins `bounds`; or why it could not be measured."""
    try:
        per_submission, per_test = design_floor(pair)
    except subprocess.CalledProcessError as exc:
        print(f"{'':>8}  floor of this design: not measured ({exc.stderr.strip()[-300:]})")
        return
    at_three = per_test + per_submission / 3
    bounds.append(baseline_ms / at_three)
    print(
        f"{'':>8}  floor of this design: {per_submission:.2f} ms per submission, {per_test:.2f} ms per test, "
        f"{at_three:.2f} ms per test at 3 a submission: at most {baseline_ms / at_three:.1f}x"
    )


def _timed(one, pairs: list[tuple[str, str]], workers: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        outputs = list(pool.map(one, pairs))
    seconds = time.perf_counter() - started
    assert all(out.strip() for out in outputs), "a baseline run printed nothing"
    return seconds


BASELINES = {"docker": docker_baseline, "bwrap": bwrap_baseline}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--submissions", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--baseline-tests", type=int, default=600, help="tests the per-test baseline runs (a sample)"
    )
    parser.add_argument("--backends", default="docker,bwrap")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds of genesys and the baseline per backend"
    )
    parser.add_argument(
        "--runner-reuse",
        type=int,
        help="also time genesys with this many submissions per runner (1: a runner per submission)",
    )
    parser.add_argument(
        "--kinds-only", action="store_true", help="time only assert tests against function_call tests"
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="only split a bwrap run's CPU time into start-up, per submission and per test",
    )
    args = parser.parse_args()

    from genesys.sandbox.backends import check_backend

    print(
        f"byte-compiled: {', '.join(byte_compile_plugins()) or 'nothing (a file would not compile, or no write access)'}"
    )
    meter = CpuMeter()
    try:
        if args.parts:
            cost_parts(args, meter)
            return
        if not args.kinds_only:
            run_all(args, meter, check_backend)
        print(f"assert against function_call tests: {args.submissions} submissions x 3 tests each")
        for kind in args.backends.split(","):
            check = check_backend(kind)
            if check.available and check.languages.get("python") == "ok":
                compare_kinds(args, meter, kind)
            else:
                print(f"{kind:>8}: skipped ({check.note or check.languages.get('python')})")
    finally:
        meter.close()


def run_all(args: argparse.Namespace, meter: CpuMeter, check_backend: Callable[[str], Any]) -> None:
    """Time genesys and the baseline on every backend asked for that works here."""
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "rollouts.jsonl"
        pairs = make_rollouts(inputs, args.submissions)
        tests = len(pairs)
        sample = random.Random(1).sample(pairs, min(args.baseline_tests, tests))
        print(
            f"{args.submissions} Python submissions x 3 tests = {tests} tests, {args.workers} workers, {os.cpu_count()} cores"
        )
        for kind in args.backends.split(","):
            check = check_backend(kind)
            if not check.available or check.languages.get("python") != "ok":
                print(f"{kind:>8}: skipped ({check.note or check.languages.get('python')})")
                continue
            wall_ratios, cpu_ratios, baseline_ms, bounds = [], [], [], []
            for round_number in range(1, args.rounds + 1):
                (seconds, mean_score), our_cpu = cpu_spent(
                    meter, functools.partial(time_genesys, inputs, kind, args.workers)
                )
                ours = tests / seconds
                baseline_s, baseline_cpu = cpu_spent(
                    meter, functools.partial(BASELINES[kind], sample, args.workers)
                )
                baseline = len(sample) / baseline_s
                wall_ratios.append(ours / baseline)
                print(
                    f"{kind:>8} round {round_number}: genesys verify {ours:7.1f} tests/s ({seconds:.1f}s, mean score {mean_score:.3f}); "
                    f"one interpreter per test {baseline:6.1f} tests/s ({len(sample)} tests); speed-up {ours / baseline:.1f}x"
                )
                if kind == "bwrap" and our_cpu is not None and baseline_cpu is not None:
                    ours_ms, theirs_ms = our_cpu / tests * 1e3, baseline_cpu / len(sample) * 1e3
                    cpu_ratios.append(theirs_ms / ours_ms)
                    baseline_ms.append(theirs_ms)
                    print(
                        f"{'':>8}  CPU per test: genesys {ours_ms:.2f} ms, one interpreter per test {theirs_ms:.2f} ms ({theirs_ms / ours_ms:.1f}x)"
                    )
                    print_design_floor(pairs[0], theirs_ms, bounds)
            summary = f"median speed-up over {args.rounds} rounds {statistics.median(wall_ratios):.1f}x by wall clock"
            if cpu_ratios:
                summary += f", {statistics.median(cpu_ratios):.1f}x by CPU time"
            print(f"{kind:>8}: {summary}")
            if baseline_ms:
                bare, with_program = fork_floor(pairs[0])
                print(
                    f"{'':>8}  floor: forking the warm interpreter costs {bare:.2f} ms of CPU per test "
                    f"({with_program:.2f} ms with the test's program run in the child): forking per test, "
                    f"no design beats the baseline by more than {statistics.median(baseline_ms) / with_program:.1f}x here"
                )
                if bounds:
                    print(
                        f"{'':>8}  floor of this design (fresh namespaces per submission, a fork per test, no runner, "
                        f"host or start-up): at most {statistics.median(bounds):.1f}x here (median over the rounds)"
                    )
            if args.runner_reuse:
                seconds, _ = time_genesys(inputs, kind, args.workers, args.runner_reuse)
                print(
                    f"{'':>8}  with runner_reuse={args.runner_reuse}: {tests / seconds:7.1f} tests/s ({tests / seconds / baseline:.1f}x)"
                )


if __name__ == "__main__":
    main()
