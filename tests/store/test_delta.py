"""The delta encoder (store/pack/delta.py, _delta.c, _delta_py.py) against independent oracles.

Every test that encodes runs against BOTH implementations (the C extension and the
pure-Python fallback; the C one is skipped only when it is not built, and
test_c_extension_is_built_when_required fails then if CI demands it). What a delta
must be is checked three ways, none of them packyard's code: dulwich's
``apply_delta``, git itself (a pack of OFS_DELTA entries through ``git index-pack``:
git applies each delta to compute the object's id), and a strict parser written
here from the format description (insert 1..127 bytes, copies inside the base and
at most 64 KiB, sizes adding up). And the two implementations must return the
same bytes for the same input.
"""
from __future__ import annotations

import hashlib
import importlib
import mmap
import os
import random
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from dulwich.pack import apply_delta
from hypothesis import given, settings
from hypothesis import strategies as st

from gitutil import CORPUS, git, repo_from_corpus
from packbuild import entry_header, ofs_bytes, varint
from packyard.store.errors import LimitExceededError
from packyard.store.pack import _delta_py, delta
from packyard.workers.cli.bench.delta import read_blobs, version_pairs

IMPLS = ["c", "python"]


def load_impl(name: str):
    if name == "python":
        return _delta_py
    try:
        return importlib.import_module("packyard.store.pack._delta")
    except ImportError:
        pytest.skip("the C extension packyard.store.pack._delta is not built")


@pytest.fixture(params=IMPLS)
def impl(request):
    return load_impl(request.param)


def both() -> list:
    """The implementations available here (the C one only when built)."""
    mods = [_delta_py]
    try:
        mods.insert(0, importlib.import_module("packyard.store.pack._delta"))
    except ImportError:
        pass
    return mods


# -- an independent reading of the format ---------------------------------------------------------
def parse_delta(d: bytes) -> tuple[int, int, list[tuple]]:
    """(base size, target size, ops); ops are ("copy", offset, size) or ("insert", bytes). Strict."""
    pos = 0

    def size() -> int:
        nonlocal pos
        n = shift = 0
        while True:
            c = d[pos]
            pos += 1
            n |= (c & 0x7F) << shift
            shift += 7
            if not c & 0x80:
                return n

    src, dst = size(), size()
    ops: list[tuple] = []
    while pos < len(d):
        op = d[pos]
        pos += 1
        if op & 0x80:
            off = sz = 0
            for i in range(4):
                if op & (1 << i):
                    off |= d[pos] << (8 * i)
                    pos += 1
            for i in range(3):
                if op & (0x10 << i):
                    sz |= d[pos] << (8 * i)
                    pos += 1
            ops.append(("copy", off, sz or 0x10000))
        else:
            assert op != 0, "opcode 0 is reserved"
            assert pos + op <= len(d), "insert runs past the end of the delta"
            ops.append(("insert", d[pos:pos + op]))
            pos += op
    return src, dst, ops


def check_delta(base: bytes, target: bytes, d: bytes) -> list[tuple]:
    """``d`` turns ``base`` into ``target`` per dulwich and per the strict reading; returns the ops."""
    assert b"".join(apply_delta(base, d)) == target
    src, dst, ops = parse_delta(d)
    assert (src, dst) == (len(base), len(target))
    out = bytearray()
    for op in ops:
        if op[0] == "copy":
            _, off, sz = op
            assert 0 < sz <= 0x10000 and off + sz <= len(base), op
            out += base[off:off + sz]
        else:
            assert 1 <= len(op[1]) <= 127
            out += op[1]
    assert bytes(out) == target
    return ops


def encode_all(base: bytes, target: bytes, max_size: int = -1) -> bytes | None:
    """The delta from every available implementation; they must agree byte for byte."""
    results = [m.DeltaIndex(base).create_delta(target, max_size) for m in both()]
    assert all(r == results[0] for r in results), "C and Python deltas differ"
    return results[0]


# -- realistic inputs ---------------------------------------------------------------------------------
WORDS = [b"int", b"static", b"return", b"if (", b"else", b"struct", b"char *", b"const", b"{", b"}", b"for (",
         b"sizeof", b"NULL", b"->", b"=", b"==", b"+", b"0", b"1", b";", b"buf", b"len", b"ret", b"die(", b"/*", b"*/"]


def text_file(rng: random.Random, lines: int) -> bytes:
    out = []
    for _ in range(lines):
        indent = b"\t" * rng.randrange(4)
        words = [rng.choice(WORDS) if rng.random() < 0.7 else b"v%d" % rng.randrange(500)
                 for _ in range(rng.randrange(1, 10))]
        out.append(indent + b" ".join(words) + b"\n")
    return b"".join(out)


def evolve(rng: random.Random, data: bytes) -> bytes:
    """The next version of a text file: a few lines inserted, deleted, changed, a block moved."""
    lines = data.splitlines(keepends=True) or [b"\n"]
    for _ in range(rng.randrange(1, 8)):
        kind = rng.randrange(4)
        i = rng.randrange(len(lines) + 1)
        if kind == 0:
            lines[i:i] = text_file(rng, rng.randrange(1, 6)).splitlines(keepends=True)
        elif kind == 1 and len(lines) > 2:
            del lines[i:i + rng.randrange(1, 4)]
        elif kind == 2 and i < len(lines):
            lines[i] = lines[i].rstrip(b"\n") + b" /* changed */\n"
        elif len(lines) > 10:
            j = rng.randrange(len(lines) - 5)
            block = lines[j:j + 5]
            del lines[j:j + 5]
            k = rng.randrange(len(lines) + 1)
            lines[k:k] = block
    return b"".join(lines)


def shuffled_blocks(rng: random.Random, data: bytes, size: int) -> bytes:
    blocks = [data[i:i + size] for i in range(0, len(data), size)]
    rng.shuffle(blocks)
    return b"".join(blocks)


@st.composite
def edited_pairs(draw) -> tuple[bytes, bytes]:
    """A base and a target made from it by byte-level edits (insert, delete, replace, move, repeat)."""
    base = draw(st.one_of(st.binary(max_size=3000),
                          st.builds(lambda s, n: text_file(random.Random(s), n),
                                    st.integers(0, 2**32), st.integers(0, 120)),
                          st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=40), st.integers(1, 200))))
    target = bytearray(base)
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.integers(0, 4))
        i = draw(st.integers(0, len(target)))
        j = draw(st.integers(i, min(len(target), i + 400)))
        if kind == 0:
            target[i:i] = draw(st.binary(max_size=300))
        elif kind == 1:
            del target[i:j]
        elif kind == 2:
            target[i:j] = draw(st.binary(max_size=50))
        elif kind == 3:
            piece = bytes(target[i:j])
            del target[i:j]
            k = draw(st.integers(0, len(target)))
            target[k:k] = piece
        else:
            target[i:i] = bytes(target[i:j]) * draw(st.integers(1, 3))
    return base, bytes(target)


any_pairs = st.one_of(edited_pairs(), st.tuples(st.binary(max_size=2000), st.binary(max_size=2000)))


# -- properties -------------------------------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(any_pairs)
def test_every_delta_rebuilds_the_target_and_both_implementations_agree(pair):
    base, target = pair
    d = encode_all(base, target)
    check_delta(base, target, d)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 400))
def test_successive_versions_of_text_files(seed, lines):
    rng = random.Random(seed)
    base = text_file(rng, lines)
    target = evolve(rng, base)
    check_delta(base, target, encode_all(base, target))


def test_successive_versions_of_a_text_file_give_small_deltas():
    # 50 versions of a ~45 KB source-like file, each a few lines away from the last: the
    # deltas carry the changed lines and a copy op per unchanged stretch (measured: 0.23%).
    rng = random.Random(9)
    text = text_file(rng, 2000)
    total_target = total_delta = 0
    for _ in range(50):
        nxt = evolve(rng, text)
        d = encode_all(text, nxt)
        check_delta(text, nxt, d)
        assert len(d) < 1000
        total_target += len(nxt)
        total_delta += len(d)
        text = nxt
    assert total_delta < total_target / 200


@settings(max_examples=200, deadline=None)
@given(edited_pairs(), st.data())
def test_max_size_returns_none_exactly_when_the_delta_is_longer(pair, data):
    base, target = pair
    for mod in both():
        index = mod.DeltaIndex(base)
        full = index.create_delta(target)
        limits = {0, 1, len(full) - 1, len(full), len(full) + 1, data.draw(st.integers(0, 2 * len(full) + 10))}
        for limit in sorted(x for x in limits if x >= 0):
            got = index.create_delta(target, limit)
            if len(full) > limit:
                assert got is None, (limit, len(full))
            else:
                assert got == full


def test_one_index_serves_many_targets_and_threads(impl):
    rng = random.Random(7)
    base = text_file(rng, 3000)
    targets = [evolve(random.Random(i), base) for i in range(16)]
    index = impl.DeltaIndex(base)
    expected = [impl.DeltaIndex(base).create_delta(t) for t in targets]
    results: dict[int, bytes] = {}

    def work(k: int) -> None:
        for i in range(k, len(targets), 4):
            results[i] = index.create_delta(targets[i])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert [results[i] for i in range(len(targets))] == expected
    for t, d in zip(targets, expected):
        check_delta(base, t, d)


# -- the cases the format's corners live in ----------------------------------------------------------
def noise(n: int, seed: int) -> bytes:
    """n random-looking bytes, the same on every run (exact expectations below depend on them)."""
    return random.Random(seed).randbytes(n)


def ops_of(impl, base: bytes, target: bytes) -> tuple[bytes, list[tuple]]:
    d = impl.DeltaIndex(base).create_delta(target)
    return d, check_delta(base, target, d)


def test_empty_inputs(impl):
    for base, target in [(b"", b""), (b"", b"x" * 300), (b"abc" * 50, b""), (b"short", b"short!")]:
        d, ops = ops_of(impl, base, target)
        assert d[:len(varint(len(base)))] == varint(len(base))
    # No whole block in the base: everything is inserted.
    d, ops = ops_of(impl, b"fifteen bytes!!", b"fifteen bytes!!" * 3)
    assert all(op[0] == "insert" for op in ops)


def test_identical_input_is_one_copy_per_64k(impl):
    base = noise(200_000, 1)
    d, ops = ops_of(impl, base, base)
    assert [op[0] for op in ops] == ["copy"] * 4
    assert [op[2] for op in ops] == [0x10000, 0x10000, 0x10000, 200_000 - 3 * 0x10000]
    assert len(d) < 30


def test_copies_longer_than_64k_are_split_and_use_the_implicit_size(impl):
    base = noise(300_000, 2)
    target = b"head" + base + b"tail"
    d, ops = ops_of(impl, base, target)
    copies = [op for op in ops if op[0] == "copy"]
    assert sum(op[2] for op in copies) == len(base)
    assert [op[2] for op in copies[:4]] == [0x10000] * 4
    # 0x10000 is written with no size bytes: the op byte has none of bits 4-6.
    assert any(b & 0x80 and not b & 0x70 for b in d[8:])


def test_offsets_above_64k_take_three_bytes(impl):
    base = noise(70_000, 3)
    target = base[66_000:67_000] + b"!" + base[100:900]
    d, ops = ops_of(impl, base, target)
    assert ops[0] == ("copy", 66_000, 1000)
    assert d[len(varint(len(base))) + len(varint(len(target)))] == 0x80 | 0x07 | 0x30


def test_offsets_above_16m_take_four_bytes(impl):
    # Mostly one repeated block (cheap to index in Python), a unique tail above 2**24.
    tail = noise(4096, 4)
    base = b"\0" * (1 << 24) + tail
    target = tail[:3000] + b"new" + tail[3000:]
    d, ops = ops_of(impl, base, target)
    assert ops[0] == ("copy", 1 << 24, 3000)
    assert ops[-1] == ("copy", (1 << 24) + 3000, 1096)
    assert len(d) < 30


def test_inserts_longer_than_127_are_split(impl):
    base = noise(1000, 5)
    target = noise(1000, 6)
    d, ops = ops_of(impl, base, target)
    assert [len(op[1]) for op in ops] == [127] * 7 + [111]
    assert len(d) == 1000 + 8 + 2 + 2


def test_appended_prepended_and_shuffled(impl):
    rng = random.Random(3)
    base = text_file(rng, 2000)
    for target in (base + b"appended line\n" * 3, b"prepended line\n" * 3 + base):
        d, ops = ops_of(impl, base, target)
        assert len(d) < 80
    target = shuffled_blocks(rng, base, 1024)
    d, ops = ops_of(impl, base, target)
    assert len(d) < len(base) // 1024 * 12 + 300


def test_long_runs_stay_small_and_fast(impl):
    base = b"\0" * 1_000_000 + b"end"
    target = b"start" + b"\0" * 2_000_000
    d, ops = ops_of(impl, base, target)
    assert len(d) < 300
    base = b"ab" * 300_000
    target = b"ab" * 100_000 + b"X" + b"ab" * 200_000
    d, ops = ops_of(impl, base, target)
    assert len(d) < 60


def test_a_match_grows_backwards_into_pending_inserts(impl):
    base = noise(10_000, 7)
    target = bytearray(base)
    for i in range(50, len(target), 100):   # one changed byte every 100: each copy spans the gap's far side
        target[i] ^= 0xFF
    d, ops = ops_of(impl, base, bytes(target))
    inserts = [op for op in ops if op[0] == "insert"]
    assert len(inserts) == 100 and all(len(op[1]) == 1 for op in inserts)


def test_binary_unrelated_input_costs_at_most_the_insert_overhead(impl):
    rng = random.Random(11)
    base = rng.randbytes(50_000)
    target = rng.randbytes(40_000)
    d, _ = ops_of(impl, base, target)
    assert len(d) <= len(target) + len(target) // 127 + 1 + 6


def test_index_memory_is_bounded_and_reported_alike():
    sizes = {}
    for mod in both():
        for n in (0, 15, 16, 17 * 16, 100_000, 1 << 20):
            idx = mod.DeltaIndex(b"\x01" * n)
            sizes.setdefault(n, set()).add(idx.memory)
            assert idx.base_size == n
            assert idx.memory <= 4 * (2 * (n // 16) + 2) + 4 * (n // 16) + 8
    assert all(len(v) == 1 for v in sizes.values()), sizes
    assert sizes[0] == {0}


def test_constants_agree():
    for mod in both():
        for name in ("BLOCK", "BUCKET_CAP", "STOP_LEN", "MAX_COPY", "MAX_INSERT", "MAX_BASE"):
            assert getattr(mod, name) == getattr(_delta_py, name), name


def test_raw_argument_errors(impl):
    index = impl.DeltaIndex(b"some base bytes, long enough to index")
    with pytest.raises(ValueError):
        index.create_delta(b"x", -2)
    with pytest.raises(TypeError):
        index.create_delta("not bytes")
    with pytest.raises(TypeError):
        impl.DeltaIndex(12345)
    with pytest.raises((TypeError, BufferError, ValueError)):
        index.create_delta(memoryview(b"abcdefgh" * 10)[::2])
    # Other buffer kinds are read as their bytes.
    assert index.create_delta(bytearray(b"some base bytes!")) == index.create_delta(b"some base bytes!")
    assert impl.DeltaIndex(memoryview(b"abc" * 40)).create_delta(b"abc" * 41) == \
        impl.DeltaIndex(b"abc" * 40).create_delta(b"abc" * 41)


# -- limits: refused, never read, never a crash ------------------------------------------------------
def sparse_map(path: Path, size: int) -> mmap.mmap:
    with open(path, "wb") as f:
        f.truncate(size)
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def test_a_base_above_4gib_is_refused_without_being_read(impl, tmp_path):
    big = sparse_map(tmp_path / "big", (1 << 32) + 16)
    try:
        with pytest.raises(OverflowError):
            impl.DeltaIndex(big)
    finally:
        big.close()


def test_the_public_api_refuses_inputs_above_the_limit(tmp_path):
    base = text_file(random.Random(1), 200)
    target = evolve(random.Random(2), base)
    assert delta.create_delta(base, target) == encode_all(base, target)
    assert delta.create_delta(base, target, max_input=len(base) - 1) is None
    assert delta.create_delta(base, target, max_input=len(target) - 1) is None
    with pytest.raises(LimitExceededError) as err:
        delta.DeltaIndex(base, max_input=100)
    assert str(len(base)) in str(err.value)
    index = delta.DeltaIndex(base, max_input=max(len(base), len(target)))
    assert index.create_delta(target + b"x" * len(base)) is None
    assert index.create_delta(target, max_size=-5) is None
    assert index.create_delta(target, max_size=3) is None
    assert index.create_delta(target) == encode_all(base, target)
    assert index.memory > 0 and index.base_size == len(base)
    assert delta.should_delta(delta.MAX_INPUT_SIZE) and not delta.should_delta(delta.MAX_INPUT_SIZE + 1)
    # The default limit: a 600 MiB (sparse, never read) object is stored whole.
    big = sparse_map(tmp_path / "big", 600 << 20)
    try:
        assert index.create_delta(big) is None
        assert delta.create_delta(big, target) is None
        with pytest.raises(LimitExceededError):
            delta.DeltaIndex(big)
    finally:
        big.close()


def test_an_empty_target_has_no_delta():
    # git refuses to apply a delta whose result is empty ("failed to apply delta", git 2.39).
    assert delta.create_delta(b"x" * 100, b"") is None
    assert delta.DeltaIndex(b"x" * 100).create_delta(b"") is None


# -- the implementation in use -------------------------------------------------------------------
def _implementation_in(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PACKYARD_PURE_PYTHON"}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", "from packyard.store.pack import delta; print(delta.IMPLEMENTATION)"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return out.strip()


def test_pure_python_is_chosen_when_asked():
    assert _implementation_in({"PACKYARD_PURE_PYTHON": "1"}) == "python"
    built = len(both()) == 2
    assert _implementation_in({}) == ("c" if built else "python")


def test_c_extension_is_built_when_required():
    if os.environ.get("PACKYARD_REQUIRE_C") != "1":
        pytest.skip("PACKYARD_REQUIRE_C=1 not set")
    importlib.import_module("packyard.store.pack._delta")   # fails the test when the build is missing
    if os.environ.get("PACKYARD_PURE_PYTHON") != "1":
        assert delta.IMPLEMENTATION == "c"


MALLOC_DEBUG_SCRIPT = r"""
import os, random
from dulwich.pack import apply_delta
from packyard.store.pack import _delta as c
rng = random.Random(5)
cases = [(b"", b""), (b"", b"x"), (b"x" * 15, b"x" * 16), (b"y" * 16, b""), (b"y" * 16, b"y" * 16),
         (b"\0" * 200000, b"\0" * 300000), (os.urandom(70000), os.urandom(300))]
for n in range(300):
    base = rng.randbytes(rng.randrange(0, 3000))
    t = bytearray(base)
    for _ in range(rng.randrange(4)):
        i = rng.randrange(len(t) + 1)
        t[i:i + rng.randrange(50)] = rng.randbytes(rng.randrange(30))
    cases.append((base, bytes(t)))
for base, target in cases:
    index = c.DeltaIndex(base)
    d = index.create_delta(target)
    assert b"".join(apply_delta(base, d)) == target
    for limit in (0, len(d) - 1, len(d)):
        r = index.create_delta(target, max(limit, 0))
        assert r is None or r == d
print("ok", len(cases))
"""


def test_c_extension_under_the_debug_allocator():
    """PYTHONMALLOC=debug puts guard bytes around every PyMem_Raw block: a write past the
    index's tables or the output buffer aborts the process when the block is freed."""
    load_impl("c")
    env = {**os.environ, "PYTHONMALLOC": "debug"}
    proc = subprocess.run([sys.executable, "-X", "dev", "-c", MALLOC_DEBUG_SCRIPT], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok ")


# -- git itself applies the deltas ----------------------------------------------------------------------
def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_applies(tmp_path: Path, pairs: list[tuple[bytes, bytes, bytes]]) -> None:
    """Write one pack: each base whole, each delta as an OFS_DELTA on it; ``git index-pack``
    applies every delta to name the object, and the names must be the targets' ids. (Not
    --strict: an identical pair puts one object in the pack twice, which --strict refuses.)"""
    body = bytearray()
    expected: dict[int, str] = {}
    for base, target, d in pairs:
        at_base = 12 + len(body)
        body += entry_header(3, len(base)) + zlib.compress(base, 1)
        at_delta = 12 + len(body)
        body += entry_header(6, len(d)) + ofs_bytes(at_delta - at_base) + zlib.compress(d, 1)
        expected[at_delta] = blob_id(target)
    pack = b"PACK" + (2).to_bytes(4, "big") + (2 * len(pairs)).to_bytes(4, "big") + bytes(body)
    pack += hashlib.sha1(pack).digest()
    path = tmp_path / "deltas.pack"
    path.write_bytes(pack)
    git("index-pack", "-o", str(tmp_path / "deltas.idx"), str(path))
    found = idx_offsets((tmp_path / "deltas.idx").read_bytes())
    assert {at: found.get(at) for at in expected} == expected


def idx_offsets(idx: bytes) -> dict[int, str]:
    """{pack offset: object id} from a version-2 .idx git wrote (small packs: 31-bit offsets)."""
    assert idx[:8] == b"\377tOc\0\0\0\2"
    n = int.from_bytes(idx[8 + 255 * 4:8 + 256 * 4], "big")
    ids_at = 8 + 256 * 4
    offs_at = ids_at + 24 * n
    return {int.from_bytes(idx[offs_at + 4 * i:offs_at + 4 * i + 4], "big"):
            idx[ids_at + 20 * i:ids_at + 20 * i + 20].hex() for i in range(n)}


def test_git_applies_the_deltas(impl, tmp_path):
    rng = random.Random(42)
    pairs: list[tuple[bytes, bytes]] = []
    text = text_file(rng, 1500)
    for _ in range(20):
        nxt = evolve(rng, text)
        pairs.append((text, nxt))
        text = nxt
    big = rng.randbytes(300_000)
    pairs += [
        (b"", b"from nothing " * 20), (b"tiny", b"tiny!"), (text, text), (text, text + b"tail\n"),
        (text, b"head\n" + text), (text, shuffled_blocks(rng, text, 700)), (big, big[70_000:] + big[:70_000]),
        (b"\0" * 500_000, b"\0" * 700_000 + b"x"), (rng.randbytes(5000), rng.randbytes(5000)),
        (big, big[:1000] + rng.randbytes(400) + big[200_000:]),
    ]
    for seed in range(40):   # random byte-level edits, as in the property test
        r = random.Random(seed)
        base = r.randbytes(r.randrange(1, 4000))
        t = bytearray(base)
        for _ in range(r.randrange(1, 5)):
            i = r.randrange(len(t) + 1)
            t[i:i + r.randrange(60)] = r.randbytes(r.randrange(60))
        pairs.append((base, bytes(t) or b"!"))
    triples = [(b, t, impl.DeltaIndex(b).create_delta(t)) for b, t in pairs]
    for b, t, d in triples:
        check_delta(b, t, d)
    git_applies(tmp_path, triples)


# -- real history: successive versions of git.git's files ---------------------------------------------
@pytest.fixture(scope="module")
def corpus_pairs(tmp_path_factory) -> list[tuple[bytes, bytes]]:
    """(old, new) blob pairs: consecutive versions of git v1.0.0's 8 most often changed files."""
    if not (CORPUS / "git-v1.0.0.pack").exists():
        pytest.skip(f"corpus pack {CORPUS / 'git-v1.0.0.pack'} absent")
    repo = repo_from_corpus(tmp_path_factory.mktemp("delta-corpus"))
    # The bench's own selection and reader (packyard bench delta), every modification of each path.
    ids = version_pairs(repo, 8, per_file=1 << 30)[:240]
    blobs = read_blobs(repo, sorted({i for pair in ids for i in pair}))
    return [(blobs[a], blobs[b]) for a, b in ids]


def test_corpus_versions(corpus_pairs, tmp_path):
    assert len(corpus_pairs) >= 100
    triples = []
    total_target = total_delta = total_dulwich = 0
    from dulwich.pack import create_delta as dulwich_delta

    for base, target in corpus_pairs:
        d = encode_all(base, target)
        check_delta(base, target, d)
        triples.append((base, target, d))
        total_target += len(target)
        total_delta += len(d)
        total_dulwich += len(b"".join(dulwich_delta(base, target)))
    git_applies(tmp_path, triples)
    # Successive versions differ by a few lines: deltas are a small fraction of the targets
    # (measured 1.2%) and smaller than dulwich's (measured 0.23x its total).
    assert total_delta < total_target / 40, (total_delta, total_target)
    assert total_delta < 0.5 * total_dulwich, (total_delta, total_dulwich)
