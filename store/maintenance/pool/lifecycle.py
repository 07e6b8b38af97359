"""A fork network's life: create a pool, fetch into it, link a member, disconnect it, delete the pool.

Each step is ordered so that a kill at any point leaves the pool and every member complete (``git fsck
--full`` passes in each) -- the fault points between the steps are where the tests SIGKILL it -- and each can
run again after a kill (a redelivered job) and finish the work:

create (``create_pool``)
    1. ``git init --bare`` layout, then the marker ``packyard/pool`` (naming the source);
    2. :func:`fetch_into_pool` from the source. Killed between: an empty pool, which the next try fills.
fetch (``fetch_into_pool``)
    1. the source's refs are read; 2. the objects they reach that the pool lacks are copied in one pack
    (:mod:`.transfer`; fault points ``pool.fetch.after_*``); 3. the refs, under ``refs/virtual/<key>/``, in one
    transaction (a ref may name only installed objects). A source ref deleted since the last fetch stays in the
    pool's namespace (the pool keeps more, never less).
link (``link_member``)
    1. the member joins the pool's members file (from now on the pool's repack keeps what it reaches);
    2. the member's ``objects/info/alternates`` names the pool (relative path; temp, flush, rename, directory
    fsync); 3. the member's full repack drops every object the pool holds (``git repack -a -d -l``).
    Killed after 1: the pool keeps a little more; after 2: the member holds copies the next repack drops.
disconnect (``disconnect_member``)
    1. everything the member reaches that only the pool has is copied into the member (:mod:`.transfer`);
    2. the member's refs are read again and walked WITHOUT the pool: every object must be its own (else
    nothing is removed: ObjectMissingError); 3. the alternates file goes (unlink, directory fsync); 4. the
    member leaves the members file. The caller holds the member's repository lease across 1-3 (no ref moves
    between the check and the removal).
delete (``delete_pool``)
    refused while the members file (or the caller's records) names a member; the directory is renamed aside
    (``<name>.deleting-<random>``, one rename: no half-deleted pool is ever visible), then removed.

Lease order (workers): the pool's maintenance lease, then the member's -- never the other way -- so that no
two jobs deadlock.
"""
from __future__ import annotations

import enum
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ... import durable
from ...alternates import ALTERNATES
from ...errors import InvalidInputError, ObjectMissingError
from ...faults import fault_point
from ...lease import Lease, token_of
from ...lease import check as check_lease
from ...objdir import ObjectDirectory
from ...progress import Progress
from ...refs import RefUpdate
from ..repack.islands import IslandOptions
from ..repack.options import RepackOptions, RepackResult
from ..repack.run import repack
from ..walk.reach import walk
from ..walk.tips import read_tips
from .layout import (
    ISLAND_REGEX,
    fetch_key,
    is_pool,
    member_key,
    namespace,
    read_marker,
    read_members,
    source_key,
    write_marker,
    write_members,
)
from .members import members_reach
from .transfer import TransferResult, copy_missing


class PoolStep(enum.Enum):
    """What a lifecycle call did (a redelivered job that finds the work done says so)."""

    DONE = "done"
    ALREADY = "already"        # nothing left to do: the step had been completed before


@dataclass
class PoolResult:
    step: PoolStep = PoolStep.DONE
    copied: TransferResult | None = None
    refs_updated: int = 0
    repack: RepackResult | None = None
    counters: dict[str, int] = field(default_factory=dict)
    key: str | None = None        # create, fetch: the namespace key the refs were written under

    def as_counters(self) -> dict[str, object]:
        out: dict[str, object] = {"step": self.step.value, "refs_updated": self.refs_updated, **self.counters}
        if self.copied is not None:
            out.update(objects_copied=self.copied.objects, objects_reachable=self.copied.reachable,
                       bytes_copied=self.copied.bytes)
        if self.repack is not None:
            out.update({f"repack_{k}": v for k, v in self.repack.as_counters().items()
                        if isinstance(v, int) and not k.startswith(("elapsed_us_", "durability_"))})
        return out


def _refs_to_share(repo) -> dict[str, bytes]:
    """The refs a pool keeps for a member: every ref under refs/ but another pool's namespaces."""
    return {name: oid for name, oid in repo.refs.as_dict().items() if not name.startswith("refs/virtual/")}


def _repository(path: Path):
    from ...repo import Repository

    return Repository.open(path)


# -- create and fetch ----------------------------------------------------------------------------------------

def create_pool(pool_dir: Path, source, *, key: str | None = None, lease: Lease | None = None,
                progress: Progress | None = None) -> PoolResult:
    """A new pool at ``pool_dir`` holding ``source``'s objects and its refs under ``refs/virtual/<key>/``.
    Refused over a directory that is not empty and not this (perhaps half-made) pool."""
    from ...repo import Repository

    pool_dir = Path(pool_dir)
    if pool_dir.exists() and any(pool_dir.iterdir()):
        existing = Repository.open(pool_dir)
        if is_pool(existing.path):
            marker = read_marker(existing.path)
            if Path(marker.get("source", "")) != Path(source.path):
                raise InvalidInputError(f"a pool already exists here, made from {marker['source']}", path=pool_dir)
            if key is not None and source_key(marker) != key:
                raise InvalidInputError(f"a pool already exists here, made with the key {source_key(marker)!r}",
                                        path=pool_dir)
        elif existing.refs.as_dict() or existing.objects.snapshot().packs or any(existing.objects.iter_ids()):
            raise InvalidInputError("refusing to make a pool over a repository that has objects or refs",
                                    path=pool_dir)
    pool = Repository.init(pool_dir)
    if not is_pool(pool.path):
        write_marker(pool.path, source.path, key or member_key(source.path))
    fault_point("pool.create.after_marker")
    return fetch_into_pool(pool, source, key=key, lease=lease, progress=progress)


def fetch_into_pool(pool, source, *, key: str | None = None, lease: Lease | None = None,
                    progress: Progress | None = None) -> PoolResult:
    """Bring ``source``'s new objects into ``pool`` and set its refs under ``refs/virtual/<key>/`` (``key``:
    :func:`~.layout.fetch_key`: the key the pool was made with for its source, :func:`~.layout.member_key` of
    any other member)."""
    _require_pool(pool)
    used = fetch_key(pool.path, source.path, key)
    ns = namespace(used)
    tips = _refs_to_share(source)
    result = PoolResult(key=used)
    result.copied = copy_missing(tips, source, pool, progress=progress, lease=lease, fault_prefix="pool.fetch")
    fault_point("pool.fetch.after_copy")
    current = pool.refs.as_dict()
    updates = []
    for name, oid in sorted(tips.items()):
        target = ns + name.removeprefix("refs/")
        if current.get(target) != oid:
            updates.append(RefUpdate(target, current.get(target), oid))
    check_lease(lease)
    if updates:
        pool.refs.update(updates, fence_token=token_of(lease))
    result.refs_updated = len(updates)
    if not updates and not result.copied.objects:
        result.step = PoolStep.ALREADY
    return result


# -- link and disconnect -------------------------------------------------------------------------------------

def _require_pool(pool) -> None:
    if not is_pool(pool.path):
        raise InvalidInputError("not an object pool (no packyard/pool marker): only a pool may be linked to",
                                path=pool.path)


def _alternates_entry(member, pool) -> str:
    """The line a member's alternates file gets: the pool's objects directory relative to the member's (git
    resolves it against the member's objects dir), so the two can move together under one storage root."""
    return os.path.relpath(Path(pool.path) / "objects", Path(member.path) / "objects")


def link_member(member, pool, *, lease: Lease | None = None, repack_options: RepackOptions | None = None,
                progress: Progress | None = None) -> PoolResult:
    """Make ``member`` borrow from ``pool`` and drop the objects the pool holds (see the module docstring)."""
    _require_pool(pool)
    if Path(member.path) == Path(pool.path):
        raise InvalidInputError("a pool cannot be its own member", path=member.path)
    if is_pool(member.path):
        raise InvalidInputError("a pool cannot be a member of another pool", path=member.path)
    wanted = Path(pool.path) / "objects"
    others = [p for p in member.alternates.paths if p != wanted]
    if others:
        raise InvalidInputError(f"the repository already borrows from {others[0]}; disconnect it first",
                                path=Path(member.path) / "objects" / ALTERNATES)
    result = PoolResult()
    members = read_members(pool.path)
    already = Path(member.path) in members and member.alternates.paths == (wanted,)
    if Path(member.path) not in members:
        check_lease(lease)
        write_members(pool.path, [*members, Path(member.path)])
    fault_point("pool.link.after_members")
    if member.alternates.paths != (wanted,):
        check_lease(lease)
        _write_alternates(member, [_alternates_entry(member, pool)])
    fault_point("pool.link.after_alternates")
    linked = _repository(member.path)   # (opened again: it reads its new alternates now)
    result.repack = repack(linked, repack_options or RepackOptions(), progress=progress, lease=lease)
    if already and not result.repack.packs_deleted and not result.repack.counters.loose_deleted:
        result.step = PoolStep.ALREADY
    return result


def _write_alternates(member, entries: Sequence[str]) -> None:
    info = Path(member.path) / "objects" / "info"
    if not info.is_dir():
        info.mkdir()
        durable.fsync_dir(info.parent)
    for e in entries:
        if not e or "\n" in e or e.startswith(('"', "#")):
            raise InvalidInputError("an alternates entry git would misread unquoted", path=e)
    data = b"".join(e.encode("utf-8", "surrogateescape") + b"\n" for e in entries)
    durable.write_file_durably(info / "alternates", data, mode=0o644)


def disconnect_member(member, pool, *, lease: Lease | None = None, progress: Progress | None = None) -> PoolResult:
    """Copy back what ``member`` reaches only through ``pool``, check it needs nothing of the pool, and only then
    remove its alternates file and its membership (see the module docstring)."""
    result = PoolResult()
    wanted = Path(pool.path) / "objects"
    alternates = Path(member.path) / "objects" / ALTERNATES
    if member.alternates.paths:
        if member.alternates.paths != (wanted,):
            raise InvalidInputError(f"the repository borrows from {member.alternates.paths[0]}, not from this pool",
                                    path=alternates)
        result.copied = copy_missing(read_tips(member), pool, member, progress=progress, lease=lease,
                                     fault_prefix="pool.disconnect")
        fault_point("pool.disconnect.after_copy")
        check_lease(lease)
        _check_self_contained(member)
        fault_point("pool.disconnect.after_check")
        check_lease(lease)
        durable.unlink_if_present(alternates)
        durable.fsync_dir(alternates.parent)
        fault_point("pool.disconnect.after_alternates")
    else:
        result.step = PoolStep.ALREADY
    members = read_members(pool.path)
    if Path(member.path) in members:
        write_members(pool.path, [m for m in members if m != Path(member.path)])
        result.step = PoolStep.DONE
    return result


def _check_self_contained(member) -> None:
    """Every object the member's tips reach is its own (read with no alternate): else ObjectMissingError."""
    own = ObjectDirectory(Path(member.path) / "objects")
    tips = read_tips(member)
    try:
        walk(sorted(tips.items()), own.read)
    except ObjectMissingError as err:
        raise ObjectMissingError(f"after copying, the repository still needs its pool ({err.message}); "
                                 "its alternates file is kept", oid=err.oid, path=member.path) from err


# -- delete --------------------------------------------------------------------------------------------------

def delete_pool(pool, *, recorded_members: Sequence[Path] = (), lease: Lease | None = None) -> PoolResult:
    """Remove ``pool``; refused (InvalidInputError naming a member) while any repository is its member, by its
    own members file or by the caller's records."""
    _require_pool(pool)
    members = [*read_members(pool.path), *recorded_members]
    if members:
        raise InvalidInputError(f"the pool has {len(set(members))} member(s), e.g. {sorted(members)[0]}: "
                                "disconnect them first", path=pool.path)
    check_lease(lease)
    path = Path(pool.path)
    aside = path.with_name(f"{path.name}.deleting-{secrets.token_hex(4)}")
    os.rename(path, aside)
    durable.fsync_dir(path.parent)
    fault_point("pool.delete.after_rename")
    shutil.rmtree(aside)
    return PoolResult()


def repack_pool(pool, options: RepackOptions | None = None, *, progress: Progress | None = None,
                lease: Lease | None = None) -> RepackResult:
    """The pool's repack: a full one keeps, as young, everything its members reach (:mod:`.members`), and makes
    its deltas within delta islands, one per member namespace (``refs/virtual/<key>/``, as git's ``repack -adi``
    with ``pack.island=refs/virtual/([^/]+)/``), unless the options name other islands (options naming only a
    core island, ``pack.islandCore``, keep the member namespaces: the core is then a member's key).

    With the member namespaces and no core named, the core is the source's island (:func:`~.layout.source_key`),
    as a fork network's root is GitHub's ``pack.islandCore``: its objects are written first and its refs get
    bitmaps. Every fork reaches much of that history, so a clone's bitmap starts with whole words of it, which
    git sends with no per-object check (``reuse_partial_packfile_from_bitmap``); with the forks' newest commits
    first, as git's recency order puts them, every object is checked one by one."""
    import dataclasses

    _require_pool(pool)
    options = options or RepackOptions()
    islands = options.islands
    if islands is None or not islands.regexes:
        core = islands.core if islands is not None else None
        islands = IslandOptions((ISLAND_REGEX,), core=core if core is not None else source_key(read_marker(pool.path)))
    options = dataclasses.replace(options, keep_reached=lambda known: members_reach(Path(pool.path), known),
                                  islands=islands)
    return repack(pool, options, progress=progress, lease=lease)


__all__ = ["PoolResult", "PoolStep", "create_pool", "delete_pool", "disconnect_member", "fetch_into_pool",
           "link_member", "repack_pool"]
