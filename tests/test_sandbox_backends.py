"""The code verifier on the real sandboxes (docker and bwrap): right programs pass, wrong ones fail,
and hostile programs are contained while the sandbox keeps scoring what comes next."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from genesys.sandbox.backends import open_sandbox
from genesys.sandbox.base import Sandbox, Submission
from genesys.schema import Rollout
from genesys.verifiers.code import CodeVerifier

SECRET = "genesys-test-secret-9d1c"
FENCE = "```"
# The real sandboxes, each a parameter with its marker: `-m "not docker"` leaves out what needs a Docker daemon.
BACKENDS = [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bwrap", marks=pytest.mark.bwrap)]


def backend_skip_reason(kind: str) -> str | None:
    """Why `kind` cannot run here (None when it can); builds the docker image offline if it is not current."""
    from genesys.sandbox.base import SandboxUnavailable

    try:
        if kind == "docker":
            from genesys.sandbox.docker_backend import DEFAULT_IMAGE, docker_client
            from genesys.sandbox.image import build_offline

            docker_client()
            build_offline(DEFAULT_IMAGE)  # a no-op when an identical image exists
        else:
            from genesys.sandbox.bwrap import find_bwrap

            find_bwrap()
    except SandboxUnavailable as exc:
        return f"{kind} sandbox unavailable: {exc}"
    return None


def opened_sandbox(kind: str, **options: object) -> Iterator[Sandbox]:
    """For a fixture to yield from: a sandbox of `kind` open around it (skipped where it cannot run)."""
    reason = backend_skip_reason(kind)
    if reason:
        pytest.skip(reason)
    with open_sandbox(kind, **options) as opened:
        yield opened


@pytest.fixture(scope="module", params=BACKENDS)
def verifier(request: pytest.FixtureRequest) -> Iterator[CodeVerifier]:
    reason = backend_skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    os.environ["GENESYS_TEST_SECRET"] = SECRET  # must not reach the sandbox
    instance = CodeVerifier({"sandbox": request.param, "time_limit": 1})
    instance.setup()
    yield instance
    instance.teardown()
    os.environ.pop("GENESYS_TEST_SECRET", None)


def code_rollout(language: str, source: str, tests: list[dict]) -> Rollout:
    return Rollout(
        task_type="verifiable_code",
        verification_info={"language": language, "test_cases": tests},
        completion=f"Here it is.\n{FENCE}{language}\n{source}\n{FENCE}\n",
    )


SUM_TESTS = [
    {"type": "stdin_stdout", "input": "2 3\n", "output": "5\n"},
    {"type": "stdin_stdout", "input": "-7 7\n", "output": "0\n"},
]

PROGRAMS = {
    "python": {
        "correct": "a, b = map(int, input().split())\nprint(a + b)",
        "wrong": "a, b = map(int, input().split())\nprint(a - b)",
        "slow": "while True:\n    pass",
        "crash": "raise SystemExit(3)",
        "broken": "def f(:\n    pass",
    },
    "cpp": {
        "correct": "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }",
        "wrong": "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a * b << std::endl; }",
        "slow": "int main() { volatile unsigned long x = 0; for (;;) x++; }",
        "crash": "#include <cstdlib>\nint main() { int* p = nullptr; return *p + std::rand(); }",
        "broken": "int main() { return undefined_name; }",
    },
    "rust": {
        "correct": (
            "use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();\n"
            'let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect(); println!("{}", v[0] + v[1]); }'
        ),
        "wrong": 'fn main() { println!("5"); }',
        "slow": "fn main() { let mut x: u64 = 0; loop { x = x.wrapping_add(std::hint::black_box(1)); } }",
        "crash": 'fn main() { let v: Vec<i32> = Vec::new(); println!("{}", v[3]); }',
        "broken": 'fn main() { let x: i32 = "text"; }',
    },
    "javascript": {
        "correct": "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);",
        "wrong": "console.log('5');",
        "slow": "for (;;) {}",
        "crash": "throw new Error('boom');",
        "broken": "function (",
    },
}
EXPECTED = {
    "correct": ("passed", 1.0),
    "wrong": ("wrong_answer", None),
    "slow": ("time_limit", 0.0),
    "crash": ("runtime_error", 0.0),
    "broken": ("compile_error", 0.0),
}


# C++ and Rust: five programs to compile, over 3 s in all.
@pytest.mark.parametrize(
    "language",
    [
        pytest.param(lang, marks=pytest.mark.slow) if lang in ("cpp", "rust") else lang
        for lang in sorted(PROGRAMS)
    ],
)
def test_programs_are_judged_right(verifier: CodeVerifier, language: str) -> None:
    if language not in verifier.sandbox.languages():
        pytest.skip(f"{language} is not available in the {verifier.sandbox.name} sandbox here")
    for kind, source in PROGRAMS[language].items():
        verdict = verifier.verify(code_rollout(language, source, SUM_TESTS))
        status, score = EXPECTED[kind]
        assert verdict.error is None, (kind, verdict.error)
        assert verdict.details["status"] == status, (language, kind, verdict.details)
        if score is not None:
            assert verdict.score == score, (language, kind, verdict.details)
    wrong = verifier.verify(code_rollout(language, PROGRAMS[language]["wrong"], SUM_TESTS))
    assert wrong.score == 0.5 if language in ("rust", "javascript") else wrong.score == 0.0


# C++ as contest solutions are written: C++20 library features and GNU extensions, and the guard
# that reads a local input.txt unless the judge defines ONLINE_JUDGE.
CONTEST_CPP = {
    "C++20 and GNU extensions": textwrap.dedent("""\
        #include <bits/stdc++.h>
        using namespace std;
        struct Pair { long long a, b; auto operator<=>(const Pair&) const = default; };
        int main() {
            vector<long long> v(2);
            for (auto& x : v) cin >> x;
            ranges::sort(v);
            map<int, int> seen{{1, 1}};
            typeof(v[0]) sum = v[0] + v[1] + popcount(0u) + (long long)(numbers::pi - 3.14159);
            Pair p{.a = 1, .b = 2};
            if (seen.contains(1) && p < Pair{1, 3}) cout << sum << '\\n';
        }"""),
    "input.txt unless ONLINE_JUDGE": textwrap.dedent("""\
        #include <bits/stdc++.h>
        int main() {
        #ifndef ONLINE_JUDGE
            freopen("input.txt", "r", stdin);
            freopen("output.txt", "w", stdout);
        #endif
            long long a, b;
            std::cin >> a >> b;
            std::cout << a + b << std::endl;
        }"""),
}


@pytest.mark.slow
def test_contest_cpp_builds_as_judges_build_it(verifier: CodeVerifier) -> None:
    if "cpp" not in verifier.sandbox.languages():
        pytest.skip(f"cpp is not available in the {verifier.sandbox.name} sandbox here")
    for name, source in CONTEST_CPP.items():
        verdict = verifier.verify(code_rollout("cpp", source, SUM_TESTS))
        assert verdict.score == 1.0, (name, verdict.details)


def test_function_call_tests(verifier: CodeVerifier) -> None:
    tests = [
        {"type": "function_call", "fn_name": "twoSum", "input": [[2, 7, 11, 15], 9], "output": [0, 1]},
        {"type": "function_call", "fn_name": "twoSum", "input": [[3, 3], 6], "output": [0, 1]},
    ]
    python = "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n                return (seen[target - x], i)\n            seen[x] = i"
    verdict = verifier.verify(code_rollout("python", python, tests))
    assert verdict.score == 1.0, verdict.details
    javascript = "function twoSum(nums, target) { const seen = new Map();\n  for (let i = 0; i < nums.length; i++) { if (seen.has(target - nums[i])) return [seen.get(target - nums[i]), i]; seen.set(nums[i], i); } }"
    if "javascript" in verifier.sandbox.languages():
        assert verifier.verify(code_rollout("javascript", javascript, tests)).score == 1.0
    off_by_one = python.replace("return (seen[target - x], i)", "return (seen[target - x], i + 1)")
    verdict = verifier.verify(code_rollout("python", off_by_one, tests))
    assert verdict.score == 0.0 and verdict.details["tests"][0]["status"] == "wrong_answer"


def test_a_leetcode_solution_finds_what_leetcode_provides_without_imports(verifier: CodeVerifier) -> None:
    tests = [{"type": "function_call", "fn_name": "topK", "input": [[3, 1, 3, 2, 3, 2], 2], "output": [3, 2]}]
    leetcode = textwrap.dedent("""\
        class Solution:
            def topK(self, nums: List[int], k: Optional[int]) -> List[int]:
                counts = Counter(nums)
                heap: Deque[int] = deque()
                best = []
                for value, count in counts.items():
                    heappush(best, (-count, value))
                order = [heappop(best)[1] for _ in range(k)]
                assert bisect_left(sorted(order), order[0]) >= 0 and min(inf, 1) == 1
                assert pow(2, 10, 1000) == 24 and gcd(4, 6) == 6  # builtins and its own names come first
                return order

        def gcd(a, b):
            return 6
        """)
    verdict = verifier.verify(code_rollout("python", leetcode, tests))
    assert verdict.score == 1.0, verdict.details
    script = "print(Counter([1]))"  # a script (stdin_stdout) is run as python3 runs it: no such names
    verdict = verifier.verify(
        code_rollout("python", script, [{"type": "stdin_stdout", "input": "", "output": "x"}])
    )
    assert verdict.details["status"] == "runtime_error" and "NameError" in str(verdict.details), (
        verdict.details
    )


# --- hostile programs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host_listener() -> Iterator[tuple[str, int]]:
    """A TCP server on the host, on every interface: sandboxed programs must not reach it."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet is sent; this picks the outward interface
        address = probe.getsockname()[0]
    except OSError:
        address = "127.0.0.1"
    finally:
        probe.close()
    yield address, server.getsockname()[1]
    server.close()


def hostile_programs(
    host: str, port: int, secret_file: Path, marker: str
) -> dict[str, tuple[str, str | None, set[str]]]:
    """name -> (python source, expected stdout when contained, acceptable statuses)."""
    return {
        "network": (
            f"""
            import socket
            reached = []
            for host, port in [({host!r}, {port}), ("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
                try:
                    socket.create_connection((host, port), timeout=2).close()
                    reached.append(host)
                except OSError:
                    pass
            try:
                socket.getaddrinfo("example.com", 80)
                reached.append("dns")
            except OSError:
                pass
            print("reached " + " ".join(reached) if reached else "blocked")
            """,
            "blocked",
            {"passed"},
        ),
        "host_files": (
            f"""
            import os
            seen = []
            for path in [{str(secret_file)!r}, "/etc/shadow", "/etc/passwd", "/root/.bash_history", "/proc/1/root/etc/shadow"]:
                try:
                    with open(path) as handle:
                        seen.append(path + ":" + handle.read(20))
                except OSError:
                    pass
            for path in [{str(secret_file.parent / "written-from-sandbox")!r}, "/usr/bin/pwned", "/etc/pwned"]:
                try:
                    with open(path, "w") as handle:
                        handle.write("x")
                    seen.append("wrote " + path)
                except OSError:
                    pass
            print(" | ".join(seen) if seen else "denied")
            """,
            "denied",
            {"passed"},
        ),
        "environment": (
            f"""
            import os
            found = [k for k, v in os.environ.items() if {SECRET!r} in v or k == "GENESYS_TEST_SECRET"]
            for pid in os.listdir("/proc"):
                try:
                    with open("/proc/%s/environ" % pid, "rb") as handle:
                        if {SECRET!r}.encode() in handle.read():
                            found.append(pid)
                except OSError:
                    pass
            print(found or "none")
            """,
            "none",
            {"passed"},
        ),
        # A test's parent, the template, is outside its pid namespace: getppid() is 0 there (as for a
        # process `docker exec` starts), and kill(0) would be the program's own process group.
        "kill_parent": (
            "import os, signal\nparent = os.getppid()\nif parent:\n    os.kill(parent, signal.SIGKILL)\nprint('alive')",
            None,
            {"runtime_error", "passed", "wrong_answer"},
        ),
        "kill_everything": (
            "import os, signal\nfor pid in (1, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nprint('alive')",
            None,
            {"runtime_error", "passed", "wrong_answer"},
        ),
        "detached_child": (
            f"""
            import os, sys
            pid = os.fork()
            if pid == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
                os._exit(0)
            os.waitpid(pid, 0)
            print("detached")
            """,
            "detached",
            {"passed"},
        ),
        "fork_bomb": (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            None,
            {"time_limit", "runtime_error", "memory_limit"},
        ),
        "memory_bomb": ("hog = []\nwhile True:\n    hog.append(bytearray(64 << 20))", None, {"memory_limit"}),
        "cpu_spin": ("while True:\n    pass", None, {"time_limit"}),
        "sleep_forever": ("import time\ntime.sleep(3600)", None, {"time_limit"}),
        "leave_process_group": (
            "import os\ntry:\n    os.setpgid(0, os.getpgid(os.getppid()))\nexcept OSError:\n    pass\nwhile True:\n    pass",
            None,
            {"time_limit"},
        ),
        "output_flood": (
            "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)",
            None,
            {"output_limit"},
        ),
        "disk_fill": (
            "with open('fill.bin', 'wb') as f:\n    while True:\n        f.write(b'0' * (1 << 20))",
            None,
            {"output_limit", "runtime_error"},
        ),
        "disk_fill_many": (
            "i = 0\nwhile True:\n    with open('f%d' % i, 'wb') as f:\n        f.write(b'0' * (32 << 20))\n    i += 1",
            None,
            {"runtime_error", "output_limit"},
        ),
    }


def host_processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            pass
    return found


@pytest.mark.slow
def test_hostile_programs_are_contained(
    verifier: CodeVerifier, host_listener: tuple[str, int], tmp_path: Path
) -> None:
    secret_file = tmp_path / "host-secret.txt"
    secret_file.write_text(SECRET)
    marker = f"genesys-detached-{os.getpid()}-{verifier.sandbox.name}"
    good = code_rollout("python", PROGRAMS["python"]["correct"], SUM_TESTS)
    for name, (source, expected, statuses) in hostile_programs(*host_listener, secret_file, marker).items():
        tests = [{"type": "stdin_stdout", "input": "", "output": expected or "never printed"}]
        with cpu_to_spare(verifier) if name == "memory_bomb" else contextlib.nullcontext():
            verdict = verifier.verify(code_rollout("python", textwrap.dedent(source).strip(), tests))
        assert verdict.error is None, (name, verdict.error)
        test = verdict.details["tests"][0]
        assert test["status"] in statuses, (name, test)
        # The sandbox is fine afterwards: the next rollout is scored right.
        assert verifier.verify(good).score == 1.0, name
    assert not (tmp_path / "written-from-sandbox").exists()
    assert host_processes_with(marker) == [], "a detached child outlived its submission"


PRIVILEGES_PROBE = """
import os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
interfaces = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:])
try:
    open("/usr/genesys-probe", "w")
    root = "writable"
except OSError:
    root = "read-only"
print("root-user" if os.getuid() == 0 or os.geteuid() == 0 else "non-root")
print("caps", status["CapEff"].strip(), status["CapBnd"].strip() == "0000000000000000")
print("no_new_privs", status["NoNewPrivs"].strip())
print("interfaces", *interfaces)
print("root", root)
print("env", sorted(os.environ))
"""


def test_programs_run_unprivileged_offline_and_read_only(verifier: CodeVerifier) -> None:
    expected = "non-root\ncaps 0000000000000000 True\nno_new_privs 1\ninterfaces lo\nroot read-only\nenv ['HOME', 'LANG', 'LC_ALL', 'PATH']\n"
    verdict = verifier.verify(code_rollout("python", PRIVILEGES_PROBE, [{"input": "", "output": expected}]))
    assert verdict.score == 1.0, verdict.details


def test_python_programs_find_the_builtins_the_site_module_adds(verifier: CodeVerifier) -> None:
    # As `python3 main.py` has them: exit and quit end the program with their code, like sys.exit.
    names = "('help', 'copyright', 'credits', 'license')"
    sources = {
        "exit()": f"import builtins\nprint(all(hasattr(builtins, n) for n in {names}))\nexit()\nprint('after')\n",
        "quit(0)": "print(True)\nquit(0)\nprint('after')\n",
        "exit(3)": "print(True)\nexit(3)\n",
    }
    for call, source in sources.items():
        result = verifier.sandbox.run(
            Submission("python", source, [{"type": "stdin_stdout", "input": ""}] * 2)
        )
        expected = ("runtime_error", 3) if call == "exit(3)" else ("ok", 0)
        assert [(test["status"], test["exit_code"], test["stdout"]) for test in result.tests] == [
            (*expected, "True\n")
        ] * 2, (call, result.tests)


STDIO_PROBE = """
import sys
line = sys.stdin.readline()
for stream in (sys.stdin, sys.stdout, sys.stderr):
    print(stream.mode, stream.name, stream.encoding, stream.errors, stream.line_buffering,
          stream.write_through, type(stream.buffer).__name__, stream.seekable())
print(repr(line), repr(sys.stdin.read()))
"""


def test_python_streams_are_those_python3_makes(verifier: CodeVerifier) -> None:
    # What `python3 main.py` finds with pipes for its streams: names, modes, buffering, errors, and
    # newlines kept as they are ("\r\n" read as is): fast-I/O templates read `sys.stdin.mode`, and a
    # program that does not strip a "\r" must fail as it would there. The input, a pipe here, is a
    # file in the sandbox: seekable, as a redirected file is.
    data = "first\r\nsecond\r\n"
    env = {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "PATH": os.environ["PATH"]}
    real = subprocess.run(
        [sys.executable, "-I", "-c", STDIO_PROBE],
        input=data.encode(),
        capture_output=True,
        env=env,
        check=True,
    ).stdout.decode()
    real = real.replace("BufferedReader False", "BufferedReader True", 1)  # stdin seekable
    result = verifier.sandbox.run(
        Submission("python", STDIO_PROBE, [{"type": "stdin_stdout", "input": data}] * 2)
    )
    assert [test["stdout"] for test in result.tests] == [real, real], result.tests


# A test's OOM score, then its submission's init's (pid 1 there), made after earlier tests were forked.
OOM_PROBE = (
    'print(open("/proc/self/oom_score_adj").read().strip(), open("/proc/1/oom_score_adj").read().strip())'
)


def test_tests_are_taken_first_under_memory_pressure_and_the_template_is_not(verifier: CodeVerifier) -> None:
    # Tests start with the highest OOM score; the template, which forked them and whose clone is
    # each later submission's init, keeps its own (the first submission's tests ran before).
    for compiled in (False, True):  # a Python test (run in a resident process) and a compiled one
        language, source = ("cpp", "int main() { return 0; }\n") if compiled else ("python", OOM_PROBE)
        if language not in verifier.sandbox.languages():
            continue
        verifier.verify(code_rollout(language, source, [{"input": "", "output": ""}] * 2))
    report = verifier.sandbox.run(Submission("python", OOM_PROBE, [{"type": "stdin_stdout", "input": ""}]))
    own, init = report.tests[0]["stdout"].split()
    assert own == "1000" and init != "1000", report.tests


STREAMS_PROGRAM = """
import io, sys
data = sys.stdin.buffer.read()
sys.stderr.write("diagnostic\\n")
sys.stdout.buffer.write(b"bytes:" + data.strip() + b"\\n")
print("argv", sys.argv, "stdin", sys.stdin.encoding, "seekable", sys.stdout.seekable(), sys.stderr.seekable(), end="")
print(" same", sys.__stdout__ is sys.stdout, end="")
sys.stdout = io.StringIO()  # what was printed before still comes out, as at interpreter exit
print("swallowed")
"""


def test_python_streams_are_fresh_in_every_test(verifier: CodeVerifier) -> None:
    # Each test of one submission sees only its own input, and nothing an earlier test wrote.
    expected = "bytes:{}\nargv ['main.py'] stdin utf-8 seekable False False same True"
    tests = [{"input": text, "output": expected.format(text)} for text in ("first", "second", "third")]
    verdict = verifier.verify(code_rollout("python", STREAMS_PROGRAM, tests))
    assert verdict.score == 1.0, verdict.details


MEMORY_BOMBS = {
    "cpp": "#include <vector>\nint main() { std::vector<std::vector<char>> hog; for (;;) hog.emplace_back(64 << 20, 1); }",
    "rust": "fn main() { let mut hog: Vec<Vec<u8>> = Vec::new(); loop { hog.push(vec![1u8; 64 << 20]); } }",
    "javascript": "const hog = []; for (;;) hog.push(Buffer.alloc(64 << 20, 1));",
}


@pytest.mark.parametrize("language", sorted(MEMORY_BOMBS))
def test_memory_bombs_are_a_memory_limit(verifier: CodeVerifier, language: str) -> None:
    if language not in verifier.sandbox.languages():
        pytest.skip(f"{language} is not available in the {verifier.sandbox.name} sandbox here")
    with cpu_to_spare(verifier):
        verdict = verifier.verify(
            code_rollout(language, MEMORY_BOMBS[language], [{"input": "", "output": ""}])
        )
    assert verdict.details["tests"][0]["status"] == "memory_limit", verdict.details


@contextlib.contextmanager
def cpu_to_spare(verifier: CodeVerifier) -> Iterator[None]:
    """Give the next rollouts 20 CPU seconds: on a busy machine filling 512 MB can take longer than
    the fixture's 1 s, and a memory bomb must meet its memory limit first."""
    limits = verifier.limits
    verifier.limits = dataclasses.replace(limits, time_limit=20.0)
    try:
        yield
    finally:
        verifier.limits = limits


def test_submissions_do_not_see_each_other(verifier: CodeVerifier) -> None:
    places = "['left-behind', '/tmp/left-behind', '/dev/shm/left-behind']"
    writer = f"import os\nfor path in {places}:\n    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass\nos.chmod('.', 0)\nprint('ok')"
    reader = f"import os\nprint('dirty' if any(os.path.exists(p) for p in {places}) else 'clean')"
    assert verifier.verify(code_rollout("python", writer, [{"input": "", "output": "ok"}])).score == 1.0
    assert verifier.verify(code_rollout("python", reader, [{"input": "", "output": "clean"}])).score == 1.0


def runner_identities(verifier: CodeVerifier, count: int) -> set[object]:
    """The runners that served `count` submissions, seen from the host: no program can see its
    runner (it runs in a pid namespace of its submission's own)."""
    seen = set()
    for _ in range(count):
        assert verifier.verify(code_rollout("python", PROGRAMS["python"]["correct"], SUM_TESTS)).score == 1.0
        sandbox = verifier.sandbox
        session = sandbox._session if sandbox.name == "bwrap" else sandbox._all[0].session
        seen.add(session)  # held, so that no two can share an identity
    return seen


def test_runner_reuse(verifier: CodeVerifier) -> None:
    assert len(runner_identities(verifier, 3)) == 1  # one runner serves many submissions
    fresh = CodeVerifier({"sandbox": verifier.sandbox.name, "runner_reuse": 1})
    fresh.setup()
    try:
        assert len(runner_identities(fresh, 3)) == 3  # a runner per submission
    finally:
        fresh.teardown()


def test_bwrap_runner_is_compiled_once_by_the_sandbox_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from genesys.sandbox.bwrap import compiled_runner
    from genesys.sandbox.process import RUNNER_PATH

    python = sys.executable
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = compiled_runner(python)
    assert path.startswith(str(tmp_path / "cache")) and path.endswith(".pyc")
    with open(path, "rb") as handle:
        assert handle.read(4) == importlib.util.MAGIC_NUMBER  # bytecode for this interpreter
    made = os.stat(path).st_mtime_ns
    assert compiled_runner(python) == path and os.stat(path).st_mtime_ns == made  # from the cache
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # no cache can be made under a file
    assert compiled_runner(python) == RUNNER_PATH
