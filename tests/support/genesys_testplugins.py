"""Verifiers with known behaviour for engine tests, and a generation backend without a model; loaded
with GENESYS_PLUGINS=genesys_testplugins."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from fractions import Fraction

import genesys
from genesys.generate.backend import BackendSpec, Completion, GenerationResult, next_weights_version
from genesys.testing.digits import (
    DigitShare,
    DigitTurns,
)  # the training tests' rewards, shared with the benchmarks


class Echo(genesys.Verifier):
    """1 when the completion equals verification_info['expected']."""

    task_type = "echo"
    timeout = 5.0

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        expected = rollout.verification_info.get("expected")
        return genesys.Verdict(score=float(rollout.completion == expected), details={"pid": os.getpid()})


class EnvProbe(genesys.Verifier):
    """Reports the value of the environment variable named by verification_info['name']."""

    task_type = "env_probe"

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        return genesys.Verdict(
            score=1.0, details={"value": os.environ.get(rollout.verification_info["name"])}
        )


class Odd(genesys.Verifier):
    """Returns details that are not plain JSON (a set, a custom object)."""

    task_type = "odd_details"

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        return genesys.Verdict(score=0.5, details={"values": {3}, "obj": Fraction(1, 3), 7: "int key"})


class Preloaded(genesys.Verifier):
    """Reports which process imported its preloaded module."""

    task_type = "preloaded"
    preload = ("genesys_preload_probe",)

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        import genesys_preload_probe

        return genesys.Verdict(
            score=1.0,
            details={
                "imported_in": genesys_preload_probe.IMPORTED_IN_PID,
                "pid": os.getpid(),
                "env": os.environ.get("GENESYS_SET_BY_PRELOAD"),
            },
        )


class ExitInSetup(genesys.Verifier):
    """setup() calls sys.exit, which is no Exception."""

    task_type = "exit_in_setup"

    def setup(self) -> None:
        raise SystemExit(3)

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        return genesys.Verdict(score=1.0)


class FlakySetup(genesys.Verifier):
    """setup() fails the first time in each process, as a sandbox's start may when another run's
    container goes away under it; teardown() says how many half-made instances it tore down."""

    task_type = "flaky_setup"
    attempts = 0
    torn_down = 0

    def setup(self) -> None:
        FlakySetup.attempts += 1
        if FlakySetup.attempts == 1:
            raise RuntimeError("the first setup fails")

    def teardown(self) -> None:
        FlakySetup.torn_down += 1

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        return genesys.Verdict(
            score=1.0, details={"attempts": FlakySetup.attempts, "torn_down": FlakySetup.torn_down}
        )


class RegexHang(genesys.Verifier):
    """A catastrophic regex: holds the GIL for far longer than its timeout."""

    task_type = "regex_hang"
    timeout = 1.0

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        import re

        re.match(r"(a+)+$", "a" * 60 + "b")
        return genesys.Verdict(score=1.0)


class AsyncBusy(genesys.Verifier):
    """An async verifier doing 50 ms of blocking work per rollout, under a 1 s timeout."""

    task_type = "async_busy"
    timeout = 1.0

    async def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        time.sleep(0.05)
        return genesys.Verdict(score=1.0)


class ErrorObject(genesys.Verifier):
    """Returns an exception object as the verdict's error."""

    task_type = "error_object"

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        return genesys.Verdict(score=None, error=ValueError("bad gold"))


class Slow(genesys.Verifier):
    """Sleeps verification_info['sleep'] seconds, records its interval, then scores 1."""

    task_type = "slow"
    timeout = 30.0

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        start = time.time()
        time.sleep(float(rollout.verification_info.get("sleep", 0.01)))
        return genesys.Verdict(score=1.0, details={"start": start, "end": time.time()})


class SerialSlow(Slow):
    """Like Slow, but at most one worker at a time."""

    task_type = "serial_slow"
    max_parallel = 1


class Hang(genesys.Verifier):
    """Never returns: a busy loop that ignores signals a thread-based timeout would rely on."""

    task_type = "hang"
    timeout = 1.0

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        while True:
            pass


class Crash(genesys.Verifier):
    """Kills its own process, as a segfault in a native library would."""

    task_type = "crash"

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class Boom(genesys.Verifier):
    """Raises."""

    task_type = "boom"

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        raise ValueError("verifier bug")


class Junk(genesys.Verifier):
    """Makes a verdict of whatever `verification_info['score']` holds (or returns it bare)."""

    task_type = "junk"

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        if rollout.verification_info.get("bare"):
            return rollout.verification_info["score"]
        return genesys.Verdict(score=rollout.verification_info["score"])


class AsyncEcho(genesys.Verifier):
    """An async verifier: 1 when the completion equals verification_info['expected']."""

    task_type = "async_echo"
    timeout = 2.0

    async def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        await asyncio.sleep(float(rollout.verification_info.get("sleep", 0.0)))
        return genesys.Verdict(score=float(rollout.completion == rollout.verification_info.get("expected")))


class Fixable(genesys.Verifier):
    """Like Echo, but raises KeyError while $GENESYS_TEST_BROKEN is set: a bug that a fix removes."""

    task_type = "fixable"

    def verify(self, rollout: genesys.Rollout) -> genesys.Verdict:
        if os.environ.get("GENESYS_TEST_BROKEN"):
            raise KeyError("gold")
        return genesys.Verdict(score=float(rollout.completion == rollout.verification_info.get("expected")))


@genesys.hookimpl
def genesys_verifiers() -> list[type[genesys.Verifier]]:
    return [
        DigitShare,
        Echo,
        EnvProbe,
        Odd,
        Preloaded,
        ExitInSetup,
        FlakySetup,
        RegexHang,
        AsyncBusy,
        ErrorObject,
        Slow,
        SerialSlow,
        Hang,
        Crash,
        Boom,
        Junk,
        AsyncEcho,
        Fixable,
    ]


class ScriptedBackend:
    """A generation backend without a model: sample i of a task answers `<last words of the prompt> #i`,
    one token per character (its code point), each with logprob -1, cut at the request's max_tokens.
    Option `delay`: seconds each request takes."""

    name = "scripted"

    def __init__(self, model: str, style, **options) -> None:
        self.model = model
        self.weights_version = 0
        self.delay = float(options.get("delay", 0.0))

    def info(self) -> dict:
        return {"backend": self.name, "model": self.model}

    def close(self) -> None:
        pass

    async def update_weights(self, weights, version=None) -> None:
        self.weights_version = next_weights_version(self.weights_version, version)

    async def generate(self, requests):
        for request in requests:
            if self.delay:
                await asyncio.sleep(self.delay)
            prompt = request.messages[-1]["content"]
            completions = []
            for sample in request.sample_indices:
                text = f"{prompt[-12:]} #{sample}"[: request.sampling.max_tokens]
                completions.append(Completion(text, [ord(c) for c in text], [-1.0] * len(text), "stop"))
            yield GenerationResult(request, [ord(c) for c in prompt], completions, self.weights_version)


@genesys.hookimpl
def genesys_environments() -> list[type[genesys.Environment]]:
    return [DigitTurns]


@genesys.hookimpl
def genesys_backends() -> list[BackendSpec]:
    return [BackendSpec("scripted", ScriptedBackend, description="scripted answers, no model")]
