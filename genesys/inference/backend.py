"""The `pipeline` generation backend: a transformers model split layer-wise into a ring of stages.

The process running `genesys generate` is stage 0: it renders and pads the prompts, embeds tokens and
runs the first layers. Stages 1..N-1 are processes it starts on this machine (`stages`), or ones
already serving at `peers` (`genesys pipeline-stage --listen HOST:PORT` on each machine, in ring
order). Each step's hidden states go stage to stage; the last stage samples and sends the tokens back
to stage 0, which starts the next step. Every hop is delayed by `latency_ms` (one way), to measure a
slow network on one machine.

With `micro_batches` M = 1 the schedule is synchronous: one batch of `batch_size` sequences goes round
the ring at a time. With M > 1 it is interleaved: M micro-batches of `batch_size` are in the ring at
once, each stage serving them in turn (`genesys.inference.plan` says when that pays). Batches are
made as the transformers backend makes them (one sampling setting each, longest prompts first) and
seeded the same way, so a batch samples the same tokens either way.

Each stage, this one included, reads only its own layers from the checkpoint (`genesys.inference.shard`).
Every connection of the ring is authenticated both ways on the shared secret `GENESYS_PIPELINE_SECRET`
and every message carries a MAC (`genesys.inference.auth`); stages started here get a fresh secret.

A stage that fails reports its error round the ring; one that dies closes its connections, and its
successor reports it; one that stops answering (stopped, hung, cut off) sends no heartbeat for
`stage_timeout_s`, and its successor reports that. Either way the run stops with a `StageError` naming
the stage, after the rows already done were handed on.
"""

from __future__ import annotations

import asyncio
import os
import platform
import queue
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import torch
import transformers

from genesys.config import ProofConfig
from genesys.errors import InputError
from genesys.generate.backend import (
    Completion,
    GenerationRequest,
    GenerationResult,
    PromptStyle,
    SamplingConfig,
    Weights,
)
from genesys.generate.hf import batches, make_completion
from genesys.inference.auth import SECRET_ENV, new_secret, ring_secret
from genesys.inference.errors import StageError
from genesys.inference.plan import split_layers
from genesys.inference.stage import StageModel, heartbeat_interval
from genesys.inference.transport import (
    HEARTBEAT,
    Closed,
    Inbox,
    Link,
    Message,
    Progress,
    accept,
    connect,
    listen,
    parse_address,
)
from genesys.models import load_generation_config, load_tokenizer, stop_token_ids

SETUP_TIMEOUT_S = 600.0  # for the ring to close (each stage connects on before it loads its layers)
DEFAULT_STAGE_TIMEOUT_S = 120.0  # a stage silent (no message, no heartbeat) this long stopped answering


@dataclass
class _InFlight:
    """A micro-batch in the ring: which (request, sample) items it holds and the tokens back so far."""

    items: list[tuple[int, int]]
    tokens: list[torch.Tensor] = field(default_factory=list)


class PipelineBackend:
    """Generation across a ring of `stages` processes; `batch_size` sequences per micro-batch."""

    name = "pipeline"

    def __init__(
        self,
        model: str,
        style: PromptStyle,
        *,
        stages: int = 2,
        latency_ms: float = 0.0,
        micro_batches: int = 1,
        batch_size: int = 8,
        peers: list[str] | None = None,
        listen: str | None = None,
        stage_timeout_s: float = DEFAULT_STAGE_TIMEOUT_S,
        device: str | None = None,
        dtype: str | None = None,
        proofs: ProofConfig | None = None,
    ) -> None:
        if peers and len(peers) != stages - 1:
            raise InputError(
                f"--backend_options.peers names {len(peers)} stages; --backend_options.stages {stages} needs "
                f"{stages - 1} (every stage but this one, in ring order)"
            )
        if stage_timeout_s <= 2 * latency_ms / 1e3:
            raise InputError(
                f"--backend_options.stage_timeout_s {stage_timeout_s:g} must exceed two one-way latencies "
                f"({2 * latency_ms / 1e3:g} s): a heartbeat needs a hop to arrive"
            )
        # Stages on other machines must be given the secret; local ones get a fresh one unless it is set.
        self._secret = ring_secret() if peers or SECRET_ENV in os.environ else new_secret().encode()
        self.stage_timeout_s = stage_timeout_s
        if listen is not None:
            try:
                parse_address(listen)
            except ValueError as exc:
                raise InputError(f"--backend_options.listen: {exc}") from None
        self.listen_address = listen  # where the last stage connects back to this one
        self.model_name = model
        self.style = style
        self.stages = stages
        self.latency_s = latency_ms / 1e3
        self.micro_batches = micro_batches
        self.batch_size = batch_size
        self.weights_version = 0
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="genesys-pipeline")
        self._processes: list[subprocess.Popen[str]] = []
        self._link: Link | None = None
        self._inbox: Inbox | None = None
        self._loopback: deque[Message] = deque()
        self._progress = Progress()
        self._addresses: list[str] = []
        self._next_mb = 0
        self.step_times: dict[int, list[float]] = defaultdict(list)  # decode step seconds, by stage
        self._proof_settings: dict[str, Any] | None = None
        self.proofs = proofs
        try:
            self._worker.submit(self._start, model, peers, device, dtype).result()
        except BaseException:
            self.close()
            raise

    # --- the ring ------------------------------------------------------------------------------

    def _start(self, model: str, peers: list[str] | None, device: str | None, dtype: str | None) -> None:
        from transformers import AutoConfig

        layers = AutoConfig.from_pretrained(model).get_text_config().num_hidden_layers
        ranges = split_layers(layers, self.stages)
        if self.stages > 1:
            if device in (None, "cpu") and not peers:  # share this machine's cores among the stages
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.stages))
            addresses = peers or self._spawn_local_stages()
            server = listen(self.listen_address or ("0.0.0.0:0" if peers else "127.0.0.1:0"))
        proofs = None
        if self.proofs is not None:
            from genesys.proofs.toploc import proof_settings_for, require_toploc

            require_toploc()
            hidden_size = AutoConfig.from_pretrained(model).get_text_config().hidden_size
            proofs = proof_settings_for(self.proofs, hidden_size)
        self.proofs = proofs
        self.stage = StageModel(
            model, ranges[0], first=True, last=self.stages == 1, device=device, dtype=dtype, proofs=proofs
        )
        self.tokenizer = load_tokenizer(model)
        self.device = self.stage.device
        self.stop_ids = stop_token_ids(load_generation_config(model), self.tokenizer)
        if proofs is not None:
            self._describe_proofs(model)
        if self.stages == 1:
            return
        self._addresses = list(addresses)
        sock, session = connect(addresses[0], self._secret, self._stage_name(1))
        host = parse_address(self.listen_address)[0] if self.listen_address else "0.0.0.0"
        if host in ("0.0.0.0", "::", ""):  # the address this machine reaches stage 1 from
            host = sock.getsockname()[0]
        back = f"{host}:{server.getsockname()[1]}"
        self._link = Link(sock, self._stage_name(1), self.latency_s, session, self.stage_timeout_s)
        self._link.keep_alive(heartbeat_interval(self.stage_timeout_s), self._progress)
        self._link.send(
            Message(
                {
                    "type": "setup",
                    "model": model,
                    "stages": self.stages,
                    "index": 1,
                    "ranges": ranges,
                    "ring": [*addresses[1:], back],
                    "latency_ms": self.latency_s * 1e3,
                    "stage_timeout_s": self.stage_timeout_s,
                    "device": device,
                    "dtype": dtype,
                    "proofs": None
                    if proofs is None
                    else {"topk": proofs.topk, "decode_batching_size": proofs.decode_batching_size},
                }
            )
        )
        server.settimeout(1.0)
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while self._inbox is None:
            try:
                sock, session = accept(server, self._secret, self._refused)
                self._inbox = Inbox(sock, self._stage_name(self.stages - 1), session, self.stage_timeout_s)
            except TimeoutError:
                self._check_processes()
                if time.monotonic() > deadline:
                    raise StageError(f"the ring did not close within {SETUP_TIMEOUT_S:.0f} s") from None
        server.close()
        ready = self._receive()
        if ready.type != "ready":
            raise StageError(
                f"stage {self.stages - 1} sent {ready.type!r} where the ring's ready was expected"
            )

    def _stage_name(self, index: int) -> str:
        return f"stage {index} at {self._addresses[index - 1]}" if self._addresses else f"stage {index}"

    @staticmethod
    def _refused(text: str) -> None:
        print(f"genesys pipeline: {text}", file=sys.stderr, flush=True)

    def _spawn_local_stages(self) -> list[str]:
        """Start stages 1..N-1 as processes on this machine; their listening addresses."""
        threads = max(1, (os.cpu_count() or 1) // self.stages)
        addresses = []
        for index in range(1, self.stages):
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "genesys.inference.stage",
                    "--listen",
                    "127.0.0.1:0",
                    "--threads",
                    str(threads),
                ],
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, SECRET_ENV: self._secret.decode()},
            )
            self._processes.append(process)
            line = process.stdout.readline() if process.stdout else ""
            if not line.startswith("listening on "):
                raise StageError(f"pipeline stage {index} did not start (exit code {process.poll()})")
            addresses.append(line.removeprefix("listening on ").strip())
        return addresses

    def _check_processes(self) -> None:
        for index, process in enumerate(self._processes, start=1):
            code = process.poll()
            if code is not None:
                raise StageError(f"pipeline stage {index} exited (code {code}); see its messages above")

    def _describe_proofs(self, model: str) -> None:
        """The proof settings rows carry, with the hash of the whole model's weights, streamed from its
        checkpoint (this stage holds only its share)."""
        from genesys.proofs.toploc import PROOF_DTYPE
        from genesys.proofs.weights import checkpoint_weights_sha256

        self._proof_settings = {
            "topk": self.proofs.topk,
            "decode_batching_size": self.proofs.decode_batching_size,
            "dtype": PROOF_DTYPE,
            "model": self.model_name,
            "weights_sha256": checkpoint_weights_sha256(model, self.stage.dtype),
        }

    def _send(self, message: Message) -> None:
        """To stage 1; with one stage, this stage's own last part answers at once."""
        if self._link is not None:
            try:
                self._link.send(message)
            except StageError as exc:
                raise self._ring_report(exc) from None
        elif message.type == "step":
            self._loopback.append(self.stage.handle_last(message))

    def _ring_report(self, error: StageError) -> StageError:
        """When stage 1 takes no more messages, the stage that stopped the ring may be further on: its
        successor reports it round the ring. That report when one comes within the stage timeout, else
        `error`."""
        deadline = time.monotonic() + self.stage_timeout_s
        while self._inbox is not None and time.monotonic() < deadline:
            try:
                message = self._inbox.get(timeout=1.0)
            except queue.Empty:
                continue
            if isinstance(message, Closed):
                break
            if message.type == "error":
                return self._stage_error(message)
        return error

    def _stage_error(self, message: Message) -> StageError:
        stage = message.header["stage"]
        return StageError(
            f"pipeline {self._stage_name(stage) if stage else 'stage 0'} {message.header['message']}"
        )

    def _receive(self, stop: threading.Event | None = None) -> Message | None:
        """The next message from the last stage (None once `stop` is set); a StageError naming the stage
        when one failed, died, or stopped answering for the stage timeout."""
        if self._loopback:
            return self._loopback.popleft()
        assert self._inbox is not None
        heard = time.monotonic()
        while True:
            try:
                message = self._inbox.get(timeout=1.0)
            except queue.Empty:
                self._check_processes()
                if stop is not None and stop.is_set():
                    return None
                if time.monotonic() - heard > self.stage_timeout_s:
                    raise StageError(
                        f"pipeline {self._inbox.peer} stopped answering: it sent nothing for "
                        f"{self.stage_timeout_s:g} s, not even a heartbeat (stopped, hung, or cut off from "
                        "stage 0)"
                    ) from None
                continue
            if isinstance(message, Closed):
                self._check_processes()
                raise StageError(
                    f"pipeline {message.peer} went away: its connection to stage 0 closed ({message.reason}); "
                    "it died or was stopped"
                )
            heard = time.monotonic()
            if message.type == HEARTBEAT:
                continue
            if message.type == "error":
                raise self._stage_error(message)
            return message

    # --- generation ----------------------------------------------------------------------------

    async def generate(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]:
        requests = list(requests)
        prompts = [r.prompt_token_ids(self.tokenizer, self.style) for r in requests]
        loop = asyncio.get_running_loop()
        done: asyncio.Queue[tuple[list[tuple[int, int]], list[Completion]] | None] = asyncio.Queue()

        def emit(items: list[tuple[int, int]], completions: list[Completion]) -> None:
            loop.call_soon_threadsafe(done.put_nowait, (items, completions))

        def finished(_: Any) -> None:
            loop.call_soon_threadsafe(done.put_nowait, None)

        stop = threading.Event()
        run = loop.run_in_executor(self._worker, self._drive, requests, prompts, emit, stop)
        run.add_done_callback(finished)
        partial: dict[int, dict[int, Completion]] = {}
        try:
            while (item := await done.get()) is not None:
                for (i, j), result in zip(*item):
                    partial.setdefault(i, {})[j] = result
                    if len(partial[i]) == requests[i].n:
                        got = partial.pop(i)
                        yield GenerationResult(
                            requests[i], prompts[i], [got[k] for k in range(requests[i].n)], 0
                        )
            await run  # raises the ring's error, after every finished row was handed on
        finally:
            stop.set()  # a caller that stops early (Ctrl-C, an error downstream) stops the driver too

    def _drive(
        self,
        requests: list[GenerationRequest],
        prompts: list[list[int]],
        emit: Callable[[list[tuple[int, int]], list[Completion]], None],
        stop: threading.Event,
    ) -> None:
        """Keep up to `micro_batches` micro-batches in the ring until every batch is done. Stopped
        early, it releases the caches of the micro-batches in flight; their last tokens, still in the
        ring, are ignored when they come back."""
        pending = deque(batches(requests, prompts, self.batch_size))
        in_flight: dict[int, _InFlight] = {}
        while (pending or in_flight) and not stop.is_set():
            while pending and len(in_flight) < self.micro_batches:
                items = pending.popleft()
                first, sample = items[0]
                keys = [(requests[i].seed, requests[i].sample_indices[j]) for i, j in items]
                mb = self._prefill(
                    [prompts[i] for i, _ in items],
                    requests[first].seed + sample,
                    requests[first].sampling,
                    keys if self._sampling_proofs else None,
                )
                in_flight[mb] = _InFlight(items)
            message = self._receive(stop)
            if message is None:
                break
            if message.type != "token":
                raise StageError(f"stage {self.stages - 1} sent {message.type!r} where tokens were expected")
            mb = message.header["mb"]
            batch = in_flight.get(mb)
            if batch is None:  # the token of a micro-batch an earlier, stopped run left in the ring
                continue
            tokens = message.tensors[0]
            batch.tokens.append(tokens)
            times = message.header.get("times", [])
            if len(batch.tokens) > 1:  # decode steps only: a prefill's time depends on the prompt
                for stage, seconds in enumerate(times):
                    self.step_times[stage].append(seconds)
            if message.header["done"]:
                del in_flight[mb]
                self.stage.release(mb)
                if self._link is not None:
                    self._send(Message({"type": "release", "mb": mb}))
                emit(batch.items, self._completions(batch, message))
            else:
                self._decode(mb, tokens)
        for mb in in_flight:  # stopped early: no stage keeps these caches
            self.stage.release(mb)
            if self._link is not None:
                self._send(Message({"type": "release", "mb": mb}))

    def _prefill(
        self,
        prompts: list[list[int]],
        seed: int,
        sampling: SamplingConfig,
        keys: list[tuple[int, int]] | None,
    ) -> int:
        """Send micro-batch `prompts` into the ring; with `keys` (each prompt's request seed and sample
        index) the last stage draws with the seeded sampler that sampling proofs check."""
        mb, self._next_mb = self._next_mb, self._next_mb + 1
        encoded = self.tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")
        started = time.perf_counter()
        with self._progress.busy(self.stage_timeout_s):
            hidden = self.stage.forward(mb, encoded["input_ids"], encoded["attention_mask"])
        settings = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": seed,
            "keys": keys,
            "stop_ids": sorted(self.stop_ids),
            "pad_id": self.tokenizer.pad_token_id,
        }
        header = {"type": "step", "mb": mb, "prefill": True, "sampling": settings}
        header["times"] = [time.perf_counter() - started]
        self._send(Message(header, [hidden, encoded["attention_mask"]]))
        return mb

    def _decode(self, mb: int, tokens: torch.Tensor) -> None:
        started = time.perf_counter()
        with self._progress.busy(self.stage_timeout_s):
            hidden = self.stage.forward(mb, tokens.unsqueeze(1))
        self._send(Message({"type": "step", "mb": mb, "times": [time.perf_counter() - started]}, [hidden]))

    def _completions(self, batch: _InFlight, message: Message) -> list[Completion]:
        tokens = torch.stack(batch.tokens, dim=1).tolist()
        logprobs = message.tensors[1].tolist()
        proofs = message.header.get("proofs")
        completions = [
            make_completion(self.tokenizer, self.stop_ids, t, lp) for t, lp in zip(tokens, logprobs)
        ]
        if proofs is not None:
            for row, row_proofs in zip(completions, proofs):
                row.proofs = row_proofs
                row.proof_settings = self._proof_settings
        if self._sampling_proofs:
            from genesys.proofs.sampling import SAMPLER

            for row in completions:
                row.sampler = SAMPLER
        return completions

    @property
    def _sampling_proofs(self) -> bool:
        """Whether rows carry sampling proofs (the last stage then draws with the seeded sampler)."""
        return self.proofs is not None and self.proofs.sampling

    def stage_step_seconds(self) -> list[float]:
        """The median decode step of each stage (seconds), over the steps generated so far."""
        return [median(self.step_times[stage]) for stage in sorted(self.step_times)]

    # --- the rest of the backend protocol ------------------------------------------------------

    async def update_weights(self, weights: Weights, version: int | None = None) -> None:
        raise NotImplementedError("the pipeline backend does not take new weights while running")

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "stages": self.stages,
            "latency_ms": self.latency_s * 1e3,
            "micro_batches": self.micro_batches,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": self.device,
            "cpu": platform.processor() or platform.machine(),
        }

    def close(self) -> None:
        if self._link is not None:
            try:
                self._link.send(Message({"type": "shutdown"}))
                self._link.close()
            except StageError:
                pass
            self._link = None
        if self._inbox is not None:
            self._inbox.close()
            self._inbox = None
        for process in self._processes:
            try:
                process.wait(timeout=max(5.0, 3 * self.latency_s * self.stages + 5))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes = []
        self._worker.shutdown()
