"""The delta search (store/pack/search.py) and the repacks that use it, with real git as the oracle:
packs with computed deltas verify, fsck and index the same as git's; the same input gives the same pack
bytes (forked or not, C encoder or pure Python); chains stay within --depth (reused ones too); the
window's memory stays bounded; objects above the size limit are stored whole."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import repackutil as ru
from gitutil import ROOT, git, repo_from_corpus
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.pack import search as S
from packyard.store.pack.idxread import read_idx_tables
from packyard.store.repo import Repository

FULL, LOOSE = RepackMode.FULL, RepackMode.LOOSE


def history(dest: Path, versions: int, files: int = 3, depth: int = 250) -> Path:
    """A linear history from git fast-import: ``files`` files, each changed a little by every one of ``versions``
    commits, then packed by git with ``--depth`` (its deltas are long chains) and nothing loose."""
    git("init", "-q", "--bare", str(dest))
    body = [f"line {i} of a text file that a source tree might hold, long enough to delta\n" for i in range(120)]
    stream = bytearray()
    for v in range(versions):
        stream += (f"commit refs/heads/main\ncommitter T <t@example.com> {1_700_000_000 + v} +0000\n"
                   f"data 4\nv{v:02}\n").encode()
        for f in range(files):
            lines = list(body)
            for k in range(v + 1):
                lines[(k * 7 + f) % 120] = f"file {f} changed in version {k}\n"
            data = "".join(lines).encode()
            stream += f"M 100644 inline f{f}.txt\ndata {len(data)}\n".encode() + data + b"\n"
    git("fast-import", "--quiet", git_dir=dest, input=bytes(stream))
    git("repack", "-adf", f"--depth={depth}", "--window=50", "-q", git_dir=dest)
    git("symbolic-ref", "HEAD", "refs/heads/main", git_dir=dest)
    return dest


def the_pack(bare: Path) -> Path:
    (idx,) = (bare / "objects" / "pack").glob("pack-*.idx")
    return idx.with_suffix(".pack")


def verify_pack(pack: Path) -> tuple[dict[int, int], int, int]:
    """``git verify-pack -v``: {chain length: objects}, deltas, whole objects; asserts the pack is ok."""
    out = git("verify-pack", "-v", str(pack.with_suffix(".idx"))).decode()
    assert out.rstrip().endswith(": ok"), out[-300:]
    chains = {int(n): int(c) for n, c in re.findall(r"chain length = (\d+): (\d+) objects?", out)}
    deltas = whole = 0
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5 and f[1] in ("commit", "tree", "blob", "tag"):
            if len(f) >= 7:
                deltas += 1
            else:
                whole += 1
    return chains, deltas, whole


def index_pack_ids(pack: Path, scratch: Path) -> list[str]:
    """The object ids git's own index-pack finds in ``pack`` (it applies every delta to name the objects)."""
    scratch.mkdir(parents=True, exist_ok=True)
    copy = scratch / "check.pack"
    shutil.copyfile(pack, copy)
    git("init", "-q", "--bare", str(scratch / "empty.git"))
    git("index-pack", "-o", str(scratch / "check.idx"), str(copy), git_dir=scratch / "empty.git")
    out = git("show-index", input=(scratch / "check.idx").read_bytes()).decode()
    return sorted(line.split()[1] for line in out.splitlines())


def our_ids(pack: Path) -> list[str]:
    t = read_idx_tables(pack.with_suffix(".idx"))
    return sorted(t.oid(i).hex() for i in range(t.count))


def force_fork(monkeypatch) -> None:
    monkeypatch.setattr(S, "FORK_MIN_CANDIDATES", 0)


# -- packs with computed deltas, git as the oracle -------------------------------------------------------

def test_no_reuse_recomputes_every_delta_and_git_accepts_the_pack(shapes, tmp_path):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    result = repack(Repository.open(bare), RepackOptions(mode=FULL, reuse=False))
    c = result.counters
    assert c.deltas_reused == 0 and c.deltas_computed > 0 and c.deltas_tried >= c.deltas_computed
    assert c.delta_bytes_saved > 0 and c.delta_candidates >= c.deltas_computed
    assert "search" in result.elapsed
    ru.check_with_git(bare, listing, result.packs_written + [result.cruft_pack])
    pack = bare / "objects" / "pack" / f"{result.packs_written[0]}.pack"
    _chains, deltas, _whole = verify_pack(pack)
    assert deltas == c.deltas_computed
    assert index_pack_ids(pack, tmp_path / "scratch") == our_ids(pack)


def test_default_repack_deltifies_what_it_cannot_reuse(tmp_path):
    """Loose objects have no delta to reuse: the search finds them one, and the pack is smaller than without it."""
    src = history(tmp_path / "src.git", versions=30)
    loose = tmp_path / "loose.git"
    git("init", "-q", "--bare", str(loose))
    data = git("pack-objects", "-q", "--stdout", "--all", git_dir=src, input=b"")
    git("unpack-objects", "-q", git_dir=loose, input=data)
    git("update-ref", "refs/heads/main", git("rev-parse", "main", git_dir=src).decode().strip(), git_dir=loose)
    sizes = {}
    for window in (10, 0):
        bare = tmp_path / f"w{window}.git"
        shutil.copytree(loose, bare)
        result = repack(Repository.open(bare), RepackOptions(mode=LOOSE, window=window))
        c = result.counters
        assert c.loose_packed == c.objects_out and c.deltas_reused == 0
        assert (c.deltas_computed > 0) == (window > 1)
        pack = the_pack(bare)
        _chains, deltas, _whole = verify_pack(pack)
        assert deltas == c.deltas_computed
        git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
        sizes[window] = pack.stat().st_size
    assert sizes[10] * 3 < sizes[0], sizes


@pytest.mark.slow
def test_corpus_no_reuse_pack_is_indexed_alike_by_git(tmp_path):
    bare = repo_from_corpus(tmp_path)
    before = the_pack(bare).stat().st_size
    result = repack(Repository.open(bare), RepackOptions(mode=FULL, reuse=False))
    pack = bare / "objects" / "pack" / f"{result.packs_written[0]}.pack"
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert index_pack_ids(pack, tmp_path / "scratch") == our_ids(pack)
    # git's own pack of the same history, for scale: a recomputed pack is no worse than 5% off it.
    assert pack.stat().st_size <= before * 1.05, (pack.stat().st_size, before)


# -- deterministic ----------------------------------------------------------------------------------------

def test_same_input_same_pack_bytes_with_forked_search(shapes, tmp_path, monkeypatch):
    force_fork(monkeypatch)
    names = []
    for run in range(2):
        copy = ru.copy(shapes, tmp_path / f"run{run}.git")
        result = repack(Repository.open(copy.bare), RepackOptions(mode=FULL, reuse=False))
        assert result.counters.search_processes == 2 and result.counters.deltas_computed > 0
        names.append(result.packs_written[0])
    assert names[0] == names[1]   # the pack's name is the SHA-1 of its bytes


@pytest.mark.slow
def test_pure_python_encoder_writes_the_same_pack(shapes, tmp_path):
    """Both encoder implementations give the same deltas, so a repack gives the same pack with either."""
    child = ("import sys\nfrom packyard.store.maintenance.repack.run import RepackMode, RepackOptions, repack\n"
             "from packyard.store.pack.delta import IMPLEMENTATION\nfrom packyard.store.repo import Repository\n"
             "r = repack(Repository.open(sys.argv[1]), RepackOptions(mode=RepackMode.FULL, reuse=False))\n"
             "print(IMPLEMENTATION, r.packs_written[0], r.counters.deltas_computed)\n")
    seen = {}
    for pure in ("0", "1"):
        copy = ru.copy(shapes, tmp_path / f"pure{pure}.git")
        env = {**os.environ, "PACKYARD_PURE_PYTHON": pure}
        proc = subprocess.run([sys.executable, "-c", child, str(copy.bare)], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        impl, name, deltas = proc.stdout.split()
        seen[impl] = (name, int(deltas))
        verify_pack(copy.bare / "objects" / "pack" / f"{name}.pack")
    assert set(seen) <= {"c", "python"} and "python" in seen
    assert len(set(seen.values())) == 1, seen


# -- depth -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reuse", [False, True])
def test_chains_never_exceed_depth(tmp_path, reuse):
    """git's pack of the history has chains far longer than 4; ours never do -- reused chains are cut too."""
    bare = history(tmp_path / "h.git", versions=40)
    chains, _d, _w = verify_pack(the_pack(bare))
    assert max(chains) > 10, chains
    result = repack(Repository.open(bare), RepackOptions(mode=FULL, reuse=reuse, depth=4))
    chains, deltas, _w = verify_pack(the_pack(bare))
    assert max(chains) <= 4, chains
    c = result.counters
    assert deltas == c.deltas_reused + c.deltas_computed
    if reuse:
        assert c.deltas_reused > 0 and c.deltas_dropped > 0
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


def test_reused_chains_leave_room_for_new_deltas_below_them():
    """A candidate that reused deltas rest on may only be as deep as the depth they leave: ``max_depth`` per
    candidate. Three identical-but-one-byte objects, the middle one already carrying a chain of 2."""
    base = bytes(range(256)) * 8
    objs = [base + b"a", base + b"b", base + b"c"]
    c = S.Candidates()
    for k, o in enumerate(objs):
        c.add(3, len(o), 7, [3, 1, 3][k])
    r = S.search(c, lambda i: objs[i], S.SearchOptions(depth=3, processes=1))
    # Whatever the search chose, no chain passes the limit once the reused height is added back.
    height = [0, 2, 0]
    for i in range(3):
        assert r.depth[i] + height[i] <= 3
        if r.base[i] >= 0:
            assert r.depth[i] == r.depth[r.base[i]] + 1


# -- window memory and size limits ------------------------------------------------------------------------

def similar_blobs(n: int, size: int) -> list[bytes]:
    return [bytes((j * 31 + (j // 97) * i) & 0xFF for j in range(size)) + b"%d" % i for i in range(n)]


def test_window_memory_is_bounded():
    objs = similar_blobs(40, 4000)
    c = S.Candidates()
    for o in objs:
        c.add(3, len(o), 1, 50)
    free = S.search(c, lambda i: objs[i], S.SearchOptions(processes=1, window_memory=0))
    tight = S.search(c, lambda i: objs[i], S.SearchOptions(processes=1, window_memory=10_000))
    # Unbounded, the window holds 10 objects and their indexes; bounded, never more than the limit plus the
    # one base always kept (its bytes and index) -- and each target then tries only that base.
    assert free.peak_window_bytes > 40_000 and free.tried > 2 * len(objs)
    one = len(objs[0]) + S.DeltaIndex(objs[0]).memory
    assert tight.peak_window_bytes <= 10_000 + one, tight.peak_window_bytes
    assert tight.tried <= len(objs) - 1
    assert tight.computed > 0


def test_objects_above_the_size_limit_are_neither_targets_nor_bases():
    objs = similar_blobs(12, 3000) + similar_blobs(6, 9000)
    c = S.Candidates()
    for o in objs:
        c.add(3, len(o), 1, 50)
    r = S.search(c, lambda i: objs[i] if len(objs[i]) <= 5000 else pytest.fail("a big object was read"),
                 S.SearchOptions(processes=1, max_input=5000))
    assert r.considered == 12 and r.computed > 0
    for i, o in enumerate(objs):
        if len(o) > 5000:
            assert r.base[i] == -1 and r.zdelta[i] is None
        assert r.base[i] < 12


def test_small_objects_commits_and_tags_are_not_tried():
    objs = [b"x" * 40, b"x" * 41, b"tree 1234\n" * 30, b"tree 1234\n" * 31]
    c = S.Candidates()
    for t, o in zip((3, 3, 1, 4), objs):
        c.add(t, len(o), 0, 50)
    r = S.search(c, lambda i: objs[i], S.SearchOptions(processes=1))
    assert r.considered == 0 and r.tried == 0 and list(r.base) == [-1] * 4


# -- the order ---------------------------------------------------------------------------------------------------

def test_name_hash_weighs_the_last_characters():
    assert S.name_hash(None) == S.name_hash(b"") == 0
    assert S.name_hash(b"a b\tc") == S.name_hash(b"abc")
    # More than 16 characters from the end no longer count: versions of one path in any directory meet.
    assert S.name_hash(b"some/long/dir/Makefile.in.tmpl") == S.name_hash(b"other/dir/Makefile.in.tmpl")
    # The last character decides the top bits: files of one suffix sort next to each other.
    assert abs(S.name_hash(b"a.c") - S.name_hash(b"b.c")) < 1 << 21
    assert S.name_hash(b"a.c") >> 24 != S.name_hash(b"a.h") >> 24


def test_search_order_and_segments_keep_a_name_together():
    c = S.Candidates()
    for t, h, size in [(2, 5, 100), (3, 9, 400), (3, 9, 500), (3, 4, 200), (3, 9, 300), (2, 5, 100)]:
        c.add(t, size, h, 50)
    order = S.search_order(c)
    assert order == [2, 1, 4, 3, 0, 5]   # blobs before trees; name hash, then size descending; then index
    parts = S.split_segments(order, c, 2)
    # Half the bytes fall inside the name 9 run: the cut moves to its end.
    assert parts == [[2, 1, 4], [3, 0, 5]]
    for a, b in zip(parts, parts[1:]):
        assert (c.types[a[-1]], c.hashes[a[-1]]) != (c.types[b[0]], c.hashes[b[0]])


# -- the two implementations of the window loop ------------------------------------------------------------

@pytest.mark.skipif(S._c_search_segment is None, reason="the C extension is not in use")
@pytest.mark.parametrize("seed", range(12))
def test_c_window_loop_gives_the_python_loops_result(seed):
    """search.py's Python loop is the specification; the extension's loop must give the same deltas, depths,
    counters and compressed bytes for any candidates (random edits of one base, mixed types, names, depth
    limits, source packs, window sizes and memory bounds)."""
    import random

    rng = random.Random(seed)
    base = bytes(rng.getrandbits(8) for _ in range(3000))
    reuse = seed % 2 == 1
    c = S.Candidates(groups=S.array("i"), fixed=bytearray()) if reuse else S.Candidates()
    objs = []
    for _ in range(rng.randint(50, 250)):
        b = bytearray(base[: rng.randint(10, 3000)])
        for _ in range(rng.randint(0, 20)):
            p = rng.randrange(len(b) + 1)
            b[p:p + rng.randint(1, 30)] = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 30)))
        objs.append(bytes(b))
        c.add(rng.choice([2, 3, 3, 1]), len(b), rng.choice([0, 1, 2, 3]), rng.randint(-1, 6), rng.randint(-1, 3),
              rng.random() < 0.5, rng.random() < 0.5)
    if seed % 3 == 0:   # delta islands: random marks over three islands, the rule's table between their classes
        masks = [0, *range(1, 8)]
        c.islands = S.array("i", [rng.randrange(len(masks)) for _ in range(len(c))])
        c.island_ok = bytes(1 if not t or (b and t & ~b == 0) else 0 for t in masks for b in masks)
    opts = S.SearchOptions(window=rng.randint(2, 12), depth=6, window_memory=rng.choice([0, 5000, 20000]),
                           processes=1)
    order = S.search_order(c, opts.max_input)
    py = S._Segment(c, lambda i: objs[i], opts, order, None).run_python()
    if c.islands is not None:   # (the rule held in the specification: no target rests on a base it may not)
        n = len(masks)
        assert all(c.island_ok[c.islands[t] * n + c.islands[b]] for t, b in zip(py.targets, py.bases))
    native = S._Segment(c, lambda i: objs[i], opts, order, None).run_c()
    assert py.targets, "the case should find deltas"
    for f in ("targets", "bases", "depths", "sizes", "zdeltas", "tried", "saved", "peak", "whole", "zwholes"):
        assert getattr(native, f) == getattr(py, f), f
    assert S.fast_name_hash(b"dir/a file.c") == S.name_hash(b"dir/a file.c")


def test_reused_chains_are_cut_at_cycles_and_at_the_depth_limit():
    """The write plan's reuse step on a hand-made plan: 0 <- 1 <- 2 <- 3 <- 4 (each a delta of the one before),
    and 5 <-> 6 a delta of each other (a cycle, which only corrupt or odd inputs make)."""
    from packyard.store.maintenance.repack import reuse as W

    r = W.Reuse(7)
    for k, b in [(1, 0), (2, 1), (3, 2), (4, 3), (5, 6), (6, 5)]:
        r.kind[k] = W.DELTA
        r.base[k] = b
        r.reused[k] = 1
    W._check_chains(r, 2)
    # 1 and 2 stay (depths 1, 2); 3 would be 3: dropped, it starts a new chain on which 4 rests;
    # the cycle loses one delta.
    assert [r.reused[k] for k in range(5)] == [0, 1, 1, 0, 1]
    assert r.reused[5] + r.reused[6] == 1 and r.dropped == 2
    assert r.height[0] == 2 and r.height[3] == 1


def test_an_error_in_the_forked_segment_is_raised_in_the_parent(monkeypatch):
    """A corrupt object met by the forked search process fails the search with the same typed error,
    naming the object, its file and offset."""
    from packyard.store.errors import CorruptObjectError

    force_fork(monkeypatch)
    objs = similar_blobs(60, 2000)
    c = S.Candidates()
    for k, o in enumerate(objs):
        c.add(3, len(o), k // 10, 50)
    order = S.search_order(c)
    first, second = S.split_segments(order, c, 2)
    bad = second[len(second) // 2]
    oid = bytes([7]) * 20

    def read(i: int) -> bytes:
        if i == bad:
            raise CorruptObjectError("object does not hash to its name; not repacked", oid=oid, path="/x/pack-1.pack",
                                     offset=1234)
        return objs[i]

    with pytest.raises(CorruptObjectError) as info:
        S.search(c, read, S.SearchOptions(processes=2))
    err = info.value
    assert err.oid == oid.hex() and err.path == "/x/pack-1.pack" and err.offset == 1234
    assert "does not hash" in str(err)
