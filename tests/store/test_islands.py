"""Delta islands (store/maintenance/repack/islands.py) against git's: the same islands from the same regexes, and no
delta of our pack -- reused or new -- rests on a base another island lacks, as none of git's `repack -adi` does. The
rule is read off the packs with `git verify-pack -v` and the islands' objects with `git rev-list --objects`."""
from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from gitutil import GIT_ENV, fsck, git
from packyard.store.maintenance.pool.layout import ISLAND_REGEX
from packyard.store.maintenance.repack.islands import IslandOptions, island_of, islands_of
from packyard.store.maintenance.repack.options import RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.repo import Repository
from poolutil import written_first


def _text(seed: int, lines: int = 400) -> str:
    rnd = random.Random(seed)
    return "".join(f"line {k} {rnd.randrange(10**9)}\n" for k in range(lines))


def _commit(work: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)


@pytest.fixture
def network(tmp_path: Path) -> Path:
    """A pool-shaped repository: refs/virtual/{a,b,c}/... Each of a and b adds its own version of one large file
    (near copies of each other: a delta between them is what a plain repack makes); c shares the base only."""
    work = tmp_path / "work"
    git("init", "-q", "-b", "main", str(work))
    shared = _text(1)
    _commit(work, {"big.txt": shared, "common.txt": _text(2)}, "base")
    git("branch", "c", cwd=work)
    for name, edit in (("a", 3), ("b", 4)):
        git("checkout", "-q", "-b", name, "main", cwd=work)
        mine = shared.replace("line 7 ", f"line 7 {name} ").replace("line 200 ", f"line 200 {edit} ")
        _commit(work, {"big.txt": mine, f"{name}.txt": shared + f"own {name}\n"}, f"{name} 1")
        _commit(work, {"big.txt": mine + f"tail {name}\n"}, f"{name} 2")
    pool = tmp_path / "pool.git"
    git("init", "-q", "--bare", str(pool))
    for name in ("a", "b", "c"):
        git("push", "-q", str(pool), f"{name}:refs/virtual/{name}/heads/main", f"main:refs/virtual/{name}/heads/base",
            cwd=work)
    git("tag", "-a", "-m", "release", "v1", "a", cwd=work)
    git("push", "-q", str(pool), "v1:refs/virtual/a/tags/v1", cwd=work)
    git("repack", "-adfq", git_dir=pool)   # git's plain repack: deltas across the forks
    return pool


def _deltas(pool: Path) -> list[tuple[str, str]]:
    """(object, its delta base) for every delta of the repository's packs (git verify-pack -v)."""
    out = []
    for idx in (pool / "objects" / "pack").glob("*.idx"):
        for line in git("verify-pack", "-v", str(idx)).decode().splitlines():
            f = line.split()
            if len(f) == 7 and len(f[0]) == 40 and len(f[6]) == 40:
                out.append((f[0], f[6]))
    return out


def _island_objects(pool: Path) -> dict[str, set[str]]:
    islands = {}
    for name in ("a", "b", "c"):
        listed = git("rev-list", "--objects", f"--glob=refs/virtual/{name}/*", git_dir=pool).decode().splitlines()
        islands[name] = {line.split()[0] for line in listed}
    return islands


def _cross_island(pool: Path) -> list[tuple[str, str]]:
    """The deltas git's rule forbids: a target some island has whose base that island lacks."""
    islands = _island_objects(pool)
    return [(t, b) for t, b in _deltas(pool) if any(t in objs and b not in objs for objs in islands.values())]


def test_island_names_as_git_makes_them() -> None:
    compiled = IslandOptions(("refs/heads/", "refs/virtual/([^/]+)/", "refs/(remotes)/([^/]+)/")).compiled()
    assert island_of("refs/virtual/fork1/heads/main", compiled) == "fork1"
    assert island_of("refs/remotes/origin/x", compiled) == "remotes-origin"   # groups joined with '-'
    assert island_of("refs/heads/main", compiled) == ""                       # no group: the one island ""
    assert island_of("refs/tags/v1", compiled) is None                        # no regex matches: no island
    assert island_of("xrefs/heads/main", compiled) is None                    # anchored, as git prepends '^'
    # the last regex that matches wins
    assert island_of("refs/virtual/x/heads/y", IslandOptions(("refs/virtual/([^/]+)/", "refs/")).compiled()) == ""


def test_git_marks_as_many_islands(network: Path) -> None:
    """git's pack-objects reports how many islands it marked; ours reads the same refs the same way."""
    refs = dict(line.split(" ")[::-1] for line in
                git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=network).decode().splitlines())
    ours = islands_of({k: bytes.fromhex(v) for k, v in refs.items()}, IslandOptions((ISLAND_REGEX,)))
    # (no bitmap: with one, git reuses the whole pack and loads no islands)
    proc = subprocess.run(["git", "-c", "pack.useBitmaps=false", "-c", f"pack.island={ISLAND_REGEX}", "pack-objects",
                           "--all", "--delta-islands", "--progress", "--stdout"], cwd=network, env=GIT_ENV, input=b"",
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert f"Marked {len(ours)} islands".encode() in proc.stderr
    assert sorted(ours) == ["a", "b", "c"]


def test_no_delta_crosses_an_island_as_in_git_repack_adi(network: Path, tmp_path: Path) -> None:
    before = sorted(git("rev-list", "--objects", "--all", git_dir=network).decode().splitlines())
    assert _cross_island(network), "the plain repack made no delta across forks: the test would prove nothing"
    # git's own: repack -adi with the same island regex
    theirs = tmp_path / "theirs.git"
    git("clone", "-q", "--bare", "--mirror", "--no-local", str(network), str(theirs))
    git("repack", "-adfq", git_dir=theirs)
    assert _cross_island(theirs)
    git("-c", f"pack.island={ISLAND_REGEX}", "repack", "-adiq", git_dir=theirs)
    assert _cross_island(theirs) == []
    # ours, reusing the plain pack's deltas where the rule allows, searching again where it does not
    result = repack(Repository.open(network), RepackOptions(islands=IslandOptions((ISLAND_REGEX,)), bitmap=False))
    assert result.counters.islands == 3
    assert result.counters.island_deltas_dropped > 0
    assert _cross_island(network) == []
    assert _deltas(network), "no deltas at all: islands must still let each fork delta within itself"
    fsck(network)
    assert sorted(git("rev-list", "--objects", "--all", git_dir=network).decode().splitlines()) == before


def test_without_islands_our_repack_crosses_them(network: Path) -> None:
    """The negative control: the same repack without islands keeps git's cross-fork deltas."""
    result = repack(Repository.open(network), RepackOptions(bitmap=False))
    assert result.counters.island_deltas_dropped == 0
    assert _cross_island(network)


def test_a_new_search_respects_islands_too(network: Path) -> None:
    """No reuse (git repack -f): every delta comes from the search, which skips bases across islands."""
    result = repack(Repository.open(network), RepackOptions(islands=IslandOptions((ISLAND_REGEX,)), reuse=False,
                                                            bitmap=False))
    assert result.counters.deltas_computed > 0
    assert _cross_island(network) == []
    fsck(network)


def test_the_core_island_is_written_first_as_git_writes_it(network: Path, tmp_path: Path) -> None:
    """pack.islandCore: git writes the core island's objects before every other (its layer 0); so do we, and
    without a core neither pack has that order here (the control: the property is not an accident)."""
    core = _island_objects(network)["b"]
    theirs = tmp_path / "theirs.git"
    git("clone", "-q", "--bare", "--mirror", "--no-local", str(network), str(theirs))
    git("-c", f"pack.island={ISLAND_REGEX}", "repack", "-adiq", git_dir=theirs)
    assert not written_first(theirs, core)
    git("-c", f"pack.island={ISLAND_REGEX}", "-c", "pack.islandCore=b", "repack", "-adiq", git_dir=theirs)
    assert written_first(theirs, core)

    before = sorted(git("rev-list", "--objects", "--all", git_dir=network).decode().splitlines())
    repack(Repository.open(network), RepackOptions(islands=IslandOptions((ISLAND_REGEX,)), bitmap=False))
    assert not written_first(network, core)
    result = repack(Repository.open(network), RepackOptions(islands=IslandOptions((ISLAND_REGEX,), core="b")))
    assert result.counters.bitmap_commits > 0
    assert written_first(network, core)
    assert _cross_island(network) == []
    fsck(network)
    git("rev-list", "--test-bitmap", "refs/virtual/b/heads/main", git_dir=network)
    assert sorted(git("rev-list", "--objects", "--all", git_dir=network).decode().splitlines()) == before
