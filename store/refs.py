"""Refs: loose files under ``refs/`` plus ``packed-refs``; compare-and-swap updates.

Ref updates are the last durability step of every write: objects first, then
refs, so that a ref never names an object that is not durably installed.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from . import durable
from . import fence, lockfile
from .errors import CorruptObjectError, InvalidInputError, RefUpdateError
from .faults import fault_point
from .objects import HEX_RE, ZERO_OID, ObjectType

_BAD_REF_CHARS = re.compile(r"[\x00-\x20\x7f ~^:?*\[\\]")
MAX_SYMREF_DEPTH = 5
#: A ref lock whose owner cannot be judged (another host, git's own) and older than this was
#: left by a writer that died (a ref update holds its locks for milliseconds); the next writer
#: removes it. A lock whose owner is provably dead is broken at once (store/lockfile.py).
STALE_REF_LOCK_SECONDS = lockfile.DEFAULT_STALE_AFTER
FENCE_FILE = fence.FENCE_FILE


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
            text = path.read_bytes()
        except FileNotFoundError:
            return {}
        refs: dict[str, bytes] = {}
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line or line.startswith(b"#") or line.startswith(b"^"):
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
            raw = path.read_bytes().strip()
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
                if fname.endswith(".lock"):
                    continue
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
               counters: durable.DurabilityCounters | None = None, *, fence_token: int | None = None) -> None:
        """All-or-nothing compare-and-swap of several refs.

        Steps: lock every ref (``<ref>.lock``, O_EXCL), check every old value,
        write and flush the new values into the lock files, rename them over
        the refs, fsync the refs' directories. On any failure before the
        renames, every lock file is removed and no ref changed.

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
            if len(u.new) != 20 or u.new == ZERO_OID:
                raise InvalidInputError(f"invalid new value for {u.name}")
            self._inside(self.git_dir / u.name)
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
        locks: list[Path] = []
        renamed = 0
        try:
            for u in updates:
                locks.append(self._lock_ref(u.name))
            self._check_old_values(updates)
            for u, lock in zip(updates, locks):
                self._write_lock(lock, u.new, counters)
            fault_point("refs.before_rename")
            for u, lock in zip(updates, locks):
                durable.rename(lock, self.git_dir / u.name, counters)
                renamed += 1
        except BaseException:
            for lock in locks[renamed:]:
                try:
                    lock.unlink()
                except FileNotFoundError:
                    pass
            raise
        for directory in sorted({(self.git_dir / n).parent for n in names}):
            durable.fsync_dir(directory, counters)

    def _lock_ref(self, name: str) -> Path:
        path = self.git_dir / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            claim = lockfile.acquire(path.with_name(path.name + ".lock"), f"ref {name}",
                                     stale_after=self.stale_lock_seconds)
        except (NotADirectoryError, IsADirectoryError, FileExistsError) as err:
            raise RefUpdateError(f"ref {name} conflicts with an existing ref", path=path) from err
        self.stale_locks_removed += len(claim.broken)
        return claim.path

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

    @staticmethod
    def _write_lock(lock: Path, new: bytes, counters) -> None:
        fd = os.open(lock, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, new.hex().encode() + b"\n")
            durable.flush_file(fd, counters)
        finally:
            os.close(fd)

    def set_symref(self, name: str, target: str) -> None:
        """Point a symbolic ref (e.g. HEAD) at ``target``."""
        check_ref_name(target)
        durable.write_file_durably(self._inside(self.git_dir / name), f"ref: {target}\n".encode(), mode=0o644)
