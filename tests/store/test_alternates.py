"""objects/info/alternates: read as git reads it (parity with git's own lookups), confined to the storage roots,
and seen by every reader of objects: lookups, snapshots, verify, index-pack's thin bases, unpack-objects, the
receive fsck, write batches."""
from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from gitutil import GIT_ENV, fsck, git
from packyard.store.alternates import MAX_DEPTH, AlternatesRefused, parse_entries, read_chain, unquote_c_style
from packyard.store.errors import CorruptObjectError, FsckError, ObjectMissingError
from packyard.store.objdir import Location
from packyard.store.objects import ObjectType
from packyard.store.pack.indexpack import index_pack
from packyard.store.pack.unpack import unpack_objects
from packyard.store.repo import Repository
from packyard.store.verify import verify_repository


def _blob(repo: Path, text: str) -> str:
    return git("hash-object", "-w", "--stdin", git_dir=repo, input=text.encode()).decode().strip()


def _has_git(repo: Path, oid: str) -> bool:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "--git-dir", str(repo), "cat-file", "-e", oid], env=env,
                          capture_output=True).returncode == 0


def _history(base: Path, name: str = "src", commits: int = 3) -> Path:
    work = base / f"{name}-work"
    git("init", "-q", "-b", "main", str(work))
    for i in range(commits):
        (work / f"f{i}.txt").write_text(f"file {i}\n" * 50)
        (work / "common.txt").write_text("".join(f"line {k} of the common file\n" for k in range(200)) + f"rev {i}\n")
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"c{i}", cwd=work)
    bare = base / f"{name}.git"
    git("clone", "-q", "--bare", str(work), str(bare))
    return bare


@pytest.fixture
def network(tmp_path: Path) -> tuple[Path, Path]:
    """(pool, fork): a pool made by git, and a fork made by ``git clone --shared`` (nothing of its own)."""
    pool = _history(tmp_path, "pool")
    git("repack", "-adq", git_dir=pool)
    fork = tmp_path / "fork.git"
    git("clone", "-q", "--bare", "--shared", str(pool), str(fork))
    return pool, fork


# -- the file's format, as git reads it ----------------------------------------------------------------

def test_parse_entries_comments_empty_lines_and_quoting() -> None:
    data = b'# a comment\n\n/abs/one\nrel/two\n"/quoted\\tpath"\n"broken\n#x\n'
    assert parse_entries(data) == ["/abs/one", "rel/two", "/quoted\tpath", '"broken']
    assert unquote_c_style('"a\\"b\\\\c\\101"') == 'a"b\\cA'
    assert unquote_c_style('"no end') is None


def test_lookups_match_git_for_relative_paths_comments_loops_and_missing_dirs(tmp_path: Path) -> None:
    """A table of alternates files built beside git: for every object, packyard sees it iff git does."""
    repos = {}
    for name in ("main", "a", "b", "c"):
        repos[name] = tmp_path / f"{name}.git"
        git("init", "-q", "--bare", str(repos[name]))
    blobs = {name: _blob(r, f"only in {name}\n") for name, r in repos.items()}
    objects = {name: r / "objects" for name, r in repos.items()}
    # main: a comment, an empty line, a path relative to main's objects dir, a missing directory, a duplicate.
    (objects["main"] / "info" / "alternates").write_text(
        f"# the pool\n\n../../a.git/objects\n{tmp_path}/missing/objects\n{objects['a']}/\n")
    # a -> b (absolute), b -> a (a loop) and c; c is reached at depth 2.
    (objects["a"] / "info" / "alternates").write_text(f"{objects['b']}\n")
    (objects["b"] / "info" / "alternates").write_text(f"{objects['a']}\n../../c.git/objects\n")
    repo = Repository.open(repos["main"])
    assert repo.alternates.paths == (objects["a"], objects["b"], objects["c"])
    assert any("missing" in p for p in repo.alternates.problems)
    for _name, oid in blobs.items():
        assert repo.objects.has(bytes.fromhex(oid)) == _has_git(repos["main"], oid)
        assert _has_git(repos["main"], oid)
    assert repo.objects.locate(bytes.fromhex(blobs["main"])) is Location.LOOSE
    assert repo.objects.locate(bytes.fromhex(blobs["c"])) is Location.ALTERNATE
    assert repo.objects.read(bytes.fromhex(blobs["c"])) == (ObjectType.BLOB, b"only in c\n")


def test_nesting_depth_is_gits(tmp_path: Path) -> None:
    """A chain of eight: git (and packyard) follow files read at depth 0..5, so six alternates are seen."""
    chain = []
    for i in range(8):
        r = tmp_path / f"r{i}.git"
        git("init", "-q", "--bare", str(r))
        chain.append(r)
    blobs = [_blob(r, f"level {i}\n") for i, r in enumerate(chain)]
    for i in range(len(chain) - 1):
        (chain[i] / "objects" / "info" / "alternates").write_text(f"{chain[i + 1] / 'objects'}\n")
    repo = Repository.open(chain[0])
    seen_by_git = [_has_git(chain[0], oid) for oid in blobs]
    seen = [repo.objects.has(bytes.fromhex(oid)) for oid in blobs]
    assert seen == seen_by_git
    assert seen.count(True) == MAX_DEPTH + 2        # the repository itself and six alternates
    assert any("nesting too deep" in p for p in repo.alternates.problems)


# -- confinement --------------------------------------------------------------------------------------

def test_alternate_outside_the_storage_roots_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    secret = outside / "secret.git"
    git("init", "-q", "--bare", str(secret))
    fork = root / "fork.git"
    git("init", "-q", "--bare", str(fork))
    alternates = fork / "objects" / "info" / "alternates"
    for spelling in (str(secret / "objects"), "../../../outside/secret.git/objects"):
        alternates.write_text(spelling + "\n")
        with pytest.raises(AlternatesRefused) as err:
            Repository.open(fork, alternate_roots=[root])
        assert str(alternates) in str(err.value) and "outside the storage roots" in str(err.value)
    # a symlink inside the root that leads out is resolved first, and refused the same way
    (root / "link").symlink_to(outside)
    alternates.write_text(f"{root / 'link' / 'secret.git' / 'objects'}\n")
    with pytest.raises(AlternatesRefused):
        Repository.open(fork, alternate_roots=[root])
    # inside the root: accepted
    pool = root / "pool.git"
    git("init", "-q", "--bare", str(pool))
    alternates.write_text("../../pool.git/objects\n")
    assert Repository.open(fork, alternate_roots=[root]).alternates.paths == (pool / "objects",)
    assert read_chain(fork / "objects", roots=[root]).paths == (pool / "objects",)


def test_workers_open_confines_repositories_in_a_root_only(tmp_path: Path) -> None:
    from packyard.workers.repos import open_repository
    from packyard.workers.settings import Settings

    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    s = Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path / "state"), "PACKYARD_STORAGE_ROOTS": f"main={root}"})
    pool = outside / "pool.git"
    git("init", "-q", "--bare", str(pool))
    for parent in (root, outside):
        fork = parent / "fork.git"
        git("init", "-q", "--bare", str(fork))
        (fork / "objects" / "info" / "alternates").write_text(f"{pool / 'objects'}\n")
    with pytest.raises(AlternatesRefused):
        open_repository(root / "fork.git", s)
    assert open_repository(outside / "fork.git", s).alternates.paths == (pool / "objects",)   # the CLI user's own


# -- every reader sees the pool -------------------------------------------------------------------------

def test_fork_reads_snapshots_and_verify(network: tuple[Path, Path]) -> None:
    pool, fork = network
    repo = Repository.open(fork)
    head = bytes.fromhex(git("rev-parse", "HEAD", git_dir=fork).decode().strip())
    snap = repo.snapshot()
    assert len(snap.packs) == 0 and not snap.loose_ids and len(snap.alternates) == 1
    assert snap.locate(head) is Location.ALTERNATE and snap.locate_local(head) is Location.MISSING
    assert snap.read(head)[0] is ObjectType.COMMIT and snap.read_header(head)[0] is ObjectType.COMMIT
    report = verify_repository(fork)
    assert report.alternates == 1 and report.alternate_objects == report.objects > 0
    fsck(fork)


def test_verify_names_the_alternates_file_when_the_pool_is_gone(network: tuple[Path, Path]) -> None:
    pool, fork = network
    pool.rename(pool.with_name("moved.git"))
    with pytest.raises(CorruptObjectError) as err:
        verify_repository(fork)
    assert "alternates" in str(err.value) and "does not exist" in str(err.value)


def test_a_fork_reader_survives_the_pools_repack(network: tuple[Path, Path]) -> None:
    """The pool's pack is replaced (moved to preserved/ by packyard's repack) under a fork's open snapshot
    and pack list: the fork's lookups still answer, through the pool's re-listing or its preserved/."""
    from packyard.store.maintenance.repack.options import RepackOptions
    from packyard.store.maintenance.repack.run import repack

    pool, fork = network
    reader = Repository.open(fork)
    ids = [bytes.fromhex(line.split()[0]) for line in
           git("rev-list", "--objects", "--all", git_dir=fork).decode().splitlines()]
    reader.objects.alternates[0].packs.prepare()
    old_snapshot = reader.snapshot()
    _blob(pool, "something new\n")
    result = repack(Repository.open(pool), RepackOptions())
    assert result.packs_deleted
    fresh = Repository.open(fork)
    for oid in ids:
        assert reader.objects.read(oid)[1] == fresh.objects.read(oid)[1]
        assert old_snapshot.read(oid)[1] == fresh.objects.read(oid)[1]
    fsck(fork)


def test_thin_push_to_a_fork_with_its_bases_in_the_pool(network: tuple[Path, Path], tmp_path: Path) -> None:
    """index-pack --fix-thin in the fork: the bases come from the pool, the fork gets a complete pack of its own,
    git fsck passes and git's own index-pack --fix-thin with the same alternates gives the same objects."""
    pool, fork = network
    work = tmp_path / "push"
    git("clone", "-q", "--no-local", str(pool), str(work))   # (no bitmap: --thin then finds its bases)
    (work / "common.txt").write_text((work / "common.txt").read_text() + "a line of the fork\n")
    git("commit", "-qam", "in the fork", cwd=work)
    new = git("rev-parse", "HEAD", cwd=work).decode().strip()
    old = git("rev-parse", "HEAD~1", cwd=work).decode().strip()
    thin = git("pack-objects", "--thin", "--stdout", "--revs", "-q", cwd=work, input=f"{new}\n^{old}\n".encode())
    copy = tmp_path / "fork-git.git"
    git("clone", "-q", "--bare", "--shared", str(pool), str(copy))
    git("index-pack", "--stdin", "--fix-thin", git_dir=copy, input=thin)

    result = index_pack(Repository.open(fork), io.BytesIO(thin), fix_thin=True, strict=True)
    assert result.thin_bases_added > 0
    git("update-ref", "refs/heads/main", new, git_dir=fork)
    fsck(fork)
    ours = set(git("show-index", input=(fork / "objects" / "pack" / f"{result.pack_name}.idx").read_bytes())
               .decode().split()[1::3])
    theirs_idx = next((copy / "objects" / "pack").glob("*.idx"))
    theirs = set(git("show-index", input=theirs_idx.read_bytes()).decode().split()[1::3])
    assert ours == theirs


def test_unpack_objects_in_a_fork_resolves_deltas_against_the_pool(network: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    pool, fork = network
    work = tmp_path / "push"
    git("clone", "-q", "--no-local", str(pool), str(work))   # (no bitmap: --thin then finds its bases)
    (work / "common.txt").write_text((work / "common.txt").read_text() + "a line of the fork, unpacked\n")
    git("commit", "-qam", "unpacked", cwd=work)
    new = git("rev-parse", "HEAD", cwd=work).decode().strip()
    thin = git("pack-objects", "--thin", "--stdout", "--revs", "-q", cwd=work, input=f"{new}\n^HEAD~1\n".encode())
    unpack_objects(Repository.open(fork), thin, strict=True)
    git("update-ref", "refs/heads/main", new, git_dir=fork)
    fsck(fork)


def test_receive_fsck_checks_a_gitmodules_blob_that_lives_in_the_pool(network: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    """A pushed tree names, as .gitmodules, a blob only the pool has: git reads it from the pool and refuses it
    (gitmodulesUrl); so does packyard."""
    pool, fork = network
    bad = _blob(pool, '[submodule "x"]\n\tpath = x\n\turl = --upload-pack=touch${IFS}owned\n')
    tree = git("mktree", git_dir=fork, input=f"100644 blob {bad}\t.gitmodules\n".encode()).decode().strip()
    head = git("rev-parse", "HEAD", git_dir=fork).decode().strip()
    commit = git("commit-tree", tree, "-p", head, "-m", "sneaky", git_dir=fork).decode().strip()
    pack = git("pack-objects", "--stdout", "-q", git_dir=fork, input=f"{commit}\n{tree}\n".encode())
    for p in (fork / "objects").glob("??/*"):
        p.unlink()   # (the commit and tree came from git in the fork itself: only the pack has them now)
    env = {**os.environ, **GIT_ENV}
    theirs = subprocess.run(["git", "--git-dir", str(fork), "index-pack", "--strict", "--stdin"], input=pack,
                            env=env, capture_output=True)
    assert theirs.returncode != 0 and b"gitmodulesUrl" in theirs.stderr
    with pytest.raises(FsckError) as err:
        index_pack(Repository.open(fork), io.BytesIO(pack), strict=True)
    assert err.value.msg_id == "gitmodulesUrl"


def test_a_write_batch_skips_what_the_pool_has_and_freshens_it_there(network: tuple[Path, Path]) -> None:
    from packyard.store.batch.api import begin

    pool, fork = network
    head = git("rev-parse", "HEAD", git_dir=pool).decode().strip()
    (_tree_line,) = [line for line in git("cat-file", "-p", head, git_dir=pool).decode().splitlines()
                     if line.startswith("tree ")]
    tree_oid = _tree_line.split()[1]
    kind, data = Repository.open(pool).objects.read(bytes.fromhex(tree_oid))
    pool_pack = next((pool / "objects" / "pack").glob("*.pack"))
    os.utime(pool_pack, (1_000_000_000, 1_000_000_000))
    repo = Repository.open(fork)
    with begin(repo) as batch:
        batch.add(kind, data)
        batch.add(ObjectType.BLOB, b"new in the fork\n")
    assert batch.counters.skipped_alternate == 1 and batch.counters.objects_written == 1
    assert pool_pack.stat().st_mtime > 1_000_000_000
    assert Repository.open(fork).snapshot().locate_local(bytes.fromhex(tree_oid)) is Location.MISSING


def test_missing_everywhere_is_still_missing(network: tuple[Path, Path]) -> None:
    _pool, fork = network
    repo = Repository.open(fork)
    with pytest.raises(ObjectMissingError):
        repo.objects.read(b"\x01" * 20)
    assert repo.objects.locate(b"\x01" * 20) is Location.MISSING


# -- a fork's repack: its own objects only (git repack -a -d -l) ------------------------------------------

def _objects(repo: Path) -> list[str]:
    return sorted(git("rev-list", "--objects", "--all", git_dir=repo).decode().splitlines())


def _local_ids(repo: Path) -> set[str]:
    ids: set[str] = set()
    for idx in (repo / "objects" / "pack").glob("*.idx"):
        ids.update(git("show-index", input=idx.read_bytes()).decode().split()[1::3])
    for f in (repo / "objects").glob("??/*"):
        ids.add(f.parent.name + f.name)
    return ids


def test_a_forks_full_repack_packs_only_its_own_objects(network: tuple[Path, Path], tmp_path: Path) -> None:
    """A fork made with git clone --shared, with a commit of its own, loose: packyard's repack (which failed with
    "reachable object is missing" before alternates) packs just the fork's objects, writes no bitmap (git disables
    it: the pack lacks closure), leaves the pool's files alone; git fsck and rev-list agree before and after, and
    git's own repack -a -d -l keeps the same set of objects in the fork."""
    from packyard.store.maintenance.repack.options import RepackOptions
    from packyard.store.maintenance.repack.run import repack

    pool, fork = network
    work = tmp_path / "w"
    git("clone", "-q", "--no-local", str(pool), str(work))
    (work / "fork.txt").write_text("the fork's own file\n")
    git("add", "fork.txt", cwd=work)
    git("commit", "-qm", "fork commit", cwd=work)
    new = git("rev-parse", "HEAD", cwd=work).decode().strip()
    pack = git("pack-objects", "--stdout", "--revs", "-q", cwd=work, input=f"{new}\n^HEAD~1\n".encode())
    git("unpack-objects", "-q", git_dir=fork, input=pack)
    git("update-ref", "refs/heads/main", new, git_dir=fork)
    twin = tmp_path / "twin.git"
    git("clone", "-q", "--bare", "--shared", str(pool), str(twin))
    git("unpack-objects", "-q", git_dir=twin, input=pack)
    git("update-ref", "refs/heads/main", new, git_dir=twin)
    pool_files = sorted(p.name for p in (pool / "objects" / "pack").iterdir())
    before = _objects(fork)

    result = repack(Repository.open(fork), RepackOptions())
    assert result.counters.borrowed > 0 and result.counters.bitmap_skipped == 1
    assert not list((fork / "objects" / "pack").glob("*.bitmap"))
    git("repack", "-a", "-d", "-l", "-q", git_dir=twin)
    assert _local_ids(fork) == _local_ids(twin) == {new, *git("rev-parse", f"{new}^{{tree}}", f"{new}:fork.txt",
                                                             git_dir=fork).decode().split()}
    assert sorted(p.name for p in (pool / "objects" / "pack").iterdir()) == pool_files
    assert _objects(fork) == before
    fsck(fork)
    fsck(pool)


def test_repacking_a_full_copy_after_linking_drops_what_the_pool_has(network: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    """A fork that holds everything itself and is then given the pool as its alternate (the link step): one
    full repack leaves it nothing the pool has, as git repack -a -d -l does, and it reads the same."""
    from packyard.store.maintenance.repack.options import RepackOptions
    from packyard.store.maintenance.repack.run import repack

    pool, _fork = network
    full = tmp_path / "full.git"
    git("clone", "-q", "--bare", "--no-local", str(pool), str(full))
    git("repack", "-adq", git_dir=full)
    (full / "objects" / "info" / "alternates").write_text(f"{pool / 'objects'}\n")
    before = _objects(full)
    assert _local_ids(full)
    result = repack(Repository.open(full), RepackOptions())
    assert result.packs_deleted and not result.packs_written
    assert _local_ids(full) == set()
    assert _objects(full) == before
    fsck(full)
