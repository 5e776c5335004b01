"""The ring's hops: framed messages over TCP, each delivered no sooner than a one-way latency after it
was sent (the injected latency of a slow network), never unpickled.

A message is a JSON header and a list of tensors. On the wire: the header's length (4 bytes, big
endian), the header (UTF-8 JSON, naming each tensor's dtype, shape and byte count), then the tensors'
raw bytes. A receiver checks every size and dtype against fixed limits and lists before it reads.

`Link` sends: `send` queues the message with its due time and returns at once; a thread writes it when
due, so a stage computes its next step while the previous one is on the wire, and messages keep their
order (without latency it writes at once). `Inbox` receives in the caller's thread; when the
connection closes or breaks it returns a `Closed` marker naming the peer, so a stage that dies fails
the run with that name instead of hanging it.
"""

from __future__ import annotations

import json
import queue
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from genesys.errors import GenesysError

MAX_HEADER_BYTES = 1 << 24
MAX_TENSOR_BYTES = 1 << 34
DTYPES = {name: getattr(torch, name) for name in ("float32", "bfloat16", "float16", "int64", "int32", "bool")}


class StageError(GenesysError, RuntimeError):
    """A pipeline stage failed, died or sent something malformed; the message names the stage."""


@dataclass
class Message:
    """What goes round the ring: `header["type"]` says what it is; `tensors` are its payload."""

    header: dict[str, Any]
    tensors: list[torch.Tensor] = field(default_factory=list)

    @property
    def type(self) -> str:
        return self.header["type"]


@dataclass(frozen=True)
class Closed:
    """The connection from `peer` closed or broke (`reason`)."""

    peer: str
    reason: str


def encode(message: Message) -> bytes:
    tensors = [t.detach().contiguous().cpu() for t in message.tensors]
    specs = [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in tensors]
    header = json.dumps({**message.header, "tensors": specs}).encode()
    parts = [struct.pack(">I", len(header)), header]
    parts += [t.view(torch.uint8).numpy().tobytes() if t.numel() else b"" for t in tensors]
    return b"".join(parts)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("connection closed")
        got += n
    return bytes(buffer)


def read_message(sock: socket.socket) -> Message:
    """One message from `sock`; ConnectionError when it closes, ValueError when it is malformed."""
    (length,) = struct.unpack(">I", _read_exactly(sock, 4))
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"a message header of {length} bytes (at most {MAX_HEADER_BYTES})")
    header = json.loads(_read_exactly(sock, length))
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ValueError("a message header without a type")
    tensors = []
    for spec in header.pop("tensors", []):
        dtype = DTYPES.get(spec.get("dtype"))
        shape = spec.get("shape")
        if (
            dtype is None
            or not isinstance(shape, list)
            or not all(isinstance(d, int) and d >= 0 for d in shape)
        ):
            raise ValueError(f"a tensor of dtype {spec.get('dtype')!r} and shape {shape!r}")
        count = 1
        for dim in shape:
            count *= dim
        size = count * torch.empty((), dtype=dtype).element_size()
        if size > MAX_TENSOR_BYTES:
            raise ValueError(f"a tensor of {size} bytes")
        raw = bytearray(_read_exactly(sock, size)) if size else bytearray()
        flat = torch.frombuffer(raw, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        tensors.append(flat.view(dtype).reshape(shape))
    return Message(header, tensors)


class Link:
    """The sending end of one hop, delivering each message `latency_s` after `send`."""

    def __init__(self, sock: socket.socket, peer: str, latency_s: float) -> None:
        self.sock = sock
        self.peer = peer
        self.latency_s = latency_s
        self._queue: queue.Queue[tuple[float, bytes | None]] = queue.Queue()
        self._error: str | None = None
        self._thread = threading.Thread(target=self._deliver, name=f"link-to-{peer}", daemon=True)
        self._thread.start()

    def send(self, message: Message) -> None:
        if self._error is not None:
            raise StageError(f"cannot send to {self.peer}: {self._error}")
        if self.latency_s == 0:  # nothing to wait for: write it from this thread
            try:
                self.sock.sendall(encode(message))
            except OSError as exc:
                self._error = f"{type(exc).__name__}: {exc}"
                raise StageError(f"cannot send to {self.peer}: {self._error}") from None
            return
        self._queue.put((time.monotonic() + self.latency_s, encode(message)))

    def _deliver(self) -> None:
        while True:
            due, payload = self._queue.get()
            if payload is None:
                return
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                self.sock.sendall(payload)
            except OSError as exc:
                self._error = f"{type(exc).__name__}: {exc}"
                return

    def close(self, flush: bool = True) -> None:
        """Stop after the queued messages (all of them when `flush`), then close the socket."""
        self._queue.put((0.0, None))
        if flush:
            self._thread.join(timeout=self.latency_s + 30)
        try:
            self.sock.close()
        except OSError:
            pass


class Inbox:
    """The receiving end of one hop, read in the caller's thread (no hand-off between threads: on a
    busy machine every wake-up of another thread costs a scheduling delay per hop)."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._closed: Closed | None = None

    def get(self, timeout: float | None = None) -> Message | Closed:
        """The next message, or `Closed` once the connection closed or broke (then always); queue.Empty
        when nothing began to arrive within `timeout` seconds."""
        if self._closed is not None:
            return self._closed
        if timeout is not None and not select.select([self.sock], [], [], timeout)[0]:
            raise queue.Empty
        try:
            return read_message(self.sock)
        except (ConnectionError, OSError) as exc:
            self._closed = Closed(self.peer, str(exc) or type(exc).__name__)
        except (ValueError, json.JSONDecodeError) as exc:
            self._closed = Closed(self.peer, f"malformed message: {exc}")
        return self._closed

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def parse_address(text: str) -> tuple[str, int]:
    """`host:port` -> (host, port); a ValueError names what is wrong."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def connect(address: str, timeout: float = 60.0) -> socket.socket:
    """A TCP connection to `address`, retried until `timeout` (the peer may still be starting)."""
    host, port = parse_address(address)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            if time.monotonic() > deadline:
                raise StageError(f"cannot connect to pipeline stage at {address}: {exc}") from None
            time.sleep(0.2)


def listen(address: str) -> socket.socket:
    """A listening socket on `address` (port 0: any free port)."""
    return socket.create_server(parse_address(address))


def accept(server: socket.socket) -> socket.socket:
    sock, _ = server.accept()
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
