"""Resolving deltas: the one resolver for every reader of complete packs.

* :func:`apply_delta_checked` applies one delta with every check git's index-pack makes
  (the base has the size the delta expects, the result size is possible for the delta's
  length before anything is allocated, the result has the size the delta says). index-pack's
  parallel resolver, the read path and the whole-pack walk below all apply deltas through it.
* :func:`resolve_all` resolves every entry of a pack depth-first from each base, holding only
  the current chain (``git index-pack``'s order of work): each entry is inflated once, every
  object is yielded with its id. REF_DELTA bases that are not in the pack (thin packs) come
  from ``read_external``. Used by unpack-objects and verification; index-pack runs the same
  walk over its own compact arrays, in forked processes.
* :func:`resolve_chain` resolves one object at an offset through its chain of bases,
  with the process-wide delta-base cache (:mod:`.cache`): the read path.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Iterator, Sequence

from dulwich._pack import apply_delta
from dulwich.errors import ApplyDeltaError

from ..errors import ObjectMissingError, PackFormatError
from ..objects import OFS_DELTA, REF_DELTA
from .cache import BASE_CACHE
from .entries import EntryHeader, inflate_at, read_header
from .format import decode_delta_header

#: A chain longer than this is refused (git's default --depth is 50; 10,000 means a cycle).
MAX_DELTA_CHAIN = 10_000
#: What git hashes before an object's bytes (then the size and a NUL), by pack type number.
TYPE_HEADER = {1: b"commit ", 2: b"tree ", 3: b"blob ", 4: b"tag "}


def apply_delta_checked(base: bytes, delta: bytes, *, path: object, offset: int | None) -> bytes:
    """``delta`` applied to ``base``; PackFormatError naming ``path``/``offset`` if it cannot be."""
    src_size, dst_size, _ = decode_delta_header(delta, path=path, offset=offset)
    if src_size != len(base):
        raise PackFormatError(f"delta expects a {src_size}-byte base, base has {len(base)} bytes",
                              path=path, offset=offset)
    # Every delta opcode byte yields at most max(127, len(base)) bytes: refuse impossible sizes
    # before the C code allocates them.
    if dst_size > len(delta) * max(127, len(base)):
        raise PackFormatError(f"delta result size {dst_size} is impossible for this delta", path=path,
                              offset=offset)
    try:
        chunks = apply_delta(base, delta)
    except ApplyDeltaError as err:
        raise PackFormatError(f"delta does not apply (result size mismatch or bad opcode): {err}",
                              path=path, offset=offset) from err
    obj = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if len(obj) != dst_size:
        raise PackFormatError(f"delta result has {len(obj)} bytes, delta header says {dst_size}",
                              path=path, offset=offset)
    return obj


def object_id(type_num: int, data: bytes) -> bytes:
    h = hashlib.sha1(TYPE_HEADER[type_num])
    h.update(b"%d\0" % len(data))
    h.update(data)
    return h.digest()


def resolve_chain(buf, offset: int, *, end: int, path: object, cache_key: str | None,
                  find_offset: Callable[[bytes], int | None],
                  resolve_ref: Callable[[bytes], tuple[int, bytes]] | None = None) -> tuple[int, bytes]:
    """(type, data) of the object at ``offset`` in the pack ``buf``, its delta chain resolved.

    Walks down the chain until a whole object or a cached one, then applies the deltas
    back up, caching each result under ``cache_key`` (the pack's name; None: no cache).
    ``find_offset(oid)`` locates REF_DELTA bases in this pack; ``resolve_ref(oid)`` resolves
    those outside it (thin packs in quarantine only).
    """
    cache = BASE_CACHE if cache_key is not None else None
    key = cache_key or ""     # only used with a cache
    if cache is not None:
        hit = cache.get(key, offset)
        if hit is not None:
            return hit
    chain: list[tuple[int, bytes]] = []  # (offset, delta), outermost first
    cur = offset
    while True:
        if len(chain) > MAX_DELTA_CHAIN:
            raise PackFormatError("delta chain too long (cycle?)", path=path, offset=offset)
        if cache is not None and cur != offset:
            hit = cache.get(key, cur)
            if hit is not None:
                base = hit
                break
        header = read_header(buf, cur, end=end, path=path)
        data, _ = inflate_at(buf, header, end=end, path=path)
        if header.type == OFS_DELTA:
            chain.append((cur, data))
            cur = header.base_offset
        elif header.type == REF_DELTA:
            chain.append((cur, data))
            base_off = find_offset(header.base_oid)
            if base_off is None:
                if resolve_ref is None:
                    raise PackFormatError(f"REF_DELTA base {header.base_oid.hex()} is not in the pack", path=path,
                                          offset=cur)
                btype, bdata = resolve_ref(header.base_oid)
                base = (int(btype), bdata)
                break
            cur = base_off
        else:
            base = (header.type, data)
            if cache is not None:
                cache.put(key, cur, header.type, data)
            break
    type_num, data = base
    for off, delta in reversed(chain):
        data = apply_delta_checked(data, delta, path=path, offset=off)
        if cache is not None:
            cache.put(key, off, type_num, data)
    return type_num, data


def resolve_all(buf, headers: Sequence[EntryHeader], *, end: int, path: object,
                read_external: Callable[[bytes], tuple[int, bytes]] | None = None,
                check_layout: bool = False) -> Iterator[tuple[EntryHeader, int, bytes, bytes]]:
    """Every entry of a pack resolved: yields (header, object type, data, object id).

    Whole objects come first in pack order, each followed depth-first by the deltas built on
    it; then deltas on bases outside the pack (``read_external``, in order of first use). A
    delta that cannot be reached raises PackFormatError naming its offset (an OFS base that
    is not an entry; a REF base neither in the pack nor readable). With ``check_layout``
    (``headers`` are every entry, in pack order) each zlib stream must end exactly where the
    next entry (or the trailer) starts.
    """
    nexts = [h.offset for h in headers[1:]] + [end] if check_layout else None
    by_offset: dict[int, list[int]] = {}
    by_oid: dict[bytes, list[int]] = {}
    for i, h in enumerate(headers):
        if h.type == OFS_DELTA:
            by_offset.setdefault(h.base_offset, []).append(i)
        elif h.type == REF_DELTA:
            by_oid.setdefault(h.base_oid, []).append(i)
    done = bytearray(len(headers))

    def inflate(i: int) -> bytes:
        data, stop = inflate_at(buf, headers[i], end=end, path=path)
        if nexts is not None and stop != nexts[i]:
            raise PackFormatError(f"entry's zlib stream ends at {stop}, the next entry starts at {nexts[i]}",
                                  path=path, offset=headers[i].offset)
        return data

    def subtree(root_type: int, root_data: bytes, root_offset: int | None, root_oid: bytes):
        """Deltas below one base, depth-first; only the current chain of bases is held."""
        stack = [(root_data, _kids(root_offset, root_oid))]
        while stack:
            base, kids = stack[-1]
            if not kids:
                stack.pop()
                continue
            ch = kids.pop()
            if done[ch]:
                raise PackFormatError("delta reached twice (duplicate base object in the pack?)", path=path,
                                      offset=headers[ch].offset)
            done[ch] = 1
            h = headers[ch]
            data = apply_delta_checked(base, inflate(ch), path=path, offset=h.offset)
            oid = object_id(root_type, data)
            yield h, root_type, data, oid
            stack.append((data, _kids(h.offset, oid)))

    def _kids(offset: int | None, oid: bytes) -> list[int]:
        kids = list(by_offset.get(offset, ())) if offset is not None else []
        if by_oid:
            kids.extend(by_oid.get(oid, ()))
        kids.reverse()  # popped from the end: pack order
        return kids

    for i, h in enumerate(headers):
        if h.type == OFS_DELTA or h.type == REF_DELTA:
            continue
        done[i] = 1
        data = inflate(i)
        oid = object_id(h.type, data)
        yield h, h.type, data, oid
        if h.offset in by_offset or oid in by_oid:
            yield from subtree(h.type, data, h.offset, oid)
    # Deltas whose base is not a whole object of this pack (thin packs, or broken ones). A REF base
    # may be produced by another external base's subtree: retry until a round makes no progress.
    pending = [i for i in range(len(headers)) if not done[i]]
    while pending:
        missing: list[int] = []
        for i in pending:
            h = headers[i]
            if done[i]:
                continue
            if h.type == OFS_DELTA:
                raise PackFormatError("ofs-delta base is not an object in this pack", path=path, offset=h.offset)
            try:
                if read_external is None:
                    raise ObjectMissingError("not looked up", oid=h.base_oid)
                btype, bdata = read_external(h.base_oid)
            except ObjectMissingError:
                missing.append(i)
                continue
            yield from subtree(int(btype), bdata, None, h.base_oid)
        if len(missing) == len(pending):
            h = headers[missing[0]]
            raise PackFormatError("ref-delta base is neither in the pack nor in the repository", oid=h.base_oid,
                                  path=path, offset=h.offset)
        pending = missing

__all__ = ["apply_delta_checked", "object_id", "resolve_chain", "resolve_all", "MAX_DELTA_CHAIN"]
