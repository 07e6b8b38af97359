"""Loose files a repack deletes on a shared filesystem, kept alive for a while for readers on other hosts.

git reads a loose object through a map: open, mmap, close, then inflate from the map (``map_loose_object``;
a large blob is streamed out a piece at a time, so its map is read over as long as its reader takes). A
repack that packs the object unlinks the file (git's ``prune-packed``; :func:`.repack.delete_old_packs`). On a
local disk a reader's map keeps the inode. Over NFS a reader on another host keeps a valid handle only while
the server's inode has a link: once the last one goes, its next page is ESTALE, which in a map is SIGBUS. git
on host B dies part way through an object host A's repack packed
(``test_git_on_host_b_reads_a_loose_object_a_repack_on_host_a_deletes``); git's own ``repack -d`` does the same
to it. packyard's readers take ESTALE as "gone" and read the new pack; git's cannot.

So on a shared filesystem (:func:`..fsparallel.is_shared`), when a repack preserves what it replaces, each loose
file it deletes whose object lives on in a pack is hard-linked first into ``objects/pack/preserved/loose-<16
hex>/<first hex digit>/<id>``: one directory per repack, sixteen below it, so that the links (each holds its
directory's lock for a round trip) overlap. The repack's link-ahead child makes them while it plans and writes
(:func:`.preserved.start_link_ahead`; every loose file of its snapshot, before it knows which objects expire); the
delete links, before its unlink, any file the child did not, and removes the link of an object that expired
(unreachable past the repack's ``expire``: its deletion is the point, as git's ``prune``). When the delete is over,
the directory's mtime is set to then: what expiry measures (the leftovers table's ``preserved_loose`` row: the
preserve time, as preserved packs). A repack that ends before its delete leaves second names of live loose files
there; they expire the same way and cost no space of their own while the loose file lives.

Nothing reads these files as objects: git (fsck, ``count-objects``, lookups) and packyard's lookups never
look into preserved/'s subdirectories. On a local disk nothing is linked: an unlinked file stays readable
through every handle and map there.
"""
from __future__ import annotations

import errno
import os
import secrets
import time
from pathlib import Path
from typing import Callable, Iterable

from ... import fsparallel
from ... import leftovers as lo
from ...objdir import PRESERVED_DIR

#: What a refused hard link says (no links on this filesystem, too many): the loose file is unlinked unkept.
_NO_LINK = frozenset({errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


def new_keep_dir(pack_dir: Path) -> Path:
    """A repack's directory for the loose files it deletes (a name only: :func:`link_loose` makes it)."""
    return Path(pack_dir) / PRESERVED_DIR / f"{lo.PRESERVED_LOOSE_PREFIX}{secrets.token_hex(8)}"


def keep_one(keep: Path, path: Path, hexid: str) -> bool:
    """Hard-link the loose file ``path`` (object ``hexid``) into ``keep``; False if it is gone or links are
    refused. A link already there is kept (the child made it, or a rerun: same file or same bytes)."""
    target = keep / hexid[0] / hexid
    for _ in range(3):
        try:
            os.link(path, target)
            return True
        except FileExistsError:
            return True
        except FileNotFoundError:
            if not os.path.lexists(path):
                return False                                  # (gone: nothing to keep)
            target.parent.mkdir(parents=True, exist_ok=True)  # (the first link into this fan-out directory)
        except OSError as err:
            if err.errno in _NO_LINK:
                return False
            raise
    return False


def link_loose(keep: Path, path_for: Callable[[bytes], Path], oids: Iterable[bytes]) -> frozenset[bytes]:
    """Hard-link the loose files of ``oids`` into ``keep`` (made here, with its sixteen fan-out directories, the
    mkdirs together as the links are: :mod:`..fsparallel`); returns the ids linked."""
    ids = sorted(oids)
    if not ids:
        return frozenset()
    keep.mkdir(parents=True, exist_ok=True)
    fsparallel.each(lambda d: (keep / d).mkdir(exist_ok=True), sorted({oid.hex()[0] for oid in ids}), where=keep)
    done = fsparallel.each(lambda oid: keep_one(keep, path_for(oid), oid.hex()), ids, where=keep)
    return frozenset(oid for oid, ok in zip(ids, done) if ok)


def settle_keep(keep: Path, *, kept: bool, now: float | None = None) -> None:
    """The delete is over. If it unlinked loose files ``keep`` holds (``kept``), its mtime is set to ``now``: what
    expiry measures. If not, nothing needs the directory (its links, if any, are second names of loose files that
    stay): it goes now."""
    if not kept:
        lo.remove_fanned_out(keep)
        return
    t = time.time() if now is None else now
    try:
        os.utime(keep, (t, t))
    except FileNotFoundError:
        pass


def expire_preserved_loose(pack_dir: Path, older_than: float, *, now: float | None = None,
                           fence: Callable[[], None] | None = None, spare: str | None = None) -> list[str]:
    """Remove the loose-file directories of preserved/ whose mtime is more than ``older_than`` seconds ago;
    returns their names. The leftovers table's ``preserved_loose`` row with ``older_than`` as its age;
    ``fence()`` runs before each removal; ``spare``: the name of the running repack's own (in use)."""
    git_dir = Path(pack_dir).parent.parent
    rule = lo.RULES[lo.Kind.PRESERVED_LOOSE].aged(unjudged_after=older_than)
    found = [item for item in lo.find_preserved_loose(git_dir, now=now, rule=rule) if item.path.name != spare]
    return [item.path.name for item in lo.remove(lo.removable(found), fence)]


__all__ = ["new_keep_dir", "keep_one", "link_loose", "settle_keep", "expire_preserved_loose"]
