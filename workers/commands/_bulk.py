"""Shared helpers for the bulk-write commands (unpack_objects, import_tree, write_objects)."""
from __future__ import annotations

from typing import Any, Iterable

from packyard.store.errors import InvalidInputError, LimitExceededError
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


#: Ref updates in one job: a bound on the loop, far above any real push.
MAX_REF_UPDATES = 10_000


def parse_ref_updates(items: Iterable[dict[str, Any]] | None) -> list[RefUpdate]:
    """[{"ref": "refs/heads/x", "old": hex | null, "new": hex}, ...] -> RefUpdate list (fields checked by name)."""
    updates = []
    for i, item in enumerate(items or ()):
        if i >= MAX_REF_UPDATES:
            raise LimitExceededError(f"more than {MAX_REF_UPDATES} ref updates in one job")
        try:
            name, new = item["ref"], item["new"]
        except (KeyError, TypeError):
            raise InvalidInputError(f"ref update #{i} needs 'ref' and 'new' (and 'old', null = must not exist)") \
                from None
        old = item.get("old")
        if not isinstance(name, str):
            raise InvalidInputError(f"ref update #{i}: 'ref' must be a string, got {type(name).__name__}")
        for field, value in (("new", new), ("old", old)):
            if not (isinstance(value, str) or (field == "old" and value is None)):
                raise InvalidInputError(f"ref update #{i}: {field!r} must be a 40-hex object id"
                                        f"{' or null' if field == 'old' else ''}, got {type(value).__name__}")
        updates.append(RefUpdate(name, from_hex(old) if old else None, from_hex(new)))
    return updates


def flush_options() -> dict[str, Any]:
    """The server's flush policy for loose batches (PACKYARD_FLUSH_*, store/flush.py): never the message's."""
    from packyard.workers.settings import get_settings

    return {"flush_policy": get_settings().flush_policy}


def fsck_options_of(extra: Iterable[str] = (), skiplist: str | None = None) -> Any:
    """The fsck options every way in checks with: PACKYARD_FSCK / PACKYARD_FSCK_SKIPLIST, then ``extra``
    (``id=severity`` items, e.g. from the CLI) and ``skiplist`` on top."""
    from packyard.store.fsck import FsckConfigError, FsckOptions
    from packyard.workers.settings import get_settings

    s = get_settings()
    items = [s.fsck] if s.fsck else []
    items += list(extra)
    try:
        return FsckOptions.from_config(items or None, skiplist or (str(s.fsck_skiplist) if s.fsck_skiplist else None),
                                       big_file_threshold=s.fsck_big_file_threshold)
    except FsckConfigError as err:
        raise InvalidInputError(f"fsck configuration: {err}") from None
    except OSError as err:
        raise InvalidInputError(f"fsck skip list: {err.strerror}", path=skiplist) from None


def pack_threshold_of(value: int | None) -> int | None:
    """The batch size from which objects are written as one pack: ``value``, else PACKYARD_PACK_THRESHOLD;
    0 means never (None for the store)."""
    if value is None:
        from packyard.workers.settings import get_settings

        value = get_settings().pack_threshold
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"pack_threshold must be 0 (never) or a number of objects, not {value!r}")
    return value or None
