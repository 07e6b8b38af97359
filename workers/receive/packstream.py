"""The pack part of a push, read from the client's pipe without reading past it.

git's index-pack stops at the pack's trailer; packyard's receiver (store/pack/receive.py) reads ahead
until end of input, but a pushing client never closes its end: it waits for the report. This stream
ends where the pack does: it keeps a running SHA-1 of everything but the last 20 bytes read, and when
the pipe has nothing more to give and those 20 bytes are that hash (a pack's trailer), it answers
end of input. Otherwise it waits for the client, at most ``idle_timeout`` seconds between reads
(a silent client is refused, :class:`ClientSilent`).
"""
from __future__ import annotations

import hashlib
import os

from packyard.workers.receive.pktline import ClientSilent, readable

__all__ = ["ClientSilent", "PackStream"]


class PackStream:
    def __init__(self, fd: int, *, idle_timeout: float, where: str = "<client>") -> None:
        self.fd = fd
        self.idle_timeout = idle_timeout
        self.where = where
        self.name = where
        self.sha = hashlib.sha1()
        self.tail = b""
        self.total = 0
        self.ended = False

    def _complete(self) -> bool:
        return self.total >= 32 and len(self.tail) == 20 and self.sha.copy().digest() == self.tail

    def _take(self, chunk: bytes) -> bytes:
        data = self.tail + chunk
        if len(data) > 20:
            self.sha.update(memoryview(data)[:-20])
            self.tail = data[-20:]
        else:
            self.tail = data
        self.total += len(chunk)
        return chunk

    def read(self, n: int = 1 << 20) -> bytes:
        if self.ended:
            return b""
        if not readable(self.fd, 0):
            if self._complete():
                self.ended = True
                return b""
            if not readable(self.fd, self.idle_timeout):
                raise ClientSilent(f"the client sent nothing for {self.idle_timeout:g} s inside its pack",
                                   path=self.where, offset=self.total)
        chunk = os.read(self.fd, n)
        if not chunk:
            self.ended = True
            return b""
        return self._take(chunk)
