"""verify_repository: every object checked (hash, parse), then connectivity from the refs.

With alternates (a fork and its pool), the alternates' packs and loose objects are checked too and
count toward connectivity, as ``git fsck --full`` checks "the ones found in alternate object pools";
an alternates entry git would skip (a directory that does not exist, nesting too deep) fails the
verification, naming the alternates file.

Packs are walked delta-chain by delta-chain by the one resolver (:mod:`.pack.resolve`), so
each object is resolved once (as ``git index-pack --verify`` does), rather than resolving
chains per object; every zlib stream must end exactly where the next entry starts.
"""
from __future__ import annotations

import os
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import CorruptObjectError, ObjectMissingError, PackFormatError, StoreError
from .objects import ObjectType
from .pack.entries import read_header
from .pack.format import PACK_HEADER_SIZE, parse_pack_header
from .pack.resolve import resolve_all
from .parse import object_links
from .progress import Progress
from .repo import Repository


@dataclass
class VerifyReport:
    objects: int = 0          # reachable objects
    commits: int = 0
    trees: int = 0
    blobs: int = 0
    tags: int = 0
    bytes: int = 0            # total inflated size of reachable objects
    refs: int = 0
    packs: int = 0
    packed_objects: int = 0   # objects checked in packs (reachable or not)
    loose_objects: int = 0    # loose objects checked
    unreachable: int = 0
    pack_rescans: int = 0
    alternates: int = 0       # alternate object directories (the pool) read
    alternate_objects: int = 0  # of the objects checked, those in the alternates

    def as_counters(self) -> dict[str, int]:
        return asdict(self)


_TYPE_FIELD = {ObjectType.COMMIT: "commits", ObjectType.TREE: "trees",
               ObjectType.BLOB: "blobs", ObjectType.TAG: "tags"}


class _Tick:
    """Calls progress at most ~200 times per phase."""

    def __init__(self, progress: Progress | None, phase: str, total: int | None) -> None:
        self.progress, self.phase, self.total = progress, phase, total
        self.step = max(1, (total or 0) // 200) if total else 1000
        self.done = 0
        if progress:
            progress(phase, 0, total)

    def add(self, n: int = 1) -> None:
        self.done += n
        if self.progress and (self.done % self.step == 0 or self.done == self.total):
            self.progress(self.phase, self.done, self.total)

    def finish(self) -> None:
        if self.progress:
            self.progress(self.phase, self.done, self.total)


def verify_repository(path: "str | os.PathLike[str] | Repository", progress: Progress | None = None) -> VerifyReport:
    """Check every object and that everything reachable from the refs is present (``path``: a path, or a
    repository already opened, e.g. with its alternates confined).

    Raises the first problem found (NotARepositoryError, CorruptObjectError,
    PackFormatError, ObjectMissingError) with the partial report attached as
    ``err.report``. Reads only; never writes to the repository.
    """
    report = VerifyReport()
    try:
        repo = path if isinstance(path, Repository) else Repository.open(path)
        return _verify(repo, report, progress)
    except StoreError as err:
        err.report = report  # type: ignore[attr-defined]
        raise


def _verify(repo: Repository, report: VerifyReport, progress: Progress | None) -> VerifyReport:
    refs = repo.refs.as_dict()
    head = repo.refs.resolve("HEAD")
    report.refs = len(refs)
    for problem in repo.alternates.problems:
        raise CorruptObjectError(f"alternates: {problem}", path=repo.objects.path / "info" / "alternates")
    report.alternates = len(repo.alternates.alternates)
    _orphaned_idx_files(repo.objects.packs.path)
    snap = repo.objects.snapshot()
    report.packs = len(snap.packs)
    # oid -> (type, size, links as bytes: 20-byte oid + 1 type byte per link)
    known: dict[bytes, tuple[int, int, bytes]] = {}

    # This repository's own objects, then each alternate's (git fsck --full checks the pools too).
    for where, own in ((snap, True), *((alt, False) for alt in snap.alternates)):
        before = len(known)
        _verify_objects(where, known, report, progress, own)
        if not own:
            report.alternate_objects += len(known) - before

    tips = list(refs.items())
    if head is not None:
        tips.append(("HEAD", head))
    _connectivity(repo, known, tips, report, progress)
    report.unreachable = len(known) - report.objects
    report.pack_rescans = repo.objects.packs.rescans
    return report


def _verify_objects(snap, known: dict, report: VerifyReport, progress: Progress | None, own: bool) -> None:
    """Every pack and loose object one snapshot lists (the repository's own, or one alternate's)."""
    if not own:
        _orphaned_idx_files(snap.loose.path / "pack")
    total_packed = sum(len(p) for p in snap.packs)
    where = "" if own else f" in {snap.loose.path}"
    tick = _Tick(progress, f"checking packed objects{where}", total_packed)
    for pack in snap.packs:
        try:
            _verify_pack(pack, known, report, tick)
        except OSError as err:   # removed since the listing (a concurrent repack), or unreadable: name the file
            raise PackFormatError(f"pack cannot be read: {err.strerror or err}", path=err.filename or pack.pack_path,
                                  offset=None) from err
    tick.finish()

    loose_ids = [oid for oid in snap.loose_ids if oid not in known]
    tick = _Tick(progress, f"checking loose objects{where}", len(loose_ids))
    for oid in loose_ids:
        obj_type, data = snap.loose.read(oid, verify=True)
        known[oid] = (int(obj_type), len(data), _pack_links(obj_type, data, oid, snap.loose.path_for(oid)))
        report.loose_objects += 1
        tick.add()
    tick.finish()


def _orphaned_idx_files(pack_dir: Path) -> None:
    """A ``pack-*.idx`` without its ``.pack`` fails verification, naming the missing file. Readers (git's and
    ours) treat it as absent; it is what an interrupted ``git repack``/``gc`` leaves (git unlinks the .pack
    first), and the janitor removes it after its age rule (store/leftovers/passes.py)."""
    try:
        names = set(os.listdir(pack_dir))
    except FileNotFoundError:
        return
    for name in sorted(names):
        if name.startswith("pack-") and name.endswith(".idx") and f"{name[:-4]}.pack" not in names:
            raise PackFormatError(f"pack index without its pack: {name[:-4]}.pack is missing (readers ignore "
                                  "the idx; the janitor removes it once stale)", path=pack_dir / f"{name[:-4]}.pack")


def _pack_links(obj_type, data: bytes, oid: bytes, where) -> bytes:
    try:
        links = object_links(obj_type, data, oid)
    except CorruptObjectError as err:
        raise CorruptObjectError(f"object does not parse: {err.message}", oid=oid, path=where) from err
    return b"".join(link + bytes((int(t),)) for link, t in links)


def _verify_pack(pack, known: dict, report: VerifyReport, tick: _Tick) -> None:
    """Every entry of ``pack`` resolved once (the one resolver, chain by chain) and checked against its idx."""
    pack.verify_checksums()
    tables = pack.tables()
    names = {tables.offsets[i]: tables.oid(i) for i in range(tables.count)}
    buf = pack.buffer()
    end = pack.end
    _version, count = parse_pack_header(buf[:PACK_HEADER_SIZE], path=pack.pack_path)
    if count != tables.count:
        raise PackFormatError(f"pack header declares {count} objects, its idx lists {tables.count}",
                              path=pack.pack_path, offset=8)
    headers = [read_header(buf, off, end=end, path=pack.pack_path) for off in sorted(names)]
    if headers and headers[0].offset != PACK_HEADER_SIZE:
        raise PackFormatError("the first entry does not follow the pack header", path=pack.pack_path,
                              offset=PACK_HEADER_SIZE)
    for h, obj_type, data, oid in resolve_all(buf, headers, end=end, path=pack.pack_path, check_layout=True):
        expected = names.pop(h.offset)
        if expected != oid:
            raise CorruptObjectError(f"packed object hashes to {oid.hex()}, idx names it {expected.hex()}",
                                     oid=expected, path=pack.pack_path, offset=h.offset)
        known[oid] = (obj_type, len(data), _pack_links(obj_type, data, oid, pack.pack_path))
        report.packed_objects += 1
        tick.add()
    if names:
        offset, oid = next(iter(names.items()))
        raise PackFormatError(f"idx lists {len(names)} objects the pack does not resolve", oid=oid,
                              path=pack.idx_path, offset=offset)


def _connectivity(repo: Repository, known: dict, tips, report: VerifyReport, progress: Progress | None) -> None:
    # The number of reachable objects is only known at the end; the bar is open-ended.
    tick = _Tick(progress, "checking connectivity", None)
    seen: set[bytes] = set()
    queue: deque[tuple[bytes, int | None, str]] = deque((oid, None, name) for name, oid in tips)
    while queue:
        oid, want_type, referrer = queue.popleft()
        if oid in seen:
            continue
        info = known.get(oid)
        if info is None:
            # Not in our snapshot: a concurrent write may have added it. The normal
            # read path re-lists the pack directory once before declaring it missing.
            try:
                read_type, data = repo.objects.read(oid, verify=True)
            except ObjectMissingError as err:
                raise ObjectMissingError(f"reachable object is missing (referenced by {referrer})",
                                         oid=oid, path=repo.path) from err
            info = (int(read_type), len(data), _pack_links(read_type, data, oid, repo.path))
            known[oid] = info
        obj_type, size, links = info
        if want_type is not None and obj_type != want_type:
            raise CorruptObjectError(f"object is a {ObjectType(obj_type).label.decode()} but {referrer} "
                                     f"refers to it as a {ObjectType(want_type).label.decode()}",
                                     oid=oid, path=repo.path)
        seen.add(oid)
        report.objects += 1
        report.bytes += size
        setattr(report, _TYPE_FIELD[ObjectType(obj_type)], getattr(report, _TYPE_FIELD[ObjectType(obj_type)]) + 1)
        for i in range(0, len(links), 21):
            child = links[i:i + 20]
            if child not in seen:
                queue.append((child, links[i + 20], oid.hex()))
        tick.add()
    tick.finish()


