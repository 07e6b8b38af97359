"""pack-refs: fold the loose refs into ``packed-refs`` as ``git pack-refs --all`` does (refs/files-backend.c).

The file written is git's, byte for byte: the header ``# pack-refs with: peeled fully-peeled sorted ``,
then ``<hex> <refname>`` sorted by name, each annotated tag followed by ``^<hex>`` of the object it
peels to (through nested tags). Symbolic refs, broken refs (their object is missing), per-worktree refs
(``refs/bisect/``, ``refs/worktree/``, ``refs/rewritten/``) and names git would not read stay loose.

The locking is git's own, so git's ``update-ref`` running beside it loses nothing:

1. ``packed-refs.lock`` is claimed (our owner record in it). git holds the same lock for the whole of
   every ref *deletion* (``files_transaction_prepare``: "so that somebody else doesn't pack a reference
   that we are trying to delete"), so no deletion runs while the loose refs are read: a ref deleted
   meanwhile is either gone before we look or deleted from the new ``packed-refs`` after us -- it never
   comes back (the JGit bug eclipse-jgit/jgit#152 packed a value read before a deletion).
2. The loose refs and the current ``packed-refs`` are read under the lock; the merged file is written to
   a temp file, flushed, the current ``packed-refs`` hard-linked into ``objects/pack/preserved/``
   (``preserve``: git mmaps a packed-refs of 32 KiB or more, and a reader on another NFS host that has it
   mapped keeps its inode for the preserve time; store/maintenance/preserved/packs.py), the new one renamed over
   ``packed-refs``, the directory fsynced; the lock is released.
3. Each packed loose ref is pruned under its own ``<ref>.lock`` (packyard's and git's writers take it):
   removed only if it still holds the value just packed. A ref moved meanwhile keeps its loose file
   (which wins over packed-refs): it is never reverted. A ref whose lock is held is left loose.

Fault points: ``packrefs.after_flush``, ``packrefs.after_preserve``, ``packrefs.after_rename``,
``packrefs.after_fsync``, ``packrefs.after_unlock``, ``packrefs.after_prune``. A kill anywhere leaves every
ref with its value (loose wins over packed).
"""
from __future__ import annotations

import os
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import durable, lockfile
from .errors import InvalidInputError, ObjectMissingError, RefUpdateError
from .faults import fault_point
from .fence import FenceKind, fenced
from .leftovers.table import PACKED_REFS_TMP_PREFIX
from .objects import HEX_RE, ObjectType
from .refs import PACKED_REFS, PACKED_REFS_LOCK, PACKED_REFS_LOCK_WAIT, REF_TMP_DIR, check_ref_name, read_replaced_file

HEADER = b"# pack-refs with: peeled fully-peeled sorted \n"
PACKED = PACKED_REFS
LOCK = PACKED_REFS_LOCK
TMP_PREFIX = PACKED_REFS_TMP_PREFIX   # (the leftovers table's name)
#: git's per-worktree refs: never packed (parse_worktree_ref != REF_WORKTREE_SHARED).
PER_WORKTREE = ("refs/bisect/", "refs/worktree/", "refs/rewritten/")
MAX_PEEL = 64
LOCK_WAIT = PACKED_REFS_LOCK_WAIT


@dataclass
class PackRefsResult:
    packed: int = 0                 # loose refs written into packed-refs
    pruned: int = 0                 # loose files removed after packing
    kept_moved: int = 0             # loose refs that moved meanwhile (kept loose)
    kept_locked: int = 0            # loose refs whose lock was held (kept loose)
    skipped: list[str] = field(default_factory=list)   # symrefs, broken refs, per-worktree, bad names
    total: int = 0                  # refs in the new packed-refs
    bytes: int = 0

    def as_counters(self) -> dict[str, object]:
        return {"pack_refs_packed": self.packed, "pack_refs_pruned": self.pruned,
                "pack_refs_kept_moved": self.kept_moved, "pack_refs_kept_locked": self.kept_locked,
                "pack_refs_skipped": len(self.skipped), "pack_refs_total": self.total,
                "pack_refs_bytes": self.bytes}


Read = Callable[[bytes], "tuple[ObjectType, bytes]"]
Header = Callable[[bytes], "tuple[ObjectType, int]"]


def loose_refs(git_dir: Path) -> dict[str, bytes | str]:
    """Every loose ref file under refs/: name -> object id or symref target (str). Unreadable values skipped."""
    out: dict[str, bytes | str] = {}
    root = git_dir / "refs"
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for fname in files:
            if fname.endswith(".lock") or fname.startswith("."):
                continue
            path = Path(dirpath) / fname
            name = path.relative_to(git_dir).as_posix()
            value = _read_value(path)
            if value is not None:
                out[name] = value
    return out


def _read_value(path: Path) -> bytes | str | None:
    try:
        raw = read_replaced_file(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    raw = raw.strip()
    if raw.startswith(b"ref:"):
        return raw[4:].strip().decode("utf-8", "replace")
    text = raw.decode("ascii", "replace")
    return bytes.fromhex(text) if HEX_RE.match(text) else None


def read_packed(git_dir: Path) -> dict[str, bytes]:
    """name -> id of every entry of ``packed-refs`` (peel lines are recomputed when writing)."""
    path = git_dir / PACKED
    try:
        data = read_replaced_file(path)
    except FileNotFoundError:
        return {}
    out: dict[str, bytes] = {}
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line or line.startswith((b"#", b"^")):
            continue
        hexid, _, name = line.partition(b" ")
        if len(hexid) != 40 or not name:
            raise RefUpdateError(f"malformed packed-refs line {lineno}: {line[:80]!r}", path=path)
        try:
            out[name.decode()] = bytes.fromhex(hexid.decode("ascii"))
        except ValueError:
            raise RefUpdateError(f"malformed packed-refs line {lineno}: {line[:80]!r}", path=path) from None
    return out


def peel(read: Read, oid: bytes, header: Header | None = None) -> tuple[bool, bytes | None]:
    """(object exists, the object an annotated tag peels to or None if ``oid`` is not a tag).
    ``header(oid) -> (type, size)`` answers for the commits most refs name without inflating them."""
    try:
        if header is not None and header(oid)[0] != ObjectType.TAG:
            return True, None
        obj_type, data = read(oid)
    except ObjectMissingError:
        return False, None
    if obj_type != ObjectType.TAG:
        return True, None
    target = oid
    for _ in range(MAX_PEEL):
        if obj_type != ObjectType.TAG:
            return True, target
        if not data.startswith(b"object "):
            return True, None
        target = bytes.fromhex(data[7:47].decode("ascii", "replace"))
        try:
            obj_type, data = read(target)
        except ObjectMissingError:
            return True, None
    return True, None


def render(entries: dict[str, bytes], read: Read, header: Header | None = None) -> bytes:
    """The packed-refs file for ``entries`` (name -> id), peeled, sorted as git sorts (bytes of the name)."""
    out = [HEADER]
    for name in sorted(entries, key=lambda n: n.encode()):
        oid = entries[name]
        out.append(b"%s %s\n" % (oid.hex().encode(), name.encode()))
        _exists, peeled = peel(read, oid, header)
        if peeled is not None:
            out.append(b"^%s\n" % peeled.hex().encode())
    return b"".join(out)


def _packable(name: str, value: bytes | str, read: Read, header: Header, skipped: list[str]) -> bool:
    if isinstance(value, str) or name.startswith(PER_WORKTREE):
        skipped.append(name)
        return False
    try:
        check_ref_name(name)
    except InvalidInputError:
        skipped.append(name)
        return False
    exists, _ = peel(read, value, header)
    if not exists:
        skipped.append(name)   # a broken ref: git does not pack it either
        return False
    return True


def pack_refs(repo, *, fence_token: int | None = None,
              counters: durable.DurabilityCounters | None = None, preserve: bool = True) -> PackRefsResult:
    """Fold every loose ref into packed-refs and prune the loose files (see the module docstring). ``preserve``:
    the packed-refs replaced is kept in ``objects/pack/preserved/`` for the preserve time (False: not kept)."""
    counters = counters or durable.DurabilityCounters()
    git_dir = Path(repo.path)
    read = repo.objects.read
    header = repo.objects.read_header
    result = PackRefsResult()
    guard = fenced(git_dir, fence_token, "pack refs", counters, kind=FenceKind.MAINTENANCE) \
        if fence_token is not None else nullcontext()
    with guard:
        claim = lockfile.acquire(git_dir / LOCK, "packed-refs", wait=LOCK_WAIT)
        try:
            loose = loose_refs(git_dir)
            entries = read_packed(git_dir)
            to_prune: dict[str, bytes] = {}
            for name, value in sorted(loose.items()):
                if _packable(name, value, read, header, result.skipped):
                    assert isinstance(value, bytes)
                    entries[name] = value
                    to_prune[name] = value
            data = render(entries, read, header)
            _install(git_dir, data, counters, preserve=preserve)
            result.packed, result.total, result.bytes = len(to_prune), len(entries), len(data)
        finally:
            lockfile.release(claim)
        fault_point("packrefs.after_unlock")
        tmp_dir = git_dir / REF_TMP_DIR
        with lockfile.OwnerRecord(tmp_dir) as record:
            for name, value in sorted(to_prune.items()):
                _prune(record, git_dir, name, value, result)
        fault_point("packrefs.after_prune")
    return result


def _install(git_dir: Path, data: bytes, counters: durable.DurabilityCounters, *, preserve: bool = True) -> None:
    tmp_dir = git_dir / REF_TMP_DIR
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"

    def between() -> None:   # flushed, not yet renamed: keep the inode readers may have mapped
        fault_point("packrefs.after_flush")
        if preserve:
            from .preserve import preserve_mapped

            preserve_mapped(git_dir / PACKED, git_dir / "objects" / "pack")
            fault_point("packrefs.after_preserve")

    durable.publish_file(tmp, git_dir / PACKED, data, mode=0o644, counters=counters, between=between,
                         what="packed-refs")
    fault_point("packrefs.after_rename")
    durable.fsync_dir(git_dir, counters)
    fault_point("packrefs.after_fsync")


def _prune(record: lockfile.OwnerRecord, git_dir: Path, name: str, packed_value: bytes,
           result: PackRefsResult) -> None:
    """Remove the loose ``name`` if it still holds ``packed_value``, under its ``<ref>.lock`` (held: skipped,
    as git's pack-refs skips a ref it cannot lock)."""
    path = git_dir / name
    try:
        claim = record.try_claim(path.with_name(path.name + ".lock"))
    except (FileNotFoundError, NotADirectoryError):
        claim = None
    if claim is None:
        result.kept_locked += 1
        return
    try:
        if _read_value(path) != packed_value:
            result.kept_moved += 1   # moved (or deleted) since it was packed: its loose value stands
            return
        path.unlink()
        result.pruned += 1
    finally:
        lockfile.release(claim)
    # No fsync: a loose file whose removal a crash undoes holds the value packed-refs holds.
    _remove_empty_parents(git_dir, path.parent)


def _remove_empty_parents(git_dir: Path, d: Path) -> None:
    # As git's pruning does: refs/heads/feature/ goes when its last ref was packed; refs/heads/ stays.
    while len(d.relative_to(git_dir).parts) > 2:
        try:
            d.rmdir()
        except OSError:
            return
        d = d.parent


def loose_ref_count(git_dir: Path) -> int:
    """Loose ref files under refs/ (what Gitaly's pack-refs threshold counts)."""
    n = 0
    for _dirpath, _dirs, files in os.walk(git_dir / "refs"):
        n += sum(1 for f in files if not f.endswith(".lock") and not f.startswith("."))
    return n


__all__ = ["pack_refs", "PackRefsResult", "render", "read_packed", "loose_refs", "loose_ref_count", "HEADER"]
