"""import_tree against git: same trees as `git add -A; git write-tree`, commit on top of the ref, bad input."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gitutil import ROOT, git, git_tree_of, make_worktree_repo, snapshot_tree
from gitutil import fsck_strict as fsck
from packyard.store import RefUpdateError, Repository
from packyard.store.errors import InvalidInputError, WriteFailedError
from packyard.store.importtree import Identity, import_tree

WHEN = Identity(name="Imp Orter", email="imp@example.com", when=1700000000)


def make_source(base: Path) -> Path:
    src = base / "src"
    (src / "dir" / "sub").mkdir(parents=True)
    (src / "dir" / "sub" / "deep.txt").write_text("deep\n")
    (src / "dir" / "a.txt").write_text("a\n")
    (src / "dir.txt").write_text("sorts before dir/ in a tree\n")   # git order: 'dir.txt' < 'dir/'
    (src / "dir-x").write_text("dash\n")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "empty").write_bytes(b"")
    (src / "bin.dat").write_bytes(bytes(range(256)) * 40)
    (src / "link").symlink_to("dir/a.txt")
    (src / "dirlink").symlink_to("dir/sub")
    (src / "emptydir").mkdir()                     # git cannot store it; omitted like git add
    (src / "ünï cödé").write_text("utf-8 name\n")
    return src


@pytest.fixture
def repo_dir(tmp_path):
    return make_worktree_repo(tmp_path / "r")


def test_directory_import_matches_git_write_tree(tmp_path, repo_dir):
    src = make_source(tmp_path)
    repo = Repository.open(repo_dir)
    parent = repo.refs.read("refs/heads/main")
    progress = []
    res = import_tree(repo, "refs/heads/main", src, message="import it", author=WHEN,
                      progress=lambda *a: progress.append(a))
    assert res.tree.hex() == git_tree_of(src, tmp_path)
    assert res.parent == parent
    assert git("rev-parse", "main", git_dir=repo_dir).strip().decode() == res.commit.hex()
    assert git("rev-parse", "main^", git_dir=repo_dir).strip() == parent.hex().encode()
    log = git("log", "-1", "--format=%an <%ae> %at%n%B", "main", git_dir=repo_dir).decode()
    assert log.startswith("Imp Orter <imp@example.com> 1700000000\nimport it")
    ls = git("ls-tree", "-r", "main", git_dir=repo_dir).decode()
    assert "100755 blob" in ls and "120000 blob" in ls and "emptydir" not in ls
    assert progress[-1][0] == "done"
    c = res.counters
    assert c["objects_written"] >= 10 and "elapsed" in c and c["renames"] == c["objects_written"] + 1
    fsck(repo_dir)
    # importing the same content again: every blob/tree skipped, only a new commit written
    res2 = import_tree(repo, "refs/heads/main", src, message="again", author=WHEN)
    assert res2.tree == res.tree and res2.parent == res.commit
    assert res2.counters["objects_written"] == 1
    fsck(repo_dir)


def test_tar_import_gives_same_tree_as_directory(tmp_path, repo_dir):
    src = make_source(tmp_path)
    tar_path = tmp_path / "src.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(src, arcname="./")
    repo = Repository.open(repo_dir)
    res = import_tree(repo, "refs/heads/imported", tar_path, author=WHEN)
    assert res.parent is None
    assert res.tree.hex() == git_tree_of(src, tmp_path)
    assert git("rev-list", "--count", "imported", git_dir=repo_dir).strip() == b"1"
    fsck(repo_dir)


def _expect_rejected(repo_dir: Path, source, match: str) -> None:
    before = snapshot_tree(repo_dir)
    with pytest.raises(InvalidInputError, match=match):
        import_tree(Repository.open(repo_dir), "refs/heads/main", source, author=WHEN)
    assert snapshot_tree(repo_dir) == before, "nothing in the repository changed"


@pytest.mark.parametrize("link,target", [("evil", "../outside"), ("evil", "/etc/passwd"),
                                         ("evil", "sub/../../x"), ("sub/evil", "../../etc"),
                                         ("sub/evil", "../sub/../..")])
def test_symlink_escaping_root_rejected(tmp_path, repo_dir, link, target):
    src = tmp_path / "s"
    (src / "sub").mkdir(parents=True)
    (src / "ok.txt").write_text("ok\n")
    (src / link).symlink_to(target)
    _expect_rejected(repo_dir, src, "outside the import root")


def test_import_leaves_source_atimes_alone(tmp_path, repo_dir):
    """Reading the input must not write its inodes: relatime would update an atime that is not
    newer than the mtime on first read (one inode write per file); packyard opens with O_NOATIME."""
    if not hasattr(os, "O_NOATIME"):
        pytest.skip("no O_NOATIME on this platform")
    src = tmp_path / "s"
    (src / "sub").mkdir(parents=True)
    files = [src / "a.txt", src / "sub" / "b.txt"]
    for f in files:
        f.write_text(f"{f.name}\n")
        os.utime(f, (1_000_000_000, 1_500_000_000))     # atime older than mtime: relatime would update it
    probe = tmp_path / "probe.txt"
    probe.write_text("probe\n")
    os.utime(probe, (1_000_000_000, 1_500_000_000))
    probe.read_bytes()
    if probe.stat().st_atime == 1_000_000_000:
        pytest.skip("this filesystem does not update atimes (noatime mount): nothing to observe")
    import_tree(Repository.open(repo_dir), "refs/heads/main", src, author=WHEN)
    assert [f.stat().st_atime for f in files] == [1_000_000_000, 1_000_000_000]
    assert git("cat-file", "blob", "main:sub/b.txt", git_dir=repo_dir) == b"b.txt\n"


def test_symlink_inside_root_accepted(tmp_path, repo_dir):
    src = tmp_path / "s"
    (src / "sub").mkdir(parents=True)
    (src / "ok.txt").write_text("ok\n")
    (src / "sub" / "up").symlink_to("../ok.txt")
    import_tree(Repository.open(repo_dir), "refs/heads/main", src, author=WHEN)
    assert git("cat-file", "blob", "main:sub/up", git_dir=repo_dir) == b"../ok.txt"
    fsck(repo_dir)


def test_dot_git_entry_rejected(tmp_path, repo_dir):
    src = tmp_path / "s"
    (src / "x" / ".GIT").mkdir(parents=True)
    (src / "x" / ".GIT" / "config").write_text("[core]\n")
    _expect_rejected(repo_dir, src, r"\.git")


def test_special_file_rejected(tmp_path, repo_dir):
    src = tmp_path / "s"
    src.mkdir()
    os.mkfifo(src / "fifo")
    _expect_rejected(repo_dir, src, "cannot store")


def _tar_with(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            if data is not None:
                import io
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _reg(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _sym(name: str, target: str) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type = tarfile.SYMTYPE
    t.linkname = target
    return t


@pytest.mark.parametrize("members,match", [
    ([(_reg("../escape.txt"), b"x")], r"escapes"),
    ([(_reg("a/../../escape.txt"), b"x")], r"escapes"),
    ([(_reg("/abs.txt"), b"x")], r"absolute"),
    ([(_sym("l", "../../etc/shadow"), None)], r"outside the import root"),
    ([(_sym("l", "/etc/shadow"), None)], r"outside the import root"),
    ([(_reg("sub/.git/HEAD"), b"ref: x")], r"\.git"),
])
def test_tar_bad_members_rejected(tmp_path, repo_dir, members, match):
    _expect_rejected(repo_dir, _tar_with(tmp_path, members), match)


def test_bad_names_rejected():
    from packyard.store.importtree import check_entry_name
    for name in (b"", b"a\0b", b"a/b", b".git", b".Git", b".", b".."):
        with pytest.raises(InvalidInputError):
            check_entry_name(name, "x")
    check_entry_name(b".gitignore", "x")
    check_entry_name(b"git", "x")


def test_unreadable_file_aborts_and_leaves_nothing(tmp_path):
    """Run as an unprivileged user (root reads anything), so the permission check is real."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged uid")
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="packyard-unreadable-"))   # tmp_path's parents are 0700
    os.chmod(base, 0o755)
    bare = base / "r.git"
    git("init", "-q", "--bare", str(bare))
    src = base / "src"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}.txt").write_text(f"readable {i}\n")
    (src / "secret").write_text("no\n")
    subprocess.run(["chown", "-R", "65534:65534", str(base)], check=True)
    (src / "secret").chmod(0o000)
    script = (
        "import sys, os; sys.path.insert(0, %r)\n"
        "from packyard.store import Repository\nfrom packyard.store.importtree import import_tree\n"
        "from packyard.store.errors import InvalidInputError\n"
        "os.setgid(65534); os.setuid(65534)  # after imports: the interpreter may live under /root\n"
        "try:\n    import_tree(Repository.open(%r), 'refs/heads/main', %r)\n"
        "except InvalidInputError as e:\n    print('ERR', e); sys.exit(3)\n" % (str(ROOT), str(bare), str(src)))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd="/", env={**os.environ, "HOME": "/nonexistent"})
    assert proc.returncode == 3, proc.stderr
    assert "cannot read file" in proc.stdout and "secret" in proc.stdout
    try:
        assert list((bare / "objects").glob("??/*")) == [], "no objects, no tmp files"
        assert not (bare / "refs" / "heads" / "main").exists()
    finally:
        subprocess.run(["rm", "-rf", str(base)])


def test_ref_cas_failure_leaves_ref_untouched(tmp_path, repo_dir):
    """The ref moves between reading the parent and the CAS: error, ref keeps the other writer's value."""
    src = make_source(tmp_path)
    repo = Repository.open(repo_dir)
    moved = git("rev-parse", "main~1", git_dir=repo_dir).strip().decode()

    def another_writer_moves_ref(phase, done, total):
        if phase == "commit":     # reported right before the batch commits
            git("update-ref", "refs/heads/main", moved, git_dir=repo_dir)

    with pytest.raises(RefUpdateError, match="moved"):
        import_tree(repo, "refs/heads/main", src, author=WHEN, progress=another_writer_moves_ref)
    assert git("rev-parse", "main", git_dir=repo_dir).strip().decode() == moved
    assert not list((repo_dir / "objects").glob("??/tmp_obj_*"))
    fsck(repo_dir)   # the new objects stay as unreferenced loose objects


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()}); "
                    "see test_efbig_via_rlimit_fsize for the RLIMIT_FSIZE variant")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_enospc_on_real_small_tmpfs(tmp_path, small_tmpfs):
    """Disk full for real: a 256 KiB tmpfs holding the repository; the import needs more."""
    bare = small_tmpfs / "r.git"
    git("init", "-q", "--bare", str(bare))
    repo = Repository.open(bare)
    first = import_tree(repo, "refs/heads/main", make_source(tmp_path), author=WHEN)
    fsck(bare)
    big = tmp_path / "big"
    big.mkdir()
    for i in range(40):
        (big / f"r{i}.bin").write_bytes(os.urandom(16 * 1024))   # incompressible: 640 KiB > 256 KiB
    objects_before = sorted(p.name for p in (bare / "objects").glob("??/*"))
    with pytest.raises(WriteFailedError) as info:
        import_tree(repo, "refs/heads/main", big, author=WHEN)
    assert info.value.errno == errno.ENOSPC
    assert "tmp_obj_" in str(info.value)      # names the file it was writing
    assert not list((bare / "objects").glob("??/tmp_obj_*")), "tmp files removed"
    assert sorted(p.name for p in (bare / "objects").glob("??/*")) == objects_before
    assert repo.refs.read("refs/heads/main") == first.commit
    fsck(bare)


def test_efbig_via_rlimit_fsize(tmp_path, repo_dir):
    """Labelled variant: RLIMIT_FSIZE makes write() fail with EFBIG (not ENOSPC); same cleanup rules."""
    big = tmp_path / "big"
    big.mkdir()
    (big / "small.txt").write_text("fits\n")
    (big / "huge.bin").write_bytes(os.urandom(200 * 1024))
    script = (
        "import sys, resource, signal; sys.path.insert(0, %r)\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))\n"
        "from packyard.store import Repository\nfrom packyard.store.importtree import import_tree\n"
        "from packyard.store.errors import WriteFailedError\n"
        "try:\n    import_tree(Repository.open(%r), 'refs/heads/main', %r)\n"
        "except WriteFailedError as e:\n    print('ERRNO', e.errno); sys.exit(3)\n"
        % (str(ROOT), str(repo_dir), str(big)))
    before = snapshot_tree(repo_dir)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == f"ERRNO {errno.EFBIG}"
    after = snapshot_tree(repo_dir)
    assert {k: v for k, v in after.items() if not k.startswith("packyard/")} == \
        {k: v for k, v in before.items() if not k.startswith("packyard/")}
    assert not list((repo_dir / "objects").glob("??/tmp_obj_*"))


# -- bounds: a source that never ends is cut at the scan ---------------------------------------------------

@pytest.mark.parametrize("as_tar", [False, True])
def test_import_bounded_by_entries_and_bytes(tmp_path, as_tar):
    from packyard.store.errors import LimitExceededError

    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"f{i}.txt").write_text("z" * 1000)
    source: Path = src
    if as_tar:
        source = tmp_path / "src.tar"
        with tarfile.open(source, "w") as t:
            t.add(src, arcname=".")
    before = snapshot_tree(bare)
    with pytest.raises(LimitExceededError, match="more than 10 entries"):
        import_tree(Repository.open(bare), "refs/heads/main", source, author=WHEN, max_files=10)
    with pytest.raises(LimitExceededError, match="more than 5000 bytes"):
        import_tree(Repository.open(bare), "refs/heads/main", source, author=WHEN, max_bytes=5000)
    assert snapshot_tree(bare) == before
    res = import_tree(Repository.open(bare), "refs/heads/main", source, author=WHEN, max_files=13,
                      max_bytes=12_000)
    assert res.files == 12
    fsck(bare)


def test_import_refuses_absurd_nesting(tmp_path):
    from packyard.store.importtree import MAX_DEPTH

    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    deep = tmp_path / "src"
    path = deep
    for _ in range(MAX_DEPTH + 2):
        path = path / "d"
    path.mkdir(parents=True)
    (path / "leaf.txt").write_text("deep\n")
    with pytest.raises(InvalidInputError, match=f"nested more than {MAX_DEPTH} deep"):
        import_tree(Repository.open(bare), "refs/heads/main", deep, author=WHEN)
