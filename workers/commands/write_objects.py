"""write_objects as a plain function: raw objects from the frontend API (type + base64 bytes) in one batch.

Objects arrive in the message (``objects``: base64, bounded per message by ``max_payload_bytes``,
PACKYARD_WRITE_OBJECTS_MAX_BYTES for queued jobs) and/or in a file (``objects_file``: the
``git cat-file --batch`` format of :mod:`packyard.store.objectsfile`, for content too big for a
message; queued jobs name a file in the incoming directory).
"""
from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any, BinaryIO

from packyard.store.batch.api import write_objects as store_write_objects
from packyard.store.errors import InvalidInputError, LimitExceededError
from packyard.store.lease import Lease
from packyard.store.objectsfile import read_objects_file
from packyard.store.progress import Progress
from packyard.workers.commands._bulk import (
    flat_counters,
    flush_options,
    fsck_options_of,
    pack_threshold_of,
    parse_ref_updates,
)
from packyard.workers.repos import open_repository

#: What a message's ``"type"`` may say: git's names only. A number (even git's 3 for a blob) is refused, so a
#: frontend that sends pack type numbers or a null learns it at once instead of writing the wrong type.
OBJECT_TYPE_NAMES = ("commit", "tree", "blob", "tag")
#: Objects per message or file: a bound on the loops over them whatever their sizes.
MAX_OBJECTS = 100_000
#: objects_file bound when the caller gives none (the CLI); queued jobs use PACKYARD_OBJECTS_FILE_MAX_BYTES.
DEFAULT_FILE_MAX_BYTES = 512 << 20


def _decoded_size(data: Any) -> int:
    """The size ``data`` (base64 text) decodes to, computed without decoding it."""
    if not isinstance(data, str):
        return 0
    return len(data) * 3 // 4 - data[-2:].count("=")


def decode_objects(objects: list[dict[str, Any]], max_payload_bytes: int | None = None) -> list[tuple[str, bytes]]:
    """[{"type": "blob", "data": "<base64>"}, ...] -> [(type, bytes)], naming the bad entry.

    With ``max_payload_bytes``, content over that many decoded bytes in total is refused before any
    of it is decoded, with a LimitExceededError saying how to pass it instead (``objects_file``).
    """
    if len(objects) > MAX_OBJECTS:
        raise LimitExceededError(f"{len(objects)} objects in one message, over {MAX_OBJECTS}; split the batch")
    if max_payload_bytes is not None:
        total = sum(_decoded_size(item.get("data")) for item in objects if isinstance(item, dict))
        if total > max_payload_bytes:
            raise LimitExceededError(
                f"write_objects message carries {total} bytes of object content, over the "
                f"{max_payload_bytes}-byte limit per message (PACKYARD_WRITE_OBJECTS_MAX_BYTES): write the objects "
                "to a file in the incoming directory (PACKYARD_INCOMING_DIR) in `git cat-file --batch` format "
                "and pass its name as objects_file=")
    out = []
    for i, item in enumerate(objects):
        try:
            kind = item["type"]
            if not isinstance(kind, str) or kind not in OBJECT_TYPE_NAMES:
                shown = json.dumps(kind, default=repr)
                raise InvalidInputError(f"object #{i}: type {shown} is not an object type name "
                                        f"(want one of {', '.join(OBJECT_TYPE_NAMES)}; numbers are not taken)")
            out.append((kind, base64.b64decode(item["data"], validate=True)))
        except (KeyError, TypeError):
            raise InvalidInputError(f"object #{i} needs 'type' and 'data' (base64)") from None
        except binascii.Error as err:
            raise InvalidInputError(f"object #{i}: data is not valid base64 ({err})") from err
    return out


def objects_from_file(objects_file: str | Path | BinaryIO, max_bytes: int) -> list[tuple[Any, bytes]]:
    """The objects of a ``git cat-file --batch`` file (a path, or a file already opened by the caller)."""
    if isinstance(objects_file, (str, Path)):
        try:
            f = open(objects_file, "rb")
        except OSError as err:
            raise InvalidInputError(f"cannot open objects file: {err.strerror}", path=str(objects_file)) from err
        with f:
            return list(read_objects_file(f, where=str(objects_file), max_bytes=max_bytes, max_objects=MAX_OBJECTS))
    where = str(getattr(objects_file, "name", "<objects file>"))
    return list(read_objects_file(objects_file, where=where, max_bytes=max_bytes, max_objects=MAX_OBJECTS))


def write_objects(repo: str | Path, objects: list[dict[str, Any]] | None = None, *,
                  objects_file: str | Path | BinaryIO | None = None, ref_updates: list[dict] | None = None,
                  max_payload_bytes: int | None = None, max_file_bytes: int = DEFAULT_FILE_MAX_BYTES,
                  pack_threshold: int | None = None, progress: Progress | None = None,
                  lease: Lease | None = None) -> dict[str, Any]:
    """Write the objects (validated first; existing ones skipped and freshened), then ``ref_updates``.

    ``objects`` (base64, in the message) come first, then those of ``objects_file``. At least
    ``pack_threshold`` objects (default: PACKYARD_PACK_THRESHOLD; 0: never) are written as one pack:
    ``counters["write_path"]`` says which.
    """
    r = open_repository(repo)
    decoded: list[tuple[Any, bytes]] = list(decode_objects(objects or [], max_payload_bytes))
    if objects_file is not None:
        decoded += objects_from_file(objects_file, max_file_bytes)
    results, res = store_write_objects(r, decoded, ref_updates=parse_ref_updates(ref_updates),
                                       progress=progress, pack_threshold=pack_threshold_of(pack_threshold),
                                       fsck=fsck_options_of(), lease=lease, **flush_options())
    return {"repo": str(r.path), "oids": [oid.hex() for oid, _ in results],
            "results": [result.value for _, result in results],
            "counters": {**flat_counters(res.counters), "write_path": res.counters["write_path"]}}
