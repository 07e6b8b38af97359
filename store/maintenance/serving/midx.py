"""git's multi-pack-index (MIDX) v1: one sorted table of every object of many packs.

Format (git 2.39, ``Documentation/gitformat-pack.txt`` and ``midx.c``): a 12-byte header
(``MIDX``, version 1, hash version 1 = SHA-1, chunk count, 0 base files, pack count), a chunk
table of contents (id + 8-byte offset per chunk, then a 0 id with the end offset), the chunks,
and the SHA-1 of everything before it as trailer. Chunks, in git's order:

    PNAM  the packs' ``.idx`` names, NUL-terminated, sorted, padded to 4 bytes
    OIDF  256-entry fan-out of the object ids
    OIDL  the object ids, sorted
    OOFF  per object: pack-int-id (its pack's position in PNAM) and a 32-bit offset
    LOFF  8-byte offsets, only when some offset is >= 2^32 (then every offset >= 2^31 goes there)
    RIDX  the pseudo-pack order: MIDX positions sorted by (preferred pack first, pack-int-id, offset);
          git writes it with ``--bitmap``; packyard writes it whenever ``ridx=True``

One entry per object: the copy in the preferred pack, else in the pack with the newest mtime
(whole seconds, as git's ``p->mtime``), else the lowest pack-int-id (git breaks that last tie by
``readdir`` order; packyard by name, so outputs are identical whenever the mtimes decide).
The preferred pack is the one given; without one, a MIDX with RIDX prefers the non-empty pack
with the OLDEST mtime (git 2.39's rule, ``write_midx_internal``), and one without RIDX prefers none.

:func:`write_midx` builds it (and its bitmap, if asked), then installs it durably (store/install.py's
order): the claim ``multi-pack-index.lock`` (git's own lock name, so git's ``multi-pack-index write``
and packyard never write at once; held for the install only), temp files ``tmp_midx_<pid>_<host>-<rand>``
in ``objects/pack``, flush, a check that every pack it names is still installed, the current
``multi-pack-index`` hard-linked into ``objects/pack/preserved/`` (``preserve``: a reader on another NFS host
that has it mapped keeps its inode; store/maintenance/preserved/packs.py), rename to
``multi-pack-index``, then the bitmap's rename (never visible before its MIDX), removal of the MIDX
bitmaps / reverse indexes of older MIDXs (git's ``clear_midx_files_ext``; each kept in preserved/ first, as the
MIDX: git maps them too), directory fsync. Fault points:
``<prefix>.midx.after_flush``, ``.after_preserve``, ``.after_rename``, ``.after_bitmap_rename``, ``.after_fsync_dirs``.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterable, Sequence

from ... import durable, lockfile
from ...errors import InvalidInputError, PackFormatError, WriteFailedError
from ...faults import fault_point
from ...leftovers.table import MIDX_LOCK_NAME
from ...pack.idxread import IdxTables, _from_be, read_idx_tables

MIDX_NAME = "multi-pack-index"
LOCK_NAME = MIDX_LOCK_NAME   # (the leftovers table's name)
TMP_PREFIX = "tmp_midx_"
SIGNATURE = b"MIDX"
VERSION = 1
HASH_SHA1 = 1
HEADER_SIZE = 12
CHUNK_PNAM, CHUNK_OIDF, CHUNK_OIDL, CHUNK_OOFF, CHUNK_LOFF, CHUNK_RIDX = (
    b"PNAM", b"OIDF", b"OIDL", b"OOFF", b"LOFF", b"RIDX")
LARGE_OFFSET_NEEDED = 0x80000000
#: How long a repack waits for someone else's multi-pack-index.lock (git holds it for a write's duration).
LOCK_WAIT = 10.0
_LITTLE = sys.byteorder == "little"


def _be(typecode: str, values: Iterable[int]) -> bytes:
    arr = array(typecode, values)
    if _LITTLE:
        arr.byteswap()
    return arr.tobytes()


@dataclass(frozen=True)
class MidxPack:
    """One pack for a MIDX: its idx name (``pack-<sha>.idx``), its idx tables and its ``.pack`` mtime (s)."""

    idx_name: str
    tables: IdxTables
    mtime: int

    @classmethod
    def load(cls, pack_dir: Path, stem: str) -> "MidxPack":
        idx = Path(pack_dir) / f"{stem}.idx"
        try:
            mtime = int(os.stat(Path(pack_dir) / f"{stem}.pack").st_mtime)
        except FileNotFoundError as err:
            raise InvalidInputError(f"pack {stem} is not installed: no .pack", path=idx) from err
        return cls(f"{stem}.idx", read_idx_tables(idx), mtime)


def default_preferred(packs: Sequence[MidxPack]) -> str | None:
    """git 2.39's preferred pack when none is given and a reverse index is written: the oldest non-empty pack."""
    best: MidxPack | None = None
    for p in sorted(packs, key=lambda p: p.idx_name):
        if p.tables.count and (best is None or p.mtime < best.mtime):
            best = p
    return None if best is None else best.idx_name


def _stem(name: str) -> str:
    for ext in (".idx", ".pack"):
        if name.endswith(ext):
            return name[:-len(ext)]
    return name


def build_midx(packs: Sequence[MidxPack], *, preferred: str | None = None, ridx: bool = True) -> bytes:
    """The bytes of a MIDX over ``packs`` (git's layout and choices, see the module docstring).

    ``preferred``: a pack's name (``pack-<sha>``, with or without ``.idx``/``.pack``); None: git's default.
    """
    if not packs:
        raise InvalidInputError("a multi-pack-index needs at least one pack (git: no pack files to index)")
    packs = sorted(packs, key=lambda p: p.idx_name)
    names = [p.idx_name for p in packs]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"a pack is named twice: {names}")
    total = sum(p.tables.count for p in packs)
    if preferred is None and ridx and total:
        preferred = default_preferred(packs)
    pref = -1
    if preferred is not None:
        want = _stem(preferred)
        pref = next((i for i, n in enumerate(names) if _stem(n) == want), -1)
        if pref < 0:
            raise InvalidInputError(f"preferred pack {preferred} is not one of the packs indexed")
        if not packs[pref].tables.count:
            raise InvalidInputError(f"cannot select preferred pack {preferred} with no objects")
    if not total:
        ridx = False   # (git: no reverse index, no bitmap without objects)

    # One copy per object: the preferred pack's, else the newest pack's, else the lowest pack-int-id.
    # Every copy, packs in that priority order, sorted stably by id (timsort merges the packs' sorted runs):
    # the first of equal ids is the copy to keep.
    order = sorted(range(len(packs)), key=lambda i: (i != pref, -packs[i].mtime, i))
    every: list[bytes] = []
    every_pid = array("I")
    every_off = array("Q")
    for pid in order:
        t = packs[pid].tables
        o = t.oids
        every += [o[k:k + 20] for k in range(0, 20 * t.count, 20)]
        every_pid += array("I", [pid]) * t.count
        every_off += t.offsets
    keep: list[int] = []
    prev = b""
    for k in sorted(range(len(every)), key=every.__getitem__):
        oid = every[k]
        if oid != prev:
            keep.append(k)
            prev = oid
    ids = [every[k] for k in keep]
    pids = array("I", map(every_pid.__getitem__, keep))
    offs = array("Q", map(every_off.__getitem__, keep))
    n = len(ids)
    large_needed = bool(n) and max(offs) > 0xFFFFFFFF

    pnam = b"".join(name.encode() + b"\0" for name in names)
    pnam += b"\0" * (-len(pnam) % 4)
    oidl = b"".join(ids)
    firsts = oidl[0::20]   # (sorted: the fan-out is where each first byte ends)
    oidf = _be("I", (bisect_right(firsts, i) for i in range(256)))
    words = array("I", bytes(8 * n))
    words[0::2] = pids
    loff: list[int] = []
    if large_needed:
        small = []
        for off in offs:
            if off >> 31:
                small.append(LARGE_OFFSET_NEEDED | len(loff))
                loff.append(off)
            else:
                small.append(off)
        words[1::2] = array("I", small)
    else:
        words[1::2] = array("I", offs)
    if _LITTLE:
        words.byteswap()
    chunks = [(CHUNK_PNAM, pnam), (CHUNK_OIDF, oidf), (CHUNK_OIDL, oidl), (CHUNK_OOFF, words.tobytes())]
    if large_needed:
        chunks.append((CHUNK_LOFF, _be("Q", loff)))
    if ridx:
        chunks.append((CHUNK_RIDX, _be("I", pseudo_pack_order(pids, offs, pref))))

    out = bytearray(SIGNATURE + struct.pack(">BBBBI", VERSION, HASH_SHA1, len(chunks), 0, len(packs)))
    at = HEADER_SIZE + 12 * (len(chunks) + 1)
    for cid, body in chunks:
        out += cid + struct.pack(">Q", at)
        at += len(body)
    out += b"\0\0\0\0" + struct.pack(">Q", at)
    for _cid, body in chunks:
        out += body
    out += hashlib.sha1(out).digest()
    return bytes(out)


def pseudo_pack_order(pids: Sequence[int], offsets: Sequence[int], preferred: int) -> list[int]:
    """MIDX positions in pseudo-pack order (git's ``midx_pack_order``): the preferred pack's objects first,
    then by pack-int-id, each pack's by offset. ``pids``/``offsets``: each object's, in MIDX (id) order."""
    by_pack: dict[int, list[int]] = {}
    for i, pid in enumerate(pids):
        by_pack.setdefault(pid, []).append(i)
    ranks = sorted(by_pack, key=lambda pid: (pid != preferred, pid))
    out: list[int] = []
    for pid in ranks:
        out += sorted(by_pack[pid], key=offsets.__getitem__)
    return out


# -- reading ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Midx:
    """A parsed MIDX (its trailer checked)."""

    path: Path
    pack_names: tuple[str, ...]    # idx names, PNAM order (pack-int-id = position)
    oids: bytes                    # 20 bytes per object, sorted
    fanout: array
    pack_ids: array                # 'I' per object
    offsets: array                 # 'Q' per object
    ridx: array | None             # 'I' pseudo-pack order, or None
    checksum: bytes
    chunk_ids: tuple[bytes, ...]

    @property
    def count(self) -> int:
        return len(self.oids) // 20

    @property
    def pack_stems(self) -> tuple[str, ...]:
        return tuple(_stem(n) for n in self.pack_names)

    def find(self, oid: bytes) -> tuple[str, int] | None:
        """(pack stem, offset) of ``oid``, or None."""
        lo = self.fanout[oid[0] - 1] if oid[0] else 0
        hi = self.fanout[oid[0]]
        view = _OidView(self.oids)
        i = bisect_left(view, oid, lo, hi)
        if i < hi and view[i] == oid:
            return _stem(self.pack_names[self.pack_ids[i]]), self.offsets[i]
        return None


class _OidView:
    """``oids`` (20 bytes each) as a sequence for bisect."""

    def __init__(self, oids: bytes) -> None:
        self.oids = oids

    def __len__(self) -> int:
        return len(self.oids) // 20

    def __getitem__(self, i: int) -> bytes:
        return self.oids[20 * i:20 * i + 20]


def parse_midx(data: bytes, path: str | Path = MIDX_NAME) -> Midx:
    """Parse MIDX bytes; PackFormatError naming the file and offset of what is wrong."""
    if len(data) < HEADER_SIZE + 20:
        raise PackFormatError(f"multi-pack-index too small ({len(data)} bytes)", path=path, offset=0)
    if data[:4] != SIGNATURE:
        raise PackFormatError("multi-pack-index signature is not MIDX", path=path, offset=0)
    version, hash_v, n_chunks, n_base, n_packs = struct.unpack_from(">BBBBI", data, 4)
    if version != VERSION:
        raise PackFormatError(f"multi-pack-index version {version} not recognized", path=path, offset=4)
    if hash_v != HASH_SHA1:
        raise PackFormatError(f"multi-pack-index hash version {hash_v} is not SHA-1's", path=path, offset=5)
    if n_base:
        raise PackFormatError(f"multi-pack-index names {n_base} base files (git writes 0)", path=path, offset=7)
    if hashlib.sha1(memoryview(data)[:-20]).digest() != data[-20:]:
        raise PackFormatError("multi-pack-index checksum mismatch", path=path, offset=len(data) - 20)
    toc_end = HEADER_SIZE + 12 * (n_chunks + 1)
    if toc_end > len(data) - 20:
        raise PackFormatError("multi-pack-index chunk table runs past the file", path=path, offset=HEADER_SIZE)
    chunks: dict[bytes, tuple[int, int]] = {}
    ids = []
    for k in range(n_chunks):
        at = HEADER_SIZE + 12 * k
        cid = data[at:at + 4]
        start = struct.unpack_from(">Q", data, at + 4)[0]
        end = struct.unpack_from(">Q", data, at + 16)[0]
        if cid == b"\0\0\0\0" or not toc_end <= start <= end <= len(data) - 20:
            raise PackFormatError(f"multi-pack-index chunk {cid!r} has improper offsets {start}..{end}",
                                  path=path, offset=at)
        chunks[cid] = (start, end)
        ids.append(cid)
    for need in (CHUNK_PNAM, CHUNK_OIDF, CHUNK_OIDL, CHUNK_OOFF):
        if need not in chunks:
            raise PackFormatError(f"multi-pack-index missing required {need.decode()} chunk", path=path)

    def body(cid: bytes) -> bytes:
        s, e = chunks[cid]
        return data[s:e]

    names = [n.decode() for n in body(CHUNK_PNAM).split(b"\0")[:n_packs]]
    if len(names) != n_packs or any(not n for n in names) or names != sorted(names):
        raise PackFormatError(f"multi-pack-index pack names are not {n_packs} sorted names",
                              path=path, offset=chunks[CHUNK_PNAM][0])
    fanout = _from_be("I", body(CHUNK_OIDF))
    if len(fanout) != 256 or any(fanout[i] > fanout[i + 1] for i in range(255)):
        raise PackFormatError("multi-pack-index OID fanout is malformed", path=path, offset=chunks[CHUNK_OIDF][0])
    n = fanout[255]
    oids = body(CHUNK_OIDL)
    words = _from_be("I", body(CHUNK_OOFF))
    if len(oids) != 20 * n or len(words) != 2 * n:
        raise PackFormatError(f"multi-pack-index OID lookup / offsets do not hold {n} objects", path=path,
                              offset=chunks[CHUNK_OIDL][0])
    large = _from_be("Q", body(CHUNK_LOFF)) if CHUNK_LOFF in chunks else None
    pack_ids = array("I", words[0::2])
    offsets = array("Q", words[1::2])
    if large is not None:
        for i, v in enumerate(words[1::2]):
            if v & LARGE_OFFSET_NEEDED:
                k = v & 0x7FFFFFFF
                if k >= len(large):
                    raise PackFormatError(f"multi-pack-index names large offset #{k} of {len(large)}", path=path,
                                          offset=chunks[CHUNK_OOFF][0] + 8 * i + 4)
                offsets[i] = large[k]
    if n and max(pack_ids) >= n_packs:
        raise PackFormatError(f"multi-pack-index names pack-int-id {max(pack_ids)} of {n_packs}", path=path,
                              offset=chunks[CHUNK_OOFF][0])
    ridx = _from_be("I", body(CHUNK_RIDX)) if CHUNK_RIDX in chunks else None
    if ridx is not None and len(ridx) != n:
        raise PackFormatError(f"multi-pack-index RIDX holds {len(ridx)} of {n} objects", path=path,
                              offset=chunks[CHUNK_RIDX][0])
    return Midx(Path(path), tuple(names), oids, fanout, pack_ids, offsets, ridx, data[-20:], tuple(ids))


def read_midx(pack_dir: Path) -> Midx | None:
    """``objects/pack/multi-pack-index``, parsed; None if there is none."""
    path = Path(pack_dir) / MIDX_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return parse_midx(data, path)


def midx_pack_names(pack_dir: Path) -> tuple[str, ...] | None:
    """The pack stems the current MIDX names (reads only the header and PNAM), None without a MIDX.

    A MIDX git or packyard could not read counts as naming nothing: (), so it is rewritten."""
    path = Path(pack_dir) / MIDX_NAME
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE or head[:4] != SIGNATURE:
                return ()
            n_chunks, n_packs = head[6], struct.unpack_from(">I", head, 8)[0]
            toc = f.read(12 * (n_chunks + 1))
            for k in range(n_chunks):
                if toc[12 * k:12 * k + 4] == CHUNK_PNAM:
                    start = struct.unpack_from(">Q", toc, 12 * k + 4)[0]
                    end = struct.unpack_from(">Q", toc, 12 * k + 16)[0]
                    f.seek(start)
                    names = f.read(end - start).split(b"\0")[:n_packs]
                    return tuple(_stem(n.decode(errors="replace")) for n in names)
    except FileNotFoundError:
        return None
    except (OSError, struct.error):
        return ()
    return ()


# -- installing ------------------------------------------------------------------------------------

def midx_side_files(pack_dir: Path, keep_checksum: bytes | None = None) -> list[Path]:
    """``multi-pack-index-<hex>.{bitmap,rev}`` of MIDXs other than ``keep_checksum``'s (git clears them)."""
    keep = keep_checksum.hex() if keep_checksum is not None else None
    out = []
    try:
        with os.scandir(pack_dir) as it:
            for e in it:
                name = e.name
                if name.startswith(MIDX_NAME + "-") and name.endswith((".bitmap", ".rev")):
                    if keep is None or name.rsplit(".", 1)[0] != f"{MIDX_NAME}-{keep}":
                        out.append(Path(e.path))
    except FileNotFoundError:
        pass
    return sorted(out)


def _tmp_name() -> str:
    from ...owner import this_host_tag  # (the writers' temp naming: the leftovers rules know it)

    return f"{TMP_PREFIX}{os.getpid()}_{this_host_tag()}-{secrets.token_hex(4)}"


def write_midx(pack_dir: Path, stems: Iterable[str], *, preferred: str | None = None, ridx: bool = True,
               counters: durable.DurabilityCounters | None = None, fault_prefix: str = "midx",
               lock_wait: float = LOCK_WAIT, bitmap: Callable[[Midx], bytes | None] | None = None,
               preserve: bool = True, now: float | None = None) -> Midx:
    """Write and install ``objects/pack/multi-pack-index`` over the installed packs ``stems`` (durably,
    see the module docstring); returns it parsed. A pack that is not installed is refused (InvalidInputError).
    ``preserve``: the MIDX replaced is kept in ``objects/pack/preserved/`` for the preserve time (linked there
    right before the rename; False: not kept), its mtime set to ``now`` (the clock; None: the time).

    ``bitmap(midx)``: the bytes of its ``multi-pack-index-<checksum>.bitmap`` (None: none), installed right
    AFTER the MIDX it describes (flushed with it; fault point ``<prefix>.midx.after_bitmap_rename``)."""
    pack_dir = Path(pack_dir)
    counters = counters if counters is not None else durable.DurabilityCounters()
    stems = sorted(set(stems))
    # Built before the claim is taken (the bitmap may take minutes): the claim covers only the install.
    packs = [MidxPack.load(pack_dir, s) for s in stems]
    data = build_midx(packs, preferred=preferred, ridx=ridx)
    midx = parse_midx(data, pack_dir / MIDX_NAME)
    bitmap_data = bitmap(midx) if bitmap is not None else None
    claim = lockfile.acquire(pack_dir / LOCK_NAME, "multi-pack-index", wait=lock_wait)
    tmp = pack_dir / _tmp_name()
    tmp_bitmap = pack_dir / _tmp_name()
    try:
        _write_flushed(tmp, data, counters)
        if bitmap_data is not None:
            _write_flushed(tmp_bitmap, bitmap_data, counters)
        fault_point(f"{fault_prefix}.midx.after_flush")
        for s in stems:   # never name a pack that is not installed (idx and pack both there)
            if not ((pack_dir / f"{s}.idx").exists() and (pack_dir / f"{s}.pack").exists()):
                raise InvalidInputError(f"pack {s} vanished before the multi-pack-index naming it was installed",
                                        path=pack_dir / f"{s}.idx")
        if preserve:
            _preserve(pack_dir / MIDX_NAME, pack_dir, now)
            fault_point(f"{fault_prefix}.midx.after_preserve")
        durable.rename(tmp, pack_dir / MIDX_NAME, counters)
        fault_point(f"{fault_prefix}.midx.after_rename")
        if bitmap_data is not None:
            durable.rename(tmp_bitmap, pack_dir / f"{MIDX_NAME}-{midx.checksum.hex()}.bitmap", counters)
            fault_point(f"{fault_prefix}.midx.after_bitmap_rename")
        for side in midx_side_files(pack_dir, midx.checksum):
            _remove_side(side, pack_dir, preserve, now)
        durable.fsync_dir(pack_dir, counters)
        fault_point(f"{fault_prefix}.midx.after_fsync_dirs")
        return midx
    finally:
        durable.unlink_if_present(tmp)
        durable.unlink_if_present(tmp_bitmap)
        lockfile.release(claim)


def _write_flushed(path: Path, data: bytes, counters: durable.DurabilityCounters) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            durable.write_all(fd, data)
            durable.flush_file(fd, counters)
        finally:
            os.close(fd)
    except OSError as err:
        raise WriteFailedError(f"writing the multi-pack-index failed: {err.strerror}", errno=err.errno,
                               path=path) from err


def _preserve(path: Path, pack_dir: Path, now: float | None) -> None:
    """Link the MIDX (or an old MIDX's ``.bitmap``/``.rev``: git maps all three) into preserved/ before it goes."""
    from ...preserve import preserve_mapped

    preserve_mapped(path, pack_dir, now=now)


def _remove_side(side: Path, pack_dir: Path, preserve: bool, now: float | None) -> None:
    """Remove an old MIDX's ``.bitmap``/``.rev``, first kept in preserved/ as the MIDX is."""
    if preserve:
        _preserve(side, pack_dir, now)
    durable.unlink_if_present(side)


def remove_midx(pack_dir: Path, counters: durable.DurabilityCounters | None = None, *,
                lock_wait: float = LOCK_WAIT, preserve: bool = True, now: float | None = None) -> bool:
    """Remove the MIDX and its bitmaps / reverse indexes (git's ``clear_midx_file``), durably; True if one was there.
    ``preserve``: the MIDX is linked into ``objects/pack/preserved/`` first (as :func:`write_midx`)."""
    pack_dir = Path(pack_dir)
    claim = lockfile.acquire(pack_dir / LOCK_NAME, "multi-pack-index", wait=lock_wait)
    try:
        if preserve:
            _preserve(pack_dir / MIDX_NAME, pack_dir, now)
        had = durable.unlink_if_present(pack_dir / MIDX_NAME)
        for side in midx_side_files(pack_dir):
            _remove_side(side, pack_dir, preserve, now)
        if had:
            durable.fsync_dir(pack_dir, counters)
        return had
    finally:
        lockfile.release(claim)


__all__ = ["MIDX_NAME", "LOCK_NAME", "TMP_PREFIX", "Midx", "MidxPack", "build_midx", "parse_midx", "read_midx",
           "midx_pack_names", "write_midx", "remove_midx", "midx_side_files", "pseudo_pack_order",
           "default_preferred"]


# -- is the MIDX current? ----------------------------------------------------------------------------

def installed_stems(pack_dir: Path, names: Collection[str] | None = None) -> list[str]:
    """``pack-<sha>`` of every installed pack (both ``.idx`` and ``.pack`` present), sorted; ``names``: a listing
    of ``pack_dir`` the caller already made (none is made then)."""
    if names is None:
        try:
            with os.scandir(pack_dir) as it:
                names = {e.name for e in it}
        except FileNotFoundError:
            return []
    return sorted(n[:-4] for n in names if n.startswith("pack-") and n.endswith(".idx") and n[:-4] + ".pack" in names)


@dataclass(frozen=True)
class MidxStatus:
    """The MIDX against the installed packs: what it names that is gone, what it misses."""

    present: bool
    packs: int                        # installed packs
    gone: tuple[str, ...] = ()        # named by the MIDX, not installed
    missed: tuple[str, ...] = ()      # installed, not named

    @property
    def stale(self) -> bool:
        return self.present and bool(self.gone or self.missed)

    @property
    def wanted(self) -> bool:
        """A repack should (re)write it: missing over 2+ packs, or stale."""
        return self.stale or (not self.present and self.packs >= 2)

    def reason(self) -> str | None:
        if not self.present:
            return f"multi-pack-index missing over {self.packs} packs" if self.packs >= 2 else None
        parts = []
        if self.gone:
            parts.append(f"names {len(self.gone)} pack(s) that are gone")
        if self.missed:
            parts.append(f"misses {len(self.missed)} of {self.packs} installed packs")
        return "multi-pack-index stale: " + ", ".join(parts) if parts else None


def midx_status(pack_dir: Path, *, names: Collection[str] | None = None) -> MidxStatus:
    stems = installed_stems(pack_dir, names)
    named = midx_pack_names(pack_dir)
    if named is None:
        return MidxStatus(False, len(stems))
    have = set(stems)
    return MidxStatus(True, len(stems), tuple(sorted(set(named) - have)), tuple(sorted(have - set(named))))


__all__ += ["installed_stems", "MidxStatus", "midx_status"]
