"""Who may join a pipeline ring: every connection proves, both ways, that its two ends know the ring's
shared secret, and every message on it then carries a MAC under a key of that connection alone.

The secret comes from the `GENESYS_PIPELINE_SECRET` environment variable of each process (the same on
every machine; never from a row, a task or a command line). Stages started on this machine get a fresh
random one from the first stage when it is not set.

The handshake, between the end that connects (C) and the end that accepts (A), with secret K:

    C -> A   MAGIC, nonce_c                         (32 random bytes)
    A -> C   nonce_a, HMAC(K, "accept"  | nonce_c | nonce_a)
    C -> A   HMAC(K, "connect" | nonce_c | nonce_a)  (C sends it only once A's proof checked out)
    A -> C   OK                                      (A sends it only once C's proof checked out)

Each end proves it knows K on nonces the other chose, so neither proof can be replayed from another
connection, and the two proofs are labelled by role, so one end's proof cannot be reflected as the
other's. Messages from C to A are then framed with `HMAC(session, sequence | frame)`, where
`session = HMAC(K, "messages" | nonce_c | nonce_a)` and the sequence counts messages from 0: a message
changed, dropped, replayed or injected by anyone on the path fails its MAC and closes the connection.

What this does not do: encrypt. Activations, token ids and the setup message (model name, layer
ranges) cross the network in the clear; run the ring over a tunnel (WireGuard, SSH) when they must
stay private. And a stage that knows the secret is trusted to compute its layers honestly: that is
what TOPLOC proofs of the last stage's hidden states check afterwards (`genesys validate`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket

from genesys.errors import InputError
from genesys.inference.errors import AuthenticationError

SECRET_ENV = "GENESYS_PIPELINE_SECRET"
MIN_SECRET_CHARS = 32
MAGIC = b"GENESYS-PIPELINE/1\n"
NONCE_BYTES = 32
MAC_BYTES = 32
OK = b"OK"
HANDSHAKE_TIMEOUT_S = 30.0
_ACCEPT, _CONNECT, _MESSAGES = b"genesys accept\x00", b"genesys connect\x00", b"genesys messages\x00"


def ring_secret(env: dict[str, str] | None = None) -> bytes:
    """The ring's shared secret from `GENESYS_PIPELINE_SECRET`; an InputError saying how to set it."""
    value = (os.environ if env is None else env).get(SECRET_ENV, "")
    if len(value) < MIN_SECRET_CHARS:
        state = "is not set" if not value else f"has {len(value)} characters (at least {MIN_SECRET_CHARS})"
        raise InputError(
            f"{SECRET_ENV} {state}: set it to the same random secret on every machine of the pipeline ring, "
            'e.g. `export GENESYS_PIPELINE_SECRET=$(python -c "import secrets; print(secrets.token_hex(32))")`'
        )
    return value.encode()


def new_secret() -> str:
    """A random secret for a ring of processes on this machine."""
    return secrets.token_hex(32)


def _mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


def _read(sock: socket.socket, size: int, peer: str) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        try:
            chunk = sock.recv(size - len(buffer))
        except TimeoutError:
            raise AuthenticationError(
                f"{peer} did not complete the handshake within {HANDSHAKE_TIMEOUT_S:.0f} s"
            ) from None
        if not chunk:
            raise AuthenticationError(f"{peer} closed the connection during the handshake")
        buffer += chunk
    return bytes(buffer)


def handshake_connect(sock: socket.socket, secret: bytes, peer: str) -> bytes:
    """Authenticate the stage at the other end of `sock` (which this process connected to) and prove
    this one; the session key of the messages this end sends. AuthenticationError when it fails."""
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        nonce_c = secrets.token_bytes(NONCE_BYTES)
        sock.sendall(MAGIC + nonce_c)
        reply = _read(sock, NONCE_BYTES + MAC_BYTES, peer)
        nonce_a, proof = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
        if not hmac.compare_digest(proof, _mac(secret, _ACCEPT, nonce_c, nonce_a)):
            raise AuthenticationError(
                f"{peer} does not know this ring's secret ({SECRET_ENV} differs there, or it is not a "
                "genesys pipeline stage): not joining it"
            )
        sock.sendall(_mac(secret, _CONNECT, nonce_c, nonce_a))
        try:
            answer = _read(sock, len(OK), peer)
        except AuthenticationError:
            answer = b""
        if answer != OK:
            raise AuthenticationError(f"{peer} refused this process's proof of the ring's secret")
    except OSError as exc:
        raise AuthenticationError(f"the handshake with {peer} failed: {exc}") from None
    sock.settimeout(None)
    return _mac(secret, _MESSAGES, nonce_c, nonce_a)


def handshake_accept(sock: socket.socket, secret: bytes, peer: str) -> bytes:
    """Authenticate the process that connected on `sock` and prove this one; the session key of the
    messages it sends here. AuthenticationError (and nothing read as a message) when it fails."""
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        hello = _read(sock, len(MAGIC) + NONCE_BYTES, peer)
        if not hello.startswith(MAGIC):
            raise AuthenticationError(f"{peer} did not open with the pipeline handshake")
        nonce_c, nonce_a = hello[len(MAGIC) :], secrets.token_bytes(NONCE_BYTES)
        sock.sendall(nonce_a + _mac(secret, _ACCEPT, nonce_c, nonce_a))
        if not hmac.compare_digest(_read(sock, MAC_BYTES, peer), _mac(secret, _CONNECT, nonce_c, nonce_a)):
            raise AuthenticationError(f"{peer} does not know this ring's secret ({SECRET_ENV} differs there)")
        sock.sendall(OK)
    except OSError as exc:
        raise AuthenticationError(f"the handshake with {peer} failed: {exc}") from None
    sock.settimeout(None)
    return _mac(secret, _MESSAGES, nonce_c, nonce_a)


def message_mac(session: bytes, sequence: int) -> hmac.HMAC:
    """The MAC of message number `sequence` on a connection, to be fed the message's bytes."""
    return hmac.new(session, sequence.to_bytes(8, "big"), hashlib.sha256)
