"""The `verifiable_code` verifier: run the completion's program against the task's tests in a sandbox.

`verification_info = {"language": "python"|"cpp"|"rust"|"javascript", "test_cases": [...]}` with
`stdin_stdout` tests (`input` text in, `output` text expected), `function_call` tests (`fn_name`,
`input` a list of arguments, `output` the expected return value), and in python `assert` tests
(`code` run in the program's namespace) and `pytest` tests (`code` a test module); an optional
`checker` judges stdin_stdout output instead of the comparison (see `code_tests`). The program is
the completion's last fenced code block, preferring blocks tagged with the task's language. `score`
is the fraction of tests passed; `details["tests"]` gives each test's status and timings.

Options (`genesys verify -O key=value`, the `[sandbox]` table or its flags) are `CodeOptions`: the
sandbox, the per-test `Limits` (`time_limit`, `memory_limit`, ...: names, defaults and ranges are
Limits'), `budget` and `runner_reuse`. The sandbox is imported and opened in `setup()`, once per
worker, so loading this plugin stays cheap.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic.dataclasses import dataclass

import genesys
from genesys.config.sections import LIMIT_NAMES, SANDBOXES, SECTION, Limits, setting
from genesys.sandbox.base import DEFAULT_REUSE
from genesys.schema import Rollout, Verdict
from genesys.verifiers.code_compare import compare_output, values_match
from genesys.verifiers.code_extract import extract_code
from genesys.verifiers.code_tests import JUDGED_TYPES, CodeTest, TaskDataError, parse_checker, parse_tests

STATUSES = (
    "passed",
    "wrong_answer",
    "time_limit",
    "memory_limit",
    "runtime_error",
    "compile_error",
    "output_limit",
    "checker_error",
)
# Seconds kept between the submission's own budget and the engine's hard deadline.
BUDGET_MARGIN_S = 10.0
TEXT_LIMIT = 500  # characters of stderr / compiler output kept in details
CALL_LANGUAGES = ("python", "javascript")  # languages whose function_call tests the runner can run
CHECKER_REJECTS = (
    1,
    2,
)  # a checker's exit codes that reject the output (testlib: wrong answer, presentation)
MISSING = {"status": "runtime_error", "message": "the runner reported no result"}  # a test with no report
TIMEOUT_S = (
    180.0  # the verifier's deadline: compile plus every test; the sandbox stops the submission before this
)


@dataclass(frozen=True, config=SECTION)
class CodeOptions(Limits):
    """The options of the `verifiable_code` verifier: the per-test limits (`Limits`), the sandbox, the budget."""

    sandbox: Literal["auto", "docker", "bwrap", "subprocess"] = setting(
        "auto",
        "sandbox backend: docker if a daemon answers and the image exists, else bwrap (auto); subprocess is no sandbox",
        choices=SANDBOXES,
    )
    sandbox_image: str | None = setting(
        None, "docker image (unset: $GENESYS_SANDBOX_IMAGE, else genesys-sandbox:latest)"
    )
    runner_reuse: int = setting(
        DEFAULT_REUSE,
        "submissions one in-sandbox runner serves before a fresh one starts (1: a new docker exec or bwrap per submission)",
        ge=1,
    )
    budget: float | None = setting(
        None,
        f"seconds for compiling plus all tests of one rollout; tests left when it runs out are time_limit "
        f"(unset: the verifier's {TIMEOUT_S:g} s deadline minus {BUDGET_MARGIN_S:g})",
        gt=0,
    )

    @property
    def limits(self) -> Limits:
        return Limits(**{name: getattr(self, name) for name in LIMIT_NAMES})


class CodeVerifier(genesys.Verifier):
    """Scores `verifiable_code` rollouts by the fraction of tests their program passes."""

    task_type = "verifiable_code"
    timeout = TIMEOUT_S
    options_model = CodeOptions

    def setup(self) -> None:
        from genesys.sandbox.backends import open_sandbox

        settings: CodeOptions = self.settings
        self.limits = settings.limits
        self.sandbox = open_sandbox(
            settings.sandbox, limits=self.limits, image=settings.sandbox_image, reuse=settings.runner_reuse
        )
        self.sandbox.warm_up()  # containers and runners start here, outside the per-rollout deadline

    def teardown(self) -> None:
        sandbox = getattr(self, "sandbox", None)
        if sandbox is not None:
            sandbox.close()

    def verify(self, rollout: Rollout) -> Verdict:
        from genesys.sandbox.base import SandboxError, Submission

        try:
            language, tests = parse_tests(rollout.verification_info, rollout.source)
            checker = parse_checker(rollout.verification_info)
        except TaskDataError as exc:
            return Verdict.failed(f"invalid_verification_info: {exc}")
        if language not in CALL_LANGUAGES and any(test.type == "function_call" for test in tests):
            return Verdict.failed(
                f"unsupported_test: function_call tests run in {' and '.join(CALL_LANGUAGES)} only, not {language}"
            )
        if language != "python" and any(test.type in JUDGED_TYPES for test in tests):
            return Verdict.failed(
                f"unsupported_test: assert and pytest tests run in python only, not {language}"
            )
        code = extract_code(rollout.completion, language)
        if code is None or not code.strip():
            return Verdict(0.0, {"language": language, "status": "no_code", "passed": 0, "total": len(tests)})
        if language not in self.sandbox.languages():
            return Verdict.failed(
                f"unsupported_language: the {self.sandbox.name} sandbox cannot run {language}"
            )
        submission = Submission(
            language=language,
            source=code,
            tests=[test.to_sandbox() for test in tests],
            limits=self.limits,
            budget_s=max(1.0, self.settings.budget or self.timeout - BUDGET_MARGIN_S),
            on_test=lambda index, report: judge(tests[index], report) if index < len(tests) else {},
            checker=None if checker is None else {"language": checker.language, "source": checker.source},
        )
        try:
            result = self.sandbox.run(submission)
        except SandboxError as exc:
            return Verdict.failed(f"sandbox_error: {exc}", language=language)
        if result.checker_error:  # the task's checker, not the program, failed: no score
            return Verdict.failed(f"checker_error: {result.checker_error}", language=language)
        if result.compiled:  # result.tests holds verdicts: each test was judged as its report came
            judged = result.tests[: len(tests)]
            judged += [judge(test, MISSING) for test in tests[len(judged) :]]
        else:
            judged = [{"status": "compile_error"} for _ in tests]
        broken = next((item for item in judged if item["status"] == "checker_error"), None)
        if broken is not None:
            return Verdict.failed(
                f"checker_error: {broken.get('message', 'the checker failed')}", language=language
            )
        passed = sum(item["status"] == "passed" for item in judged)
        details: dict[str, Any] = {
            "language": language,
            "status": _overall(judged),
            "passed": passed,
            "total": len(tests),
            "compile_time_s": round(result.compile_time_s, 4),
            "tests": judged,
        }
        if result.compile_message:
            details["compile_message"] = result.compile_message[-TEXT_LIMIT:]
        return Verdict(passed / len(tests), details)


def judge(test: CodeTest, report: dict[str, Any]) -> dict[str, Any]:
    """The verdict on one test from what the runner reported."""
    status = report.get("status", "runtime_error")
    item: dict[str, Any] = {
        "status": status,
        "time_s": report.get("time_s"),
        "wall_s": report.get("wall_s"),
        "memory_kb": report.get("memory_kb"),
    }
    if status == "ok" and test.type in JUDGED_TYPES:  # the sandbox's judge has decided: passed
        item["status"] = "passed"
    elif status == "ok" and "checker" in report:
        item.update(_checker_verdict(report["checker"]))
    elif status == "ok":
        difference = _difference(test, report)
        item["status"] = "passed" if difference is None else "wrong_answer"
        if difference:
            item["message"] = difference
    else:
        message = report.get("message") or (report.get("stderr") or "")[-TEXT_LIMIT:]
        if message:
            item["message"] = message
        if report.get("exit_code") not in (None, 0):
            item["exit_code"] = report["exit_code"]
        if report.get("signal"):
            item["signal"] = report["signal"]
    return item


def _checker_verdict(checker: dict[str, Any]) -> dict[str, Any]:
    """A checked test's status from its checker's report: exit 0 accepts, testlib's wrong-answer and
    presentation-error codes reject, anything else (a crash, a limit, testlib's `fail`) is the
    checker's own failure."""
    message = (checker.get("message") or "")[-TEXT_LIMIT:]
    if checker.get("status") == "ok":
        return {"status": "passed"}
    if checker.get("status") == "runtime_error" and checker.get("exit_code") in CHECKER_REJECTS:
        return {"status": "wrong_answer", "message": message or "the checker rejected the output"}
    why = (
        f"exit code {checker['exit_code']}" if checker.get("exit_code") is not None else checker.get("status")
    )
    return {"status": "checker_error", "message": f"the checker failed ({why}): {message}".strip()}


def _difference(test: CodeTest, report: dict[str, Any]) -> str | None:
    if test.type == "stdin_stdout":
        return compare_output(report.get("stdout", ""), test.expected)
    try:
        value = json.loads(report.get("result") or "null")
    except json.JSONDecodeError:
        return "the function's result is not valid JSON"
    if values_match(value, test.expected):
        return None
    return f"expected {_clip(test.expected)}, got {_clip(value)}"


def _clip(value: Any, limit: int = 120) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _overall(judged: list[dict[str, Any]]) -> str:
    """'passed' when every test passed, else the first failing test's status."""
    return next((item["status"] for item in judged if item["status"] != "passed"), "passed")


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [CodeVerifier]
