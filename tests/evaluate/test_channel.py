"""The judge's socket to a candidate's process: framing, descriptors, tokens, deadlines."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from evokernel.evaluate.channel import (
    Channel,
    ChannelClosed,
    ChannelTimeout,
    ProtocolError,
    Session,
)


def test_messages_and_file_descriptors_travel() -> None:
    mine, theirs = Channel.pair()
    other = Channel(theirs)
    read_end, write_end = os.pipe()
    big = "x" * (3 << 20)  # larger than one socket buffer: sent while the other end reads
    sender = threading.Thread(target=mine.send, args=({"op": "map", "blob": big}, [read_end]))
    sender.start()
    message, fds = other.receive(5)
    sender.join()
    assert message["op"] == "map" and len(message["blob"]) == len(big) and len(fds) == 1
    os.write(write_end, b"hi")
    assert os.read(fds[0], 2) == b"hi"


def test_deadline_and_closed_peer() -> None:
    mine, theirs = Channel.pair()
    with pytest.raises(ChannelTimeout):
        mine.receive(0.2)
    theirs.close()
    with pytest.raises(ChannelClosed):
        mine.receive(1)


def test_garbage_is_a_protocol_error() -> None:
    mine, theirs = Channel.pair()
    theirs.sendall((5).to_bytes(4, "little") + b"[1,2]")
    with pytest.raises(ProtocolError, match="JSON object"):
        mine.receive(1)
    theirs.sendall((1 << 31).to_bytes(4, "little"))
    with pytest.raises(ProtocolError, match="over the limit"):
        mine.receive(1)


@pytest.mark.parametrize("payload", [
    b"[" * 100_000 + b"]" * 100_000,  # the decoder runs out of recursion (RecursionError)
    b'{"seconds": ' + b"7" * 5000 + b"}",  # an integer past Python's digit limit (ValueError)
    b'{"a": "\xff"}',  # not UTF-8
])
def test_a_message_no_decoder_can_read_is_a_protocol_error(payload: bytes) -> None:
    # red team 8: a well-framed message of nested arrays made the judge's evaluation raise
    mine, theirs = Channel.pair()
    theirs.sendall(len(payload).to_bytes(4, "little") + payload)
    with pytest.raises(ProtocolError, match="unreadable message"):
        mine.receive(5)


def _echo(sock: socket.socket, tamper: str | None) -> None:
    peer = Channel(sock)
    request, _ = peer.receive(5)
    reply = {"token": request["token"], "seq": request["seq"], "nonce": request["nonce"], "ok": True}
    if tamper:
        reply[tamper] = 99 if tamper == "seq" else "forged"
    peer.send(reply)


@pytest.mark.parametrize("tamper", [None, "token", "seq", "nonce"])
def test_a_reply_must_carry_the_token_and_sequence(tamper: str | None) -> None:
    mine, theirs = Channel.pair()
    thread = threading.Thread(target=_echo, args=(theirs, tamper))
    thread.start()
    session = Session(mine, "secret-token")
    if tamper is None:
        assert session.request("ping", 5)["ok"]
    else:
        with pytest.raises(ProtocolError, match="out of sequence or carries a wrong token"):
            session.request("ping", 5)
    thread.join()


def test_a_reply_sent_before_its_request_is_refused() -> None:
    """A reply written ahead (to stop the judge's clock early) cannot know the request's
    nonce, and anything sent out of turn is seen before the next request goes out."""
    mine, theirs = Channel.pair()
    session = Session(mine, "secret-token")
    Channel(theirs).send({"token": "secret-token", "seq": 1, "ok": True})
    with pytest.raises(ProtocolError, match="out of turn"):
        session.request("batch", 5)


def test_a_request_can_be_answered_while_the_judge_works() -> None:
    """``send`` then ``receive``: the reply is read later, checked as ``request`` checks
    it; one request at a time; and a channel closed here (its process killed) says so."""
    mine, theirs = Channel.pair()
    session = Session(mine, "secret-token")
    session.send("cupti_collect")
    assert session.outstanding
    with pytest.raises(RuntimeError, match="awaits its reply"):
        session.send("ping")
    _echo(theirs, None)  # the process answers while the judge does something else
    assert session.answered()
    assert session.receive(5)["ok"] and not session.outstanding and not session.answered()

    session.send("ping")
    with pytest.raises(ChannelTimeout):
        session.receive(0.1)
    assert not session.outstanding  # given up on: a late reply is out of turn, as before
    session.send("capture")
    mine.close()  # the process killed while a request was out (a wrong checked call)
    assert not mine.pending()
    with pytest.raises(ChannelClosed):
        session.send("ping")
    with pytest.raises(ChannelClosed):
        mine.receive(1)
