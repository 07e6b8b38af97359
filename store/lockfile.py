"""Claim files: ``<path>.lock`` created with O_EXCL, naming their owner, broken when the owner is dead.

git's lock protocol (``<ref>.lock`` created exclusively; whoever creates it holds it)
plus one thing git lacks: the file starts with an owner record (:mod:`.owner`), so a
waiter breaks a claim **at once** when its owner is provably dead (same host; pid gone,
a zombie, reused, or the host rebooted), instead of blocking the ref for minutes. A claim
whose owner cannot be judged (another host, or no record: git's own lock, an older
packyard) is broken only once it is older than ``stale_after`` (the age rule git users
apply by hand). A claim held by a live owner is never broken: the caller gets
:class:`~.errors.LockContendedError` (retry later) after waiting up to ``wait`` seconds.

A claim is never visible without its owner record: the record is written to a unique
side file first (``<claim>.<hex>.lock``) which is then hard-linked to the claim's name
(``link`` fails if the name exists: the same exclusivity as O_EXCL, and safe on NFS);
a writer killed between create and write would otherwise leave an empty claim nobody can
judge. Side files and broken-aside names end in ``.lock`` so git never reads them as refs.

Breaking is done by renaming the claim to a unique name first and checking that the
file renamed is the one judged (inode, mtime, owner record): two waiters breaking the same dead claim
cannot remove a fresh claim that a third process created in between.
"""
from __future__ import annotations

import enum
import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import LockContendedError
from .owner import Liveness, Owner, current_owner, liveness, read_owner

#: A claim whose owner cannot be judged is presumed abandoned after this long (a ref update
#: holds its locks for milliseconds; git's own stale-lock advice is "remove it by hand").
DEFAULT_STALE_AFTER = 600.0
POLL = 0.01
MAX_BREAKS = 8   # a bound on the acquire loop: claims broken in one call


class BreakVerdict(enum.Enum):
    """Why a claim may or may not be broken (a result, not a boolean)."""

    OWNER_DEAD = "owner-dead"           # provably dead owner: break now
    AGED_OUT = "aged-out"               # owner unknown (other host / no record) and older than stale_after
    OWNER_ALIVE = "owner-alive"         # never break
    TOO_YOUNG = "too-young"             # owner unknown and not yet old: wait
    GONE = "gone"                       # released meanwhile


def judge(path: str | os.PathLike[str], *, stale_after: float | None = DEFAULT_STALE_AFTER,
          now: float | None = None) -> tuple[BreakVerdict, Owner | None]:
    """Pure question (reads the claim, changes nothing): may this claim be broken, and whose is it?"""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return BreakVerdict.GONE, None
    owner = read_owner(path)
    if owner is not None:
        alive = liveness(owner)
        if alive is Liveness.DEAD:
            return BreakVerdict.OWNER_DEAD, owner
        if alive is Liveness.ALIVE:
            return BreakVerdict.OWNER_ALIVE, owner
    if stale_after is None:
        return BreakVerdict.TOO_YOUNG, owner
    age = (time.time() if now is None else now) - st.st_mtime
    return (BreakVerdict.AGED_OUT if age >= stale_after else BreakVerdict.TOO_YOUNG), owner


def break_if_dead(path: str | os.PathLike[str], *, stale_after: float | None = DEFAULT_STALE_AFTER
                  ) -> BreakVerdict:
    """Remove the claim at ``path`` if :func:`judge` allows it. Returns the verdict acted on.

    The claim is first renamed aside; if the file renamed is not the one judged (another
    waiter broke it and a new owner claimed it in between), it is linked back.
    """
    path = os.fspath(path)
    try:
        judged = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return BreakVerdict.GONE
    verdict, owner = judge(path, stale_after=stale_after)
    if verdict not in (BreakVerdict.OWNER_DEAD, BreakVerdict.AGED_OUT):
        return verdict
    done = _remove_judged(path, judged, owner)
    return verdict if done else BreakVerdict.GONE if done is None else BreakVerdict.OWNER_ALIVE


def remove_claim(path: str | os.PathLike[str], owner: Owner | None) -> bool:
    """Remove the claim at ``path`` if it still carries ``owner``'s record (a caller that judged the owner
    by other means -- the janitor asks the job records -- removes exactly what it judged). True if removed."""
    path = os.fspath(path)
    try:
        judged = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if read_owner(path) != owner:
        return False
    return bool(_remove_judged(path, judged, owner))


def _remove_judged(path: str, judged: os.stat_result, owner: Owner | None) -> bool | None:
    """Rename the claim aside, check it is the file judged (inode, mtime, owner record), unlink it; a claim
    someone else created meanwhile is linked back (why: two breakers never remove a fresh claim).
    True: removed; False: another claim was there (given back); None: it was gone already."""
    aside = f"{path}.broken-{os.getpid()}-{os.urandom(4).hex()}.lock"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    st = os.stat(aside, follow_symlinks=False)
    # The same file? An inode number is reused at once on most filesystems, and a rename changes
    # ctime: compare inode, mtime and the owner record (pid, start time and creation time).
    if (st.st_ino, st.st_dev, st.st_mtime_ns) != (judged.st_ino, judged.st_dev, judged.st_mtime_ns) \
            or read_owner(aside) != owner:
        try:
            os.link(aside, path)      # not the claim we judged: give it back
        except FileExistsError:
            pass
        os.unlink(aside)
        return False
    os.unlink(aside)
    return True


@dataclass(frozen=True)
class Claim:
    """A held claim file, the owner record written into it, and the claims of dead owners broken to get it."""

    path: Path
    broken: tuple[BreakVerdict, ...] = ()
    owner: Owner | None = None


def acquire(path: str | os.PathLike[str], what: str, *, wait: float = 0.0,
            stale_after: float | None = DEFAULT_STALE_AFTER, mode: int = 0o644) -> Claim:
    """Create the claim file ``path`` exclusively, with this process's owner record in it.

    Waits up to ``wait`` seconds for a live holder; breaks a dead one's claim at once and an
    unjudgeable one's after ``stale_after``. Raises LockContendedError (naming the holder when
    known) if the claim stays held. Release it with :func:`release`.
    """
    path = Path(path)
    deadline = time.monotonic() + wait
    breaks = 0
    broken: list[BreakVerdict] = []
    me = current_owner()
    side = _write_side_file(path, me, mode)
    try:
        while True:
            try:
                _link_exclusively(side, path, me, mode)
            except FileExistsError:
                if breaks < MAX_BREAKS:
                    verdict = break_if_dead(path, stale_after=stale_after)
                    if verdict in (BreakVerdict.OWNER_DEAD, BreakVerdict.AGED_OUT, BreakVerdict.GONE):
                        breaks += 1
                        if verdict is not BreakVerdict.GONE:
                            broken.append(verdict)
                        continue
                if time.monotonic() < deadline:
                    time.sleep(POLL)
                    continue
                holder = read_owner(path)
                by = f" ({holder.describe()})" if holder is not None else ""
                raise LockContendedError(f"{what} is locked by another writer{by}", path=path) from None
            return Claim(path, tuple(broken), me)
    finally:
        _unlink_quietly(side)


class OwnerRecord:
    """One owner-record file to claim many paths with, one ``link`` each (pack-refs claims every ref it
    prunes: one side file per claim would double the file creations). Use as a context manager."""

    def __init__(self, directory: str | os.PathLike[str], mode: int = 0o644) -> None:
        self.owner = current_owner()
        self.mode = mode
        self.side = _write_side_file(Path(directory) / "owner.lock", self.owner, mode)

    def try_claim(self, path: str | os.PathLike[str]) -> Claim | None:
        """Claim ``path`` now, or None if it is held (no waiting and no breaking: the caller skips it)."""
        try:
            _link_exclusively(self.side, Path(path), self.owner, self.mode)
        except FileExistsError:
            return None
        return Claim(Path(path), (), self.owner)

    def __enter__(self) -> "OwnerRecord":
        return self

    def __exit__(self, *exc: object) -> None:
        _unlink_quietly(self.side)


def _write_side_file(path: Path, me: Owner, mode: int) -> Path:
    """The owner record in a unique file next to the claim (why: the claim appears with its record)."""
    side = path.with_name(f"{path.name}.{os.urandom(6).hex()}.lock")
    fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, me.encode())
    except BaseException:
        os.close(fd)
        _unlink_quietly(side)
        raise
    os.close(fd)
    return side


def _link_exclusively(side: Path, path: Path, me: Owner, mode: int) -> None:
    """Give the side file the claim's name; FileExistsError if the claim is held.

    Where the filesystem has no hard links, fall back to O_EXCL and write (the record then
    follows the create by one system call).
    """
    try:
        os.link(side, path)
        return
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, me.encode())
    finally:
        os.close(fd)


def _unlink_quietly(path: str | os.PathLike[str]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def release(claim: str | os.PathLike[str] | Claim) -> None:
    """Remove a claim this process holds (missing is fine: released or broken already).

    Given the :class:`Claim`, a file that no longer carries our owner record is left alone:
    our claim was broken (age rule) and the file is now someone else's claim.
    """
    if isinstance(claim, Claim):
        path: str | os.PathLike[str] = claim.path
        if claim.owner is not None and read_owner(path) not in (claim.owner, None):
            return
    else:
        path = claim
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
