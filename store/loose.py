"""Loose objects: ``objects/xx/yyyy…`` files, one zlib stream each."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import CorruptObjectError, ObjectMissingError
from .objects import ObjectType, decode_loose, hash_object
from .pack.packdir import is_gone

_HEX = frozenset("0123456789abcdef")


class LooseObjects:
    """Reads the loose half of an object directory (JGit's LooseObjects)."""

    def __init__(self, objects_dir: Path) -> None:
        self.path = objects_dir

    def path_for(self, oid: bytes) -> Path:
        h = oid.hex()
        return self.path / h[:2] / h[2:]

    def has(self, oid: bytes) -> bool:
        """One stat of the object's file."""
        return self.path_for(oid).is_file()

    def _read_file(self, oid: bytes) -> bytes:
        path = self.path_for(oid)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as err:
            # ENOENT, or ESTALE over NFS: another host deleted the file between our open and read (a
            # loose repack moved it into a pack). Either way it is gone here: the caller re-lists packs.
            if not is_gone(err):
                raise
            raise ObjectMissingError("loose object not found", oid=oid, path=path) from None

    def read(self, oid: bytes, *, verify: bool = True) -> tuple[ObjectType, bytes]:
        """Inflate the object; with ``verify`` check that it hashes to its name."""
        path = self.path_for(oid)
        obj_type, _, data = decode_loose(self._read_file(oid), str(path))
        if verify:
            actual = hash_object(obj_type, data)
            if actual != oid:
                raise CorruptObjectError(f"loose object content hashes to {actual.hex()}, not its name",
                                         oid=oid, path=path)
        return obj_type, data

    def read_header(self, oid: bytes) -> tuple[ObjectType, int]:
        path = self.path_for(oid)
        obj_type, size, _ = decode_loose(self._read_file(oid), str(path), header_only=True)
        return obj_type, size

    def list_ids(self) -> frozenset[bytes]:
        """Every loose object id, by one listing of each fan-out directory.

        Temp files and other junk are ignored by name (38 hex characters).
        """
        ids: set[bytes] = set()
        try:
            top = os.scandir(self.path)
        except FileNotFoundError:
            return frozenset()
        with top:
            fanouts = [e.name for e in top if len(e.name) == 2 and set(e.name) <= _HEX]
        for fan in fanouts:
            try:
                with os.scandir(self.path / fan) as it:
                    for entry in it:
                        name = entry.name
                        if len(name) == 38 and set(name) <= _HEX:
                            ids.add(bytes.fromhex(fan + name))
            except FileNotFoundError:
                continue
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
