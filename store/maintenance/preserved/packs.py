"""Preserved packs: a replaced pack goes to ``objects/pack/preserved/`` instead of being unlinked.

A reader on another host may have listed ``objects/pack`` before the repack and open the old
pack a moment later (over NFS an unlinked file is gone for a client that had not opened it,
and ESTALE for one that had). JGit keeps replaced packs in ``preserved/`` for a while; so does
packyard: a reader that misses everywhere looks there before it says "missing"
(:mod:`packyard.store.objdir`). git reads no object from the subdirectory (fsck and gc say nothing
of it); only ``git count-objects -v`` counts it, as one "garbage found" entry (README, "Operating safely").

Moving a pack keeps it whole in one of the two directories at every moment: its ``.pack`` (and
``.rev``) and then its ``.idx`` are hard-linked into preserved/ first (preserved/ now holds the whole
pack), then the ``.idx`` leaves objects/pack (the switch: no new reader discovers the pack there once the
idx is gone), then the old names of the other linked files go, then ``.mtimes`` and ``.bitmap`` move.
Moving the idx first and the pack after (the order before) left a moment in which neither directory listed
a whole pack: a reader on another host that re-listed both then lost every object only that pack held
(the two-host race, docs/nfs.md). Links and unlinks, not a rename, move the idx: a rename between two
directories takes the filesystem's rename lock and both directories' locks (the kernel serializes every
such rename on a mount, and each is a round trip on NFS), while a link locks only preserved/ and an unlink
only objects/pack, so the moves of several packs overlap (``retire_packs``). Where hard links are refused,
the idx is renamed, still first. The preserved idx's mtime is set to the time of the move, which is what
expiry measures. Expiry removes the idx first, then the rest.

On a shared filesystem a repack links its replaceable packs' ``.pack`` and ``.rev`` into preserved/ ahead
(:func:`link_ahead`, in a child process while the new pack is planned and written: :mod:`.repack`), so that the
delete waits only for the idx links and the unlinks: each link there is a round trip holding preserved/'s lock (two
on a FUSE mount, whose kernel client looks the new name up first). The same child links the loose files a full or
loose repack may delete into ``preserved/loose-<hex>/`` (:mod:`.preservedloose`: git maps loose objects too).
Never the ``.idx``: its link is the move's switch
and its mtime, set then, is what expiry measures; linked ahead, a pack still live would be a whole preserved pack
too (readers that miss would map it a second time from there, and one left by a failed repack would count as
preserved with the live idx's age). A ``.pack`` there without its idx is invisible to readers (packs are found by
their idx) and is a second name of the live file; the delete checks each one is still that file before it relies on
it (:func:`preserve_pack`'s ``ahead``), and removes those of packs it did not replace (:func:`unlink_ahead`). One
left by a repack that ended before its delete expires by its own mtime, as a crashed move's file does.

Files git maps at a fixed path are kept the same way. git mmaps ``objects/pack/multi-pack-index`` (and the
MIDX's ``multi-pack-index-<checksum>.bitmap`` and ``.rev``, which a new MIDX removes),
``objects/info/commit-graph`` and ``packed-refs`` (from 32 KiB), and over NFS a reader on another host
keeps a valid handle only while the server's inode lives: when maintenance renames a new file over the
old one (or removes it) and the old inode's last link goes, that reader's next read of a page it has
not cached is ESTALE, which in a mapping is SIGBUS -- a ``git upload-pack`` serving a clone on host B
dies because host A's repack replaced the MIDX. So, just before the rename (or the unlink), the writer
hard-links the current file into preserved/ as ``<name>-<16 hex>.old`` (:func:`preserve_mapped`; a name
git never reads, that no pack or temp file can have) and sets its mtime to now; :func:`expire_preserved_mapped`
removes it after the same preserve time (the leftovers table's ``preserved_mapped`` row). Nothing is
fsynced for it (a crash ends every mapping anyway); a crash between the link and the rename leaves one
more link of the file still in place, which expires like the others. A preserved pack's file that a later move of a
pack of the same name replaces in preserved/ (the same bytes written again as new files) is kept the same way, as
``pack-<checksum>.<ext>-<16 hex>.old`` (:func:`packyard.store.preserve.preserve_pack`). Where hard links are refused,
nothing is preserved (a copy would be another inode: no use to a reader). The writers' ``preserve``
flag (a repack's ``preserve`` with ``preserve_for`` > 0) turns it off.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ... import fsparallel
from ... import leftovers as lo
from ...errors import StoreError
from ...forked import ForkedCall
from ...install import advance_listing
from ...preserve import PACK_EXTS as _EXTS
from ...preserve import pack_files_present, preserve_pack, preserved_dir, remove_pack_files, same_file
from .loose import link_loose

#: JGit's default: replaced packs stay readable in preserved/ for an hour.
DEFAULT_PRESERVE_SECONDS = 3600.0
def link_ahead(pack_dir: Path, names: Sequence[str]) -> list[str]:
    """Hard-link the ``.pack`` and ``.rev`` of each pack of ``names`` into preserved/, never its ``.idx`` (the
    module doc); returns the names whose files are all there now. One listing says which files exist; the links
    are made together (:mod:`..fsparallel`). For a repack on a shared filesystem, before it knows which of the
    packs it will replace: :func:`retire_packs` takes the names as ``ahead``, :func:`unlink_ahead` removes the
    links of packs that stay."""
    if not names:
        return []
    pack_dir = Path(pack_dir)
    present = pack_files_present(pack_dir)
    dest = preserved_dir(pack_dir)
    dest.mkdir(exist_ok=True)

    def one(name: str) -> bool:
        # Never over a file already there: a pack of that name preserved before may be mapped by a reader on
        # another host, and replacing it (which the delete does only for a pack it replaces) would end its inode.
        files = present.get(name, set())
        if ".idx" not in files:
            return False
        try:
            for e in (".pack", ".rev"):
                if e in files:
                    os.link(pack_dir / f"{name}{e}", dest / f"{name}{e}")
        except FileExistsError:
            try:
                return all(same_file(pack_dir / f"{name}{e}", dest / f"{name}{e}") for e in (".pack", ".rev")
                           if e in files)
            except OSError:
                return False
        except OSError:
            return False     # (gone, or links refused: the delete does what it does without them)
        return True

    done = fsparallel.each(one, list(names), where=pack_dir)
    return [name for name, ok in zip(names, done) if ok]


@dataclass(frozen=True)
class Ahead:
    """What :func:`start_link_ahead`'s child linked: packs (by name) and loose files (by id)."""

    packs: frozenset[str] = frozenset()
    loose: frozenset[bytes] = frozenset()


@dataclass(frozen=True)
class LooseAhead:
    """The loose files a repack may delete, to link into ``keep`` (:mod:`.preservedloose`)."""

    keep: Path
    path_for: Callable[[bytes], Path]
    ids: frozenset[bytes]


def start_link_ahead(pack_dir: Path, names: Sequence[str], preserve: bool,
                     loose: LooseAhead | None = None) -> ForkedCall[Ahead] | None:
    """A repack's :func:`link_ahead` (and :func:`.preservedloose.link_loose` of ``loose``), on a shared filesystem
    (:func:`..fsparallel.is_shared`) when it preserves what it replaces: in a child process, while the repack plans
    and writes (a thread would be forked by its walk and its search); :func:`linked_ahead` waits for it. None on a
    local disk, where a link costs microseconds and a fork more."""
    if not (preserve and (names or loose is not None and loose.ids) and fsparallel.is_shared(str(pack_dir))):
        return None

    def work() -> Ahead:
        packs = frozenset(link_ahead(pack_dir, names))
        return Ahead(packs, link_loose(loose.keep, loose.path_for, loose.ids) if loose is not None else frozenset())
    return ForkedCall.start(work, what="preserved links")


def linked_ahead(call: ForkedCall[Ahead] | None) -> Ahead:
    """What :func:`start_link_ahead`'s child linked; nothing if it failed (the delete then links them itself and
    meets any error of its own)."""
    if call is None:
        return Ahead()
    try:
        return call.result()
    except StoreError:
        return Ahead()


def unlink_ahead(pack_dir: Path, names: Iterable[str]) -> int:
    """Remove the links :func:`link_ahead` made for packs that stay in objects/pack (a repack spared them or
    wrote them again under the same name); returns how many. A file there that is not the live pack's (its
    name preserved earlier, then replaced) is left to expire."""
    pack_dir = Path(pack_dir)
    dest = preserved_dir(pack_dir)
    removed = 0
    for name in names:
        for ext in (".pack", ".rev"):
            try:
                if same_file(pack_dir / f"{name}{ext}", dest / f"{name}{ext}"):
                    os.unlink(dest / f"{name}{ext}")
                    removed += 1
            except FileNotFoundError:
                continue
    return removed


def retire_packs(pack_dir: Path, names: Sequence[str], *, preserve: bool, now: float | None = None,
                 after_each: Callable[[str], None] | None = None, ahead: Iterable[str] = ()) -> list[int]:
    """Move each pack of ``names`` to preserved/ (``preserve``) or unlink it; returns the files of each.

    One listing of ``pack_dir`` says which of each pack's files exist (no rename or unlink of a file that is
    not there: over NFS each would be a round trip answering ENOENT, three per pack of a repository without
    ``.mtimes`` and ``.bitmap``); preserved/ is made once; the packs are moved together (each pack's idx
    first, as :func:`preserve_pack` does; :mod:`..fsparallel`), since no order between two packs matters
    to a reader or a crash. ``after_each(name)`` runs once each pack is done (a fault point). ``ahead``: the
    packs whose ``.pack`` and ``.rev`` :func:`link_ahead` linked into preserved/ already. Then the caller calls
    :func:`advance_after_moves`.
    """
    pack_dir = Path(pack_dir)
    present = pack_files_present(pack_dir)
    linked = set(ahead)
    if preserve and names:
        preserved_dir(pack_dir).mkdir(exist_ok=True)

    def one(name: str) -> int:
        files = present.get(name, set())
        n = (preserve_pack(pack_dir, name, now=now, present=files, dest_ready=True, ahead=name in linked)
             if preserve else remove_pack_files(pack_dir, name, files))
        if after_each is not None:
            after_each(name)
        return n

    return fsparallel.each(one, list(names), where=pack_dir)


def advance_after_moves(pack_dir: Path, names: Sequence[str], *, preserve: bool) -> None:
    """After :func:`retire_packs` moved ``names``: both directories change once more a clock tick later
    (install.advance_listing, on shared filesystems only). A listing another host took in the tick of the last
    move would otherwise stay cached with the pack in neither place. The caller may do other work meanwhile (a
    repack expires old preserved packs during the tick's wait)."""
    if names:
        advance_listing(pack_dir, *([preserved_dir(pack_dir)] if preserve else []))


def expire_preserved(pack_dir: Path, older_than: float = DEFAULT_PRESERVE_SECONDS, *,
                     now: float | None = None, fence: Callable[[], None] | None = None) -> list[str]:
    """Remove preserved packs moved there more than ``older_than`` seconds ago; returns their names.

    A file left without its idx (a crash between two moves) expires by its own mtime. ``fence()``
    (a job's maintenance-lease check) runs before each pack is removed.
    """
    d = preserved_dir(pack_dir)
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return []
    ages: dict[str, float] = {}
    idx_ages: dict[str, float] = {}
    exts: dict[str, set[str]] = {}
    for e in entries:
        stem, dot, ext = e.name.rpartition(".")
        if not dot or not stem.startswith("pack-") or f".{ext}" not in _EXTS:
            continue
        exts.setdefault(stem, set()).add(f".{ext}")
        try:
            age = now - e.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if ext == "idx":
            idx_ages[stem] = age
        ages[stem] = max(ages.get(stem, age), age)
    removed = []
    for stem in sorted(ages):
        age = idx_ages.get(stem, ages[stem])
        if age >= older_than:
            if fence is not None:
                fence()
            remove_pack_files(d, stem, exts[stem])
            removed.append(stem)
    return removed


def expire_preserved_mapped(pack_dir: Path, older_than: float = DEFAULT_PRESERVE_SECONDS, *,
                            now: float | None = None, fence: Callable[[], None] | None = None) -> list[str]:
    """Remove the preserved old files git maps (:func:`preserve_mapped`) linked there more than ``older_than``
    seconds ago; returns their names. The leftovers table's ``preserved_mapped`` row with ``older_than`` as its
    age; ``fence()`` runs before each removal."""
    git_dir = Path(pack_dir).parent.parent
    rule = lo.RULES[lo.Kind.PRESERVED_MAPPED].aged(unjudged_after=older_than)
    found = lo.find_preserved_mapped(git_dir, now=now, rule=rule)
    return [item.path.name for item in lo.remove(lo.removable(found), fence)]


__all__ = ["DEFAULT_PRESERVE_SECONDS", "expire_preserved", "retire_packs", "advance_after_moves", "link_ahead",
           "start_link_ahead", "linked_ahead", "unlink_ahead", "Ahead", "LooseAhead", "expire_preserved_mapped"]
