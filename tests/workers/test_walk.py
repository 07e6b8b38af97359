"""The reachability walk in C (store/maintenance/walk/_walk.c) against the pure-Python walk (walk/reach.py), which
specifies it: the same lists (objects, order, names) on real repositories; corrupt, missing and
mistyped objects met inside the packs stop the walk with a typed error naming the object, pack and
offset; garbage entries (whose CRC32 matches, so that the parsers themselves are reached) never make
it read outside its buffers (run under PYTHONMALLOC=debug too).
"""
from __future__ import annotations

import hashlib
import os
import random
import struct
import subprocess
import sys
import zlib
from array import array
from pathlib import Path

import pytest

from gitutil import corpus_available, git, needs_corpus, repo_from_corpus
from packbuild import entry_header, ofs_bytes, varint
from packyard.store.errors import CorruptObjectError, ObjectMissingError, PackFormatError, StoreError
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.maintenance.walk import reach as walk_mod
from packyard.store.maintenance.walk import sources as sources_mod
from packyard.store.maintenance.walk.sources import SourceIndex
from packyard.store.maintenance.walk.tips import read_tips
from packyard.store.objects import ObjectType, hash_object
from packyard.store.repo import Repository

TESTS = Path(__file__).resolve().parent
needs_c = pytest.mark.skipif(walk_mod.IMPLEMENTATION != "c",
                             reason="the C walk is not built (or PACKYARD_PURE_PYTHON=1)")


def _sources(bare: Path) -> tuple[Repository, SourceIndex]:
    repo = Repository.open(bare)
    snap = repo.objects.snapshot()
    kept = [p for p in snap.packs if p.is_kept()]
    return repo, SourceIndex(snap, [p for p in snap.packs if not p.is_kept()], kept, read_fresh=repo.objects.read)


def _lists(r):
    return r.commits, r.tags, r.trees, r.blobs, r.names, r.seen, r.commit_meta


def _both_walks(bare: Path, processes: int = 1):
    repo, sources = _sources(bare)
    try:
        tips = sorted(read_tips(repo).items())
        python = walk_mod.walk(tips, sources.read)
        c = walk_mod.walk(tips, sources.read, packs=sources, processes=processes)
        return python, c
    finally:
        sources.release()


# -- the same lists on real repositories -------------------------------------------------------------------

@needs_c
@needs_corpus("git-v1.0.0")
@pytest.mark.parametrize("processes,drop_every", [(1, sources_mod.DROP_PAGES_EVERY), (2, sources_mod.DROP_PAGES_EVERY),
                                                 (2, 1)])
def test_c_walk_equals_python_walk_on_git_split_in_packs_and_loose(tmp_path, monkeypatch, processes, drop_every):
    """git-v1.0.0 in 8 packs of consecutive history plus its newest commits loose: OFS and REF deltas,
    bases in other packs, objects only the fallback reads; with a helper thread on half the roots. drop_every=1:
    the pages of the packs' maps are given back after every entry either thread inflates (the other thread
    reading on: what it reads faults in again, the same bytes)."""
    from packyard.workers.cli.bench.repack import split_repo

    src = repo_from_corpus(tmp_path)
    bare = split_repo(tmp_path / "split.git", src, packs=8, loose_commits=15)
    monkeypatch.setattr(sources_mod, "DROP_PAGES_EVERY", drop_every)
    monkeypatch.setattr(walk_mod, "FORK_MIN_COMMITS", 1)
    monkeypatch.setattr(walk_mod, "STEAL_MIN_ROOTS", 2)   # the main thread takes the helper's tail if it can
    python, c = _both_walks(bare, processes)
    assert _lists(c) == _lists(python)
    listed = git("rev-list", "--objects", "--all", git_dir=bare).split(b"\n")
    assert {o.hex() for o, _t in c.in_order()} == {line.split()[0].decode() for line in listed if line}


@needs_c
@needs_corpus("git-v2.0.0")
@pytest.mark.slow
def test_c_walk_equals_python_walk_on_git_v2(tmp_path):
    python, c = _both_walks(repo_from_corpus(tmp_path, "git-v2.0.0"), processes=2)
    assert len(c) > 160_000
    assert _lists(c) == _lists(python)


class _StealFirst(walk_mod._HelperThread):
    """The helper thread, started only after the main walk took the tail of its roots (a steal that happens
    on every run, whatever the timing)."""

    stolen: list = []

    def __init__(self, walker, start: int, stop: int) -> None:
        import threading

        self.walker = walker
        self.error = None
        walker.claim_roots(start, stop)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def steal(self, main, cache: int):
        tail = super().steal(main, cache)
        self.stolen.append(tail is not None)
        self.thread.start()
        return tail


@needs_c
@pytest.mark.parametrize("share", [0.0, 0.3, 0.7])
@pytest.mark.slow
def test_roots_stolen_from_the_helper_thread_merge_into_the_lists_of_one_walk(tmp_path, monkeypatch, share):
    """The main thread walks the second half of the roots the helper thread has left (with a copy of its seen
    set); merged after the helper's, the lists are those of one Python walk: objects, order, names."""
    from gitutil import make_worktree_repo

    bare = make_worktree_repo(tmp_path, commits=40, files_per_commit=3)   # dir1 unchanged in every other commit
    git("repack", "-q", "-a", "-d", "--depth=5", git_dir=bare)
    monkeypatch.setattr(walk_mod, "FORK_MIN_COMMITS", 1)
    monkeypatch.setattr(walk_mod, "FORK_SHARE", share)
    monkeypatch.setattr(walk_mod, "STEAL_MIN_ROOTS", 2)
    monkeypatch.setattr(walk_mod, "_HelperThread", _StealFirst)
    _StealFirst.stolen = []
    python, c = _both_walks(bare, processes=2)
    assert _StealFirst.stolen == [True]
    assert _lists(c) == _lists(python)
    listed = git("rev-list", "--objects", "--all", git_dir=bare).split(b"\n")
    assert {o.hex() for o, _t in c.in_order()} == {line.split()[0].decode() for line in listed if line}


@needs_c
def test_steal_roots_takes_the_second_half_of_what_is_left_and_nothing_twice(tmp_path):
    """claim_roots / steal_roots / walk_claimed: the stolen span is the second half of the claimed roots, the
    claimed walk stops where it begins, a span too short is not stolen."""
    from gitutil import make_worktree_repo

    bare = make_worktree_repo(tmp_path, commits=12, files_per_commit=2)
    git("repack", "-q", "-a", "-d", git_dir=bare)
    repo, sources = _sources(bare)
    try:
        w = walk_mod._c.Walker(sources.c_packs, lambda *a: None)
        for name, oid in sorted(read_tips(repo).items()):
            if name == "refs/heads/main":
                w.mark_seen(oid)
                w.queue_commit(oid, repo.objects.read(oid)[1])
        w.walk_commits()
        n = w.counts()[3]
        assert n == 12
        helper = w.copy(1 << 20)
        helper.claim_roots(2, n)
        assert helper.steal_roots(n) is None                 # 10 left: fewer than asked for
        assert helper.steal_roots(2) == (7, 12)
        assert helper.steal_roots(2) == (4, 7)
        assert helper.steal_roots(4) is None
        helper.walk_claimed()                                # roots 2 and 3 only
        assert helper.steal_roots(2) is None                 # nothing left
        one = w.copy(1 << 20)
        one.walk_roots(2, 4)
        assert helper.counts()[:3] == one.counts()[:3] and helper.result() == one.result()
        _commits, trees, blobs = helper.result()
        assert helper.names(trees, blobs) == one.names(*one.result()[1:]) and helper.names(trees, blobs)
        with pytest.raises(ValueError):
            helper.names(blobs, trees)
        helper.release_reader()
        with pytest.raises(RuntimeError, match="released"):
            helper.walk_roots(0, n)
        assert helper.result() == one.result() and len(helper) == len(one)
        some = helper.result()[1][0]
        assert some in helper
        helper.release_seen()                                # then nothing may touch the seen set
        for use in (lambda: some in helper, lambda: helper.mark_seen(some), lambda: helper.copy(1 << 20),
                    lambda: helper.merge(one)):
            with pytest.raises(RuntimeError, match="seen set was released"):
                use()
        assert helper.names(*helper.result()[1:]) == one.names(*one.result()[1:])
    finally:
        sources.release()


def _implementation_in(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PACKYARD_PURE_PYTHON"}
    env.update(env_extra)
    script = "from packyard.store.maintenance.walk import reach; print(reach.IMPLEMENTATION)"
    out = subprocess.run([sys.executable, "-c", script],
                         env=env, check=True, capture_output=True, text=True).stdout
    return out.strip()


def test_pure_python_walk_is_chosen_when_asked():
    assert _implementation_in({"PACKYARD_PURE_PYTHON": "1"}) == "python"
    try:
        import packyard.store.maintenance.walk._walk  # noqa: F401
        built = True
    except ImportError:
        built = False
    assert _implementation_in({}) == ("c" if built else "python")


def test_c_walk_is_built_when_required():
    if os.environ.get("PACKYARD_REQUIRE_C") != "1":
        pytest.skip("PACKYARD_REQUIRE_C=1 (the C extensions must be built) not set")
    import packyard.store.maintenance.walk._walk  # noqa: F401 - fails the test when the build is missing
    if os.environ.get("PACKYARD_PURE_PYTHON") != "1":
        assert walk_mod.IMPLEMENTATION == "c"


# -- bad objects inside the packs ----------------------------------------------------------------------------

def _repo(tmp_path: Path) -> Path:
    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    return bare


def _write(bare: Path, typ: str, data: bytes) -> str:
    return git("hash-object", "-w", "--literally", "-t", typ, "--stdin", git_dir=bare, input=data).decode().strip()


def _tree(entries: list[tuple[str, str, str]]) -> bytes:
    return b"".join(f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid) for mode, name, oid in entries)


def _commit(tree: str, parents: list[str] = (), when: int = 1_700_000_000) -> bytes:
    lines = [f"tree {tree}"] + [f"parent {p}" for p in parents]
    lines += [f"author A <a@example.com> {when} +0000", f"committer A <a@example.com> {when} +0000", "", "m", ""]
    return "\n".join(lines).encode()


def _one_file_commit(bare: Path, data: bytes, mode: str = "100644", name: str = "f") -> tuple[str, str, str]:
    """A blob of ``data`` as the one entry (``mode name``) of a tree, and a commit of it: (blob, tree, commit)."""
    blob = _write(bare, "blob", data)
    tree = _write(bare, "tree", _tree([(mode, name, blob)]))
    return blob, tree, _write(bare, "commit", _commit(tree))


def _pack_everything(bare: Path) -> Path:
    """Every loose object into one pack (git pack-objects), loose files removed; the pack's path."""
    ids = b"".join(p.parent.name.encode() + p.name.encode() + b"\n" for p in (bare / "objects").glob("??/*"))
    name = git("pack-objects", "-q", str(bare / "objects" / "pack" / "pack"), git_dir=bare, input=ids).decode().strip()
    git("prune-packed", git_dir=bare)
    return bare / "objects" / "pack" / f"pack-{name}.pack"


def _entry_offset(pack: Path, oid: str) -> int:
    out = git("verify-pack", "-v", str(pack.with_suffix(".idx"))).decode()
    for line in out.splitlines():
        if line.startswith(oid):
            return int(line.split()[4])
    raise AssertionError(f"{oid} not in {pack}")


def _walk_errors(bare: Path) -> tuple[BaseException, BaseException]:
    """The error of the Python walk and of the C walk over the same repository."""
    repo, sources = _sources(bare)
    tips = sorted(read_tips(repo).items())
    errors = []
    try:
        for packs in (None, sources):
            with pytest.raises(StoreError) as info:
                walk_mod.walk(tips, sources.read, packs=packs)
            errors.append(info.value)
    finally:
        sources.release()
    return errors[0], errors[1]


@needs_c
def test_packed_tree_whose_bytes_differ_from_its_crc_stops_the_walk(tmp_path):
    bare = _repo(tmp_path)
    _blob, tree, commit = _one_file_commit(bare, b"content\n")
    git("update-ref", "refs/heads/main", commit, git_dir=bare)
    pack = _pack_everything(bare)
    offset = _entry_offset(pack, tree)
    raw = bytearray(pack.read_bytes())
    raw[offset + 4] ^= 0x40        # inside the zlib stream
    pack.chmod(0o644)
    pack.write_bytes(bytes(raw))
    python_err, c_err = _walk_errors(bare)
    assert isinstance(python_err, CorruptObjectError)
    assert isinstance(c_err, PackFormatError) and "CRC32" in str(c_err)
    assert (c_err.oid, c_err.path, c_err.offset) == (tree, str(pack), offset)
    # ... and the repack stops before deleting anything.
    before = sorted(p.name for p in (bare / "objects" / "pack").iterdir())
    with pytest.raises(PackFormatError):
        repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL))
    assert sorted(p.name for p in (bare / "objects" / "pack").iterdir()) == before


@needs_c
def test_tree_entry_naming_a_blob_as_a_directory_is_refused(tmp_path):
    bare = _repo(tmp_path)
    blob, tree, commit = _one_file_commit(bare, b"not a tree\n", "40000", "dir")
    git("update-ref", "refs/heads/main", commit, git_dir=bare)
    pack = _pack_everything(bare)
    python_err, c_err = _walk_errors(bare)
    for err in (python_err, c_err):
        assert type(err) is CorruptObjectError and err.oid == blob
        assert f"is a blob but tree {tree} refers to it as a tree" in str(err)
    assert (c_err.path, c_err.offset) == (str(pack), _entry_offset(pack, blob))


@needs_c
@pytest.mark.parametrize("what", ["tree", "parent", "entry"])
def test_malformed_commit_or_tree_in_a_pack_is_refused_like_the_python_walk(tmp_path, what):
    bare = _repo(tmp_path)
    blob = _write(bare, "blob", b"x\n")
    good_tree = _tree([("100644", "f", blob)])
    if what == "entry":
        tree = _write(bare, "tree", good_tree + b"100644 truncated\0" + b"\x01" * 7)
        commit = _write(bare, "commit", _commit(tree))
        bad = tree
    else:
        tree = _write(bare, "tree", good_tree)
        data = _commit(tree, ["z" * 40] if what == "parent" else [])
        if what == "tree":
            data = data.replace(f"tree {tree}".encode(), f"tree {tree[:39]}".encode())
        bad = _write(bare, "commit", data)
        commit = _write(bare, "commit", _commit(tree, [bad], when=1_700_000_100))
    (bare / "refs" / "heads" / "main").write_text(commit + "\n")   # (git refuses to point a ref at it)
    _pack_everything(bare)
    python_err, c_err = _walk_errors(bare)
    assert type(c_err) is type(python_err) is CorruptObjectError
    assert c_err.oid == python_err.oid == bad
    assert c_err.message == python_err.message


@needs_c
def test_object_missing_below_a_packed_tree_names_the_tree(tmp_path):
    bare = _repo(tmp_path)
    ghost = hash_object(ObjectType.BLOB, b"never written\n").hex()
    sub = _write(bare, "tree", _tree([("100644", "gone", ghost)]))
    tree = _write(bare, "tree", _tree([("40000", "sub", sub)]))
    ghost_dir = hash_object(ObjectType.TREE, b"").hex()
    tree2 = _write(bare, "tree", _tree([("40000", "a", ghost_dir)]))
    commit = _write(bare, "commit", _commit(tree))
    commit2 = _write(bare, "commit", _commit(tree2, [commit], when=1_700_000_100))
    git("update-ref", "refs/heads/main", commit2, git_dir=bare)
    _pack_everything(bare)
    python_err, c_err = _walk_errors(bare)
    for err in (python_err, c_err):
        assert type(err) is ObjectMissingError and err.oid == ghost_dir
        assert f"referenced by tree {tree2}" in str(err)


@needs_c
def test_loose_object_with_wrong_content_is_refused_by_the_fallback(tmp_path):
    """Objects outside the packs reach the C walk through the Python read, which checks their SHA-1."""
    bare = _repo(tmp_path)
    blob, _tree_id, commit = _one_file_commit(bare, b"x\n")
    _pack_everything(bare)
    other = _write(bare, "tree", _tree([("100644", "g", blob)]))
    loose = bare / "objects" / other[:2] / other[2:]
    # A new commit (loose) whose tree's file holds another tree's bytes.
    victim_tree = _write(bare, "tree", _tree([("100644", "h", blob)]))
    victim = bare / "objects" / victim_tree[:2] / victim_tree[2:]
    victim.chmod(0o644)
    victim.write_bytes(loose.read_bytes())
    top = _write(bare, "commit", _commit(victim_tree, [commit], when=1_700_000_100))
    git("update-ref", "refs/heads/main", top, git_dir=bare)
    python_err, c_err = _walk_errors(bare)
    for err in (python_err, c_err):
        assert type(err) is CorruptObjectError and err.oid == victim_tree and "hash" in str(err)


# -- garbage entries: never outside the buffers ---------------------------------------------------------------

def _whole(typ: int, data: bytes) -> bytes:
    return entry_header(typ, len(data)) + zlib.compress(data)


def synthetic_packs(entries: list[tuple[bytes, bytes]]):
    """A pack of raw entries [(id, entry bytes)] (ids need not be their hashes) with the tables SourceIndex
    gives _walk.Packs: CRC32s of the raw bytes, so that every entry passes the CRC check."""
    from packyard.store.maintenance.walk import _walk

    body = bytearray(b"PACK" + struct.pack(">II", 2, len(entries)))
    offsets = []
    for _oid, raw in entries:
        offsets.append(len(body))
        body += raw
    end = len(body)
    body += hashlib.sha1(body).digest()
    n = len(entries)
    by_id = sorted(range(n), key=lambda k: entries[k][0])
    nxt = {offsets[k]: (offsets[k + 1] if k + 1 < n else end) for k in range(n)}
    offs = array("Q", [offsets[k] for k in by_id])
    order = array("I", sorted(range(n), key=offs.__getitem__))
    tables = (bytes(body), end, b"".join(entries[k][0] for k in by_id), offs,
              array("I", [zlib.crc32(entries[k][1]) for k in by_id]), array("Q", [nxt[o] for o in offs]),
              array("Q", sorted(offs)), order)
    return _walk.Packs([tables], [], 12345)


def _missing(oid, want, referrer):
    raise ObjectMissingError(f"missing (referenced by {referrer})", oid=oid)


def walk_synthetic(entries, commit_id: bytes, commit_data: bytes) -> str:
    """Walk one commit over a synthetic pack; what happened ("ok" or the error's class)."""
    from packyard.store.maintenance.walk import _walk

    cw = _walk.Walker(synthetic_packs(entries), _missing, cache_bytes=1 << 16)
    try:
        cw.mark_seen(commit_id)
        cw.queue_commit(commit_id, commit_data)
        cw.walk_commits()
        cw.walk_roots(0, cw.counts()[3])
        cw.result()
        return "ok"
    except (_walk.WalkError, StoreError) as err:
        return type(err).__name__


def fuzz_cases(seed: int, count: int):
    """(entries, commit id, commit data): a commit whose tree is damaged in one of many ways."""
    rng = random.Random(seed)
    ids = [hashlib.sha1(b"%d" % k).digest() for k in range(40)]
    for case in range(count):
        names = [b"f%d" % k for k in range(rng.randrange(0, 12))]
        tree = b"".join((b"40000" if rng.random() < 0.3 else b"100644") + b" " + nm + b"\0" + rng.choice(ids)
                        for nm in names)
        entries = []
        tree_id = ids[0]
        kind = case % 6
        if kind == 0:      # the tree's bytes damaged: flipped, cut, NULs and spaces moved
            t = bytearray(tree)
            for _ in range(rng.randrange(1, 4)):
                if t:
                    t[rng.randrange(len(t))] = rng.choice([0, 32, 0x34, rng.randrange(256)])
            if t and rng.random() < 0.5:
                del t[rng.randrange(len(t)):]
            entries.append((tree_id, _whole(2, bytes(t))))
        elif kind == 1:    # a header with garbage after the type byte, or a wrong size
            data = zlib.compress(tree)
            hdr = entry_header(2, max(0, len(tree) + rng.choice([-3, -1, 1, 5, 1 << 20])))
            entries.append((tree_id, bytes(hdr) + data[:rng.randrange(len(data) + 1)]))
        elif kind == 2:    # random bytes as the whole entry
            entries.append((tree_id, bytes([rng.choice([0x20, 0x2f, 0x60, 0x70, 0xa0, rng.randrange(256)])]) +
                            rng.randbytes(rng.randrange(0, 40))))
        elif kind == 3:    # an OFS_DELTA on a valid base with damaged instructions
            base = _whole(2, tree)
            delta = bytearray(varint(len(tree)) + varint(max(0, len(tree) + rng.randrange(-5, 5))))
            for _ in range(rng.randrange(1, 6)):
                op = rng.randrange(256)
                delta.append(op)
                delta += rng.randbytes(rng.randrange(0, 8))
            entries.append((ids[1], base))
            entries.append((tree_id, entry_header(6, len(delta)) + ofs_bytes(len(base) + rng.choice([0, 0, 1, 7]))
                            + zlib.compress(bytes(delta))))
        elif kind == 4:    # a REF_DELTA chain with a cycle or an absent base
            a, b = ids[2], ids[3]
            d = varint(len(tree)) + varint(len(tree)) + (b"\x90" + bytes([len(tree) & 0xff]) if tree else b"")
            entries.append((tree_id, entry_header(7, len(d)) + a + zlib.compress(d)))
            entries.append((a, entry_header(7, len(d)) + rng.choice([tree_id, b, ids[4]]) + zlib.compress(d)))
        else:              # a valid tree whose subtrees are damaged the same ways (depth)
            entries.append((tree_id, _whole(2, tree)))
            for oid in set(ids[1:6]):
                t = bytearray(tree)
                if t:
                    t[rng.randrange(len(t))] = rng.randrange(256)
                entries.append((oid, _whole(2, bytes(t))))
        commit_id = ids[39]
        yield entries, commit_id, _commit(tree_id.hex())


@needs_c
def test_garbage_entries_raise_typed_errors():
    outcomes = {walk_synthetic(*case) for case in fuzz_cases(1, 600)}
    assert outcomes <= {"ok", "WalkError", "ObjectMissingError"}, outcomes
    assert "WalkError" in outcomes and "ObjectMissingError" in outcomes


MALLOC_DEBUG_SCRIPT = r"""
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/.."]  # test_walk's folder, then tests/ (its helpers)
import test_walk as t
outcomes = {t.walk_synthetic(*case) for case in t.fuzz_cases(2, 400)}
assert outcomes <= {"ok", "WalkError", "ObjectMissingError"}, outcomes
print("fuzz", sorted(outcomes))
if len(sys.argv) > 2:
    from packyard.store.maintenance.walk import reach as walk
    python, c = t._both_walks(__import__("pathlib").Path(sys.argv[2]), processes=2)
    assert t._lists(c) == t._lists(python)
    print("walk", len(c))
"""


@needs_c
def test_c_walk_under_python_malloc_debug(tmp_path):
    """PYTHONMALLOC=debug checks every PyMem_Raw* block the walk allocates for over- and underruns."""
    args = [str(TESTS)]
    if corpus_available("git-v1.0.0"):
        from packyard.workers.cli.bench.repack import split_repo

        args.append(str(split_repo(tmp_path / "split.git", repo_from_corpus(tmp_path), packs=4, loose_commits=10)))
    env = {**os.environ, "PYTHONMALLOC": "debug"}
    proc = subprocess.run([sys.executable, "-c", MALLOC_DEBUG_SCRIPT, *args], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fuzz" in proc.stdout


# -- threads: the GIL is released, a failed walk stops its helper ---------------------------------------------

@needs_c
@needs_corpus("git-v1.0.0")
def test_other_threads_run_while_the_c_walk_works(tmp_path):
    """The walk releases the GIL (a lease's heartbeat thread must keep renewing during a long walk): a
    Python thread counting in a loop advances while one C call walks every tree."""
    import threading

    from packyard.store.maintenance.walk import _walk

    repo, sources = _sources(repo_from_corpus(tmp_path))
    w = walk_mod.Walker(sources.read, packs=sources)
    cw = _walk.Walker(sources.c_packs, w._read)
    for name, oid in sorted(read_tips(repo).items()):
        if cw.mark_seen(oid):
            typ, data = w._read(oid, None, name)
            cw.queue_commit(oid, data)
    cw.walk_commits()
    counts = []
    stop = threading.Event()

    def count():
        n = 0
        while not stop.is_set():
            n += 1
            if n % 1000 == 0:
                counts.append(n)

    t = threading.Thread(target=count)
    t.start()
    interval = sys.getswitchinterval()
    try:
        while len(counts) < 3:      # the counter is running
            pass
        # For the next second the interpreter does not take the GIL from this thread by itself (the walk
        # takes ~0.2 s): the counter runs only if the C call lets go of it (a build that holds it fails).
        sys.setswitchinterval(1.0)
        before = len(counts)
        cw.walk_roots(0, cw.counts()[3])   # one C call: every tree of git v1.0.0
        during = len(counts) - before
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        t.join()
        sources.release()
    assert cw.counts()[1] > 1000
    assert during > 0


@needs_c
def test_an_error_in_the_main_walk_stops_the_helper_thread(tmp_path, monkeypatch):
    import threading

    bare = _repo(tmp_path)
    blob = _write(bare, "blob", b"x\n")
    parent = None
    for k in range(40):
        tree = _write(bare, "tree", _tree([("100644", f"f{k}", blob)]))
        commit = _write(bare, "commit", _commit(tree, [parent] if parent else [], when=1_700_000_000 + k))
        parent = commit
    git("update-ref", "refs/heads/main", parent, git_dir=bare)
    ghost = hash_object(ObjectType.TREE, b"a tree nobody wrote").hex()
    # A tip naming a tree whose subtree is missing: the main walker meets it after the helper started.
    broken = _write(bare, "tree", _tree([("40000", "sub", ghost)]))
    (bare / "refs" / "tags" / "broken").write_text(broken + "\n")
    _pack_everything(bare)
    monkeypatch.setattr(walk_mod, "FORK_MIN_COMMITS", 1)
    threads = threading.active_count()
    repo, sources = _sources(bare)
    try:
        with pytest.raises(ObjectMissingError) as info:
            walk_mod.walk(sorted(read_tips(repo).items()), sources.read, packs=sources, processes=2)
    finally:
        sources.release()
    assert info.value.oid == ghost and f"referenced by tree {broken}" in str(info.value)
    assert threading.active_count() == threads   # the helper was stopped and joined


@needs_c
def test_c_index_answers_as_the_python_one_on_every_shape(tmp_path, monkeypatch):
    """SourceIndex with the C index vs without it, on a repository with unreachable (old and young,
    loose and packed), .keep-pack, loose and duplicated objects: loc, present(), unreached(), oid_at()."""
    import repackutil as ru

    shapes = ru.build(tmp_path / "shapes")
    repo, c_sources = _sources(shapes.bare)
    try:
        reach = walk_mod.walk(sorted(read_tips(repo).items()), c_sources.read, packs=c_sources)
        snap = repo.objects.snapshot()
        import packyard.store.maintenance.walk.sources as sources_mod

        monkeypatch.setattr(sources_mod, "_walk_c", None)     # this SourceIndex: the Python dict and loops
        py = SourceIndex(snap, [p for p in snap.packs if not p.is_kept()], [p for p in snap.packs if p.is_kept()],
                         read_fresh=repo.objects.read)
        monkeypatch.undo()
        assert py.c_packs is None and isinstance(py.loc, dict)
        every = [p.oids[20 * i:20 * i + 20] for p in py.packs for i in range(p.count)] + sorted(py.loose_ids)
        assert {oid: c_sources.loc.get(oid) for oid in every} == {oid: py.loc.get(oid) for oid in every}
        assert len(c_sources.loc) == len(py.loc) and all((oid in c_sources.loc) == (oid in py.loc) for oid in every)
        assert c_sources.present(reach.ids()) == py.present(reach.ids())
        reached = reach.reached()                            # the C walker's own seen set, no Python set built
        assert reach._seen is None and reached is not reach.seen
        unreached = c_sources.unreached(reached)
        assert unreached == c_sources.unreached(reach.seen) == py.unreached(reach.seen) == py.unreached(reached)
        assert any(unreached)
        assert len(reached) == len(reach.seen) and all(oid in reached for oid in reach.seen)
        assert not any(oid in reached for oid in every if oid not in reach.seen)
        names = dict(reach.names)
        reach._seen = None                                   # as after the C walk: then the walker's set is dropped
        reach.drop_index()
        assert reach.reached() == set(reach.ids()) and reach.names == names and reach._walker is None
        for p in py.packs:
            for i in range(p.count):
                off = p.offsets[i]
                assert (c_sources.oid_at(c_sources.packs[p.number], off) == py.oid_at(p, off)
                        == p.oids[20 * i:20 * i + 20])
                assert c_sources.oid_at(c_sources.packs[p.number], off + 1) is None
        py.release()
    finally:
        c_sources.release()


@needs_c
@pytest.mark.parametrize("n", [0, 1, 2, 3000])
def test_c_pack_layout_equals_the_python_one(monkeypatch, n):
    """pack_layout (a radix sort by offset) against sources._layout's Python sort: offsets past 32 and 40 bits,
    and a duplicated offset (a broken idx: ties stay in idx order in both)."""
    import packyard.store.maintenance.walk.sources as sources_mod

    rng = random.Random(n)
    offsets = array("Q", [rng.choice((rng.randrange(12, 1 << 20), rng.randrange(1 << 32, 1 << 45)))
                          for _ in range(n)])
    if n > 2:
        offsets[1] = offsets[n - 1]
    c = sources_mod._layout(offsets, 1 << 46)
    monkeypatch.setattr(sources_mod, "_walk_c", None)
    assert c == sources_mod._layout(offsets, 1 << 46)


# -- what the walk keeps of each commit for the bitmap and the commit-graph ---------------------------------

def _odd_commits(bare: Path) -> None:
    """Commits the commit-graph reads differently from the walk, or whose dates are edge cases; main names them."""
    _blob, tree, base = _one_file_commit(bare, b"x")
    head = "\n".join(["author A <a@example.com> 1 +0000", "committer A <a@example.com> 2 +0000", "", "m", ""])
    bodies = [
        f"tree {tree}\nparent {base}\n" + head,                                              # ordinary
        f"tree {tree}\nauthor A <a@example.com> 1 +0000\nparent {base}\ncommitter A <a@e> 3 +0000\n\nm\n",  # late
        f"tree {tree}\nparent {base}\nauthor A <a@example.com> 1 +0000\n\nno committer\n",
        f"tree {tree}\nparent {base}\nauthor A <a@example.com> 1 +0000\ncommitter no bracket 5 +0000\n\nm\n",
        f"tree {tree}\nparent {base}\nauthor A <a@e> 1 +0000\ncommitter A <a@e>  \t 77 +0000\n\nm\n",
        f"tree {tree}\nparent {base}\nauthor A <a@e> 1 +0000\ncommitter A <a@e> 99999999999999999999999 +0000\n\nm\n",
        f"tree {tree.upper()}\nparent {base.upper()}\n" + head,                               # upper-case hex
        f"tree {tree}\nparent {base}\ncommitter A <a@e> 4 +0000\nauthor A <a@e> 1 +0000\n\nm\n",   # swapped
    ]
    tips = [_write(bare, "commit", b.encode()) for b in bodies]
    merge = _write(bare, "commit", (f"tree {tree}\n" + "".join(f"parent {t}\n" for t in tips) + head).encode())
    git("update-ref", "refs/heads/main", merge, git_dir=bare)


@needs_c
@pytest.mark.parametrize("packed", [False, True])
def test_commit_meta_of_the_c_walk_equals_the_python_one_and_the_graphs_reading(tmp_path, packed):
    """Both walks keep the same trees, parents, dates and graph flags; where a commit is graph_ok its
    graph date is what the commit-graph's own parser reads, and a commit the graph reads otherwise (a
    parent line after the author line) is not graph_ok."""
    from array import array

    from packyard.store.maintenance.serving.commitgraph import parse_commit_for_graph

    bare = _repo(tmp_path)
    _odd_commits(bare)
    if packed:
        _pack_everything(bare)
    python, c = _both_walks(bare)
    assert c.commit_meta == python.commit_meta
    m = c.commit_meta
    ok = list(m.graph_ok)
    graph_dates = array("Q", m.graph_dates)
    counts = array("I", m.nparents)
    repo = Repository.open(bare)
    at = 0
    for k, oid in enumerate(c.commits):
        _typ, data = repo.objects.read(oid)
        parents = [m.parents[at + 20 * j:at + 20 * j + 20] for j in range(counts[k])]
        at += 20 * counts[k]
        g = parse_commit_for_graph(data, oid)
        if ok[k]:
            assert (g.tree, g.parents, g.date) == (m.trees[20 * k:20 * k + 20], parents, graph_dates[k])
    assert ok.count(0) == 1            # the late parent line
    assert set(graph_dates) >= {0, 2, 77, (1 << 64) - 1}
