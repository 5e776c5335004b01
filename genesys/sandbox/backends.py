"""Choosing and opening a sandbox backend by name, and checking which ones work here."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from genesys.sandbox.base import DEFAULT_REUSE, Sandbox, SandboxError, SandboxUnavailable, Submission
from genesys.sandbox.limits import Limits

BACKENDS = ("auto", "docker", "bwrap", "subprocess")

# A tiny program per language: read two numbers, print their sum.
PROBES = {
    "python": "a, b = map(int, input().split())\nprint(a + b)\n",
    "cpp": "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }\n",
    "rust": (
        "use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();\n"
        '  let n: i64 = s.split_whitespace().map(|x| x.parse::<i64>().unwrap()).sum(); println!("{}", n); }\n'
    ),
    "javascript": "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n",
}


def _host() -> Any:
    from genesys.sandbox.host import host_toolchains
    from genesys.sandbox.toolchains import ToolchainError

    try:
        return host_toolchains()
    except (ToolchainError, OSError) as exc:
        raise SandboxUnavailable(f"cannot find the toolchains to sandbox: {exc}") from None


def open_sandbox(
    kind: str = "auto",
    *,
    limits: Limits | None = None,
    image: str | None = None,
    pool_size: int = 1,
    scratch_mb: int = 256,
    reuse: int = DEFAULT_REUSE,
) -> Sandbox:
    """Open the backend named `kind`; `auto` is docker when a daemon answers, else bwrap.

    `reuse`: submissions one runner process serves before a fresh one is started.
    """
    if kind not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if kind == "docker":
        from genesys.sandbox.docker_backend import DEFAULT_IMAGE, DockerSandbox

        return DockerSandbox(
            image or DEFAULT_IMAGE, pool_size=pool_size, limits=limits, scratch_mb=scratch_mb, reuse=reuse
        )
    if kind == "bwrap":
        from genesys.sandbox.bwrap import BwrapSandbox, find_bwrap

        find_bwrap()  # before looking for toolchains: says plainly when bubblewrap is missing
        host = _host()
        return BwrapSandbox(
            host.toolchains, files=host.files, limits=limits, scratch_mb=scratch_mb, reuse=reuse
        )
    if kind == "subprocess":
        from genesys.sandbox.toolchains import runner_commands
        from genesys.sandbox.unsandboxed import SubprocessSandbox

        return SubprocessSandbox(runner_commands(_host().toolchains), reuse=reuse)
    reasons = []
    for candidate in ("docker", "bwrap"):
        try:
            return open_sandbox(
                candidate, limits=limits, image=image, pool_size=pool_size, scratch_mb=scratch_mb, reuse=reuse
            )
        except SandboxUnavailable as exc:
            reasons.append(f"{candidate}: {exc}")
    raise SandboxUnavailable(
        "no sandbox is available (" + "; ".join(reasons) + "). Install Docker or bubblewrap, or pass "
        "--sandbox subprocess to run code unsandboxed (development only)."
    )


@dataclass
class BackendCheck:
    """Whether one backend works here, and which languages ran a probe program correctly."""

    backend: str
    available: bool
    note: str = ""
    languages: dict[str, str] = field(default_factory=dict)  # language -> "ok" or what went wrong
    seconds: float = 0.0


def check_backend(kind: str, image: str | None = None) -> BackendCheck:
    """Open `kind` and run the probe program of every language it offers."""
    started = time.monotonic()
    try:
        sandbox = open_sandbox(kind, image=image)
    except (SandboxError, OSError) as exc:
        return BackendCheck(kind, False, str(exc), seconds=time.monotonic() - started)
    report = BackendCheck(kind, True)
    with sandbox:
        for language in sandbox.languages():
            try:
                result = sandbox.run(
                    Submission(language, PROBES[language], [{"type": "stdin_stdout", "input": "2 40\n"}])
                )
            except SandboxError as exc:
                report.languages[language] = f"sandbox error: {exc}"
                continue
            if not result.compiled:
                report.languages[language] = f"compile error: {(result.compile_message or '')[:200]}"
            elif result.tests[0]["status"] != "ok" or result.tests[0].get("stdout", "").strip() != "42":
                test = result.tests[0]
                report.languages[language] = (
                    f"{test['status']}: {(test.get('stderr') or test.get('message') or '')[:200]}"
                )
            else:
                report.languages[language] = "ok"
        report.note = "; ".join(sandbox.notes())
    report.seconds = time.monotonic() - started
    return report
