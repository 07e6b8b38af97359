"""The one move of a pack's files into ``objects/pack/preserved/``, and the keeping of a file git maps at a fixed path.

The primitives of :mod:`packyard.store.maintenance.preserved.packs` (whose docstring tells why and in which order),
here in the core layer because three layers finish such a move: a repack retires packs with
:func:`preserve_pack`; the leftovers table's remover finishes a half-preserved pack a crash left
(:mod:`packyard.store.leftovers`); the MIDX, commit-graph and packed-refs writers keep the inode they replace
(:func:`preserve_mapped`). It reads only the leftovers table's names (:mod:`packyard.store.leftovers.table`).
"""
from __future__ import annotations

import errno
import os
import secrets
import time
from pathlib import Path
from typing import Iterable

from .faults import fault_point
from .leftovers.table import MIDX_SIDE_RE, PACK_FILE_RE, PRESERVED_MAPPED
from .objdir import PRESERVED_DIR

PACK_EXTS = (".idx", ".pack", ".rev", ".mtimes", ".bitmap")


def preserved_dir(pack_dir: Path) -> Path:
    return Path(pack_dir) / PRESERVED_DIR


#: What a refused hard link says (a filesystem without them, another device, too many links): move instead.
_NO_LINK = frozenset({errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


def preserve_pack(pack_dir: Path, name: str, *, now: float | None = None, present: Iterable[str] = PACK_EXTS,
                  dest_ready: bool = False, ahead: bool = False) -> int:
    """Move ``pack-<sha>.*`` into preserved/, the pack whole in one directory at every moment (the module doc);
    returns the files moved. ``present``: the extensions to move (default all; :func:`retire_packs` passes
    what a fresh listing showed); ``dest_ready``: preserved/ exists (no mkdir round trip); ``ahead``: its
    ``.pack`` and ``.rev`` were linked there before (:func:`~packyard.store.maintenance.preserved.packs.link_ahead`;
    each is checked to be the same file, and linked again if not).

    Steps: link ``.pack`` and ``.rev`` into preserved/ (fault point ``repack.after_pack_linked``); link the
    ``.idx`` there and set its mtime, then unlink its old name -- or, where links are refused, rename it
    (``repack.after_idx_preserved``); unlink the other linked files' old names; move ``.mtimes`` and
    ``.bitmap``. A rerun after a crash anywhere finishes the move (a link already there is the same file:
    kept)."""
    pack_dir = Path(pack_dir)
    dest = preserved_dir(pack_dir)
    if not dest_ready:
        dest.mkdir(exist_ok=True)
    wanted = set(present)
    moved = 0
    linked = [e for e in (".pack", ".rev") if e in wanted and _link_into(pack_dir / f"{name}{e}", dest, ahead=ahead)]
    if linked:
        fault_point("repack.after_pack_linked")
    if ".idx" in wanted and _move_idx(pack_dir / f"{name}.idx", dest, now):
        moved += 1
        fault_point("repack.after_idx_preserved")
    for e in linked:
        (pack_dir / f"{name}{e}").unlink(missing_ok=True)
        moved += 1
    for rest in (".pack", ".rev", ".mtimes", ".bitmap"):
        if rest in wanted and rest not in linked and _move(pack_dir / f"{name}{rest}", dest):
            moved += 1
    return moved


def _move_idx(idx: Path, dest: Path, now: float | None) -> bool:
    """The switch: the idx into preserved/ (linked, its mtime set to the move's time, then its old name
    unlinked; renamed where links are refused); False if it is gone."""
    t = time.time() if now is None else now
    if _link_into(idx, dest):
        # The move's time is what expiry measures (set before the old name goes: a crash after the unlink
        # leaves no preserved idx with the pack's old mtime).
        os.utime(dest / idx.name, (t, t))
        idx.unlink(missing_ok=True)
        return True
    if not _rename_into(idx, dest):
        return False
    os.utime(dest / idx.name, (t, t))
    return True


def _link_into(src: Path, dest: Path, *, ahead: bool = False) -> bool:
    """Hard-link ``src`` into ``dest`` under its name; False if ``src`` is gone or links are refused here. A
    file of that name already there is kept if it is the same file (a crashed move's link), else replaced, its
    inode kept under a name of its own for the preserve time (:func:`preserve_mapped`). ``ahead``: it was linked
    there before (:func:`link_ahead`): two stats, which wait on no directory's lock, say whether it still is; only
    if not is it linked."""
    target = dest / src.name
    if ahead:
        try:
            if same_file(src, target):
                return True
        except FileNotFoundError:
            pass
    try:
        os.link(src, target)
        return True
    except FileExistsError:
        try:
            if same_file(src, target):
                return True
            # An older preserved copy of the same name (same bytes, another inode: the pack was preserved, then
            # written again). A reader on another host may map it: it keeps a name of its own, then goes.
            preserve_mapped(target, dest.parent)
            os.unlink(target)
            os.link(src, target)
            return True
        except FileNotFoundError:
            return False
    except FileNotFoundError:
        return False
    except OSError as err:
        if err.errno in _NO_LINK:
            return False
        raise


def _move(src: Path, dest: Path) -> bool:
    """Move ``src`` into ``dest`` under its name (False if it is gone): hard-linked there (:func:`_link_into`,
    which keeps an older file of that name under a name of its own: git maps a pack's ``.bitmap`` too), then
    unlinked; renamed where links are refused."""
    if _link_into(src, dest):
        src.unlink(missing_ok=True)
        return True
    return _rename_into(src, dest)


def _rename_into(src: Path, dest: Path) -> bool:
    """Rename ``src`` into ``dest`` under its name (False if it is gone): where hard links are refused."""
    try:
        os.replace(src, dest / src.name)
    except FileNotFoundError:
        return False
    return True


def same_file(a: Path, b: Path) -> bool:
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def remove_pack_files(directory: Path, name: str, present: Iterable[str] = PACK_EXTS) -> int:
    """Unlink ``name``'s files in ``directory``, the idx first; returns how many were removed."""
    removed = 0
    wanted = set(present)
    for ext in PACK_EXTS:
        if ext not in wanted:
            continue
        try:
            os.unlink(Path(directory) / f"{name}{ext}")
            removed += 1
        except FileNotFoundError:
            continue
    return removed


def pack_files_present(pack_dir: Path) -> dict[str, set[str]]:
    """One listing of ``pack_dir``: each ``pack-<sha>`` stem and the extensions of its files there."""
    out: dict[str, set[str]] = {}
    try:
        with os.scandir(pack_dir) as it:
            for e in it:
                stem, dot, ext = e.name.rpartition(".")
                if dot and stem.startswith("pack-") and f".{ext}" in PACK_EXTS:
                    out.setdefault(stem, set()).add(f".{ext}")
    except FileNotFoundError:
        pass
    return out


def preserve_mapped(path: Path, pack_dir: Path, *, now: float | None = None) -> Path | None:
    """Keep the inode now at ``path`` (``multi-pack-index``, ``commit-graph`` or ``packed-refs``: a file git mmaps
    at a fixed path; a MIDX's ``.bitmap``/``.rev``, removed when a new MIDX is installed; a preserved pack's file
    that a pack of the same name moved there replaces: :func:`_link_into`) alive for readers
    that have it open: hard-link it into ``pack_dir``'s preserved/ as
    ``<name>-<16 hex>.old`` and set its mtime to ``now`` (what :func:`expire_preserved_mapped` measures). Call it
    right before the rename over ``path`` (or its unlink). Returns the link; None when there is no file at
    ``path`` or hard links are refused here (nothing is copied)."""
    path = Path(path)
    if (path.name not in PRESERVED_MAPPED and MIDX_SIDE_RE.match(path.name) is None
            and PACK_FILE_RE.match(path.name) is None):
        raise ValueError(f"not a file git maps at a fixed path: {path.name}")
    dest = preserved_dir(pack_dir)
    for _ in range(4):
        target = dest / f"{path.name}-{secrets.token_hex(8)}.old"
        try:
            os.link(path, target, follow_symlinks=False)
        except FileExistsError:
            continue                      # (a 64-bit name taken: another one)
        except FileNotFoundError:
            if dest.is_dir() or not os.path.lexists(path):
                return None               # nothing to keep
            try:
                dest.mkdir(exist_ok=True)     # the first preserve of this repository
            except FileNotFoundError:
                return None                   # (no objects/pack: nothing git maps there either)
            continue
        except OSError as err:
            if err.errno in _NO_LINK:
                return None
            raise
        t = time.time() if now is None else now
        os.utime(target, (t, t), follow_symlinks=False)
        return target
    return None


__all__ = ["PACK_EXTS", "same_file", "preserved_dir", "preserve_pack", "preserve_mapped", "remove_pack_files",
           "pack_files_present"]
