"""The ring's hops: authenticated, framed messages over TCP, each delivered no sooner than a one-way
latency after it was sent (the injected latency of a slow network), never unpickled.

A message is a JSON header and a list of tensors. On the wire: the header's length (4 bytes, big
endian), the header (UTF-8 JSON, naming each tensor's dtype, shape and byte count), the tensors' raw
bytes, then the message's MAC (`genesys.inference.auth`: a connection is used only after a mutual
handshake on the ring's secret, and a message whose MAC fails is never used). A receiver checks every
size and dtype against fixed limits and lists before it reads.

`Link` sends: `send` queues the message with its due time and returns at once; a thread writes it when
due, so a stage computes its next step while the previous one is on the wire, and messages keep their
order (without latency it writes at once). A link also sends a heartbeat every so often while its
process is getting on (`Progress`), so the next stage can tell a stage that is slow from one that is
stopped or hung. `Inbox` receives in the caller's thread; when the connection closes, breaks or fails
authentication it returns a `Closed` marker naming the peer, so a stage that dies fails the run with
that name instead of hanging it. A write that the peer does not take, or a message that stops arriving
half-way, fails after the ring's stage timeout instead of blocking for ever.
"""

from __future__ import annotations

import hmac
import json
import queue
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from genesys.inference.auth import MAC_BYTES, handshake_accept, handshake_connect, message_mac
from genesys.inference.errors import AuthenticationError, StageError

MAX_HEADER_BYTES = 1 << 24
MAX_TENSOR_BYTES = 1 << 34
DTYPES = {name: getattr(torch, name) for name in ("float32", "bfloat16", "float16", "int64", "int32", "bool")}
HEARTBEAT = "heartbeat"


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
    """The connection from `peer` closed, broke or failed authentication (`reason`)."""

    peer: str
    reason: str


def encode(message: Message) -> bytes:
    tensors = [t.detach().contiguous().cpu() for t in message.tensors]
    specs = [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in tensors]
    header = json.dumps({**message.header, "tensors": specs}).encode()
    parts = [struct.pack(">I", len(header)), header]
    parts += [t.view(torch.uint8).numpy().tobytes() if t.numel() else b"" for t in tensors]
    return b"".join(parts)


def seal(payload: bytes, session: bytes, sequence: int) -> bytes:
    """An encoded message followed by its MAC as message number `sequence` of a connection."""
    mac = message_mac(session, sequence)
    mac.update(payload)
    return payload + mac.digest()


def _read_exactly(sock: socket.socket, size: int, mac: hmac.HMAC | None = None) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("connection closed")
        got += n
    if mac is not None:
        mac.update(buffer)
    return bytes(buffer)


def read_message(sock: socket.socket, session: bytes, sequence: int) -> Message:
    """Message number `sequence` from `sock`; ConnectionError when it closes, ValueError when it is
    malformed, AuthenticationError when its MAC does not check out (then nothing of it is used)."""
    mac = message_mac(session, sequence)
    (length,) = struct.unpack(">I", _read_exactly(sock, 4, mac))
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"a message header of {length} bytes (at most {MAX_HEADER_BYTES})")
    header = json.loads(_read_exactly(sock, length, mac))
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
        raw = bytearray(_read_exactly(sock, size, mac)) if size else bytearray()
        flat = torch.frombuffer(raw, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        tensors.append(flat.view(dtype).reshape(shape))
    if not hmac.compare_digest(_read_exactly(sock, MAC_BYTES), mac.digest()):
        raise AuthenticationError(
            "a message whose MAC does not check out (changed, replayed or injected on the way)"
        )
    return Message(header, tensors)


class Progress:
    """Whether this process is getting on: waiting for input, or busy with one thing for no longer
    than that thing's limit. A link sends heartbeats only while it is."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._limit_s = 0.0

    @contextmanager
    def busy(self, limit_s: float) -> Iterator[None]:
        self._since, self._limit_s = time.monotonic(), limit_s
        try:
            yield
        finally:
            self._since = None

    def stuck(self) -> bool:
        since = self._since
        return since is not None and time.monotonic() - since > self._limit_s


class Link:
    """The sending end of one hop, delivering each message `latency_s` after `send`; a write the peer
    does not take within `timeout_s` fails the link."""

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        latency_s: float,
        session: bytes,
        timeout_s: float | None = None,
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.latency_s = latency_s
        self.session = session
        self.timeout_s = timeout_s
        sock.settimeout(timeout_s)
        self._sequence = 0
        self._lock = threading.Lock()  # one sequence number, one frame on the socket at a time
        self._queue: queue.Queue[tuple[float, bytes | None]] = queue.Queue()
        self._error: str | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._deliver, name=f"link-to-{peer}", daemon=True)
        self._thread.start()

    def send(self, message: Message) -> None:
        if self._error is not None:
            raise StageError(f"cannot send to {self.peer}: {self._error}")
        with self._lock:
            frame = seal(encode(message), self.session, self._sequence)
            self._sequence += 1
            if self.latency_s > 0:
                self._queue.put((time.monotonic() + self.latency_s, frame))
                return
            try:  # nothing to wait for: write it from this thread
                self.sock.sendall(frame)
            except OSError as exc:
                self._error = self._describe(exc)
        if self._error is not None:
            raise StageError(f"cannot send to {self.peer}: {self._error}")

    def _describe(self, exc: OSError) -> str:
        if isinstance(exc, TimeoutError):
            return f"it took nothing for {self.timeout_s:g} s (stopped or hung)"
        return f"{type(exc).__name__}: {exc}"

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
                self._error = self._describe(exc)
                return

    def keep_alive(self, interval_s: float, progress: Progress) -> None:
        """Send a heartbeat every `interval_s` from now on, while `progress` is not stuck."""

        def beat() -> None:
            while not self._stopped.wait(interval_s):
                if progress.stuck():
                    continue
                try:
                    self.send(Message({"type": HEARTBEAT}))
                except StageError:
                    return

        threading.Thread(target=beat, name=f"heartbeat-to-{self.peer}", daemon=True).start()

    def close(self, flush: bool = True) -> None:
        """Stop after the queued messages (all of them when `flush`), then close the socket."""
        self._stopped.set()
        self._queue.put((0.0, None))
        if flush:
            self._thread.join(timeout=self.latency_s + (self.timeout_s or 30))
        try:
            self.sock.close()
        except OSError:
            pass


class Inbox:
    """The receiving end of one hop, read in the caller's thread (no hand-off between threads: on a
    busy machine every wake-up of another thread costs a scheduling delay per hop). A message that
    stops arriving half-way for `timeout_s` closes it."""

    def __init__(
        self, sock: socket.socket, peer: str, session: bytes, timeout_s: float | None = None
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.session = session
        self.set_timeout(timeout_s)
        self._sequence = 0
        self._closed: Closed | None = None

    def set_timeout(self, timeout_s: float | None) -> None:
        """How long a message may stop arriving half-way before the inbox closes."""
        self.timeout_s = timeout_s
        self.sock.settimeout(timeout_s)

    def get(self, timeout: float | None = None) -> Message | Closed:
        """The next message, heartbeats included, or `Closed` once the connection closed, broke or
        failed authentication (then always); queue.Empty when nothing began to arrive within `timeout`
        seconds."""
        if self._closed is not None:
            return self._closed
        if timeout is not None and not select.select([self.sock], [], [], timeout)[0]:
            raise queue.Empty
        try:
            message = read_message(self.sock, self.session, self._sequence)
            self._sequence += 1
            return message
        except TimeoutError:
            reason = (
                f"it stopped sending in the middle of a message for {self.timeout_s:g} s (stopped or hung)"
            )
            self._closed = Closed(self.peer, reason)
        except AuthenticationError as exc:
            self._closed = Closed(self.peer, str(exc))
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


def connect(address: str, secret: bytes, peer: str, timeout: float = 60.0) -> tuple[socket.socket, bytes]:
    """An authenticated TCP connection to the stage at `address` and its session key; the TCP
    connection is retried until `timeout` (the peer may still be starting), a failed handshake is not."""
    host, port = parse_address(address)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise StageError(f"cannot connect to {peer}: {exc}") from None
            time.sleep(0.2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        return sock, handshake_connect(sock, secret, peer)
    except AuthenticationError:
        sock.close()
        raise


def listen(address: str) -> socket.socket:
    """A listening socket on `address` (port 0: any free port)."""
    return socket.create_server(parse_address(address))


def accept(
    server: socket.socket, secret: bytes, refused: Callable[[str], None]
) -> tuple[socket.socket, bytes]:
    """The next connection to `server` that passes the handshake, and its session key; each one that
    fails is closed and reported to `refused`. TimeoutError when `server` has a timeout and it passes."""
    while True:
        sock, (host, port, *_) = server.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            return sock, handshake_accept(sock, secret, "it")
        except AuthenticationError as exc:
            refused(f"refused a connection from {host}:{port}: {exc}")
            sock.close()
