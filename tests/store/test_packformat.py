"""packyard.store.pack.format: the one pack-format decoder shared by packdir, index-pack and unpack-objects.

Table-driven edge cases (varints, truncation, OFS offsets out of range, absurd sizes), a
round trip against the encoder, and real git as the oracle: every entry header of packs
written by `git pack-objects` decodes to what `git verify-pack -v` reports.
"""
from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gitutil import git, make_worktree_repo
from packbuild import ofs_bytes as ofs
from packbuild import varint
from packyard.store.errors import PackFormatError
from packyard.store.pack.format import decode_delta_header, decode_entry_header, encode_entry_header, parse_pack_header

OID = bytes(range(20))


def decode(buf: bytes, start: int = 12, end: int | None = None):
    """Decode an entry header placed at pack offset ``start`` (the buffer is the pack from offset 0)."""
    pad = b"\0" * start + buf
    typ, size, base, pos = decode_entry_header(pad, start, len(pad) if end is None else start + end, start, "t.pack")
    return typ, size, base, pos - start


# -- entry headers: valid ------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    (b"\x30", (3, 0, None, 1)),                        # empty blob: one byte
    (b"\x3f", (3, 15, None, 1)),                       # largest size in the first byte
    (b"\xb0\x01", (3, 16, None, 2)),                   # first continuation byte
    (b"\x1f\x99", (1, 15, None, 1)),                   # trailing bytes are not part of the header
    (b"\xbf\x7f", (3, 15 | (0x7F << 4), None, 2)),
    (b"\xbf\xff\x7f", (3, 2**18 - 1, None, 3)),
    (b"\x4f", (4, 15, None, 1)),                       # tag
    (b"\xb0" + b"\x80" * 8 + b"\x01", (3, 1 << 60, None, 10)),   # 2^60 declared: a number, nothing allocated
    (b"\x70" + OID, (7, 0, OID, 21)),                  # REF_DELTA base id follows the size
])
def test_entry_header_decodes(raw, expected):
    assert decode(raw) == expected


@pytest.mark.parametrize("rel", [1, 2, 127, 128, 129, 16511, 16512, 2**20, 2**35 + 7])
def test_ofs_delta_offset_encoding(rel):
    # The buffer is a window at pack offset rel + 12 (as in index-pack's stream buffer).
    raw = b"\x65" + ofs(rel) + b"\xff" * 4
    assert decode_entry_header(raw, 0, len(raw), rel + 12, "t.pack") == (6, 5, 12, 1 + len(ofs(rel)))


@given(st.sampled_from([1, 2, 3, 4]), st.integers(min_value=0, max_value=2**64 - 1))
def test_encode_decode_round_trip(typ, size):
    raw = encode_entry_header(typ, size)
    assert decode(raw + b"trailing") == (typ, size, None, len(raw))


# -- entry headers: refused, with the entry offset -------------------------------------------------------

@pytest.mark.parametrize("raw, end, message", [
    (b"", None, "truncated inside an entry header"),
    (b"\xb0", None, "truncated inside an entry header"),                 # continuation bit, then nothing
    (b"\xb0\x80\x80", None, "truncated inside an entry header"),
    (b"\xb0\x01", 1, "truncated inside an entry header"),                # bytes exist but past ``end``
    (b"\xb0" + b"\xff" * 12 + b"\x01", None, "overflows 64 bits"),       # size varint longer than 64 bits
    (b"\x60", None, "truncated inside an OFS_DELTA header"),
    (b"\x60\x80", None, "OFS_DELTA offset overflows or is truncated"),
    (b"\x60" + b"\xff" * 10 + b"\x01", None, "OFS_DELTA offset overflows or is truncated"),  # > 10 bytes
    (b"\x60\x00", None, "delta cycle: OFS_DELTA names itself"),          # offset 0: its own base
    (b"\x60\x01", None, "OFS_DELTA base offset 11 is out of bounds"),    # base inside the pack header
    (b"\x60\x80\x00", None, "OFS_DELTA base offset -116 is out of bounds"),
    (b"\x70" + OID[:19], None, "truncated inside a REF_DELTA header"),
    (b"\x00", None, "invalid object type 0"),
    (b"\x50", None, "invalid object type 5"),
])
def test_entry_header_refused(raw, end, message):
    with pytest.raises(PackFormatError, match=message) as info:
        decode(raw, end=end)
    assert info.value.offset == 12 and info.value.path == "t.pack"


def test_ofs_base_offset_names_the_entry_not_the_base():
    start = 4096
    with pytest.raises(PackFormatError) as info:
        decode_entry_header(b"\0" * start + b"\x60" + ofs(start), start, start + 11, start, "p")
    assert info.value.offset == start and "base offset 0 is out of bounds" in str(info.value)


def test_absurd_sizes_allocate_nothing():
    raw = b"\x00" * 12 + b"\xbf" + b"\xff" * 8 + b"\x7f"     # size just below 2^67
    tracemalloc.start()
    try:
        typ, size, _base, _pos = decode_entry_header(raw, 12, len(raw), 12, "p")
        src, dst, _n = decode_delta_header(varint(2**63) + varint(2**63 - 1) + b"\x01x")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert size >= 2**66 and (src, dst) == (2**63, 2**63 - 1)
    assert peak < 64 * 1024


# -- delta headers -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("src, dst", [(0, 0), (127, 128), (16383, 16384), (2**32, 1), (2**63, 2**64 - 1)])
def test_delta_header_sizes(src, dst):
    head = varint(src) + varint(dst)
    assert decode_delta_header(head + b"\x90\x05") == (src, dst, len(head))


@pytest.mark.parametrize("head", [b"", b"\x05", b"\x05\x80", b"\x80", b"\xff" * 10 + b"\x01\x05",
                                  b"\x05" + b"\xff" * 10 + b"\x01"])
def test_delta_header_refused(head):
    with pytest.raises(PackFormatError, match="delta header unreadable") as info:
        decode_delta_header(head, path="p.pack", offset=77)
    assert info.value.offset == 77 and info.value.path == "p.pack"


# -- pack header ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("head, expected", [
    (b"PACK\0\0\0\2\0\0\0\0", (2, 0)),
    (b"PACK\0\0\0\3\0\2\x83\x88", (3, 164744)),
    (b"PACK\0\0\0\2\xff\xff\xff\xff" + b"more", (2, 2**32 - 1)),
])
def test_pack_header(head, expected):
    assert parse_pack_header(head, path="p") == expected


@pytest.mark.parametrize("head, message, offset", [
    (b"", "no complete header", 0),
    (b"PACK\0\0\0\2\0\0\0", "no complete header", 0),
    (b"KCAP\0\0\0\2\0\0\0\1", "bad signature", 0),
    (b"PACK\0\0\0\1\0\0\0\1", "unsupported pack version 1", 4),
    (b"PACK\0\0\0\4\0\0\0\1", "unsupported pack version 4", 4),
])
def test_pack_header_refused(head, message, offset):
    with pytest.raises(PackFormatError, match=message) as info:
        parse_pack_header(head, path="p")
    assert info.value.offset == offset


# -- real git as the oracle ----------------------------------------------------------------------------------

@pytest.mark.parametrize("ofs_deltas", [True, False])
def test_every_entry_of_a_git_pack(tmp_path, ofs_deltas):
    """Types, sizes, entry bounds and delta bases of a git-written pack match `git verify-pack -v`."""
    bare = make_worktree_repo(tmp_path, commits=8, files_per_commit=6)
    revs = git("rev-list", "--objects", "--all", git_dir=bare)
    args = ["pack-objects", "-q", "--stdout", "--window=50", "--depth=20"]
    pack = git(*(args + (["--delta-base-offset"] if ofs_deltas else [])), git_dir=bare, input=revs)
    (tmp_path / "p.pack").write_bytes(pack)
    git("index-pack", str(tmp_path / "p.pack"))
    listing = git("verify-pack", "-v", str(tmp_path / "p.idx")).decode().splitlines()
    rows = [line.split() for line in listing if len(line.split()) >= 5 and len(line.split()[0]) == 40]
    by_oid = {r[0]: int(r[4]) for r in rows}
    version, count = parse_pack_header(pack, path="p")
    assert (version, count) == (2, len(rows))
    kinds = set()
    end = len(pack) - 20
    for _oid, typ_label, _size, in_pack, offset, *delta in rows:
        offset, in_pack = int(offset), int(in_pack)
        typ, size, base, pos = decode_entry_header(pack, offset, end, offset, "p")
        kinds.add(typ)
        assert pos < offset + in_pack
        if delta:
            assert typ == (6 if ofs_deltas else 7)
            expected_base = by_oid[delta[1]] if ofs_deltas else bytes.fromhex(delta[1])
            assert base == expected_base
        else:
            assert base is None and typ == {"commit": 1, "tree": 2, "blob": 3, "tag": 4}[typ_label]
            assert size == int(_size)
    assert (6 if ofs_deltas else 7) in kinds, "the pack really carries deltas"


# -- the readers share it: the same malformed entry gets the same error from unpack-objects and index-pack ----

def build_pack(entries: list[bytes]) -> bytes:
    import hashlib
    body = b"PACK" + (2).to_bytes(4, "big") + len(entries).to_bytes(4, "big") + b"".join(entries)
    return body + hashlib.sha1(body).digest()


BLOB = b"hello packformat\n" * 3


@pytest.mark.parametrize("bad, message", [
    (b"\x60\x00", "delta cycle: OFS_DELTA names itself as its base"),
    (b"\x60\x80\x00", r"OFS_DELTA base offset -\d+ is out of bounds"),
    (b"\x60" + ofs(4096), r"OFS_DELTA base offset -\d+ is out of bounds"),
    (b"\x60" + b"\xff" * 10 + b"\x01", "OFS_DELTA offset overflows or is truncated"),
    (b"\x00", "invalid object type 0 in pack entry"),
    (b"\x50", "invalid object type 5 in pack entry"),
    (b"\xb0" + b"\xff" * 12 + b"\x01", "entry size overflows 64 bits"),
])
def test_unpack_and_index_pack_refuse_alike(tmp_path, bad, message):
    """unpack (entries.read_header) and index-pack's receive loop refuse a bad entry with the same message
    and offset."""
    import zlib

    from packyard.store.pack.indexpack import index_pack
    from packyard.store.pack.unpack import parse_pack
    from packyard.store.repo import Repository

    first = encode_entry_header(3, len(BLOB)) + zlib.compress(BLOB)
    pack = build_pack([first, bad + zlib.compress(b"x")])
    with pytest.raises(PackFormatError, match=message) as unpacked:
        parse_pack(pack)
    (tmp_path / "t.pack").write_bytes(pack)
    with pytest.raises(PackFormatError, match=message) as indexed:
        index_pack(Repository.init(tmp_path / "r.git"), tmp_path / "t.pack")
    assert unpacked.value.offset == indexed.value.offset == 12 + len(first)


def test_unpack_refuses_a_stream_longer_than_declared_without_inflating_it():
    """A 10-byte header over a stream that inflates to 8 MiB: refused, the 8 MiB never held."""
    import zlib

    from packyard.store.pack.unpack import parse_pack

    pack = build_pack([encode_entry_header(3, 10) + zlib.compress(b"\0" * (8 << 20), 9)])
    tracemalloc.start()
    try:
        with pytest.raises(PackFormatError, match="more than the 10 bytes its header says") as info:
            parse_pack(pack)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.offset == 12 and peak < 1 << 20
