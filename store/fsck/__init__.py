"""git's fsck for everything that enters a repository (index-pack, unpack-objects, write_objects,
import_tree): git 2.39's ``fsck.c`` rules with its message ids and severities.

* :mod:`.msgs` — message ids, default severities, :class:`FsckOptions` (severities, skip list);
* :mod:`.paths` — names that are ``.git`` / ``.gitmodules`` on NTFS or HFS+ (path.c, utf8.c);
* :mod:`.gitmodules` — git's config parser for a blob, submodule name/url checks;
* :mod:`.rules` — ``fsck_tree`` / ``fsck_commit`` / ``fsck_tag`` / the ``.gitmodules`` blob check;
* :mod:`.checker` — per-batch state: links by type, ``.gitmodules`` blobs, ``fsck_finish``.

See docs/fsck.md for which checks run where.
"""
from __future__ import annotations

from ..errors import FsckError
from .checker import FsckChecker, FsckState, check_batch, fsck_error
from .msgs import DEFAULTS, STRICT, FsckConfigError, FsckOptions, Severity, parse_severities, read_skiplist

__all__ = ["DEFAULTS", "STRICT", "FsckChecker", "FsckConfigError", "FsckError", "FsckOptions", "FsckState",
           "Severity", "check_batch", "fsck_error", "parse_severities", "read_skiplist"]
