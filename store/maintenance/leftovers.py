"""Leftovers of pack writers that died: their temp files, and packs they left half-moved or half-installed.

Run by every repack before it starts, and by ``packyard gc`` / the ``packyard.gc`` job. Expired
preserved packs are :func:`.preserved.expire_preserved`'s.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from .. import lockfile
from ..objdir import PRESERVED_DIR
from ..owner import Liveness, Owner, current_owner, liveness
from ..pack.midx import LOCK_NAME as MIDX_LOCK
from ..pack.write import tmp_owner_tag, this_host_tag
from .preserved import preserve_pack

#: A writer temp file or an orphaned pack file (no idx) of a dead or unknown owner older than this is removed.
STALE_AFTER = 600.0
#: Temp files we cannot attribute (git's own tmp_pack_XXXXXX, another host's) go at git's prune expiry.
FOREIGN_STALE_AFTER = 14 * 24 * 3600.0


def remove_stale_temp_files(pack_dir: Path, *, now: float | None = None, stale_after: float = STALE_AFTER,
                            foreign_after: float = FOREIGN_STALE_AFTER,
                            fence: Callable[[], None] | None = None, orphans: bool = True) -> int:
    """Remove writer temp files of dead repacks and pack files left without their idx; returns how many.

    Ours (``tmp_<kind>_<pid>_<host>-<rand>``) from this host go as soon as the pid is dead and they are
    older than ``stale_after``; others named ``tmp_*`` (git's, another host's) after ``foreign_after``.
    A ``pack-*.pack``/``.rev``/``.mtimes`` without its ``.idx`` is invisible to readers: if the idx is in
    preserved/ (a repack died moving the pack there) the move is finished; otherwise (an install killed
    between renames) it is removed once older than ``stale_after``. A ``pack-*.idx`` whose ``.pack`` is
    gone (an interrupted ``git repack``/``gc``: git unlinks the .pack first) goes by the same age rule.

    The multi-pack-index's claim ``multi-pack-index.lock`` is broken when its owner is dead (or, git's own
    lock without an owner record, once older than ``stale_after``); its temp files are ``tmp_midx_<tag>``.

    ``fence()`` (a job's maintenance-lease check) runs before each removal: a holder that lost its
    lease stops before deleting anything more. ``orphans=False`` (an ingesting job, which holds no
    maintenance lease): writer temp files only, installed names are left to the maintenance jobs.
    """
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(pack_dir))
    except FileNotFoundError:
        return 0
    names = {e.name for e in entries}
    removed = 0
    for e in entries:
        name = e.name
        try:
            age = now - e.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if name == MIDX_LOCK:
            # multi-pack-index.lock: packyard's claim (owner record: broken once the owner is dead) or git's
            # own lock file (no record: broken after stale_after; git holds it for one write).
            if fence is not None:
                fence()
            removed += lockfile.break_if_dead(e.path, stale_after=stale_after) in (
                lockfile.BreakVerdict.OWNER_DEAD, lockfile.BreakVerdict.AGED_OUT)
            continue
        if name.startswith("tmp_"):
            tag = tmp_owner_tag(name)
            if tag is not None and tag[1] == this_host_tag():
                # Our own name, this host: the writer's pid tells (a reused pid reads as alive: kept).
                stale = liveness(Owner(pid=tag[0], host=current_owner().host)) is Liveness.DEAD \
                    or age >= foreign_after
            else:
                stale = age >= foreign_after
        elif orphans and name.startswith("pack-") and name.rsplit(".", 1)[-1] in ("pack", "rev", "mtimes", "bitmap"):
            stem = name.rsplit(".", 1)[0]
            if f"{stem}.idx" in names:
                continue
            if (Path(pack_dir) / PRESERVED_DIR / f"{stem}.idx").exists():
                # A repack died while moving this pack to preserved/ (idx first): finish the move.
                if fence is not None:
                    fence()
                preserve_pack(pack_dir, stem, now=now)
                removed += 1
                continue
            stale = age >= stale_after
        elif orphans and name.startswith("pack-") and name.endswith(".idx") and f"{name[:-4]}.pack" not in names:
            # An idx whose pack is gone: what git's unlink_pack_path leaves when interrupted (it removes
            # the .pack first). Readers treat it as absent (packdir.list_packs); past the age rule it goes.
            stale = age >= stale_after
        else:
            continue
        if stale:
            if fence is not None:
                fence()
            try:
                os.unlink(e.path)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


# -- the commit-graph's and pack-refs' leftovers ------------------------------------------------------

#: Where the commit-graph and pack-refs writers claim and stage files (relative to the git dir).
SERVING_LOCKS = ("packed-refs.lock", "objects/info/commit-graphs/commit-graph-chain.lock")


def serving_claims(git_dir: Path) -> list[Path]:
    """The claim files of the commit-graph and pack-refs writers present now (with their side files)."""
    out: list[Path] = []
    for rel in SERVING_LOCKS:
        path = Path(git_dir) / rel
        try:
            names = os.listdir(path.parent)
        except FileNotFoundError:
            continue
        out += [path.parent / n for n in sorted(names) if n == path.name
                or (n.startswith(path.name + ".") and n.endswith(".lock"))]
    return out


def remove_serving_leftovers(git_dir: Path, *, now: float | None = None, stale_after: float = STALE_AFTER,
                             fence: Callable[[], None] | None = None) -> int:
    """Leftovers of dead commit-graph and pack-refs writers; returns how many were removed.

    * ``packed-refs.lock``, ``commit-graph-chain.lock`` (and their side files): at once when the owner
      record names a dead process, after ``stale_after`` when nobody can judge (git's own, another host);
      a live owner's never (:func:`..lockfile.break_if_dead`).
    * ``objects/info/commit-graphs/tmp_{graph,chain}_*``: a dead writer's on this host at once, others
      (git's ``tmp_graph_XXXXXX``) after two weeks, as pack temps.
    * ``packyard/tmp/packed-refs-*``: live only while the writer holds ``packed-refs.lock``; orphans once
      older than ``stale_after``.
    """
    from .. import lockfile
    from ..packrefs import TMP_PREFIX
    from ..refs import REF_TMP_DIR
    from .commitgraph import GRAPHS_DIR
    from .graphwrite import remove_stale_graph_temps

    git_dir = Path(git_dir)
    now = time.time() if now is None else now
    removed = 0
    for path in serving_claims(git_dir):
        if fence is not None:
            fence()
        verdict = lockfile.break_if_dead(path, stale_after=stale_after)
        removed += verdict in (lockfile.BreakVerdict.OWNER_DEAD, lockfile.BreakVerdict.AGED_OUT)
    if fence is not None:
        fence()
    removed += remove_stale_graph_temps(git_dir / "objects" / GRAPHS_DIR, now=now)
    tmp_dir = git_dir / REF_TMP_DIR
    for tmp in sorted(tmp_dir.glob(f"{TMP_PREFIX}*")) if tmp_dir.is_dir() else []:
        try:
            if now - tmp.stat().st_mtime >= stale_after:
                tmp.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed


__all__ = ["remove_stale_temp_files", "STALE_AFTER", "FOREIGN_STALE_AFTER", "remove_serving_leftovers",
           "serving_claims", "SERVING_LOCKS"]
