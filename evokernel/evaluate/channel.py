"""The judge's line to a candidate's process: length-prefixed JSON over a socket pair.

The judge creates the pair, keeps one end and hands the other to the process it
starts; nothing else can write to it (the candidate's process sees no other process
and no file the judge uses). File descriptors (shared chunks) travel with a message
as ``SCM_RIGHTS``. Every request carries the job's token, a sequence number and a fresh
random nonce, and a reply must echo all three: a reply cannot be written before its
request has arrived (which would stop the judge's clock early), and anything the
candidate's side sends out of turn is an error, never a result.
"""

from __future__ import annotations

import array
import json
import os
import secrets
import select
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

_HEADER = struct.Struct("<I")
MAX_MESSAGE = 64 * 2**20
MAX_FDS = 64


class ChannelClosed(Exception):
    """The other end went away (the process exited or was killed)."""


class ChannelTimeout(Exception):
    """No message before the deadline."""


class ProtocolError(Exception):
    """A malformed, oversized or out-of-sequence message."""


class Channel:
    """One end of a connected ``AF_UNIX`` stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @staticmethod
    def pair() -> tuple[Channel, socket.socket]:
        """(the judge's end, the socket to pass to the child process)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.set_inheritable(True)
        return Channel(mine), theirs

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        if self.closed:
            raise ChannelClosed("this end was closed (the process was killed)")
        payload = json.dumps(message, separators=(",", ":")).encode()
        if len(payload) > MAX_MESSAGE:
            raise ProtocolError(f"message of {len(payload)} bytes is over the limit")
        data = _HEADER.pack(len(payload)) + payload
        self.sock.settimeout(None)
        try:
            if fds:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                sent = self.sock.sendmsg([data], ancillary)
                data = data[sent:]
            if data:
                self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(str(exc)) from exc

    def receive(self, timeout_s: float | None = None) -> tuple[dict[str, Any], list[int]]:
        """The next message and the file descriptors that came with it."""
        if self.closed:
            raise ChannelClosed("this end was closed (the process was killed)")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        header, fds = self._read(_HEADER.size, deadline, with_fds=True)
        (length,) = _HEADER.unpack(header)
        if length > MAX_MESSAGE:
            raise ProtocolError(f"message of {length} bytes is over the limit")
        payload, _ = self._read(length, deadline, with_fds=False)
        try:
            message = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            # ValueError: not JSON, not UTF-8, or an integer too long to convert; and a
            # well-framed message of 100000 nested arrays exhausts the decoder's recursion
            # (a candidate's process sent one: the judge's evaluation raised, red team 8)
            raise ProtocolError(f"unreadable message: {type(exc).__name__}: {str(exc)[:200]}") from None
        if not isinstance(message, dict):
            raise ProtocolError("a message must be a JSON object")
        return message, fds

    def _read(self, n: int, deadline: float | None, *, with_fds: bool) -> tuple[bytes, list[int]]:
        chunks: list[bytes] = []
        fds: list[int] = []
        got = 0
        while got < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout(f"no message within the time limit ({got}/{n} bytes)")
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            try:
                if with_fds and not chunks:
                    space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
                    data, ancillary, _, _ = self.sock.recvmsg(n - got, space)
                    for level, kind, blob in ancillary:
                        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                            received = array.array("i")
                            received.frombytes(blob[: len(blob) - len(blob) % received.itemsize])
                            fds.extend(received)
                else:
                    data = self.sock.recv(min(n - got, 1 << 20))
            except TimeoutError as exc:
                raise ChannelTimeout("no message within the time limit") from exc
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise ChannelClosed(str(exc)) from exc
            if not data:
                raise ChannelClosed("the other end closed the channel")
            chunks.append(data)
            got += len(data)
        return b"".join(chunks), fds

    @property
    def closed(self) -> bool:
        """Whether this end was closed (``close``; the judge kills the process first)."""
        return self.sock.fileno() < 0

    def pending(self) -> bool:
        """Whether the other end has sent anything not yet read (never, once closed here)."""
        if self.closed:
            return False
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def close(self) -> None:
        self.sock.close()


class Session:
    """Request/reply on a channel, with the job's token and a sequence number.

    ``request`` sends and waits; ``send`` and ``receive`` split it, so that the judge can
    work while the other side does (one request at a time is outstanding either way)."""

    def __init__(self, channel: Channel, token: str) -> None:
        self.channel = channel
        self.token = token
        self.seq = 0
        self._outstanding: tuple[str, int, str] | None = None
        """(op, seq, nonce) of the request sent and not yet answered."""

    def request(
        self, op: str, timeout_s: float | None, fds: Sequence[int] = (), **fields: Any
    ) -> dict[str, Any]:
        self.send(op, fds, **fields)
        return self.receive(timeout_s)

    def send(self, op: str, fds: Sequence[int] = (), **fields: Any) -> None:
        """Send one request; its reply is ``receive``'s."""
        if self.channel.closed:  # killed while a request was out: that one is given up
            raise ChannelClosed("this end was closed (the process was killed)")
        if self._outstanding is not None:
            raise RuntimeError(f"{op!r} sent while {self._outstanding[0]!r} awaits its reply")
        if self.channel.pending():
            raise ProtocolError(f"the candidate's process spoke out of turn (before {op!r})")
        self.seq += 1
        nonce = secrets.token_hex(8)
        self._outstanding = (op, self.seq, nonce)
        self.channel.send({"op": op, "token": self.token, "seq": self.seq, "nonce": nonce,
                           **fields}, fds)

    @property
    def outstanding(self) -> bool:
        """Whether a request sent awaits its reply."""
        return self._outstanding is not None

    def answered(self) -> bool:
        """Whether the reply to the outstanding request has begun to arrive (no wait)."""
        return self._outstanding is not None and self.channel.pending()

    def receive(self, timeout_s: float | None) -> dict[str, Any]:
        """The reply to the request ``send`` sent (checked: its token, sequence, nonce)."""
        if self._outstanding is None:
            raise RuntimeError("no request awaits a reply")
        op, seq, nonce = self._outstanding
        try:
            reply, stray = self.channel.receive(timeout_s)
        finally:  # a late reply to a request given up on is out of turn, as before
            self._outstanding = None
        for fd in stray:
            os.close(fd)
        if stray:
            raise ProtocolError("the candidate's process sent file descriptors")
        if (reply.get("token"), reply.get("seq"), reply.get("nonce")) != (self.token, seq, nonce):
            raise ProtocolError(f"reply to {op!r} is out of sequence or carries a wrong token")
        return reply
