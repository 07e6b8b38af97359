"""Loose objects: ``objects/xx/yyyy…`` files, one zlib stream each."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from . import fsparallel
from .errors import CorruptObjectError, ObjectMissingError, StoreError
from .faults import fault_point
from .objects import ObjectType, decode_loose, hash_object
from .pack.packdir import is_gone

_HEX = frozenset("0123456789abcdef")
#: Bytes per read of a loose file: most fit in one (a loose object is one zlib stream, usually small), and a
#: buffer this size stays below malloc's mmap threshold (a larger one would be an mmap and munmap per read).
READ_CHUNK = 1 << 16
MAX_READ = 1 << 24


class LooseObjects:
    """Reads the loose half of an object directory (JGit's LooseObjects)."""

    def __init__(self, objects_dir: Path) -> None:
        self.path = objects_dir
        self.estale = 0   # reads that met ESTALE (over NFS: deleted through another host after our open), taken as gone

    def path_for(self, oid: bytes) -> Path:
        h = oid.hex()
        return self.path / h[:2] / h[2:]

    def has(self, oid: bytes) -> bool:
        """One stat of the object's file."""
        return self.path_for(oid).is_file()

    def _read_file(self, oid: bytes, limit: int | None = None) -> bytes | None:
        """The file's bytes (None: it is larger than ``limit``); ObjectMissingError if it is gone.

        An open and reads to the end, nothing else for a file that fits one read: no ``fstat`` (Python's ``open``
        and ``read`` make three), which over FUSE is a request to the daemon each (its attributes are not cached in
        the kernel) and over NFS a GETATTR once the attribute cache has expired. A full repack reads hundreds of
        loose files at once. A file that fills the first read is checked once to be a regular file, so the loop
        ends: a name that leads to a device (a symlink to ``/dev/zero``) is a CorruptObjectError, and a FIFO
        (opened without blocking) reads as empty, which no object is."""
        path = self.path_for(oid)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                fault_point("loose.after_open")   # (tests: another host deletes the file here)
                parts: list[bytes] = []
                size, n = 0, READ_CHUNK
                while chunk := os.read(fd, n):
                    if not parts and len(chunk) == n and not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise CorruptObjectError("loose object is not a regular file", oid=oid, path=path)
                    size += len(chunk)
                    if limit is not None and size > limit:
                        return None
                    parts.append(chunk)
                    n = min(n * 4, MAX_READ)   # (a large file: fewer, larger reads)
            finally:
                os.close(fd)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        except OSError as err:
            # ENOENT, or ESTALE over NFS: another host deleted the file between our open and read (a
            # loose repack moved it into a pack). Either way it is gone here: the caller re-lists packs.
            if not is_gone(err):
                raise
            if err.errno == errno.ESTALE:
                self.estale += 1
            raise ObjectMissingError("loose object not found", oid=oid, path=path) from None

    def read(self, oid: bytes, *, verify: bool = True) -> tuple[ObjectType, bytes]:
        """Inflate the object; with ``verify`` check that it hashes to its name."""
        path = self.path_for(oid)
        obj_type, _, data = decode_loose(self._file(oid), str(path))
        if verify:
            actual = hash_object(obj_type, data)
            if actual != oid:
                raise CorruptObjectError(f"loose object content hashes to {actual.hex()}, not its name",
                                         oid=oid, path=path)
        return obj_type, data

    def read_header(self, oid: bytes) -> tuple[ObjectType, int]:
        path = self.path_for(oid)
        obj_type, size, _ = decode_loose(self._file(oid), str(path), header_only=True)
        return obj_type, size

    def _file(self, oid: bytes) -> bytes:
        raw = self._read_file(oid)
        assert raw is not None   # (no limit)
        return raw

    def read_raw(self, oid: bytes, limit: int) -> bytes | None:
        """The file's bytes if it is at most ``limit`` bytes; None otherwise (too large, gone, unreadable:
        whoever needs the object reads it with :meth:`read`, which says why)."""
        try:
            return self._read_file(oid, limit)
        except (OSError, StoreError):
            return None

    def decode_checked(self, oid: bytes, raw: bytes) -> tuple[ObjectType, bytes] | None:
        """``raw`` (a loose file's bytes) inflated, if it is an object that hashes to ``oid``; None if not."""
        try:
            obj_type, _, data = decode_loose(raw, str(self.path_for(oid)))
        except StoreError:
            return None
        return (obj_type, data) if hash_object(obj_type, data) == oid else None

    def list_ids(self) -> frozenset[bytes]:
        """Every loose object id, by one listing of each fan-out directory.

        Temp files and other junk are ignored by name (38 hex characters).
        """
        try:
            top = os.scandir(self.path)
        except FileNotFoundError:
            return frozenset()
        with top:
            fanouts = [e.name for e in top if len(e.name) == 2 and set(e.name) <= _HEX]

        def listing(fan: str) -> list[bytes]:
            try:
                with os.scandir(self.path / fan) as it:
                    return [bytes.fromhex(fan + e.name) for e in it if len(e.name) == 38 and set(e.name) <= _HEX]
            except OSError as err:
                if is_gone(err):   # (removed since the top listing: ENOENT, or ESTALE over NFS)
                    return []
                raise

        # Up to 256 listings, independent of each other: listed together (over NFS each is a round trip).
        ids: set[bytes] = set()
        for found in fsparallel.each(listing, fanouts, where=self.path):
            ids.update(found)
        return frozenset(ids)

    def freshen(self, oid: bytes) -> bool:
        """Move the file's mtime to now so a prune's grace period protects it.

        Returns False if the file is not there (the caller must then write it).
        """
        try:
            os.utime(self.path_for(oid))
            return True
        except FileNotFoundError:
            return False
