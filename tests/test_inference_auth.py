"""Who may join a pipeline ring: the mutual handshake on the ring's secret, the MAC of every message,
and the refusals an unauthenticated or wrong-key peer gets (it can neither join nor inject)."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from genesys.errors import InputError
from genesys.inference.auth import SECRET_ENV, handshake_accept, handshake_connect, ring_secret
from genesys.inference.errors import AuthenticationError
from genesys.inference.transport import (
    HEARTBEAT,
    Closed,
    Inbox,
    Link,
    Message,
    Progress,
    accept,
    connect,
    encode,
    listen,
    seal,
)

SECRET = b"s" * 64
OTHER = b"o" * 64


def _in_thread(function: Callable[[], Any]) -> Callable[[], Any]:
    """Run `function` in a thread; the returned callable joins it and returns its result or raises."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = function()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(timeout=120)
        if "error" in box:
            raise box["error"]
        return box["result"]

    return join


def _pair(connect_secret: bytes, accept_secret: bytes) -> tuple[Any, Any]:
    """Both ends' handshake results (a session key or the AuthenticationError raised); an end that
    fails closes its socket, as `connect` and `accept` do."""
    a, b = socket.socketpair()

    def accept_end() -> Any:
        try:
            return handshake_accept(b, accept_secret, "it")
        except AuthenticationError as exc:
            b.close()
            return exc

    accepted = _in_thread(accept_end)
    try:
        connecting: Any = handshake_connect(a, connect_secret, "stage 1")
    except AuthenticationError as exc:
        a.close()
        connecting = exc
    return connecting, accepted()


def _session_pair() -> tuple[socket.socket, socket.socket, bytes]:
    """A connected socket pair past the handshake, and the session key of messages a -> b."""
    a, b = socket.socketpair()
    accepted = _in_thread(lambda: handshake_accept(b, SECRET, "it"))
    session = handshake_connect(a, SECRET, "stage 1")
    assert accepted() == session
    return a, b, session


# --- the handshake -----------------------------------------------------------------------------------


def test_both_ends_knowing_the_secret_agree_on_a_fresh_session_key():
    first, first_other_end = _pair(SECRET, SECRET)
    second, _ = _pair(SECRET, SECRET)
    assert isinstance(first, bytes) and first == first_other_end
    assert second != first  # fresh nonces: no key (and no proof) is reused across connections


def test_ends_with_different_secrets_both_fail_with_a_clear_error():
    connecting, accepting = _pair(OTHER, SECRET)
    assert isinstance(connecting, AuthenticationError) and isinstance(accepting, AuthenticationError)
    # the connecting end checks the accepting end's proof first, and sends none of its own
    assert "stage 1 does not know this ring's secret" in str(connecting)
    assert "closed the connection during the handshake" in str(accepting)


def test_a_peer_that_cannot_prove_the_secret_is_refused_even_after_seeing_the_other_proof():
    from genesys.inference.auth import MAGIC

    a, b = socket.socketpair()
    accepted = _in_thread(lambda: handshake_accept(b, SECRET, "it"))
    a.sendall(MAGIC + b"n" * 32)
    reply = a.recv(64)
    assert len(reply) == 64  # the accepting end's nonce and proof, bound to this nonce pair
    a.sendall(reply[32:])  # reflecting that proof back is no proof: they are labelled by role
    with pytest.raises(AuthenticationError, match="it does not know this ring's secret"):
        accepted()
    b.close()  # as `accept` does
    assert a.recv(2) == b""  # no OK


def test_a_peer_that_skips_the_handshake_is_refused_and_none_of_its_bytes_are_read_as_a_message():
    server = listen("127.0.0.1:0")
    address = "127.0.0.1:%d" % server.getsockname()[1]
    refusals: list[str] = []
    accepted = _in_thread(lambda: accept(server, SECRET, refusals.append))
    # An intruder sends a setup message straight away, as an unauthenticated stage 0 would.
    intruder = socket.create_connection(("127.0.0.1", server.getsockname()[1]))
    setup = encode(Message({"type": "setup", "model": "/attacker/model", "index": 1, "stages": 2}))
    intruder.sendall(seal(setup, b"\0" * 32, 0))
    # Then an impostor that speaks the protocol with the wrong secret.
    with pytest.raises(AuthenticationError, match="does not know this ring's secret"):
        connect(address, OTHER, "stage 1")
    # The real previous stage still gets in, and only its messages arrive.
    sock, session = connect(address, SECRET, "stage 1")
    inbox_sock, inbox_session = accepted()
    assert inbox_session == session
    assert len(refusals) == 2
    assert "did not open with the pipeline handshake" in refusals[0]
    assert "closed the connection during the handshake" in refusals[1]  # the impostor gave up
    link, inbox = Link(sock, "stage 1", 0.0, session), Inbox(inbox_sock, "stage 0", inbox_session)
    link.send(Message({"type": "step", "mb": 7}))
    assert inbox.get(timeout=30).header == {"type": "step", "mb": 7}
    link.close()
    intruder.close()
    server.close()


# --- messages after the handshake ------------------------------------------------------------------------


def test_messages_keep_header_and_tensors_of_every_dtype():
    a, b, session = _session_pair()
    tensors = [
        torch.randn(2, 3).to(torch.bfloat16),
        torch.arange(4),
        torch.ones(2, 0),
        torch.tensor([True, False]),
    ]
    link, inbox = Link(a, "stage 1", 0.0, session), Inbox(b, "stage 0", session)
    link.send(Message({"type": "step", "mb": 3}, tensors))
    got = inbox.get(timeout=30)
    assert got.header == {"type": "step", "mb": 3}
    for sent, received in zip(tensors, got.tensors):
        assert received.dtype == sent.dtype and torch.equal(received, sent)


def _tampered(frame: bytes) -> bytes:
    """`frame` with one byte of its tensor payload changed (tokens 5 -> 6), MAC left as it was."""
    changed = bytearray(frame)
    changed[-32 - 8] ^= 3
    return bytes(changed)


@pytest.mark.parametrize("attack", ["changed", "replayed", "other session", "no MAC"])
def test_a_message_changed_replayed_or_injected_on_the_path_closes_the_inbox_unread(attack: str):
    a, b, session = _session_pair()
    inbox = Inbox(b, "stage 2", session)
    honest = seal(encode(Message({"type": "token", "mb": 0}, [torch.tensor([5])])), session, 0)
    if attack == "changed":
        a.sendall(_tampered(honest))
    elif attack == "replayed":
        a.sendall(honest + honest)
        assert torch.equal(inbox.get(timeout=30).tensors[0], torch.tensor([5]))
    elif attack == "other session":  # sealed under another connection's key (or a guessed one)
        a.sendall(seal(encode(Message({"type": "token", "mb": 0}, [torch.tensor([5])])), b"\1" * 32, 0))
    else:
        a.sendall(encode(Message({"type": "token", "mb": 0}, [torch.tensor([5])])) + b"\0" * 32)
    closed = inbox.get(timeout=30)
    assert isinstance(closed, Closed) and closed.peer == "stage 2", closed
    assert "MAC does not check out" in closed.reason
    a.sendall(seal(encode(Message({"type": "token", "mb": 1})), session, 1))
    assert inbox.get(timeout=30) == closed  # nothing after it is read either


def test_a_malformed_or_pickled_message_closes_the_inbox_naming_the_peer():
    a, b, session = _session_pair()
    inbox = Inbox(b, "stage 2", session)
    header = b'{"type": "step", "tensors": [{"dtype": "object", "shape": [1]}]}'
    a.sendall(len(header).to_bytes(4, "big") + header)
    closed = inbox.get(timeout=30)
    assert isinstance(closed, Closed) and closed.peer == "stage 2" and "malformed" in closed.reason


def test_a_link_delivers_no_sooner_than_its_latency_and_in_order():
    import time

    a, b, session = _session_pair()
    link, inbox = Link(a, "stage 1", 0.2, session), Inbox(b, "stage 0", session)
    sent = time.monotonic()
    for k in range(3):
        link.send(Message({"type": "step", "mb": k}))
    first = inbox.get(timeout=30)
    assert time.monotonic() - sent >= 0.2
    assert [first.header["mb"], inbox.get(timeout=30).header["mb"], inbox.get(timeout=30).header["mb"]] == [
        0,
        1,
        2,
    ]
    link.close()
    assert isinstance(inbox.get(timeout=30), Closed)


def test_heartbeats_flow_while_the_process_gets_on_and_stop_while_it_is_stuck():
    a, b, session = _session_pair()
    progress = Progress()
    link, inbox = Link(a, "stage 1", 0.0, session), Inbox(b, "stage 0", session)
    link.keep_alive(0.05, progress)
    assert inbox.get(timeout=30).type == HEARTBEAT
    with progress.busy(limit_s=0.0):  # a step that has run past its limit: hung, as far as anyone knows
        for _ in range(20):  # drain what was sent before
            try:
                inbox.get(timeout=0.5)
            except queue.Empty:
                break
        with pytest.raises(queue.Empty):
            inbox.get(timeout=0.5)
    assert inbox.get(timeout=30).type == HEARTBEAT
    link.close()


# --- the secret ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "short"])
def test_a_missing_or_short_secret_is_an_error_saying_how_to_set_it(value: str | None):
    env = {} if value is None else {SECRET_ENV: value}
    with pytest.raises(InputError, match=f"{SECRET_ENV} (is not set|has 5 characters)"):
        ring_secret(env)
    assert ring_secret({SECRET_ENV: "x" * 32}) == b"x" * 32
