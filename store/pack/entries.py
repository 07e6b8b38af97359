"""Reading pack entries: the one entry reader for pack bytes held in memory or mapped from a file.

Every consumer of a complete pack's bytes reads entries here: the read path
(:class:`~.packdir.PackFile`), unpack-objects (:mod:`.unpack`), verification
(:mod:`packyard.store.verify`) and repack's write plan (:mod:`packyard.store.maintenance.repack.writeplan`:
the headers of its reused entries; their bytes are copied, not inflated, and its C fast paths decode
headers in C, ``_walk_packs.c``).
index-pack's receive loop parses a *stream* arriving in chunks; it decodes each header
with the same :func:`~.format.decode_entry_header`.

* :func:`read_header` — an entry's header (type, size, delta base, where its zlib data starts);
  :func:`header_fields` the same as a tuple, :func:`entry_type` just the type (from the first byte);
* :func:`inflate_at` — the entry's zlib stream inflated, bounded by the declared size
  (nothing is allocated from a header: at most ``size + 1`` bytes come out), returning
  where the stream ends, which is where the next entry starts;
* :func:`iter_entries` — every entry in pack order, each inflated once.

Errors are :class:`PackFormatError` naming the file and the entry's offset.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterator

from ..errors import PackFormatError
from .format import PACK_HEADER_SIZE, PACK_TRAILER_SIZE, decode_entry_header

#: Output bound per decompress call (max_length must fit a C ssize_t; large objects loop).
INFLATE_LIMIT = 1 << 30


@dataclass(frozen=True, slots=True)
class EntryHeader:
    offset: int                   # where the entry starts
    type: int                     # pack type: 1-4 objects, 6 OFS_DELTA, 7 REF_DELTA
    size: int                     # declared inflated size (object, or delta instructions)
    base: int | bytes | None      # OFS_DELTA: base offset; REF_DELTA: base id; else None
    data_offset: int              # where the zlib stream starts

    @property
    def is_delta(self) -> bool:
        return self.base is not None

    @property
    def base_offset(self) -> int:
        """An OFS_DELTA's base offset."""
        assert isinstance(self.base, int), "not an OFS_DELTA entry"
        return self.base

    @property
    def base_oid(self) -> bytes:
        """A REF_DELTA's base object id."""
        assert isinstance(self.base, bytes), "not a REF_DELTA entry"
        return self.base


def read_header(buf, offset: int, *, end: int, path: object) -> EntryHeader:
    """The header of the entry at ``offset``; ``end`` is where entries stop (the trailer)."""
    return EntryHeader(offset, *header_fields(buf, offset, end=end, path=path))


def header_fields(buf, offset: int, *, end: int, path: object) -> tuple[int, int, int | bytes | None, int]:
    """:func:`read_header` as a tuple: (type, size, base, data_offset), the same checks and errors. For
    loops over every entry of a repack's input (writeplan.py), where an EntryHeader per entry costs time."""
    if offset < PACK_HEADER_SIZE or offset >= end:
        raise PackFormatError("entry offset outside the pack", path=path, offset=offset)
    return decode_entry_header(buf, offset, end, offset, path)


def entry_type(buf, offset: int) -> int:
    """The pack type of the entry at ``offset`` (1-4 objects, 6 OFS_DELTA, 7 REF_DELTA) from its first byte
    alone, without decoding the rest of the header: "is it a delta?" for an offset an idx gave."""
    return (buf[offset] >> 4) & 7


def _bound(size: int) -> int:
    # zlib's deflateBound() plus room for the stream header and a little slack: any stream zlib
    # wrote for ``size`` bytes fits, so the one-call fast path below almost always ends the stream.
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 64


def inflate_at(buf, header: EntryHeader, *, end: int, path: object) -> tuple[bytes, int]:
    """Inflate the entry's data: (exactly ``header.size`` bytes, offset where its zlib stream ends)."""
    size = header.size
    pos = header.data_offset
    offset = header.offset
    view = memoryview(buf)
    try:
        d = zlib.decompressobj()
        if size < INFLATE_LIMIT:
            stop = min(end, pos + _bound(size))
            out = d.decompress(view[pos:stop], size + 1)
            if d.eof:
                if len(out) != size:
                    raise PackFormatError(f"entry inflates to {len(out)} bytes, header says {size}",
                                          path=path, offset=offset)
                return out, stop - len(d.unused_data)
            if len(out) > size:
                raise PackFormatError(f"entry inflates to more than the {size} bytes its header says",
                                      path=path, offset=offset)
            d = zlib.decompressobj()  # a stream longer than zlib would write: take the careful way
        return _inflate_pieces(d, view, header, end, path)
    except zlib.error as err:
        raise PackFormatError(f"entry does not inflate: {err}", path=path, offset=offset) from err
    finally:
        view.release()


def _inflate_pieces(d, view: memoryview, header: EntryHeader, end: int, path: object) -> tuple[bytes, int]:
    size = header.size
    pos = header.data_offset
    pieces = []
    got = 0
    while not d.eof:
        if pos >= end:
            raise PackFormatError("zlib stream runs past the end of the pack data", path=path, offset=header.offset)
        chunk = view[pos:min(pos + (1 << 20), end)]
        piece = d.decompress(chunk, min(size + 1 - got, INFLATE_LIMIT))
        got += len(piece)
        if got > size:
            raise PackFormatError(f"entry inflates to more than the {size} bytes its header says",
                                  path=path, offset=header.offset)
        pieces.append(piece)
        while d.unconsumed_tail and not d.eof:  # output bound (INFLATE_LIMIT) reached inside this chunk
            piece = d.decompress(d.unconsumed_tail, min(size + 1 - got, INFLATE_LIMIT))
            got += len(piece)
            if got > size:
                raise PackFormatError(f"entry inflates to more than the {size} bytes its header says",
                                      path=path, offset=header.offset)
            pieces.append(piece)
        pos += len(chunk) - len(d.unconsumed_tail) - len(d.unused_data)
    data = b"".join(pieces)
    if len(data) != size:
        raise PackFormatError(f"entry inflates to {len(data)} bytes, header says {size}", path=path,
                              offset=header.offset)
    return data, pos


def read_entry(buf, offset: int, *, end: int, path: object) -> tuple[EntryHeader, bytes, int]:
    """Header, inflated data and end offset of the entry at ``offset``."""
    header = read_header(buf, offset, end=end, path=path)
    data, stop = inflate_at(buf, header, end=end, path=path)
    return header, data, stop


def iter_entries(buf, count: int, *, path: object, end: int | None = None) -> Iterator[tuple[EntryHeader, bytes]]:
    """Every entry of a complete pack in pack order (header and inflated data), each inflated once.

    ``end`` defaults to the start of the trailer. Raises if the entries do not end exactly there.
    """
    end = len(buf) - PACK_TRAILER_SIZE if end is None else end
    pos = PACK_HEADER_SIZE
    for _ in range(count):
        if pos >= end:
            raise PackFormatError("pack ends before its last entry", path=path, offset=pos)
        header, data, pos = read_entry(buf, pos, end=end, path=path)
        yield header, data
    if pos != end:
        raise PackFormatError(f"{end - pos} unexpected bytes after the last entry", path=path, offset=pos)


__all__ = ["EntryHeader", "read_header", "header_fields", "entry_type", "inflate_at", "read_entry", "iter_entries"]
