"""Per-repository statistics for the maintenance planner, gathered cheaply: no object is read.

What it costs (a repository with P packs):

* one listing of ``objects/pack`` and, per pack, one ``stat`` and one 1,032-byte read of its
  ``.idx`` — the fan-out table's last entry is the object count, so the idx is not read whole;
* cruft packs (those with a ``.mtimes`` file, git's format) are read for their oldest mtime
  (4 bytes per object, once per cruft pack);
* the loose-object count is *estimated* from a fixed sample of fan-out directories, as
  ``git gc --auto`` does with ``objects/17`` — sixteen directories here, so one unlucky
  directory does not decide; the count is scaled by 256 / 16;
* one listing each of ``objects/`` (``incoming-*`` quarantines), ``objects/pack/preserved/``
  and ``objects/pack`` again for ``tmp_*`` files.

The repository's history (last repacks, ingests since) comes from the job records; the
worker layer reads it and hands it in as a :class:`RepackHistory`, so this module stays pure.
"""
from __future__ import annotations

import os
import struct
import sys
import time
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ... import leftovers
from ...errors import PackFormatError
from ...repo import find_git_dir
from ..serving.midx import MidxStatus, midx_status
from .poolstats import PoolStats, gather_pool_stats
from .servingstats import ServingStats, gather_serving_stats

#: Fan-out directories sampled for the loose-object estimate (00, 11, …, ff: spread over the id space).
SAMPLE_FANOUTS: tuple[str, ...] = tuple(f"{i:x}{i:x}" for i in range(16))
FANOUT_DIRS = 256
PRESERVED_DIR = "preserved"

_IDX_V2_MAGIC = b"\377tOc"
_MTIMES_MAGIC = b"MTME"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class PackInfo:
    """One installed pack, from its idx header and stat data."""

    name: str                 # pack-<sha>
    pack_bytes: int
    objects: int
    mtime: float
    keep: bool = False        # a .keep file: never repacked
    cruft: bool = False       # a .mtimes file: unreachable objects with their ages (git's cruft pack)
    cruft_oldest: float | None = None  # the oldest object mtime a cruft pack records
    bitmap: str | None = None  # reachability bitmap: "ok", "missing", or why it does not match (None: not looked at)

    @property
    def repackable(self) -> bool:
        """Counts toward pack limits and the geometric progression (git leaves out .keep and cruft packs)."""
        return not self.keep and not self.cruft


@dataclass(frozen=True)
class RepackHistory:
    """What the records know about a repository's maintenance (epoch seconds; None: never)."""

    last_full_repack_at: float | None = None
    last_repack_at: float | None = None
    ingests_since_repack: int = 0


@dataclass(frozen=True)
class RepoStats:
    """A repository at ``gathered_at``: packs, a loose estimate, leftovers, and its maintenance history."""

    path: str
    gathered_at: float
    packs: tuple[PackInfo, ...] = ()
    loose_sampled: int = 0                  # loose objects found in the sampled fan-out dirs
    loose_sample_dirs: int = len(SAMPLE_FANOUTS)
    # Leftovers the table of store/leftovers/ says go (the same finders as gc's):
    stale_tmp_objects: int = 0              # tmp_obj_* files in the sampled dirs (loose_tmp)
    stale_pack_temps: int = 0               # objects/pack/tmp_* files (pack_tmp)
    stale_quarantines: int = 0              # incoming-* quarantines (quarantine)
    preserved_at: tuple[float, ...] = ()    # when each preserved pack was moved aside
    history: RepackHistory = field(default_factory=RepackHistory)
    serving: ServingStats = field(default_factory=ServingStats)   # commit-graph and refs (servingstats.py)
    # multi-pack-index (issue 19): None when not gathered (the planner then has no opinion on it)
    midx: MidxStatus | None = None
    pool: PoolStats = field(default_factory=PoolStats)   # a pool, a member of one, or neither (poolstats.py)

    # -- derived, pure -----------------------------------------------------------------------
    @property
    def loose_estimate(self) -> int:
        if self.loose_sample_dirs <= 0:
            return 0
        return self.loose_sampled * FANOUT_DIRS // self.loose_sample_dirs

    @property
    def repackable_packs(self) -> tuple[PackInfo, ...]:
        return tuple(p for p in self.packs if p.repackable)

    @property
    def keep_packs(self) -> int:
        return sum(p.keep for p in self.packs)

    @property
    def cruft_packs(self) -> int:
        return sum(p.cruft for p in self.packs)

    @property
    def pack_bytes(self) -> int:
        return sum(p.pack_bytes for p in self.packs)

    @property
    def packed_objects(self) -> int:
        return sum(p.objects for p in self.packs)

    def packs_outside_progression(self, factor: int = 2) -> int:
        """How many packs ``git repack --geometric=<factor>`` would merge (see :func:`geometric_split`)."""
        return geometric_split([p.objects for p in self.repackable_packs], factor)

    def since(self, at: float | None) -> float | None:
        return None if at is None else max(0.0, self.gathered_at - at)

    def as_dict(self, factor: int = 2) -> dict[str, Any]:
        """A flat JSON-able summary (job rows, ``packyard status --repo``, metrics)."""
        h = self.history
        return {
            "packs": len(self.packs), "repackable_packs": len(self.repackable_packs),
            "keep_packs": self.keep_packs, "cruft_packs": self.cruft_packs,
            "pack_bytes": self.pack_bytes, "packed_objects": self.packed_objects,
            "packs_outside_progression": self.packs_outside_progression(factor),
            "loose_estimate": self.loose_estimate, "loose_sampled": self.loose_sampled,
            "loose_sample_dirs": self.loose_sample_dirs,
            "stale_tmp_objects": self.stale_tmp_objects, "stale_pack_temps": self.stale_pack_temps,
            "stale_quarantines": self.stale_quarantines, "preserved_packs": len(self.preserved_at),
            "since_full_repack": _round(self.since(h.last_full_repack_at)),
            "since_repack": _round(self.since(h.last_repack_at)),
            "ingests_since_repack": h.ingests_since_repack,
            **self.serving.as_dict(),
            **({} if self.midx is None else {"midx_present": self.midx.present, "midx_gone_packs": len(self.midx.gone),
                                              "midx_missed_packs": len(self.midx.missed)}),
            **self.pool.as_dict(),
        }

    def pack_table(self) -> list[dict[str, Any]]:
        return [asdict(p) for p in sorted(self.packs, key=lambda p: p.objects, reverse=True)]


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def geometric_split(weights: Sequence[int], factor: int = 2) -> int:
    """How many of the smallest packs must be merged so the rest form a geometric progression.

    git's ``split_pack_geometry`` (builtin/repack.c): sort the pack weights (object counts)
    ascending; from the largest down, find the first neighbour pair where the larger is
    less than ``factor`` times the smaller — everything up to and including that pair is
    merged; then roll forward while the next pack is smaller than ``factor`` times what is
    merged so far. 0: the packs already form the progression.
    """
    if factor < 1:
        raise ValueError(f"geometric factor must be >= 1, got {factor}")
    w = sorted(weights)
    i = len(w) - 1
    while i > 0:
        if w[i] < factor * w[i - 1]:
            break
        i -= 1
    split = i + 1 if i > 0 else 0
    total = sum(w[:split])
    for ours in w[split:]:
        if ours < factor * total:
            split += 1
            total += ours
        else:
            break
    return split


# -- gathering ------------------------------------------------------------------------------------

def idx_object_count(idx_path: str | os.PathLike[str]) -> int:
    """The object count of a pack index from its fan-out table's last entry (v1 and v2), one small read."""
    with open(idx_path, "rb") as f:
        head = f.read(8 + 256 * 4)
    if head[:4] == _IDX_V2_MAGIC:
        if len(head) < 8 + 256 * 4:
            raise PackFormatError("pack index shorter than its fan-out table", path=idx_path)
        version = struct.unpack(">I", head[4:8])[0]
        if version != 2:
            raise PackFormatError(f"unsupported pack index version {version}", path=idx_path, offset=4)
        return struct.unpack(">I", head[8 + 255 * 4:8 + 256 * 4])[0]
    if len(head) < 256 * 4:
        raise PackFormatError("pack index shorter than its fan-out table", path=idx_path)
    return struct.unpack(">I", head[255 * 4:256 * 4])[0]  # v1: the table starts at offset 0


def mtimes_oldest(mtimes_path: str | os.PathLike[str]) -> float | None:
    """The oldest object mtime a cruft pack's ``.mtimes`` records (git's format), None if it has none.

    Layout: 'MTME', version 1, hash id (1 SHA-1, 2 SHA-256), then one 4-byte big-endian
    mtime per object in index order, then the pack's and the file's own checksums.
    """
    with open(mtimes_path, "rb") as f:
        data = f.read()
    if len(data) < 12 or data[:4] != _MTIMES_MAGIC:
        raise PackFormatError("not a .mtimes file (bad magic)", path=mtimes_path)
    version, hash_id = struct.unpack(">II", data[4:12])
    if version != 1 or hash_id not in (1, 2):
        raise PackFormatError(f"unsupported .mtimes version {version} / hash id {hash_id}", path=mtimes_path,
                              offset=4)
    hash_len = 20 if hash_id == 1 else 32
    body = len(data) - 12 - 2 * hash_len
    if body < 0 or body % 4:
        raise PackFormatError("truncated .mtimes table", path=mtimes_path, offset=12)
    if body == 0:
        return None
    table = array("I")
    table.frombytes(data[12:12 + body])
    if sys.byteorder == "little":
        table.byteswap()
    return float(min(table))


def bitmap_state(pack_dir: Path, stem: str) -> str:
    """"ok" if ``<stem>.bitmap`` is a bitmap git 2.39 reads for this pack (signature, version 1, full-closure flag,
    the pack's checksum in its header), else why not (its header only: 32 bytes read)."""
    try:
        with open(pack_dir / f"{stem}.bitmap", "rb") as f:
            head = f.read(32)
    except FileNotFoundError:
        return "missing"
    if len(head) < 32 or head[:4] != b"BITM":
        return "not a bitmap file (no BITM header)"
    version, flags = struct.unpack_from(">HH", head, 4)
    if version != 1 or not flags & 1:
        return f"bitmap version {version}, flags {flags:#x}: not what git 2.39 reads"
    if head[12:32].hex() != stem[5:]:
        return f"bitmap names pack {head[12:32].hex()}"
    return "ok"


def _list(d: Path) -> frozenset[str] | None:
    """The names in ``d`` (None if it is missing): objects/pack is listed once for every statistic."""
    try:
        with os.scandir(d) as it:
            return frozenset(e.name for e in it)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _pack_infos(pack_dir: Path, names: frozenset[str] | None) -> tuple[PackInfo, ...]:
    if names is None:
        return ()
    infos = []
    for name in sorted(names):
        if not (name.startswith("pack-") and name.endswith(".idx")):
            continue
        stem = name[:-4]
        if stem + ".pack" not in names:
            continue  # an idx without its pack: not a usable pack (a writer renames the idx last)
        try:
            st = os.stat(pack_dir / (stem + ".pack"))
            count = idx_object_count(pack_dir / name)
        except FileNotFoundError:
            continue  # removed by a concurrent repack since the listing
        cruft = stem + ".mtimes" in names
        oldest = None
        if cruft:
            try:
                oldest = mtimes_oldest(pack_dir / (stem + ".mtimes"))
            except FileNotFoundError:
                cruft = False
            except PackFormatError:
                oldest = st.st_mtime  # unreadable table: the pack's own age is a safe lower bound
        infos.append(PackInfo(name=stem, pack_bytes=st.st_size, objects=count, mtime=st.st_mtime,
                              keep=stem + ".keep" in names, cruft=cruft, cruft_oldest=oldest,
                              bitmap=bitmap_state(pack_dir, stem) if stem + ".bitmap" in names else "missing"))
    return tuple(infos)


def _sample_loose(objects_dir: Path, sample: Sequence[str], now: float) -> tuple[int, int]:
    """(loose objects, removable tmp_obj_* files by the leftovers table) in the sampled fan-out directories."""
    loose = stale = 0
    for fan in sample:
        try:
            it = os.scandir(objects_dir / fan)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for entry in it:
                name = entry.name
                if len(name) == 38 and set(name) <= _HEX:
                    loose += 1
                elif name.startswith(leftovers.LOOSE_TMP_PREFIX):
                    try:
                        age = now - entry.stat(follow_symlinks=False).st_mtime
                    except FileNotFoundError:
                        continue
                    verdict = leftovers.loose_tmp_verdict(name, age)
                    stale += verdict is not None and verdict.removes
    return loose, stale


def preserved_packs(pack_dir: Path) -> dict[str, tuple[float, list[Path]]]:
    """``objects/pack/preserved/``: {pack stem: (when it was preserved, its files)}.

    A preserved pack's files are renamed there, which keeps their mtime but sets their ctime
    (on Linux a rename updates the inode's ctime): the later of the two is when it was moved.
    """
    out: dict[str, tuple[float, list[Path]]] = {}
    try:
        it = os.scandir(pack_dir / PRESERVED_DIR)
    except (FileNotFoundError, NotADirectoryError):
        return out
    with it:
        for e in it:
            if not e.name.startswith("pack-") or e.name.endswith(".old") or not e.is_file(follow_symlinks=False):
                continue
            stem = e.name.split(".", 1)[0]
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            at, files = out.get(stem, (0.0, []))
            files.append(Path(e.path))
            out[stem] = (max(at, st.st_mtime, st.st_ctime), files)
    return out


def gather_stats(repo_path: str | os.PathLike[str], *, history: RepackHistory | None = None,
                 now: float | None = None, sample: Sequence[str] = SAMPLE_FANOUTS,
                 roots: Sequence[Path] | None = None) -> RepoStats:
    """Statistics of the repository at ``repo_path`` (NotARepositoryError if it is not one). ``roots``: the
    storage roots inside which its pool, a pool's source and members may be read (None: none is)."""
    git_dir = find_git_dir(repo_path)
    now = time.time() if now is None else now
    objects_dir = git_dir / "objects"
    pack_dir = objects_dir / "pack"
    loose, stale_tmp = _sample_loose(objects_dir, sample, now)
    pack_names = _list(pack_dir)
    return RepoStats(
        path=str(git_dir), gathered_at=now, packs=_pack_infos(pack_dir, pack_names),
        loose_sampled=loose, loose_sample_dirs=len(sample), stale_tmp_objects=stale_tmp,
        stale_pack_temps=sum(f.count for f in leftovers.removable(leftovers.find_pack_temps(git_dir, now=now))),
        stale_quarantines=len(leftovers.removable(leftovers.find_quarantines(git_dir, now=now))),
        preserved_at=tuple(sorted(at for at, _ in preserved_packs(pack_dir).values())),
        history=history or RepackHistory(), serving=gather_serving_stats(git_dir),
        midx=midx_status(pack_dir, names=pack_names or ()), pool=gather_pool_stats(git_dir, roots=roots))
