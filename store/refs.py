"""Refs: loose files under ``refs/`` plus ``packed-refs``; compare-and-swap updates.

Ref updates are the last durability step of every write: objects first, then
refs, so that a ref never names an object that is not durably installed.

The update protocol differs from git's in one way, so that a claim always names its owner.
git writes the new value *into* ``<ref>.lock`` and renames the lock over the ref; a writer
killed between the two leaves a lock holding only an object id, which nobody can attribute
and which blocks the ref until it ages out. Here ``<ref>.lock`` is a pure claim: created
exclusively (git's writers and ours exclude each other exactly as before) and holding the
owner record (pid, host, job) from creation to release. The new value goes to a temp file
under ``packyard/tmp/`` (not in ``refs/``: git checks the names of every non-``.lock`` file
there), is flushed, and is renamed over the ref while the claim is held; the claims are
released last. A writer killed at any step leaves claims whose owner is provably dead, which
the next writer breaks at once (:mod:`.lockfile`), and at most an orphaned temp file that
``packyard gc`` removes.
"""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from . import durable, fence, lockfile
from .errors import CorruptObjectError, InvalidInputError, RefUpdateError
from .faults import fault_point
from .leftovers import table as leftover_names
from .objects import HEX_RE, ZERO_OID, ObjectType

_BAD_REF_CHARS = re.compile(r"[\x00-\x20\x7f ~^:?*\[\\]")
MAX_SYMREF_DEPTH = 5
#: A ref lock whose owner cannot be judged (another host, git's own) and older than this was
#: left by a writer that died (a ref update holds its locks for milliseconds); the next writer
#: removes it. A lock whose owner is provably dead is broken at once (store/lockfile.py).
STALE_REF_LOCK_SECONDS = lockfile.DEFAULT_STALE_AFTER
FENCE_FILE = fence.FENCE_FILE
#: Where new ref values are written before they are renamed over the ref (same filesystem): the leftovers
#: table's names, which judge what a dead writer left there.
REF_TMP_DIR = leftover_names.REF_TMP_DIR
#: packed-refs, its lock and how long to wait for a live holder (git's core.packedRefsTimeout is 1 s).
#: Defined here, below packrefs, because a ref deletion rewrites packed-refs (packrefs imports this module).
PACKED_REFS = "packed-refs"
PACKED_REFS_LOCK = "packed-refs.lock"
PACKED_REFS_LOCK_WAIT = 1.0
#: How long a ref update waits for a ``<ref>.lock`` another writer holds: git's ``core.filesRefLockTimeout``
#: default (100 ms). pack-refs prunes each loose ref under that lock for a moment; a push meeting it must wait,
#: as git's does, not fail with "failed to update ref".
REF_LOCK_WAIT = 0.1
REF_TMP_PREFIX = leftover_names.REF_TMP_PREFIX
#: Opens of a ref file or ``packed-refs`` that answered ESTALE, at most. Over NFS a file replaced by a rename
#: through another host (every ref update and ``pack-refs`` replaces, never rewrites) answers ESTALE to a
#: read of the handle opened before; the name now leads to the new file, so opening it again reads the new
#: value. Three replacements between an open and its read in a row is no race a writer makes; the error goes up.
STALE_REREADS = 3


def read_replaced_file(path: Path) -> bytes:
    """``path``'s bytes, opened again when a read met ESTALE (the file was replaced through another host
    between the open and the read); FileNotFoundError and the rest as ``read_bytes`` raises them."""
    for attempt in range(STALE_REREADS):
        try:
            return path.read_bytes()
        except OSError as err:
            if err.errno != errno.ESTALE or attempt == STALE_REREADS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class RefUpdate:
    """Move ``name`` from ``old`` to ``new``; ``old=None`` means the ref must not exist yet."""

    name: str
    old: bytes | None
    new: bytes


def check_ref_name(name: str) -> None:
    """git check-ref-format rules for names we write (must live under refs/)."""
    problems = []
    if not name.startswith("refs/") or name.endswith("/"):
        problems.append("must start with refs/ and not end with /")
    if ".." in name or "//" in name or "@{" in name or name.endswith(".") or _BAD_REF_CHARS.search(name):
        problems.append("contains a forbidden sequence or character")
    for part in name.split("/"):
        if part.startswith(".") or part.endswith(".lock") or part == "":
            problems.append(f"bad component {part!r}")
    if problems:
        raise InvalidInputError(f"invalid ref name {name!r}: {'; '.join(problems)}")


class RefStore:
    """Reads and updates the refs of one repository (git dir).

    A ref file, ``packed-refs`` or a directory under ``refs/`` that is a symlink leading
    outside the repository is refused (InvalidInputError) before it is read or written
    through. ``objects`` (the repository's ObjectDirectory) lets ``update`` refuse to point
    a branch (``refs/heads/*``) at anything but a commit, as git does.
    """

    def __init__(self, git_dir: Path, stale_lock_seconds: float | None = STALE_REF_LOCK_SECONDS, *,
                 objects=None) -> None:
        self.git_dir = git_dir
        self.stale_lock_seconds = stale_lock_seconds
        self.stale_locks_removed = 0
        self.objects = objects

    def _inside(self, path: Path) -> Path:
        """``path`` if it stays inside the repository with symlinks resolved, else InvalidInputError."""
        real = os.path.realpath(path)
        root = str(self.git_dir)
        if real != root and not real.startswith(root + os.sep):
            raise InvalidInputError("a symlink here leads outside the repository; refusing to read or write "
                                    "through it", path=path)
        return path

    # -- reading -----------------------------------------------------------
    def _packed(self) -> dict[str, bytes]:
        path = self._inside(self.git_dir / "packed-refs")
        try:
            text = read_replaced_file(path)
        except FileNotFoundError:
            return {}
        refs: dict[str, bytes] = {}
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line or line.startswith((b"#", b"^")):
                continue
            hexid, _, name = line.partition(b" ")
            if not HEX_RE.match(hexid.decode("ascii", "replace")) or not name:
                raise CorruptObjectError(f"malformed packed-refs line {lineno}: {line[:80]!r}", path=path)
            refs[name.decode()] = bytes.fromhex(hexid.decode())
        return refs

    def _read_loose(self, name: str) -> bytes | str | None:
        """A loose ref's value: oid bytes, a symref target (str), or None."""
        path = self._inside(self.git_dir / name)
        try:
            raw = read_replaced_file(path).strip()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        if raw.startswith(b"ref: "):
            return raw[5:].decode()
        text = raw.decode("ascii", "replace")
        if not HEX_RE.match(text):
            raise CorruptObjectError(f"malformed ref {name}: {raw[:80]!r}", path=path)
        return bytes.fromhex(text)

    def read_raw(self, name: str) -> bytes | str | None:
        """The direct value of ``name``: oid, symref target (str) or None."""
        value = self._read_loose(name)
        if value is None and name.startswith("refs/"):
            value = self._packed().get(name)
        return value

    def symref_target(self, name: str) -> str | None:
        value = self._read_loose(name)
        return value if isinstance(value, str) else None

    def read(self, name: str) -> bytes | None:
        """The object id ``name`` points to, following symbolic refs."""
        for _ in range(MAX_SYMREF_DEPTH):
            value = self.read_raw(name)
            if not isinstance(value, str):
                return value
            name = value
        raise CorruptObjectError(f"symbolic ref loop at {name}", path=self.git_dir / name)

    def resolve(self, name: str = "HEAD") -> bytes | None:
        return self.read(name)

    def as_dict(self) -> dict[str, bytes]:
        """Every ref under refs/ with its object id (loose refs win over packed-refs)."""
        refs = self._packed()
        root = self.git_dir / "refs"
        for dirpath, _dirs, files in os.walk(root):
            for fname in files:
                if fname.endswith(".lock") or fname.startswith("."):
                    continue  # claims, and names git never reads as refs
                full = Path(dirpath) / fname
                name = full.relative_to(self.git_dir).as_posix()
                value = self._read_loose(name)
                if isinstance(value, bytes):
                    refs[name] = value
                elif isinstance(value, str):
                    target = self.read(value)
                    if target is not None:
                        refs[name] = target
        return dict(sorted(refs.items()))

    # -- updating ----------------------------------------------------------
    def update(self, updates: Sequence[RefUpdate] | Iterable[RefUpdate],
               counters: durable.DurabilityCounters | None = None, *, fence_token: int | None = None,
               allow_delete: bool = False) -> None:
        """All-or-nothing compare-and-swap of several refs.

        ``allow_delete``: an update whose ``new`` is the zero id deletes the ref (git's ``delete-refs``):
        its line leaves ``packed-refs`` (rewritten under ``packed-refs.lock``, as git's files backend
        does) before its loose file is removed, both after the old values are checked.

        Steps: claim every ref (``<ref>.lock``, O_EXCL, holding our owner record),
        check every old value, write and flush each new value to a temp file,
        rename the temps over the refs, fsync the refs' directories, release the
        claims. On any failure before the renames, the temps and claims are
        removed and no ref changed. (A crash during the renames can leave some
        refs moved and others not, as with git's own multi-ref transactions.)

        ``fence_token`` (the writer's repository lease token) makes the storage itself
        refuse a stale writer: under ``packyard/fence.lock`` the token must be at least
        the highest one that already moved refs here (``packyard/fence``), else
        LockLostError and nothing changes; a higher token is recorded durably before
        any ref moves. A lease holder that stalled past its TTL, after a later holder
        (larger token) moved refs, is refused even though its own lease check passed.
        Without a token (an operator's in-process command) nothing is checked.
        """
        updates = list(updates)
        if not updates:
            return
        names = [u.name for u in updates]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"ref updated twice in one transaction: {names}")
        for u in updates:
            check_ref_name(u.name)
            if len(u.new) != 20 or (u.new == ZERO_OID and not allow_delete):
                raise InvalidInputError(f"invalid new value for {u.name}")
            self._inside(self.git_dir / u.name)
            if u.new != ZERO_OID:
                self._check_branch_target(u)
        if fence_token is None:
            self._update(updates, counters)
            return
        self._inside(self.git_dir / FENCE_FILE)   # a symlinked packyard/ must not lead out
        with fence.fenced(self.git_dir, fence_token, f"update {updates[0].name}", counters):
            self._update(updates, counters)

    def _check_branch_target(self, u: RefUpdate) -> None:
        """A branch names a commit (git: "trying to write non-commit object to branch"); other refs
        (tags, notes) may name any object. Checked before any lock is taken."""
        if self.objects is None or not u.name.startswith("refs/heads/"):
            return
        obj_type, _size = self.objects.read_header(u.new)
        if obj_type != ObjectType.COMMIT:
            raise InvalidInputError(f"trying to write non-commit object ({obj_type.label.decode()}) to branch "
                                    f"{u.name}", oid=u.new)

    def fence_token(self) -> int:
        """The highest fencing token that has changed this repository (0: none yet)."""
        return fence.recorded_token(self.git_dir)

    def _update(self, updates: list[RefUpdate], counters: durable.DurabilityCounters | None) -> None:
        """The CAS itself, on validated updates (see ``update``)."""
        names = [u.name for u in updates]
        claims: list[lockfile.Claim] = []
        temps: list[Path] = []
        renamed = 0
        try:
            for u in updates:
                claims.append(self._claim_ref(u.name))
            self._check_old_values(updates)
            writes = [u for u in updates if u.new != ZERO_OID]
            deletes = [u.name for u in updates if u.new == ZERO_OID]
            for u in writes:
                temps.append(self._write_new_value(u.new, counters))
            fault_point("refs.before_rename")
            if deletes:
                self._delete_from_packed(deletes, counters)
            for u, tmp in zip(writes, temps):
                self._publish_new_value(tmp, u.name, counters)
                renamed += 1
            for name in deletes:
                _unlink_if_present(self.git_dir / name)
            self._fsync_ref_dirs(names, counters)
        except BaseException:
            for tmp in temps[renamed:]:
                _unlink_if_present(tmp)
            raise
        finally:
            for claim in claims:
                lockfile.release(claim)  # last: the next writer starts from durable values

    def _claim_ref(self, name: str) -> lockfile.Claim:
        """Claim ``<ref>.lock`` (our owner record in it): git's writers and ours exclude each other."""
        path = self.git_dir / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            claim = lockfile.acquire(path.with_name(path.name + ".lock"), f"ref {name}", wait=REF_LOCK_WAIT,
                                     stale_after=self.stale_lock_seconds)
        except (NotADirectoryError, IsADirectoryError, FileExistsError) as err:
            raise RefUpdateError(f"ref {name} conflicts with an existing ref", path=path) from err
        self.stale_locks_removed += len(claim.broken)
        return claim

    def _write_new_value(self, new: bytes, counters: durable.DurabilityCounters | None) -> Path:
        """Write one new value to a temp file on the repository's filesystem and flush it (why: the
        rename that publishes it must never expose a ref file whose content is not on disk)."""
        tmp_dir = self.git_dir / REF_TMP_DIR
        tmp_dir.mkdir(parents=True, exist_ok=True)
        tmp = tmp_dir / f"{REF_TMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, new.hex().encode() + b"\n")
            durable.flush_file(fd, counters)
        except BaseException:
            os.close(fd)
            _unlink_if_present(tmp)
            raise
        os.close(fd)
        return tmp

    def _publish_new_value(self, tmp: Path, name: str, counters: durable.DurabilityCounters | None) -> None:
        """Rename the flushed temp over the ref (why: one atomic step; readers see old or new, never half)."""
        durable.rename(tmp, self.git_dir / name, counters)

    def _fsync_ref_dirs(self, names: list[str], counters: durable.DurabilityCounters | None) -> None:
        """fsync every directory a ref was renamed into (why: the renames survive a crash)."""
        for directory in sorted({(self.git_dir / n).parent for n in names}):
            durable.fsync_dir(directory, counters)

    def _delete_from_packed(self, names: list[str], counters: durable.DurabilityCounters | None) -> None:
        """Rewrite ``packed-refs`` without ``names`` (and their peeled lines), under its lock; nothing to do
        when none of them is packed."""
        path = self._inside(self.git_dir / PACKED_REFS)
        gone = {n.encode() for n in names}
        claim = lockfile.acquire(self.git_dir / PACKED_REFS_LOCK, "packed-refs", wait=PACKED_REFS_LOCK_WAIT)
        try:
            try:
                text = read_replaced_file(path)
            except FileNotFoundError:
                return
            kept: list[bytes] = []
            dropping = False
            for line in text.splitlines(keepends=True):
                if line.startswith(b"^"):
                    if not dropping:
                        kept.append(line)
                    continue
                dropping = line.rstrip(b"\n").partition(b" ")[2] in gone
                if not dropping:
                    kept.append(line)
            data = b"".join(kept)
            if data == text:
                return
            tmp_dir = self.git_dir / REF_TMP_DIR
            tmp_dir.mkdir(parents=True, exist_ok=True)
            tmp = tmp_dir / f"{leftover_names.PACKED_REFS_TMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}"
            durable.publish_file(tmp, path, data, mode=0o644, counters=counters, what="packed-refs")
            durable.fsync_dir(self.git_dir, counters)
        finally:
            lockfile.release(claim)

    def _check_old_values(self, updates: list[RefUpdate]) -> None:
        packed = None
        for u in updates:
            current = self._read_loose(u.name)
            if current is None:
                if packed is None:
                    packed = self._packed()
                current = packed.get(u.name)
            if isinstance(current, str):
                raise RefUpdateError(f"ref {u.name} is a symbolic ref; refusing to overwrite it")
            if current != u.old:
                have = current.hex() if current else "nothing"
                want = u.old.hex() if u.old else "nothing"
                raise RefUpdateError(f"ref {u.name} moved: expected {want}, found {have}")

    def set_symref(self, name: str, target: str) -> None:
        """Point a symbolic ref (e.g. HEAD) at ``target``."""
        check_ref_name(target)
        durable.write_file_durably(self._inside(self.git_dir / name), f"ref: {target}\n".encode(), mode=0o644)


def _unlink_if_present(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class RemovedClaim:
    """A claim file (or orphaned ref temp) ``packyard gc`` removed, and why."""

    path: str            # relative to the git dir
    verdict: str         # owner-dead | aged-out
    owner: str | None    # "pid 4242 on web-3 job 6f1c…", when the file named one

    def as_dict(self) -> dict[str, str | None]:
        return {"path": self.path, "verdict": self.verdict, "owner": self.owner}


def remove_dead_claims(git_dir: Path, stale_after: float = STALE_REF_LOCK_SECONDS) -> list[RemovedClaim]:
    """Remove the claim files under ``refs/`` and ``packyard/`` left by writers that died, and orphaned ref
    temp files (``packyard/tmp/ref-*``): the leftovers table's ``ref_claim`` and ``ref_tmp`` rules
    (:mod:`.leftovers`; a dead owner's claim at once, one nobody can judge once older than ``stale_after``,
    a live owner's never; a temp file lives only while its writer holds the claim)."""
    from . import leftovers as lo

    found = lo.find_ref_claims(git_dir, rule=lo.RULES[lo.Kind.REF_CLAIM].aged(unjudged_after=stale_after))
    found += lo.find_ref_temps(git_dir, rule=lo.RULES[lo.Kind.REF_TMP].aged(unjudged_after=stale_after))
    why = {lo.Verdict.REMOVE_DEAD_OWNER: lockfile.BreakVerdict.OWNER_DEAD.value,
           lo.Verdict.REMOVE_EXPIRED: lockfile.BreakVerdict.AGED_OUT.value}
    return [RemovedClaim(item.path.relative_to(git_dir).as_posix(), why[item.verdict],
                         item.owner.describe() if item.owner is not None else None)
            for item in lo.remove(lo.removable(found))]
