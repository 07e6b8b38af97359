"""write_objects as a plain function: raw objects from the frontend API (type + base64 bytes) in one batch."""
from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any, Callable

from packyard.store.bulk import write_objects as store_write_objects
from packyard.store.errors import InvalidInputError
from packyard.store.repo import Repository
from packyard.workers.commands._bulk import fence_options, flat_counters, parse_ref_updates

Progress = Callable[[str, int, "int | None"], None]


def decode_objects(objects: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """[{"type": "blob", "data": "<base64>"}, ...] -> [(type, bytes)], naming the bad entry."""
    out = []
    for i, item in enumerate(objects):
        try:
            out.append((item["type"], base64.b64decode(item["data"], validate=True)))
        except (KeyError, TypeError):
            raise InvalidInputError(f"object #{i} needs 'type' and 'data' (base64)") from None
        except binascii.Error as err:
            raise InvalidInputError(f"object #{i}: data is not valid base64 ({err})") from err
    return out


def write_objects(repo: str | Path, objects: list[dict[str, Any]], *, ref_updates: list[dict] | None = None,
                  progress: Progress | None = None, lease: Any = None) -> dict[str, Any]:
    """Write the objects (validated first; existing ones skipped and freshened), then ``ref_updates``."""
    r = Repository.open(repo)
    results, res = store_write_objects(r, decode_objects(objects), ref_updates=parse_ref_updates(ref_updates),
                                       progress=progress, **fence_options(lease))
    return {"repo": str(r.path), "oids": [oid.hex() for oid, _ in results],
            "results": [result.value for _, result in results],
            "counters": flat_counters(res.counters)}
