"""A full repack's reads of loose objects: each file opened once, and all of them read together first.

The walk reads loose commits, trees and tags; the delta search and the writer read loose blobs (and would
read the others again). :class:`LooseKeeper` keeps what was read -- each object checked against its name --
for all of them (``plan.preloaded``), so every loose file is opened once (over NFS an open is a lookup and
an open round trip: a loose object's opens, stat and unlink went from five calls to three).

:meth:`LooseKeeper.prefetch` reads the snapshot's loose objects before the walk, together
(:mod:`..fsparallel`): 546 loose objects read one after the other as the walk meets them cost 546 serial
round trips on an NFS mount with 1 ms latency; read together they overlap. Files over
:data:`PREFETCH_FILE_BYTES` and whatever passes the byte budget are left to be read when needed; a file
that is gone, corrupt or does not hash to its name is left too, for the read that needs it to fail with the
typed error (prefetching decides nothing).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ... import fsparallel
from ...objects import hash_object

if TYPE_CHECKING:
    from ..walk.sources import SourceIndex

#: A loose file larger than this (compressed) is not read ahead: the walk reads no blob, and a large one is
#: read once by the writer anyway.
PREFETCH_FILE_BYTES = 1 << 20
#: Files read together at most, before they are inflated (bounds the compressed bytes held at once).
PREFETCH_CHUNK = 1024


class LooseKeeper:
    """Loose objects read once for a full repack, kept (type, data) in ``kept`` up to ``budget`` bytes."""

    def __init__(self, sources: "SourceIndex", kept: dict[bytes, tuple[int, bytes]], budget: int) -> None:
        self.sources, self.kept, self.budget = sources, kept, budget
        self.held = 0
        self.file_sizes: dict[bytes, int] = {}   # what the prefetch read: each file's size (no stat to delete it)
        self._lock = threading.Lock()

    def _keep(self, oid: bytes, typ: int, data: bytes) -> None:
        with self._lock:
            if oid not in self.kept and self.held + len(data) <= self.budget:
                self.kept[oid] = (typ, data)
                self.held += len(data)

    def read(self, oid: bytes) -> tuple[int, bytes]:
        """``sources.read`` for the walk: a kept object from memory; a loose one read now is kept (checked
        against its name first; the walk checks it too, after this read, and a mismatch aborts the repack)."""
        got = self.kept.get(oid)
        if got is not None:
            return got
        s = self.sources
        typ, data = s.read(oid)
        if oid not in s.loc and oid in s.loose_ids and hash_object(typ, data) == oid:
            self._keep(oid, typ, data)
        return typ, data

    def prefetch(self) -> int:
        """Read every loose object of the snapshot that no replaceable pack holds, together; returns how many
        were kept. The threads only open and read (the round trips); inflating and hashing happen here, one
        after the other (in threads they would only queue for the interpreter lock)."""
        s = self.sources
        loose = s.snapshot.loose
        loc, kept_ids = s.loc, s.kept_ids
        todo = [oid for oid in s.loose_ids if oid not in loc and oid not in kept_ids]
        kept = 0
        for start in range(0, len(todo), PREFETCH_CHUNK):
            if self.held >= self.budget:
                break
            chunk = todo[start:start + PREFETCH_CHUNK]
            for oid, raw in zip(chunk, fsparallel.each(self._raw, chunk, where=loose.path)):
                if raw is None or self.held >= self.budget:
                    continue
                got = loose.decode_checked(oid, raw)
                if got is None:
                    continue
                self.file_sizes[oid] = len(raw)
                self._keep(oid, int(got[0]), got[1])
                kept += 1
        return kept

    def _raw(self, oid: bytes) -> bytes | None:
        return self.sources.snapshot.loose.read_raw(oid, PREFETCH_FILE_BYTES)
