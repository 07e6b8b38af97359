"""Object ids, types and the loose-object encoding.

Object ids inside ``store`` are 20-byte binary SHA-1 digests (``bytes``); hex
strings appear only at the edges (CLI, database, error messages).
"""
from __future__ import annotations

import enum
import hashlib
import re
import zlib

from .errors import CorruptObjectError, InvalidInputError

OID_LEN = 20
HEX_RE = re.compile(r"^[0-9a-f]{40}$")
ZERO_OID = b"\0" * OID_LEN


class ObjectType(enum.IntEnum):
    """Git object types with their pack type numbers."""

    COMMIT = 1
    TREE = 2
    BLOB = 3
    TAG = 4

    @property
    def label(self) -> bytes:
        return _LABELS[self]

    @classmethod
    def from_label(cls, label: bytes | str) -> "ObjectType":
        if isinstance(label, str):
            label = label.encode()
        try:
            return _BY_LABEL[label]
        except KeyError:
            raise InvalidInputError(f"unknown object type {label!r}") from None


_LABELS = {ObjectType.COMMIT: b"commit", ObjectType.TREE: b"tree",
           ObjectType.BLOB: b"blob", ObjectType.TAG: b"tag"}
_BY_LABEL = {v: k for k, v in _LABELS.items()}

# Pack entry types that are deltas, not objects.
OFS_DELTA = 6
REF_DELTA = 7


def object_header(obj_type: ObjectType | int, size: int) -> bytes:
    return ObjectType(obj_type).label + b" " + str(size).encode() + b"\0"


def hash_object(obj_type: ObjectType | int, data: bytes | memoryview) -> bytes:
    """The binary object id of ``data`` stored as ``obj_type``."""
    h = hashlib.sha1(object_header(obj_type, len(data)))
    h.update(data)
    return h.digest()


def to_hex(oid: bytes) -> str:
    return oid.hex()


def from_hex(hexid: str | bytes) -> bytes:
    """Parse a 40-hex object id; raises InvalidInputError naming the bad value."""
    if isinstance(hexid, bytes):
        hexid = hexid.decode("ascii", "replace")
    hexid = hexid.strip().lower()
    if not HEX_RE.match(hexid):
        raise InvalidInputError(f"not a full hex object id: {hexid!r}")
    return bytes.fromhex(hexid)


def encode_loose(obj_type: ObjectType | int, data: bytes, level: int = 1) -> bytes:
    """zlib-compressed ``<type> <size>\\0<data>`` as stored in objects/xx/yyyy."""
    comp = zlib.compressobj(level)
    return comp.compress(object_header(obj_type, len(data))) + comp.compress(data) + comp.flush()


def parse_loose_header(raw: bytes, where: str) -> tuple[ObjectType, int, int]:
    """Parse ``<type> <size>\\0``; returns (type, size, header length)."""
    nul = raw.find(b"\0", 0, 64)
    if nul < 0:
        raise CorruptObjectError("loose object header has no NUL terminator", path=where)
    label, sp, size_s = raw[:nul].partition(b" ")
    if not sp or not size_s.isdigit() or (len(size_s) > 1 and size_s[:1] == b"0"):
        raise CorruptObjectError(f"malformed loose object header {raw[:nul][:40]!r}", path=where)
    try:
        obj_type = ObjectType.from_label(label)
    except InvalidInputError as err:
        raise CorruptObjectError(f"unknown loose object type {label!r}", path=where) from err
    return obj_type, int(size_s), nul + 1


def decode_loose(compressed: bytes, where: str, header_only: bool = False) -> tuple[ObjectType, int, bytes]:
    """Inflate a loose object file. Raises CorruptObjectError naming ``where``.

    With ``header_only`` only enough is inflated to read the header; the data
    returned is empty.
    """
    d = zlib.decompressobj()
    try:
        if header_only:
            head = d.decompress(compressed, 64)
            obj_type, size, _ = parse_loose_header(head, where)
            return obj_type, size, b""
        raw = d.decompress(compressed)
    except zlib.error as err:
        raise CorruptObjectError(f"loose object does not inflate: {err}", path=where) from err
    if not d.eof:
        raise CorruptObjectError("loose object is truncated (zlib stream incomplete)", path=where)
    obj_type, size, hlen = parse_loose_header(raw, where)
    data = raw[hlen:]
    if len(data) != size:
        raise CorruptObjectError(f"loose object size mismatch: header says {size}, data has {len(data)}",
                                 path=where)
    return obj_type, size, data
