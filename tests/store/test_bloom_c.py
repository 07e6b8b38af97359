"""The Bloom filters' C loop (store/maintenance/serving/_bloom.c) against its specification (bloom.py) and git:
the same filter bytes for every commit of a history with renames, deep directories, more than 512 changes,
path bytes over 0x7f at every position modulo 4 (git 2.39's signed-char murmur3), merges, two root commits,
gitlinks (added, moved, turned into a directory), a non-canonical mode and loose objects; the same BIDX/BDAT
(the whole graph file) from C, from ``PACKYARD_PURE_PYTHON=1`` and from git; typed errors for bad trees."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import graphutil
from gitutil import GIT_ENV, git
from packyard.store.errors import CorruptObjectError
from packyard.store.maintenance.serving import bloom
from packyard.store.maintenance.serving import commitgraph as cg
from packyard.store.repo import Repository

needs_c = pytest.mark.skipif(bloom._c is None, reason="the _bloom extension is not built or pure Python is asked")
ODD = [os.fsdecode(b"\xff"), os.fsdecode(b"a\x80b"), os.fsdecode(b"ab\xc3\xa9"), os.fsdecode(b"abc\xfe\xfd"),
       "caf\u00e9", "\u00e4\u00f6\u00fc\u00df\u00e9\u00e8"]


def _commit(work: Path, n: int, msg: str, *args: str) -> None:
    env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": f"{1_600_000_000 + n} +0000",
           "GIT_COMMITTER_DATE": f"{1_600_000_000 + n} +0000"}
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", msg, *args], cwd=work, env=env, check=True)


def _build(base: Path) -> Path:
    work = base / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", str(work))
    deep = work.joinpath(*[f"d{i}" for i in range(40)])
    deep.mkdir(parents=True)
    (deep / "leaf.txt").write_text("leaf\n")
    for i, name in enumerate(ODD):
        (work / name).mkdir()
        (work / name / f"{name}{i}.txt").write_text(f"{i}\n")
    (work / "old-name.txt").write_text("renamed later\n" * 20)
    git("add", "-A", cwd=work)
    _commit(work, 1, "root")
    head = git("rev-parse", "HEAD", cwd=work).decode().strip()
    git("mv", "old-name.txt", "new-name.txt", cwd=work)
    git("mv", ODD[0], "moved-" + ODD[0], cwd=work)
    (deep / "leaf.txt").write_text("leaf 2\n")
    git("add", "-A", cwd=work)
    _commit(work, 2, "renames, a deep change")
    git("update-index", "--add", "--cacheinfo", f"160000,{head},sub/module", cwd=work)
    _commit(work, 3, "a gitlink")
    git("update-index", "--cacheinfo", f"160000,{git('rev-parse', 'HEAD', cwd=work).decode().strip()},sub/module",
        cwd=work)
    git("update-index", "--add", "--cacheinfo", f"160000,{head},gl", cwd=work)
    _commit(work, 4, "the gitlink moves, another one")
    git("rm", "-q", "--cached", "sub/module", cwd=work)
    (work / "sub" / "module").mkdir(parents=True)
    (work / "sub" / "module" / "inside.txt").write_text("now a directory\n")
    git("add", "sub/module/inside.txt", cwd=work)
    _commit(work, 5, "gitlink to directory")
    many = deep / "many"
    many.mkdir()
    for i in range(700):
        (many / f"m{i}").write_text(f"{i}\n")
    git("add", "-A", cwd=work)
    _commit(work, 6, "700 files, 40 directories deep")
    for i in range(300):
        (many / f"m{i}").write_text(f"{i} again\n")
    git("add", "-A", cwd=work)
    _commit(work, 7, "300 changes under 41 directories (over 512 with them)")
    for i in range(450):
        (many / f"m{i}").write_text(f"{i} third\n")
    (work / "d0" / "d1" / "x.txt").write_text("x\n")
    git("add", "-A", cwd=work)
    _commit(work, 8, "451 changes")
    git("checkout", "-q", "-b", "side", "main~3", cwd=work)
    for i, name in enumerate(ODD[1:]):
        (work / name / f"{name}{i}.txt").write_text(f"side {i}\n")
    git("add", "-A", cwd=work)
    _commit(work, 9, "side: non-ASCII changes")
    git("checkout", "-q", "--orphan", "other", cwd=work)
    git("rm", "-q", "-rf", ".", cwd=work)
    (work / "unrelated.txt").write_text("a second root\n")
    git("add", "-A", cwd=work)
    _commit(work, 10, "second root")
    git("checkout", "-q", "main", cwd=work)
    _commit(work, 11, "merge side", "--allow-empty")
    subprocess.run(["git", "merge", "-q", "--no-ff", "--no-edit", "side"], cwd=work, check=True,
                   env={**os.environ, **GIT_ENV}, capture_output=True)
    subprocess.run(["git", "merge", "-q", "--no-ff", "--no-edit", "--allow-unrelated-histories", "other"],
                   cwd=work, check=True, env={**os.environ, **GIT_ENV}, capture_output=True)
    git("rm", "-q", "-r", "d0", cwd=work)
    _commit(work, 12, "the deep tree removed")
    bare = base / "repo.git"
    git("clone", "-q", "--bare", "--no-local", str(work), str(bare))
    for b in ("side", "other"):
        git("update-ref", f"refs/heads/{b}", git("rev-parse", b, cwd=work).decode().strip(), git_dir=bare)
    # loose objects on top (read through read(), not the packs): a tree with a non-canonical mode
    tip = git("rev-parse", "main", git_dir=bare).decode().strip()
    blob = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"loose\n").decode().strip()
    raw = git("cat-file", "tree", f"{tip}^{{tree}}", git_dir=bare)
    assert b"100644 new-name.txt\0" in raw
    raw = raw.replace(b"100644 new-name.txt\0", b"100664 new-name.txt\0")   # no change to git's tree diff
    raw += b"100664 zz-group-writable\0" + bytes.fromhex(blob)
    tree = git("hash-object", "-t", "tree", "-w", "--literally", "--stdin", git_dir=bare, input=raw).decode().strip()
    body = (f"tree {tree}\nparent {tip}\nauthor A <a@example.com> 1600000100 +0000\n"
            f"committer C <c@example.com> 1600000100 +0000\n\nloose, mode 100664\n").encode()
    oid = git("hash-object", "-t", "commit", "-w", "--stdin", git_dir=bare, input=body).decode().strip()
    git("update-ref", "refs/heads/main", oid, git_dir=bare)
    shutil.rmtree(work)
    return bare


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("bloomc"))


def _pairs(bare: Path) -> tuple[Repository, list[tuple[bytes | None, bytes]]]:
    repo = Repository.open(bare)
    commits = cg.reachable_commits(repo.objects.read, cg.ref_tips(repo))
    pairs: list[tuple[bytes | None, bytes]] = []
    for c in commits.values():
        pairs.append((None, c.tree))
        pairs += [(commits[p].tree, c.tree) for p in c.parents]   # every parent, not only the first
        pairs += [(c.tree, commits[p].tree) for p in c.parents]   # and the other way round
    return repo, pairs


def _python(read, pairs):   # type: ignore[no-untyped-def]
    differ = bloom.TreeDiffer(read)
    return [bloom.filter_bytes(differ.changed(old, new)) for old, new in pairs]


@needs_c
@pytest.mark.parametrize("which", ["history", "graphutil"])
def test_c_filters_are_the_pythons(history, tmp_path, which):
    bare = history if which == "history" else graphutil.build_history(tmp_path)
    repo, pairs = _pairs(bare)
    c_packs = bloom.open_packs(repo.objects.packs.prepare())
    try:
        ours = bloom.filters(repo.objects.read, pairs, c_packs)
    finally:
        bloom.close_packs(c_packs)
    spec = _python(repo.objects.read, pairs)
    assert ours == spec
    kinds = {f[:1] if len(f) == 1 else b"filter" for f in ours}
    assert kinds == {bloom.TOO_LARGE, bloom.EMPTY, b"filter"}   # every kind of filter was compared
    # without the packs every object comes through read(): the same filters
    assert bloom.filters(repo.objects.read, pairs[:200]) == spec[:200]


def test_graph_bytes_from_c_pure_python_and_git_are_identical(history, tmp_path):
    bare = tmp_path / "repo.git"
    shutil.copytree(history, bare, symlinks=True)
    ours, result = cg.build_single(Repository.open(bare))
    assert result.filters_large >= 2 and result.filters_empty >= 1
    script = ("import sys; from pathlib import Path; from packyard.store.repo import Repository; "
              "from packyard.store.maintenance.serving import bloom, commitgraph as cg; assert bloom._c is None; "
              "sys.stdout.buffer.write(cg.build_single(Repository.open(Path(sys.argv[1])))[0])")
    pure = subprocess.run([sys.executable, "-c", script, str(bare)], env={**os.environ, "PACKYARD_PURE_PYTHON": "1"},
                          capture_output=True, check=True).stdout
    assert pure == ours
    git("commit-graph", "write", "--reachable", "--changed-paths", git_dir=bare)
    assert (bare / "objects" / "info" / "commit-graph").read_bytes() == ours
    git("commit-graph", "verify", git_dir=bare)


@needs_c
def test_c_bad_trees_are_typed_errors_naming_them(history, tmp_path):
    bare = tmp_path / "repo.git"
    shutil.copytree(history, bare, symlinks=True)
    repo = Repository.open(bare)
    good = git("rev-parse", "main^{tree}", git_dir=bare).decode().strip()
    bad = git("hash-object", "-t", "tree", "-w", "--literally", "--stdin", git_dir=bare,
              input=b"100644 truncated\0ab").decode().strip()
    blob = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"not a tree\n").decode().strip()
    packs = bloom.open_packs(repo.objects.packs.prepare())
    for oid in (bad, blob):
        for pair in ((bytes.fromhex(good), bytes.fromhex(oid)), (None, bytes.fromhex(oid))):
            with pytest.raises(CorruptObjectError) as err:
                bloom.filters(repo.objects.read, [pair], packs)
            assert err.value.oid == oid
            with pytest.raises(CorruptObjectError):
                _python(repo.objects.read, [pair])
    # a blob standing where a subtree should be, inside the packs: the C loop names it
    sub = git("rev-parse", "main~1:sub", git_dir=bare).decode().strip()
    inner = git("rev-parse", "main~1:sub/module/inside.txt", git_dir=bare).decode().strip()
    fake = git("hash-object", "-t", "tree", "-w", "--literally", "--stdin", git_dir=bare,
               input=b"40000 module\0" + bytes.fromhex(inner)).decode().strip()
    with pytest.raises(CorruptObjectError) as err:
        bloom.filters(repo.objects.read, [(bytes.fromhex(sub), bytes.fromhex(fake))], packs)
    assert err.value.oid == inner
    bloom.close_packs(packs)


@needs_c
def test_c_commit_reads_walk_as_reachable_commits(history):
    repo = Repository.open(history)
    read = repo.objects.read
    tips = cg.ref_tips(repo)
    spec = cg.reachable_commits(read, tips)
    c_packs = bloom.open_packs(repo.objects.packs.prepare())
    try:
        ours = cg.reachable_commits(read, tips, c_packs=c_packs)
        assert list(ours.items()) == list(spec.items())   # the same commits, parsed alike, in the same order
        assert any(not repo.objects.packs.prepare().find(oid) for oid in ours)   # a loose one, through read()
        stop = {git("rev-parse", "main~3", git_dir=history).decode().strip()}
        stop_ids = {bytes.fromhex(o) for o in stop}
        have = {oid: spec[oid] for oid in list(spec)[:2]}
        assert (list(cg.reachable_commits(read, tips, dict(have), stop_ids, c_packs=c_packs).items())
                == list(cg.reachable_commits(read, tips, dict(have), stop_ids).items()))
        tree = git("rev-parse", "main^{tree}", git_dir=history).decode().strip()
        with pytest.raises(CorruptObjectError) as err:
            cg.reachable_commits(read, [bytes.fromhex(tree)], c_packs=c_packs)
        assert err.value.oid == tree and "a commit's parent is a tree" in str(err.value)
    finally:
        bloom.close_packs(c_packs)


def _random_trees(rng, trees: dict, depth: int, base: dict | None = None) -> bytes:
    """A random tree (stored in ``trees`` by a made-up id), or a mutation of ``base`` (name -> entry)."""
    from packyard.store.objects import ObjectType

    names = [bytes([rng.choice(b"ab./-_\x7f\x80\xc3\xe9\xff")]) * rng.randint(1, 3) + bytes([rng.randint(0x21, 0xff)])
             for _ in range(rng.randint(0, 9))]
    entries = dict(base or {})
    for name in names:
        if b"/" in name:
            name = name.replace(b"/", b"+")
        kind = rng.random()
        if entries and kind < 0.3:
            entries.pop(rng.choice(sorted(entries)))
            continue
        if kind < 0.55 and depth < 4:
            sub = entries.get(name)
            sub_base = sub[2] if sub and sub[0] in (b"40000", b"040000") else None
            entries[name] = (rng.choice([b"40000", b"040000"]), None,
                             _random_trees(rng, trees, depth + 1, trees[sub_base][2] if sub_base else None))
        else:
            entries[name] = (rng.choice([b"100644", b"100755", b"100664", b"120000", b"160000", b"644"]), None,
                             bytes([rng.randint(0, 3)]) * 20)
    order = sorted(entries, key=lambda n: n + (b"/" if entries[n][0] in (b"40000", b"040000") else b""))
    if rng.random() < 0.1:
        rng.shuffle(order)   # not in git's order (a tree git would not write): the C loop sorts it
    data = b"".join(entries[n][0] + b" " + n + b"\0" + entries[n][2] for n in order)
    oid = bytes(rng.getrandbits(8) for _ in range(20))
    trees[oid] = (ObjectType.TREE, data, entries)
    return oid


@needs_c
def test_c_and_python_agree_on_random_trees():
    """Random trees read through read() only (no packs): names with bytes over 0x7f at every position, names
    that sort differently as a file and as a tree, file <-> tree <-> gitlink, non-canonical modes, unsorted."""
    import random

    rng = random.Random(19)
    trees: dict = {}
    pairs: list[tuple[bytes | None, bytes]] = []
    for _ in range(150):
        a = _random_trees(rng, trees, 0)
        b = _random_trees(rng, trees, 0, trees[a][2])
        c = _random_trees(rng, trees, 0, trees[b][2])
        pairs += [(a, b), (b, a), (b, c), (a, c), (None, a)]

    def read(oid: bytes):   # type: ignore[no-untyped-def]
        return trees[oid][:2]

    assert bloom.filters(read, pairs) == _python(read, pairs)
