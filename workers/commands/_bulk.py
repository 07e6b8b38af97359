"""Shared helpers for the bulk-write commands (unpack_objects, import_tree, write_objects)."""
from __future__ import annotations

from typing import Any, Iterable

from packyard.store.errors import InvalidInputError
from packyard.store.objects import from_hex
from packyard.store.refs import RefUpdate


def flat_counters(counters: dict[str, Any]) -> dict[str, int]:
    """The batch counters as {name: int} for the job row; phase times become elapsed_us_<phase> (microseconds)."""
    out: dict[str, int] = {}
    for key, value in counters.items():
        if key == "elapsed":
            for phase, seconds in value.items():
                out[f"elapsed_us_{phase}"] = int(round(seconds * 1_000_000))
        elif isinstance(value, (int, float)):
            out[key] = int(value)
    return out


def parse_ref_updates(items: Iterable[dict[str, Any]] | None) -> list[RefUpdate]:
    """[{"ref": "refs/heads/x", "old": hex | null, "new": hex}, ...] -> RefUpdate list."""
    updates = []
    for i, item in enumerate(items or ()):
        try:
            name, new = item["ref"], item["new"]
        except (KeyError, TypeError):
            raise InvalidInputError(f"ref update #{i} needs 'ref' and 'new' (and 'old', null = must not exist)") \
                from None
        old = item.get("old")
        updates.append(RefUpdate(name, from_hex(old) if old else None, from_hex(new)))
    return updates


def fence_options(lease: Any) -> dict[str, Any]:
    """Batch options from a repo lease: ``fence`` raises LockLostError if the lease was lost before
    publishing; ``fence_token`` lets the storage refuse the ref update if a later holder moved refs."""
    if lease is None:
        return {}
    return {"fence": lease.check, "fence_token": lease.token}
