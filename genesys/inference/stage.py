"""One pipeline stage: a contiguous share of a transformers decoder's layers, their KV cache per
micro-batch, and (on the last stage) the output layer and the sampler.

A stage keeps the model's own base-model module with only its layers in it (renumbered, with a config
that says so), built and read from the checkpoint by `genesys.inference.shard` without the rest of the
model, so masks, rotary positions and the cache are built by transformers exactly as in the whole
model: greedy output is the unsplit model's token for token. The first stage embeds token ids;
the others take the previous stage's hidden states; the last applies the final norm and output layer
and picks tokens as the transformers backend does (`genesys.generate.decoding.TokenPicker`: the same
warpers, `TokenSampler` and per-batch seed), so seeded samples match its batch for batch too.

`python -m genesys.inference.stage --listen HOST:PORT` (or `genesys pipeline-stage`) serves one stage of
one ring: it accepts the previous stage's connection, reads the setup message (model, its index, the
rest of the ring), passes the setup on, loads its layers, then serves steps until shutdown.
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from genesys.config import ProofConfig, SamplingConfig
from genesys.errors import GenesysError
from genesys.generate.decoding import SeededSampler, TokenPicker, TokenSampler
from genesys.inference.auth import ring_secret
from genesys.inference.errors import StageError
from genesys.inference.shard import load_stage
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
)
from genesys.models import sampling_warpers

SETUP_WAIT_S = 60.0  # from an authenticated connection to its setup message
LOAD_TIMEOUT_S = 3600.0  # a stage still reading its layers after this long is reported as hung


@dataclass
class _Sequences:
    """One micro-batch as a stage holds it: its cache and attention mask, and on the last stage its sampling."""

    cache: Any
    attention_mask: torch.Tensor
    settings: dict[str, Any] = field(default_factory=dict)
    pick: TokenPicker | None = None
    tokens: list[torch.Tensor] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)  # the final states, for proofs


class StageModel:
    """Layers `[start, end)` of `model`, with the embedding when first and the output layer when last."""

    def __init__(
        self,
        model: str,
        layer_range: tuple[int, int],
        first: bool,
        last: bool,
        device: str | None = None,
        dtype: str | None = None,
        proofs: ProofConfig | None = None,
    ) -> None:
        modules = load_stage(model, layer_range, first, last, device, dtype)
        self.device = modules.device
        self.dtype = modules.dtype
        self.base = modules.base
        self.output = modules.output
        self.config = modules.config
        self.checkpoint_tensors = modules.read
        self.first, self.last = first, last
        self.proofs = proofs
        self.batches: dict[int, _Sequences] = {}

    def parameter_count(self) -> int:
        """The parameters this stage holds (tied ones once)."""
        held = {
            id(p): p for module in (self.base, self.output) if module is not None for p in module.parameters()
        }
        return sum(p.numel() for p in held.values())

    @torch.inference_mode()
    def forward(
        self, mb: int, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One step of micro-batch `mb`: token ids (first stage) or hidden states in, hidden states out.

        `attention_mask` starts the micro-batch (its prefill); a decode step extends the mask by one."""
        from transformers import DynamicCache

        inputs = inputs.to(self.device)
        if attention_mask is not None:
            self.batches[mb] = _Sequences(DynamicCache(config=self.config), attention_mask.to(self.device))
        state = self.batches[mb]
        if attention_mask is None:
            ones = state.attention_mask.new_ones((state.attention_mask.shape[0], 1))
            state.attention_mask = torch.cat([state.attention_mask, ones], dim=-1)
        # Positions as `generate` makes them from a left-padded mask.
        positions = state.attention_mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(state.attention_mask == 0, 1)[:, -inputs.shape[1] :]
        given = {"input_ids": inputs} if self.first else {"inputs_embeds": inputs}
        out = self.base(
            **given,
            attention_mask=state.attention_mask,
            position_ids=positions,
            past_key_values=state.cache,
            use_cache=True,
        )
        return out.last_hidden_state

    def begin_sampling(self, mb: int, settings: dict[str, Any]) -> None:
        """The last stage's sampling of micro-batch `mb` (temperature, top_p, max_tokens, seed, stop_ids, pad_id)."""
        state = self.batches[mb]
        sampling = SamplingConfig(
            temperature=settings["temperature"], top_p=settings["top_p"], max_tokens=settings["max_tokens"]
        )
        state.settings = settings
        if settings.get("keys") is not None:  # sampling proofs: the sampler a validator can check
            sampler: TokenSampler = SeededSampler(
                [tuple(key) for key in settings["keys"]], sampling.temperature
            )
        else:
            seeded = sampling.temperature > 0
            sampler = TokenSampler(
                torch.Generator(self.device).manual_seed(settings["seed"]) if seeded else None
            )
        pad = settings["pad_id"]
        state.pick = TokenPicker(
            sampler,
            sampling_warpers(sampling),
            settings["stop_ids"],
            pad if pad is not None else 0,
            state.attention_mask.shape[0],
            self.device,
        )

    @torch.inference_mode()
    def sample(self, mb: int, hidden: torch.Tensor) -> Message:
        """The next token of every sequence of `mb` (pad for finished ones), as `generate` picks it; the
        message says whether the micro-batch is done and then carries its logprobs (and proofs)."""
        state = self.batches[mb]
        assert state.pick is not None
        tokens = state.pick(self.output(hidden[:, -1:, :])[:, -1, :])
        state.tokens.append(tokens)
        if self.proofs is not None:
            state.hidden.append(hidden[:, -1, :].clone())
        done = state.pick.done or len(state.tokens) >= state.settings["max_tokens"]
        header: dict[str, Any] = {"type": "token", "mb": mb, "done": done}
        tensors = [tokens.cpu()]
        if done:
            tensors.append(state.pick.sampler.logprobs().cpu().float())
            if self.proofs is not None:
                header["proofs"] = self._proofs(state)
            self.release(mb)
        return Message(header, tensors)

    def _proofs(self, state: _Sequences) -> list[list[str]]:
        """Each sequence's TOPLOC proofs of its tokens' final hidden states (up to its first stop token)."""
        from genesys.proofs.toploc import as_proof_dtype, build_proofs

        tokens = torch.stack(state.tokens, dim=1).tolist()
        stops = set(state.settings["stop_ids"])
        proofs = []
        for row, states in zip(tokens, as_proof_dtype(torch.stack(state.hidden, dim=1))):
            length = next((k + 1 for k, t in enumerate(row) if t in stops), len(row))
            proofs.append(build_proofs(states[:length], self.proofs))
        return proofs

    def handle(self, message: Message) -> Message:
        """A step message from the previous stage -> the message for the next one (hidden states, or
        from the last stage the sampled tokens)."""
        header = message.header
        prefill = header.get("prefill", False)
        started = time.perf_counter()
        hidden = self.forward(header["mb"], message.tensors[0], message.tensors[1] if prefill else None)
        if self.last:
            out = self.handle_last(Message(header, [hidden]))
        else:
            out = Message(dict(header), [hidden, *message.tensors[1:2]])
        out.header["times"] = [*header.get("times", []), time.perf_counter() - started]
        return out

    def handle_last(self, message: Message) -> Message:
        """The last stage's part of a step whose hidden states are computed: the sampled tokens."""
        header = message.header
        if header.get("prefill", False):
            self.begin_sampling(header["mb"], header["sampling"])
        out = self.sample(header["mb"], message.tensors[0])
        out.header["times"] = list(header.get("times", []))
        return out

    def release(self, mb: int) -> None:
        self.batches.pop(mb, None)


def heartbeat_interval(timeout_s: float) -> float:
    """How often a link sends a heartbeat: several times within the ring's stage timeout."""
    return min(1.0, timeout_s / 4)


def serve(
    address: str,
    device: str | None = None,
    threads: int | None = None,
    announce: Any = print,
    secret: bytes | None = None,
) -> int:
    """Serve one stage of one ring at `address`; returns the exit code (0 after a clean shutdown).
    Only a previous stage that proves it knows `secret` (default: `GENESYS_PIPELINE_SECRET`) is served."""
    secret = secret or ring_secret()
    if threads:
        torch.set_num_threads(threads)
    server = listen(address)
    host, port = server.getsockname()[:2]
    announce(f"listening on {host}:{port}")
    sys.stdout.flush()
    sock, session = accept(server, secret, _say)
    server.close()
    inbox = Inbox(sock, "the previous stage", session, timeout_s=SETUP_WAIT_S)
    try:
        setup = inbox.get(timeout=SETUP_WAIT_S)
    except queue.Empty:
        setup = Closed(inbox.peer, f"no setup within {SETUP_WAIT_S:.0f} s")
    if isinstance(setup, Closed) or setup.type != "setup":
        _say("the previous stage sent no setup; exiting")
        return 1
    spec = setup.header
    index, stages, timeout_s = spec["index"], spec["stages"], spec["stage_timeout_s"]
    last = index == stages - 1
    inbox.peer = f"stage {index - 1}"
    inbox.set_timeout(timeout_s)
    next_address = spec["ring"][0]
    peer = f"stage {(index + 1) % stages} at {next_address}"
    sock, session = connect(next_address, secret, peer)
    link = Link(sock, peer, spec["latency_ms"] / 1e3, session, timeout_s)
    progress = Progress()
    link.keep_alive(heartbeat_interval(timeout_s), progress)
    if last:
        link.send(Message({"type": "ready"}))
    else:
        link.send(Message({**spec, "index": index + 1, "ring": spec["ring"][1:]}))
    try:
        proofs = ProofConfig(**spec["proofs"]) if last and spec.get("proofs") else None
        with progress.busy(LOAD_TIMEOUT_S):
            stage = StageModel(
                spec["model"],
                tuple(spec["ranges"][index]),
                False,
                last,
                device or spec.get("device"),
                spec.get("dtype"),
                proofs,
            )
    except Exception as exc:  # noqa: BLE001 - whatever stops the load, the first stage must hear of it
        return _report(link, index, index, f"failed: loading failed: {exc}")
    return _serve_steps(stage, index, stages, inbox, link, progress, timeout_s)


def _say(text: str) -> None:
    print(f"genesys pipeline-stage: {text}", file=sys.stderr, flush=True)


def _report(link: Link, index: int, stage: int, text: str) -> int:
    """Send the error of `stage` on round the ring to the first stage (this is stage `index`), and end."""
    _say(f"(stage {index}) stage {stage} {text}")
    try:
        link.send(Message({"type": "error", "stage": stage, "message": text}))
    except StageError:
        pass
    link.close()
    return 1


def _serve_steps(
    stage: StageModel, index: int, stages: int, inbox: Inbox, link: Link, progress: Progress, timeout_s: float
) -> int:
    previous = (index - 1) % stages
    while True:
        try:
            message = inbox.get(timeout=timeout_s)
        except queue.Empty:
            return _report(
                link,
                index,
                previous,
                f"stopped answering: it sent nothing for {timeout_s:g} s, not even a heartbeat (stopped, "
                f"hung, or cut off from stage {index}, which noticed)",
            )
        if isinstance(message, Closed):
            return _report(
                link,
                index,
                previous,
                f"went away: its connection to stage {index} closed ({message.reason}); it died or was stopped",
            )
        try:
            if message.type == HEARTBEAT:
                continue
            if message.type == "step":
                try:
                    with progress.busy(timeout_s):
                        out = stage.handle(message)
                except Exception as exc:  # noqa: BLE001 - reported to the first stage, which fails the run
                    traceback.print_exc()
                    out = Message(
                        {"type": "error", "stage": index, "message": f"failed: {type(exc).__name__}: {exc}"}
                    )
                link.send(out)
            elif message.type == "release":
                stage.release(message.header["mb"])
                if not stage.last:
                    link.send(message)
            else:  # errors and shutdown go on round the ring
                link.send(message)
                if message.type == "shutdown":
                    link.close()
                    inbox.close()
                    return 0
        except StageError as exc:  # the next stage does not take messages: it will report this one
            _say(f"(stage {index}) {exc}")
            link.close(flush=False)
            return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve one stage of a genesys inference pipeline.")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to accept the previous stage on")
    parser.add_argument("--device", help="torch device (default: the setup's, else cuda when available)")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    args = parser.parse_args(argv)
    try:
        return serve(args.listen, args.device, args.threads)
    except GenesysError as exc:
        _say(f"error: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
