"""index-pack's quarantines and keeps: ``objects/incoming-<random>/`` while a pack is received, and the
``.keep`` an ingest holds until its refs name the pack.

A quarantine holds an owner record (``packyard-owner``: pid, host, job; :mod:`..owner`) so whoever
cleans up after a killed ingest can tell whose it is. Which quarantines are stale is the leftovers
table's rule (:data:`..leftovers.RULES` ``[Kind.QUARANTINE]``: untouched for an hour, a live owner's
never); :func:`remove_stale_quarantines` applies it. Used by index-pack, ``packyard gc``, the janitor
and the maintenance statistics.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import WriteFailedError
from ..leftovers import QUARANTINE_OWNER, QUARANTINE_PREFIX, RULES, Kind, find_quarantines, removable, remove
from ..owner import current_owner

if TYPE_CHECKING:
    from .indexpack import IndexPackResult


def create_quarantine(objects_dir: Path) -> Path:
    """``objects/incoming-<random>`` holding an owner record (who is ingesting into it: pid, host, job)."""
    try:
        q = Path(tempfile.mkdtemp(prefix=QUARANTINE_PREFIX, dir=objects_dir))
    except OSError as err:
        raise WriteFailedError(f"cannot create the quarantine directory: {err.strerror}", errno=err.errno,
                               path=objects_dir) from err
    try:
        (q / QUARANTINE_OWNER).write_bytes(current_owner().encode())
    except OSError as err:
        shutil.rmtree(q, ignore_errors=True)
        raise WriteFailedError(f"cannot write the quarantine's owner record: {err.strerror}", errno=err.errno,
                               path=q / QUARANTINE_OWNER) from err
    return q


def remove_stale_quarantines(repo, *, older_than: float | None = None, now: float | None = None) -> list[Path]:
    """Delete the ``objects/incoming-*`` directories the leftovers table says are abandoned (ingests that
    died: SIGKILL, power loss); ``older_than`` replaces the table's hour (``gc --quarantine-after``). A live
    owner's quarantine stays whatever its age. Returns the directories removed."""
    rule = RULES[Kind.QUARANTINE]
    if older_than is not None:
        rule = rule.aged(dead_after=older_than, unjudged_after=older_than)
    return [item.path for item in remove(removable(find_quarantines(repo, now=now, rule=rule)))]


def release_keep(keep: "IndexPackResult | Path | str | None") -> bool:
    """Remove the ``.keep`` an ingest created (after the refs naming the pack are updated).

    Returns False when there was nothing to remove.
    """
    path = keep if keep is None or isinstance(keep, (str, Path)) else keep.keep_path
    if path is None:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


__all__ = ["create_quarantine", "remove_stale_quarantines", "release_keep"]
