"""The store's error hierarchy.

Every error names what failed (file, object id, offset) so that a job record
carries a reason an operator can act on. Wrap lower-level errors with the step
that failed: ``raise PackFormatError(...) from err``.
"""
from __future__ import annotations

from typing import Any


class StoreError(Exception):
    """Base of every error raised by ``store``.

    ``path`` (a str, a Path or anything whose ``str()`` names the file), ``oid`` (hex) and
    ``offset`` are set when known; ``str(err)`` always includes them.
    """

    def __init__(self, message: str, *, path: object = None, oid: str | bytes | None = None,
                 offset: int | None = None) -> None:
        if isinstance(oid, (bytes, bytearray)) and len(oid) == 20:
            oid = bytes(oid).hex()
        elif isinstance(oid, (bytes, bytearray)):
            oid = bytes(oid).decode("ascii", "replace")
        self.path = str(path) if path is not None else None
        self.oid = oid
        self.offset = offset
        parts = [message]
        if oid is not None:
            parts.append(f"object {oid}")
        if path is not None:
            parts.append(f"file {self.path}")
        if offset is not None:
            parts.append(f"offset {offset}")
        super().__init__(parts[0] + (" (" + ", ".join(parts[1:]) + ")" if len(parts) > 1 else ""))
        self.message = message


class NotARepositoryError(StoreError):
    """The path does not exist or is not a bare (or .git) repository."""


class ObjectMissingError(StoreError):
    """An object is absent after the pack directory was re-listed once."""


class CorruptObjectError(StoreError):
    """An object's bytes do not decompress, do not parse, or do not hash to its name."""


class FsckError(CorruptObjectError):
    """An object git's fsck refuses (store/fsck): ``msg_id`` is git's message id (``hasDotgit``,
    ``gitmodulesUrl``, ...), ``oid`` the object, ``tree_path`` the entry name when known.
    The message reads ``"<object id>: <msgId>: <text>"`` (plus ``[path <tree path>]``)."""

    def __init__(self, message: str, *, msg_id: str | None = None, tree_path: str | None = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        if msg_id is None or tree_path is None:   # rebuilt from its message (e.g. across a fork's pipe)
            import re
            m = re.match(r"[0-9a-f]{40}: ([A-Za-z0-9]+): .*?(?: \[path (.*)\])?\Z", message, re.S)
            if m is not None:
                msg_id = msg_id or m.group(1)
                tree_path = tree_path or m.group(2)
        self.msg_id = msg_id
        self.tree_path = tree_path


class PackFormatError(CorruptObjectError):
    """A pack, idx or rev file is malformed (header, checksum, entry, delta)."""


class CollisionError(StoreError):
    """An incoming object has the id of an existing object but different content."""


class RefUpdateError(StoreError):
    """A ref compare-and-swap failed (the ref moved) or the ref name is invalid."""


class LockContendedError(RefUpdateError):
    """A claim file (``<ref>.lock``, ``packyard/fence.lock``, …) is held by a live owner, or one
    that cannot be judged from this host and is not yet old: try again later (a transient
    condition, unlike a compare-and-swap that found the ref moved)."""


class LockLostError(StoreError):
    """A lock or lease was lost (expired or taken over) while work was in progress."""


class LimitExceededError(StoreError):
    """Input exceeds a configured limit (pack size, object size)."""


class InvalidInputError(StoreError):
    """Caller-supplied input is unacceptable (bad path, bad name, bad object type)."""


class WriteFailedError(StoreError):
    """Writing to the repository's filesystem failed (disk full, file too large, I/O error).

    ``errno`` is the underlying OSError's errno. Nothing was published: temp files were removed.
    """

    def __init__(self, message: str, *, errno: int | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.errno = errno


class BackupError(StoreError):
    """A backup or restore failed (store/backup): its bundle, its manifest or its chain."""


class BundleFormatError(BackupError):
    """A bundle file is malformed (header line, signature, pack header or trailer) at ``offset``."""

    def __init__(self, path: object, offset: int | None, reason: str) -> None:
        super().__init__(f"malformed bundle: {reason}", path=path, offset=offset)
        self.reason = reason

    def __reduce__(self) -> Any:   # (rebuilt from its fields across a pipe or a result backend)
        return (type(self), (self.path, self.offset, self.reason))


class BackupChainError(BackupError):
    """A backup chain cannot be used: its manifest is unreadable, an entry's parent or file is missing."""

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"backup chain refused: {reason}", path=path)
        self.reason = reason

    def __reduce__(self) -> Any:
        return (type(self), (self.path, self.reason))


class BackupChecksumError(BackupError):
    """A backup's bytes or a restored repository do not match what the manifest recorded."""

    def __init__(self, path: object, expected: str, actual: str) -> None:
        super().__init__(f"checksum mismatch: expected {expected}, found {actual}", path=path)
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> Any:
        return (type(self), (self.path, self.expected, self.actual))
