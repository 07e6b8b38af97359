"""Objects handed over as a file, in the format ``git cat-file --batch`` prints.

Each object is one record::

    <40-hex id> SP <type> SP <size> LF
    <size bytes of content> LF

so ``git cat-file --batch < ids > objects.batch`` makes such a file from any repository, and a
frontend writes one with a few lines of code. The id in each header is checked against the
content (a mismatch is an InvalidInputError naming the offset): the file says what it holds.

This is how ``write_objects`` takes content too big for one broker message
(PACKYARD_WRITE_OBJECTS_MAX_BYTES): the file is dropped in the incoming directory and named
with ``objects_file=``. The file is read whole into memory (the objects are validated before
any is written), so its size is bounded (``max_bytes``: PACKYARD_OBJECTS_FILE_MAX_BYTES);
bigger content belongs in a pack (index_pack) or a directory (import_tree), which stream.
Errors name the file and the offset, never the file's bytes.
"""
from __future__ import annotations

import io
import os
import re
from typing import BinaryIO

from .errors import InvalidInputError, LimitExceededError
from .objects import ObjectType, hash_object

_HEADER = re.compile(rb"([0-9a-f]{40}) (blob|tree|commit|tag) (0|[1-9][0-9]{0,18})\n\Z")
MAX_HEADER_BYTES = 80


def read_objects_file(f: BinaryIO, *, where: str, max_bytes: int,
                      max_objects: int | None = None) -> list[tuple[ObjectType, bytes]]:
    """Every (type, content) of a ``git cat-file --batch`` stream, ids checked; bounded by ``max_bytes``."""
    try:
        size = os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, io.UnsupportedOperation):
        size = None
    if size is not None and size > max_bytes:
        raise _too_big(where, max_bytes, size)
    stream = f if isinstance(f, io.BufferedIOBase) else io.BufferedReader(f)  # type: ignore[arg-type,type-var]
    out: list[tuple[ObjectType, bytes]] = []
    offset = 0
    while True:
        header = stream.readline(MAX_HEADER_BYTES + 1)
        if not header:
            return out
        m = _HEADER.match(header)
        if m is None:
            raise InvalidInputError("not a `<id> <type> <size>` header line (git cat-file --batch format)",
                                    path=where, offset=offset)
        oid, label, length = bytes.fromhex(m.group(1).decode()), m.group(2), int(m.group(3))
        end = offset + len(header) + length + 1
        if end > max_bytes:
            raise _too_big(where, max_bytes, end)
        if max_objects is not None and len(out) >= max_objects:
            raise LimitExceededError(f"objects file holds more than {max_objects} objects", path=where,
                                     offset=offset)
        content = stream.read(length)
        if len(content) != length or stream.read(1) != b"\n":
            raise InvalidInputError(f"object truncated: the header promises {length} bytes and a newline",
                                    path=where, offset=offset)
        obj_type = ObjectType.from_label(label)
        if hash_object(obj_type, content) != oid:
            raise InvalidInputError("content does not hash to the id its header names", path=where,
                                    oid=oid, offset=offset)
        out.append((obj_type, content))
        offset = end


def _too_big(where: str, max_bytes: int, size: int) -> LimitExceededError:
    return LimitExceededError(f"objects file is larger than {max_bytes} bytes (at least {size}); put bigger "
                              "content in a pack (index_pack) or a directory (import_tree)", path=where)
