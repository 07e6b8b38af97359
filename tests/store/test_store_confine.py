"""The store refuses to read or write through symlinks that leave a repository, and the small item-7 rules:
a branch names a commit, a file given as a repository is "not a directory", a non-pack's bytes are never echoed."""
from __future__ import annotations

from pathlib import Path

import pytest

from gitutil import git, make_worktree_repo
from packyard.store.batch.api import write_objects
from packyard.store.errors import InvalidInputError, NotARepositoryError, PackFormatError
from packyard.store.objects import ObjectType, from_hex, hash_object
from packyard.store.pack.indexpack import index_pack
from packyard.store.refs import RefUpdate
from packyard.store.repo import Repository


def outside_state(path: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``path``: bytes and mtime (ns), to prove nothing there was written."""
    return {str(p.relative_to(path)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file()}


def head_of(repo: Path) -> bytes:
    return from_hex(git("rev-parse", "main", git_dir=repo).strip().decode())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose refs are all loose files (git clone leaves them in packed-refs)."""
    bare = make_worktree_repo(tmp_path / "r")
    for line in git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=bare).decode().splitlines():
        oid, name = line.split()
        (bare / name).parent.mkdir(parents=True, exist_ok=True)
        (bare / name).write_text(oid + "\n")
    (bare / "packed-refs").unlink(missing_ok=True)
    return bare


def test_refs_heads_symlinked_outside_is_not_written_through(repo, tmp_path):
    outside = tmp_path / "outside-heads"
    (repo / "refs" / "heads").rename(outside)
    (repo / "refs" / "heads").symlink_to(outside)
    before = outside_state(outside)
    r = Repository.open(repo)
    blob = b"written through a symlink?\n"
    tree = b"100644 f\0" + hash_object(ObjectType.BLOB, blob)
    main = from_hex((outside / "main").read_text().strip())
    commit = (f"tree {hash_object(ObjectType.TREE, tree).hex()}\nparent {main.hex()}\n"
              "author A <a@x> 1 +0000\ncommitter A <a@x> 1 +0000\n\nx\n").encode()
    with pytest.raises(InvalidInputError, match="leads outside the repository") as info:
        write_objects(r, [("blob", blob), ("tree", tree), ("commit", commit)],
                      ref_updates=[RefUpdate("refs/heads/main", main, hash_object(ObjectType.COMMIT, commit))])
    assert info.value.path == str(repo / "refs" / "heads" / "main")
    with pytest.raises(InvalidInputError, match="leads outside the repository"):
        r.refs.read("refs/heads/main")
    assert outside_state(outside) == before
    assert sorted(p.name for p in outside.iterdir()) == ["main"]   # no lock file left there either


def test_loose_ref_and_packed_refs_symlinked_outside_are_not_read(repo, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRETTOKEN-9c1e:19000:0:99999:7:::\n")
    ref = repo / "refs" / "heads" / "leak"
    ref.symlink_to(secret)
    r = Repository.open(repo)
    with pytest.raises(InvalidInputError) as info:
        r.refs.read("refs/heads/leak")
    assert "SECRETTOKEN" not in str(info.value) and str(ref) in str(info.value)
    ref.unlink()
    (repo / "packed-refs").symlink_to(secret)
    with pytest.raises(InvalidInputError, match="leads outside the repository"):
        r.refs.read("refs/heads/absent")
    with pytest.raises(InvalidInputError, match="leads outside the repository"):
        r.refs.as_dict()


def test_symlinks_that_stay_inside_are_allowed(repo):
    (repo / "refs" / "heads" / "alias").symlink_to(repo / "refs" / "heads" / "main")
    r = Repository.open(repo)
    assert r.refs.read("refs/heads/alias") == head_of(repo)


@pytest.mark.parametrize("what", ["objects", "objects/pack", "fanout", "packfile", "packyard"])
def test_object_dirs_symlinked_outside_refuse_the_repository(repo, tmp_path, what):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    if what == "fanout":
        fan = next(p for p in (repo / "objects").iterdir() if len(p.name) == 2)
        target, link = outside / fan.name, fan
    elif what == "packfile":
        (repo / "objects" / "pack").mkdir(exist_ok=True)
        target, link = outside / "pack-x.pack", repo / "objects" / "pack" / "pack-x.pack"
        target.write_bytes(b"secret")
    elif what == "packyard":
        target, link = outside / "packyard", repo / "packyard"
        target.mkdir()
    else:
        target, link = outside / Path(what).name, repo / what
    if link.exists():
        link.rename(target)
    link.symlink_to(target)
    with pytest.raises(InvalidInputError, match="leads outside the repository") as info:
        Repository.open(repo)
    assert info.value.path == str(link)


def test_a_branch_names_only_a_commit_tags_anything(repo):
    r = Repository.open(repo)
    main = head_of(repo)
    blob = b"not a commit\n"
    blob_id = hash_object(ObjectType.BLOB, blob)
    with pytest.raises(InvalidInputError, match=r"non-commit object \(blob\) to branch refs/heads/main"):
        write_objects(r, [("blob", blob)], ref_updates=[RefUpdate("refs/heads/main", main, blob_id)])
    assert head_of(repo) == main
    tag = from_hex(git("rev-parse", "v1", git_dir=repo).strip().decode())   # an annotated tag object
    with pytest.raises(InvalidInputError, match=r"non-commit object \(tag\)"):
        r.refs.update([RefUpdate("refs/heads/from-tag", None, tag)])
    r.refs.update([RefUpdate("refs/tags/blob-tag", None, blob_id)])   # git allows a tag to name a blob
    assert git("cat-file", "-t", "refs/tags/blob-tag", git_dir=repo).strip() == b"blob"
    git("fsck", "--full", "--no-dangling", git_dir=repo)


def test_a_regular_file_as_repository_is_not_a_directory(tmp_path):
    f = tmp_path / "plain-file"
    f.write_text("x")
    for mode in (0o644, 0o000):
        f.chmod(mode)
        with pytest.raises(NotARepositoryError, match="not a directory") as info:
            Repository.open(f)
        assert "permission" not in str(info.value)
    with pytest.raises(NotARepositoryError, match="not a directory"):
        Repository.open(f / "below")


def test_index_pack_of_a_non_pack_names_the_file_not_its_bytes(repo, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_bytes(b"SECRETTOKEN-5f3a:19000:0:99999:7:::\n" * 4)
    with pytest.raises(PackFormatError) as info:
        index_pack(Repository.open(repo), secret)
    message = str(info.value)
    assert "not a pack file (bad signature)" in message and str(secret) in message
    assert "SECRETTOKEN" not in message and "19000" not in message


def test_a_work_trees_dot_git_symlinked_elsewhere_is_refused(repo, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / ".git").symlink_to(repo)
    with pytest.raises(InvalidInputError, match="leads outside the repository") as info:
        Repository.open(work)
    assert info.value.path == str(work / ".git")
    inside = work / "real.git"
    repo.rename(inside)
    (work / ".git").unlink()
    (work / ".git").symlink_to("real.git")            # staying inside the work tree is fine
    assert Repository.open(work).path == inside
