"""git's bundle format (v2; v3 read with ``@object-format=sha1``): a header of refs and prerequisites, then a pack.

The format (git's ``bundle.c`` and ``Documentation/gitformat-bundle.txt``)::

    # v2 git bundle\\n
    -<40 hex>[ <comment>]\\n        a prerequisite: a commit the receiving repository must already have
    <40 hex> <refname>\\n            a ref the bundle carries (in file order; HEAD may be one of them)
    \\n                              the header ends with an empty line
    PACK...                          a pack v2 whose objects complete the refs given the prerequisites

:func:`write_bundle` writes every object the refs reach and the prerequisites do not (``git bundle create
A..B``'s set, found as git finds it: store/backup/limit.py; prerequisites are commits, as git's, so an annotated
tag a previous backup carried is carried again), read through the repository's object directory
with its alternates (a pool member's bundle is complete on its own). The pack is the repack's: the reachability
walk (store/maintenance/walk/reach.py; C for a full bundle, the Python walk with ``known=`` for an incremental
one), then :func:`~..maintenance.repack.writeplan.write_plan` into the one pack writer (store/pack/write.py, with the
bundle header before the pack), so deltas are reused verbatim as a full repack reuses them. Durable: the temp
file (the writer's ``tmp_pack_*`` and its ``tmp_owner_*`` record, in the destination's directory: the leftovers
table's ``backup_tmp`` row) is flushed, renamed onto the destination, and the directory fsynced.

:func:`read_header` is bounded (a line longer than :data:`MAX_LINE` or more than :data:`MAX_LINES` lines is
refused); :func:`verify_bundle` checks the header, the pack's header and trailer SHA-1, and (given a
repository) that the prerequisites are present. Every refusal is a :class:`BundleFormatError` naming the file
and the offset.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Container, Sequence

from ..errors import BackupChainError, BundleFormatError, InvalidInputError
from ..faults import fault_point
from ..maintenance.repack.options import RepackCounters
from ..maintenance.repack.writeplan import write_plan
from ..maintenance.walk.reach import walk
from ..maintenance.walk.sources import SourceIndex
from ..objects import HEX_RE
from ..pack.format import PACK_SIGNATURE
from ..pack.write import PackWriter
from ..progress import Progress
from .limit import excluded_by_edges, peel_to_commit

SIGNATURE_V2 = b"# v2 git bundle\n"
SIGNATURE_V3 = b"# v3 git bundle\n"
#: The longest header line read (a ref name is at most a few KiB in practice).
MAX_LINE = 64 << 10
#: The most header lines read (refs plus prerequisites plus capabilities).
MAX_LINES = 4 << 20
READ_CHUNK = 1 << 20
#: The walk and the delta search fork a helper (as a repack's default).
PROCESSES = 2


@dataclass(frozen=True)
class BundleHeader:
    version: int
    prerequisites: tuple[bytes, ...]          # 20-byte ids
    refs: tuple[tuple[str, bytes], ...]       # (name, 20-byte id), file order
    pack_offset: int


@dataclass(frozen=True)
class BundleWritten:
    path: Path
    size: int
    sha256: str
    objects: int


# -- reading -----------------------------------------------------------------------------------------------

def _oid_hex(text: bytes, path: object, offset: int, what: str) -> bytes:
    try:
        s = text.decode("ascii")
    except UnicodeDecodeError:
        s = ""
    if not HEX_RE.match(s) or len(s) != 40:
        raise BundleFormatError(path, offset, f"{what}: {text[:60]!r} is not a 40-hex object id")
    return bytes.fromhex(s)


def read_header_from(f: BinaryIO, path: object) -> BundleHeader:
    """The header of the bundle open as ``f`` (read from its start; ``f`` is left at the pack)."""
    f.seek(0)
    offset = 0
    sig = f.readline(MAX_LINE + 1)
    if sig == SIGNATURE_V2:
        version = 2
    elif sig == SIGNATURE_V3:
        version = 3
    else:
        raise BundleFormatError(path, 0, f"does not start with a v2 or v3 bundle signature ({sig[:40]!r})")
    offset += len(sig)
    prereqs: list[bytes] = []
    refs: list[tuple[str, bytes]] = []
    for _ in range(MAX_LINES):
        line = f.readline(MAX_LINE + 1)
        if not line:
            raise BundleFormatError(path, offset, "the file ends inside the header (no empty line before the pack)")
        if not line.endswith(b"\n"):
            if len(line) > MAX_LINE:
                raise BundleFormatError(path, offset, f"header line longer than {MAX_LINE} bytes")
            raise BundleFormatError(path, offset, "the file ends inside a header line")
        start, offset = offset, offset + len(line)
        body = line[:-1].rstrip()
        if not body:
            if line != b"\n":
                raise BundleFormatError(path, start, "blank header line that is not the header's end")
            return BundleHeader(version, tuple(prereqs), tuple(refs), offset)
        if version == 3 and body.startswith(b"@"):
            if body != b"@object-format=sha1":
                raise BundleFormatError(path, start, f"unsupported capability {body[1:60]!r} "
                                                     "(only object-format=sha1, unfiltered, is read)")
            continue
        if body.startswith(b"-"):
            if len(body) > 41 and body[41:42] not in (b" ", b"\t"):   # (an optional comment: the subject)
                raise BundleFormatError(path, start, f"malformed prerequisite line {body[:60]!r}")
            prereqs.append(_oid_hex(body[1:41], path, start, "prerequisite"))
            continue
        hexid, sep, name = body.partition(b" ")
        if not sep or not name:
            raise BundleFormatError(path, start, f"malformed ref line {body[:60]!r} (expected '<id> <refname>')")
        oid = _oid_hex(hexid, path, start, "ref")
        try:
            refs.append((name.decode("utf-8"), oid))
        except UnicodeDecodeError:
            raise BundleFormatError(path, start, f"ref name {name[:60]!r} is not UTF-8") from None
    raise BundleFormatError(path, offset, f"header has more than {MAX_LINES} lines")


def read_header(path: str | os.PathLike[str]) -> BundleHeader:
    """The bundle's header (see the module docstring); BundleFormatError naming the file and offset."""
    try:
        with open(path, "rb") as f:
            return read_header_from(f, path)
    except OSError as err:
        raise BundleFormatError(path, None, f"cannot read the bundle: {err.strerror}") from err


def check_pack(path: str | os.PathLike[str], header: BundleHeader) -> tuple[int, bytes]:
    """(object count, trailer) of the bundle's pack after checking its header and its trailer SHA-1 (the
    whole pack is read once)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = header.pack_offset
            if size < start + 12 + 20:
                raise BundleFormatError(path, start, f"the pack is truncated ({size - start} bytes after the header)")
            f.seek(start)
            head = f.read(12)
            if head[:4] != PACK_SIGNATURE or int.from_bytes(head[4:8], "big") not in (2, 3):
                raise BundleFormatError(path, start, f"no pack v2 after the header ({head[:8]!r})")
            count = int.from_bytes(head[8:12], "big")
            h = hashlib.sha1(head)
            left = size - 20 - start - 12
            while left > 0:
                chunk = f.read(min(READ_CHUNK, left))
                if not chunk:
                    raise BundleFormatError(path, size - left, "the pack is truncated")
                h.update(chunk)
                left -= len(chunk)
            trailer = f.read(20)
    except OSError as err:
        raise BundleFormatError(path, None, f"cannot read the bundle: {err.strerror}") from err
    if h.digest() != trailer:
        raise BundleFormatError(path, size - 20, f"the pack's trailer {trailer.hex()} is not the SHA-1 of its "
                                                 f"bytes ({h.hexdigest()}): truncated or corrupt")
    return count, trailer


def verify_bundle(repo, path: str | os.PathLike[str]) -> BundleHeader:
    """The header, after checking that it parses, that the pack's trailer SHA-1 matches its bytes and (``repo``
    not None) that the repository has every prerequisite (else BackupChainError naming the file)."""
    header = read_header(path)
    check_pack(path, header)
    if repo is not None:
        missing = [p.hex() for p in header.prerequisites if not repo.objects.has(p)]
        if missing:
            raise BackupChainError(path, f"the repository lacks {len(missing)} prerequisite(s) of the bundle: "
                                         f"{', '.join(missing[:5])}")
    return header


# -- writing -----------------------------------------------------------------------------------------------

def encode_header(refs: Sequence[tuple[str, bytes]], prerequisites: Sequence[bytes]) -> bytes:
    out = [SIGNATURE_V2]
    out += [b"-" + p.hex().encode() + b"\n" for p in prerequisites]
    out += [oid.hex().encode() + b" " + name.encode() + b"\n" for name, oid in refs]
    out.append(b"\n")
    return b"".join(out)


def _check_refs(refs: Sequence[tuple[str, bytes]], prerequisites: Sequence[bytes]) -> None:
    for name, oid in refs:
        if not name or any(c in name for c in "\n\0 ") or len(oid) != 20:
            raise InvalidInputError(f"bundle ref {name!r} must be a name without spaces and a 20-byte id")
    for p in prerequisites:
        if len(p) != 20:
            raise InvalidInputError("a bundle prerequisite is a 20-byte id")


def _source_index(repo) -> SourceIndex:
    """Every pack of the repository and of its alternates as sources (none left out as borrowed or kept: the
    bundle must hold all it needs); loose objects from the snapshot, anything else by a fresh lookup."""
    snapshot = repo.objects.snapshot()
    packs = [*snapshot.packs, *(p for alt in snapshot.alternates for p in alt.packs)]
    return SourceIndex(snapshot, packs, [], read_fresh=repo.objects.read)


def write_bundle(repo, dest: Path, refs: Sequence[tuple[str, bytes]], prerequisites: Sequence[bytes], *,
                 progress: Progress | None = None) -> BundleWritten:
    """Write ``dest`` (a v2 bundle): ``refs`` (name, id) in that order, the ``prerequisites`` peeled to commits
    (tags followed; trees and blobs dropped), and a pack of every object the refs reach that the prerequisites
    do not. ObjectMissingError/CorruptObjectError (naming the object) when an object is missing or corrupt:
    nothing is left at ``dest`` then."""
    dest = Path(dest)
    refs = list(refs)
    _check_refs(refs, prerequisites)
    sources = _source_index(repo)
    writer: PackWriter | None = None
    try:
        commits: list[bytes] = []
        for p in prerequisites:
            c = peel_to_commit(sources, p)
            if c is not None and c not in commits:
                commits.append(c)
        tips = sorted({(name, oid) for name, oid in refs})
        if commits:
            known = excluded_by_edges(sources, commits, [oid for _name, oid in tips])
            if known is None:   # (too far into the history: what the prerequisites reach, exactly, walked in C)
                excluded = walk([(f"prerequisite {c.hex()}", c) for c in commits], sources.read, packs=sources,
                                processes=PROCESSES)
                known = _member_of(excluded.reached())
            reach = walk(tips, sources.read, known=known, progress=progress)
        else:
            reach = walk(tips, sources.read, packs=sources, processes=PROCESSES, progress=progress)
        ids = reach.ids()
        fault_point("backup.bundle.after_walk")
        writer = PackWriter(dest.parent, len(ids), header=encode_header(refs, commits), fault_prefix="backup.bundle")
        if ids:
            write_plan(writer, ids, sources, RepackCounters(), progress=progress, names=lambda: reach.names)
        writer.finish(index=False)
        digest = _sha256_of(writer.tmp_pack)
        writer.publish_as(dest)
        return BundleWritten(path=dest, size=writer.header_size + writer.size, sha256=digest, objects=len(ids))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        sources.release()


def _member_of(seen: Container[bytes]) -> Callable[[bytes], bool]:
    return lambda oid: oid in seen


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(READ_CHUNK):
                h.update(chunk)
    except OSError as err:
        raise BundleFormatError(path, None, f"cannot read the bundle back: {err.strerror}") from err
    return h.hexdigest()


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a whole file (what the manifest records of each bundle)."""
    return _sha256_of(Path(path))


__all__ = ["BundleHeader", "BundleWritten", "read_header", "read_header_from", "verify_bundle", "check_pack",
           "write_bundle", "encode_header", "sha256_of"]
