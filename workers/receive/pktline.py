"""pkt-line framing as git's pkt-line.c reads and writes it, with bounds.

A packet is four hex digits of length (including themselves) and the payload; ``0000`` is a flush,
``0001`` a delim, ``0002`` a response-end (v2 only; refused here). The length is bounded by git's
LARGE_PACKET_MAX (65520); a reader also bounds the number of packets it reads in one section
(:class:`PktReader` ``max_packets``) so a client cannot make the server hold an unbounded list.
Errors are :class:`ProtocolError` (an :class:`~packyard.store.errors.InvalidInputError`) naming the
offset in the input where the bad packet starts, worded as git words them where git has words.
"""
from __future__ import annotations

import select
from typing import BinaryIO

from packyard.store.errors import InvalidInputError, LimitExceededError

LARGE_PACKET_MAX = 65520
LARGE_PACKET_DATA_MAX = LARGE_PACKET_MAX - 4
#: side-band-64k: one byte of band, the rest data
SIDEBAND_DATA_MAX = LARGE_PACKET_MAX - 5
FLUSH = None


class ProtocolError(InvalidInputError):
    """The client's bytes are not git's protocol (git: ``fatal: protocol error: ...``)."""


class ClientSilent(ProtocolError):
    """The client sent nothing for the idle time limit (``PACKYARD_RECEIVE_IDLE_TIMEOUT``); git has no such limit."""


class ClientGone(ProtocolError):
    """The input ended where a packet was expected (git: ``the remote end hung up unexpectedly``)."""


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has input (or its end) within ``timeout`` seconds. poll, not select: a server holding many
    descriptors (``packyard http`` taking pushes over its socket, docs/receive.md) may get one above 1023."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))


def pkt(data: bytes) -> bytes:
    """One packet holding ``data`` (at most LARGE_PACKET_DATA_MAX bytes)."""
    if len(data) > LARGE_PACKET_DATA_MAX:
        raise LimitExceededError(f"packet of {len(data)} bytes exceeds {LARGE_PACKET_DATA_MAX}")
    return b"%04x" % (len(data) + 4) + data


def flush_pkt() -> bytes:
    return b"0000"


def sideband(band: int, data: bytes) -> bytes:
    """``data`` on side band ``band`` (1 data, 2 progress, 3 error), split as git's send_sideband splits it."""
    out = []
    view = memoryview(data)
    while True:
        piece = bytes(view[:SIDEBAND_DATA_MAX])
        out.append(pkt(bytes((band,)) + piece))
        view = view[SIDEBAND_DATA_MAX:]
        if not view:
            break
    return b"".join(out)


class PktReader:
    """Reads packets from a binary stream; counts the bytes read (``offset``) for error messages."""

    def __init__(self, stream: BinaryIO, *, where: str = "<client>", idle_timeout: float | None = None) -> None:
        self.stream = stream
        self.where = where
        self.offset = 0
        self.idle_timeout = idle_timeout   # seconds the client may be silent before a packet is complete

    def _wait(self, what: str) -> None:
        if self.idle_timeout is None:
            return
        if not readable(self.stream.fileno(), self.idle_timeout):
            raise ClientSilent(f"the client sent nothing for {self.idle_timeout:g} s (waiting for {what})",
                               path=self.where, offset=self.offset)

    def _read_exact(self, n: int, what: str) -> bytes:
        parts = []
        need = n
        while need:
            self._wait(what)
            chunk = self.stream.read(need)
            if not chunk:
                raise ClientGone(f"the remote end hung up unexpectedly (input ended inside {what}, "
                                 f"{n - need} of {n} bytes)", path=self.where, offset=self.offset)
            parts.append(chunk)
            need -= len(chunk)
        data = b"".join(parts) if len(parts) != 1 else parts[0]
        self.offset += n
        return data

    def read(self) -> bytes | None:
        """The next packet's payload, or None for a flush packet."""
        start = self.offset
        head = self._read_exact(4, "a packet length")
        try:
            length = int(head, 16) if all(c in b"0123456789abcdefABCDEF" for c in head) else -1
        except ValueError:
            length = -1
        if length < 0:
            raise ProtocolError(f"protocol error: bad line length character: {head.decode('latin-1')}",
                                path=self.where, offset=start)
        if length == 0:
            return FLUSH
        if length < 4:
            raise ProtocolError(f"protocol error: bad line length {length}", path=self.where, offset=start)
        if length - 4 >= LARGE_PACKET_MAX:   # git's words: the payload's length (pkt-line.c, len -= 4)
            raise ProtocolError(f"protocol error: bad line length {length - 4}", path=self.where, offset=start)
        return self._read_exact(length - 4, "a packet")

    def read_section(self, max_packets: int, what: str) -> list[bytes]:
        """Packets up to the next flush (chomped of one trailing newline); at most ``max_packets``."""
        lines: list[bytes] = []
        while True:
            data = self.read()
            if data is None:
                return lines
            if len(lines) >= max_packets:
                raise LimitExceededError(f"more than {max_packets} {what} in one push", path=self.where,
                                         offset=self.offset)
            lines.append(data[:-1] if data.endswith(b"\n") else data)
