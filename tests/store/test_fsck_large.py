"""A .gitmodules blob over core.bigFileThreshold (fsck.c's fsck_blob with no buffer: index-pack holds no blob
that big): git's index-pack --strict refuses it unread with gitmodulesLarge when a tree naming it came
earlier in the pack (pack-objects writes trees before blobs). packyard's threshold is
PACKYARD_FSCK_BIG_FILE_THRESHOLD (FsckOptions.big_file_threshold, git's default 512 MiB); the cases set it,
and git's core.bigFileThreshold, to 1 MiB so the blobs stay small enough for a test: the same verdict, lowered
too, on both of index-pack's receive paths (a whole entry in the buffer, and one inflated in pieces), and for
a directory import (import_tree, whose blob would reach git as the same push)."""
from __future__ import annotations

import io
import os
import subprocess

import pytest

from gitutil import GIT_ENV, git, snapshot_tree
from packyard.store.errors import FsckError
from packyard.store.fsck import FsckOptions
from packyard.store.importtree import import_tree
from packyard.store.pack.indexpack import index_pack
from packyard.store.repo import Repository

MiB = 1 << 20
THRESHOLD = MiB


def test_the_settings_default_is_gits_threshold():
    from packyard.store.fsck.msgs import BIG_FILE_THRESHOLD
    from packyard.workers.settings import FSCK_BIG_FILE_THRESHOLD, Settings

    assert FSCK_BIG_FILE_THRESHOLD == BIG_FILE_THRESHOLD == FsckOptions().big_file_threshold == 512 * MiB
    assert Settings.from_env({}).fsck_big_file_threshold == BIG_FILE_THRESHOLD


def _gitmodules(size: int) -> bytes:
    """A valid .gitmodules (one submodule) padded with comment lines to ``size`` bytes or a little more."""
    head = b'[submodule "a"]\n\tpath = a\n\turl = https://example.com/a\n'
    line = b"# a comment line that git's config parser skips, padding the file\n"
    return head + line * ((size - len(head)) // len(line) + 1)


def _source(tmp_path, size: int):
    """A work tree with .gitmodules of ``size`` bytes and a file, committed by git; its pack as git's
    pack-objects writes it (--revs: commit, trees, then blobs)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / ".gitmodules").write_bytes(_gitmodules(size))
    (work / "f").write_bytes(b"a file\n")
    git("init", "-q", str(work))
    git("-C", str(work), "add", ".gitmodules", "f")
    git("-C", str(work), "commit", "-q", "-m", "c")
    tip = git("-C", str(work), "rev-parse", "HEAD").decode().strip()
    pack = git("-C", str(work), "pack-objects", "-q", "--revs", "--stdout", input=f"{tip}\n".encode())
    return work, pack


def _git_index_pack(tmp_path, pack: bytes, name: str, threshold: int | None, strict: str = "--strict"):
    dest = tmp_path / f"git-{name}.git"
    git("init", "-q", "--bare", str(dest))
    cfg = ["-c", f"core.bigFileThreshold={threshold}"] if threshold else []
    return subprocess.run(["git", "--git-dir", str(dest), *cfg, "index-pack", strict, "--stdin"], input=pack,
                          capture_output=True, env={**os.environ, **GIT_ENV})


@pytest.mark.parametrize("size", [2 * MiB + 5, 17 * MiB + 5], ids=["in-buffer", "in-pieces"])
def test_index_pack_refuses_a_gitmodules_over_the_threshold_as_git_does(tmp_path, size):
    _work, pack = _source(tmp_path, size)
    g = _git_index_pack(tmp_path, pack, "small", THRESHOLD)
    assert g.returncode != 0 and b"gitmodulesLarge" in g.stderr, g.stderr
    repo = Repository.init(tmp_path / "ours.git")
    before = snapshot_tree(repo.path)
    with pytest.raises(FsckError) as info:
        index_pack(repo, io.BytesIO(pack), strict=True, fsck=FsckOptions(big_file_threshold=THRESHOLD))
    assert info.value.msg_id == "gitmodulesLarge"
    assert snapshot_tree(repo.path) == before, "a refused push left something behind"

    # Under the default threshold both parse it and take the push; lowered, both take it too.
    assert _git_index_pack(tmp_path, pack, "default", None).returncode == 0
    index_pack(Repository.init(tmp_path / "ours-default.git"), io.BytesIO(pack), strict=True)
    assert _git_index_pack(tmp_path, pack, "lowered", THRESHOLD, "--strict=gitmodulesLarge=ignore").returncode == 0
    index_pack(Repository.init(tmp_path / "ours-lowered.git"), io.BytesIO(pack), strict=True,
               fsck=FsckOptions.from_config("gitmodulesLarge=ignore", big_file_threshold=THRESHOLD))


@pytest.mark.parametrize("large_file_threshold", [8 * MiB, MiB // 2], ids=["read-whole", "streamed"])
def test_import_tree_refuses_a_gitmodules_over_the_threshold_unread(tmp_path, large_file_threshold):
    """The same tree imported from a directory: git would refuse its push (above), so the import refuses it,
    from the file's size (never read for the check), whether the file is read into memory or streamed into
    the object store; nothing is published. Under the threshold the import takes it."""
    work, _pack = _source(tmp_path, 2 * MiB + 5)
    (work / ".git").rename(tmp_path / "dotgit")            # the import reads the directory, not git's repository
    repo = Repository.init(tmp_path / "ours.git")
    before = snapshot_tree(repo.path)
    with pytest.raises(FsckError) as info:
        import_tree(repo, "refs/heads/main", work, fsck=FsckOptions(big_file_threshold=THRESHOLD),
                    large_file_threshold=large_file_threshold)
    assert info.value.msg_id == "gitmodulesLarge"
    assert snapshot_tree(repo.path) == before
    import_tree(repo, "refs/heads/main", work, large_file_threshold=large_file_threshold)
    tree = git("rev-parse", "refs/heads/main^{tree}", git_dir=repo.path).decode().strip()
    size = git("cat-file", "-s", f"{tree}:.gitmodules", git_dir=repo.path).strip()
    assert int(size) == len(_gitmodules(2 * MiB + 5))
    git("fsck", "--full", "--strict", git_dir=repo.path)


def test_write_objects_judges_the_blob_whatever_order_the_batch_lists_it_in(tmp_path):
    """The objects API: the blob listed before the tree naming it (the order import_tree builds), as the
    push above would reach git (trees before blobs): gitmodulesLarge over the threshold, nothing written;
    under it the batch is written."""
    from packyard.store.batch.api import write_objects

    work, _pack = _source(tmp_path, 2 * MiB + 5)
    data = (work / ".gitmodules").read_bytes()
    blob = git("-C", str(work), "rev-parse", "HEAD:.gitmodules").decode().strip()
    f = git("-C", str(work), "rev-parse", "HEAD:f").decode().strip()
    tree = git("-C", str(work), "cat-file", "tree", "HEAD^{tree}")
    objects = [("blob", data), ("blob", b"a file\n"), ("tree", tree)]
    repo = Repository.init(tmp_path / "ours.git")
    before = snapshot_tree(repo.path)
    with pytest.raises(FsckError) as info:
        write_objects(repo, objects, fsck=FsckOptions(big_file_threshold=THRESHOLD))
    assert info.value.msg_id == "gitmodulesLarge" and info.value.oid == blob
    assert snapshot_tree(repo.path) == before
    write_objects(repo, objects)
    assert git("cat-file", "-t", f, git_dir=repo.path).strip() == b"blob"
    git("fsck", "--strict", git_dir=repo.path)
