"""A full disk: index-pack (and the pack writer) fail with WriteFailedError naming the temp file,
remove what they wrote and leave the repository as it was. Needs root (a small tmpfs is mounted);
skipped otherwise."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gitutil import CORPUS, ROOT, git, snapshot_tree
from packyard.store.errors import WriteFailedError
from packyard.store.pack.indexpack import index_pack
from packyard.store.repo import Repository

PACK = CORPUS / "git-v1.0.0.pack"   # 3.4 MB: larger than the filesystem below


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs mounted for the test (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_index_pack_on_a_full_disk_names_the_temp_file_and_changes_nothing(small_fs):
    if not PACK.exists():
        pytest.skip("corpus not available")
    repo = Repository.init(small_fs / "r.git")
    before = snapshot_tree(repo.path)
    with pytest.raises(WriteFailedError) as info:
        index_pack(repo, PACK)
    err = info.value
    assert err.errno == 28 and "tmp_pack_" in err.path and "incoming-" in err.path, str(err)
    assert snapshot_tree(repo.path) == before, "quarantine removed, nothing else changed"
    git("fsck", "--full", git_dir=repo.path)


def test_index_pack_cli_on_a_full_disk_prints_one_line(small_fs):
    if not PACK.exists():
        pytest.skip("corpus not available")
    repo = Repository.init(small_fs / "r.git")
    proc = subprocess.run([sys.executable, "-c", "import sys; from packyard.workers.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "index-pack", "--repo", str(repo.path), "--no-progress",
                           str(PACK)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("packyard index-pack: WriteFailedError:") and "tmp_pack_" in lines[0]
    assert not list(Path(repo.path, "objects").glob("incoming-*"))


def test_pack_writer_on_a_full_disk_names_the_temp_file_and_leaves_nothing(small_fs):
    from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
    from packyard.store.maintenance.repack.run import repack
    from packyard.store.objects import ObjectType, encode_loose, hash_object

    repo = Repository.init(small_fs / "r.git")
    # A loose object that fits once (stored) but not twice (packed alongside it): random bytes do not compress.
    data = os.urandom(1_200_000)
    oid = hash_object(ObjectType.BLOB, data)
    path = repo.objects.loose.path_for(oid)
    path.parent.mkdir()
    path.write_bytes(encode_loose(ObjectType.BLOB, data, level=0))
    before = snapshot_tree(repo.path)
    with pytest.raises(WriteFailedError) as info:
        repack(repo, RepackOptions(mode=RepackMode.LOOSE))
    err = info.value
    assert err.errno == 28 and "/objects/pack/tmp_pack_" in err.path, str(err)
    assert snapshot_tree(repo.path) == before, "temp files removed, the loose object untouched"
