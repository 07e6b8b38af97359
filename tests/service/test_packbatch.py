"""Large batches written as one pack (store/batch/pack.py): the same trees and commits as the loose path and
as git, existing objects skipped from one snapshot, computed deltas git accepts, big files streamed and
re-checked, nothing published on failure, and the worker job saying which path it took."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gitutil import ROOT, batch_check_all, git, git_tree_of, make_worktree_repo
from gitutil import fsck_strict as fsck
from packyard.store import Repository
from packyard.store.batch.api import should_write_pack, write_objects
from packyard.store.batch.contract import WriteResult
from packyard.store.batch.pack import PackBatch
from packyard.store.errors import InvalidInputError
from packyard.store.importtree import Identity, import_tree
from packyard.store.objects import ObjectType, hash_object
from packyard.store.pack.search import SearchOptions

WHEN = Identity(name="Imp Orter", email="imp@example.com", when=1700000000)


def make_tree(src: Path, files: int, version: int = 0, changed_every: int = 10) -> Path:
    """``files`` small text files in 10 directories; version v rewrites every ``changed_every``-th file."""
    for i in range(files):
        d = src / f"d{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        v = version if i % changed_every == 0 else 0
        lines = "".join(f"file {i} line {k} of some source text\n" for k in range(12 + i % 7))
        (d / f"f{i:04d}.txt").write_text(lines + f"version {v}\n")
    return src


def packs(bare: Path) -> list[Path]:
    return sorted((bare / "objects" / "pack").glob("pack-*.pack"))


def loose(bare: Path) -> list[Path]:
    return list((bare / "objects").glob("??/*"))


def verify(pack: Path) -> str:
    out = git("verify-pack", "-v", str(pack.with_suffix(".idx"))).decode()
    assert out.rstrip().endswith(": ok"), out[-300:]
    return out


def test_threshold_is_a_pure_question():
    assert should_write_pack(1000, 1000) and not should_write_pack(999, 1000)
    assert not should_write_pack(10**6, None) and not should_write_pack(10**6, 0)


def test_import_as_a_pack_matches_git_and_the_loose_path(tmp_path, bare):
    src = make_tree(tmp_path / "src", 300)
    res = import_tree(Repository.open(bare), "refs/heads/main", src, author=WHEN, pack_threshold=100)
    c = res.counters
    assert c["write_path"] == "pack" and c["deltas_computed"] > 0 and c["deltas_tried"] >= c["deltas_computed"]
    assert res.tree.hex() == git_tree_of(src, tmp_path)
    assert loose(bare) == [] and len(packs(bare)) == 1
    (pack,) = packs(bare)
    assert c["pack_bytes"] == pack.stat().st_size
    assert c["objects_written"] == res.files + res.trees + 1 == len(batch_check_all(bare))
    out = verify(pack)
    assert sum(1 for line in out.splitlines() if len(line.split()) >= 7 and line.split()[1] == "blob") \
        == c["deltas_computed"] - sum(1 for line in out.splitlines()
                                      if len(line.split()) >= 7 and line.split()[1] == "tree")
    fsck(bare)
    assert git("rev-parse", "main", git_dir=bare).decode().strip() == res.commit.hex()
    # The loose path writes the same commit (same objects, same ids) -- only the storage differs.
    other = tmp_path / "loose.git"
    git("init", "-q", "--bare", str(other))
    res2 = import_tree(Repository.open(other), "refs/heads/main", src, author=WHEN, pack_threshold=None)
    assert res2.counters["write_path"] == "loose" and res2.commit == res.commit and packs(other) == []


def test_second_import_packs_only_what_is_new(tmp_path, bare):
    repo = Repository.open(bare)
    first = import_tree(repo, "refs/heads/main", make_tree(tmp_path / "v0", 300), author=WHEN, pack_threshold=100)
    second = import_tree(repo, "refs/heads/main", make_tree(tmp_path / "v1", 300, version=1), author=WHEN,
                         pack_threshold=100, message="second")
    c = second.counters
    # 30 files changed (all in d0): 30 blobs, d0, the root tree and the commit are new; the rest is skipped.
    assert c["write_path"] == "pack" and c["objects_written"] == 30 + 1 + 1 + 1
    assert c["objects_skipped"] == c["skipped_packed"] == 270 + 9 and c["freshened_packs"] == 1   # blobs, dirs
    assert second.parent == first.commit and len(packs(bare)) == 2
    newest = max(packs(bare), key=lambda p: p.stat().st_mtime_ns)
    assert verify(newest).count(" blob ") == 30
    fsck(bare)


def test_write_objects_above_the_threshold_is_one_pack(tmp_path, bare):
    shared = "".join(f"a line every object shares, number {k}\n" for k in range(10))
    blobs = [(ObjectType.BLOB, (shared + f"object {i}\n").encode()) for i in range(60)]
    existing = git("hash-object", "-w", "--stdin", git_dir=bare, input=blobs[0][1]).decode().strip()
    results, res = write_objects(Repository.open(bare), blobs + [blobs[1]], pack_threshold=50)
    assert res.counters["write_path"] == "pack" and res.counters["deltas_computed"] > 0
    assert results[0] == (bytes.fromhex(existing), WriteResult.EXISTS_LOOSE)
    assert [r for _o, r in results[1:60]] == [WriteResult.QUEUED] * 59
    assert results[60][1] is WriteResult.DUPLICATE_IN_BATCH
    assert res.written == 59 and res.skipped == 1 and res.duplicates == 1
    (pack,) = packs(bare)
    assert verify(pack).count(" blob ") == 59
    fsck(bare)


def test_objects_above_the_delta_limit_are_stored_whole(tmp_path, bare):
    repo = Repository.open(bare)
    shared = "".join(f"a line every object shares, number {k}\n" for k in range(40))
    small = [(shared + f"small {i}\n").encode() for i in range(20)]
    big = [(shared * 3 + f"big {i}\n").encode() for i in range(20)]
    with PackBatch(repo, search_options=SearchOptions(max_input=2000, processes=1)) as batch:
        ids = [batch.add(ObjectType.BLOB, d, b"f.txt")[0] for d in small + big]
        batch.commit()
    out = verify(packs(bare)[0])
    whole = {line.split()[0] for line in out.splitlines() if len(line.split()) == 5}
    delta = {line.split()[0] for line in out.splitlines() if len(line.split()) >= 7}
    assert {i.hex() for i in ids[20:]} <= whole
    assert delta and delta <= {i.hex() for i in ids[:20]}
    fsck(bare)


def test_big_files_are_streamed_and_rechecked(tmp_path, bare):
    src = make_tree(tmp_path / "src", 40)
    big = src / "big.bin"
    big.write_bytes(bytes(range(256)) * 4096)           # 1 MiB: over the 64 KiB threshold below
    res = import_tree(Repository.open(bare), "refs/heads/main", src, author=WHEN, pack_threshold=10,
                      large_file_threshold=64 << 10)
    assert res.counters["write_path"] == "pack" and res.tree.hex() == git_tree_of(src, tmp_path)
    fsck(bare)


def test_a_big_file_changed_before_the_pack_is_written_publishes_nothing(tmp_path, bare):
    repo = Repository.open(bare)
    big = tmp_path / "big.bin"
    big.write_bytes(b"a" * 200_000)
    batch = PackBatch(repo)
    with batch:
        batch.add(ObjectType.BLOB, b"small object\n" * 10, b"small")
        oid, _ = batch.add_file(big, big.stat().st_size, name=b"big.bin")
        assert oid == hash_object(ObjectType.BLOB, b"a" * 200_000)
        big.write_bytes(b"b" * 200_000)                    # same size, other content
        with pytest.raises(InvalidInputError) as info:
            batch.commit()
    assert info.value.path == str(big) and info.value.oid == oid.hex()
    assert packs(bare) == [] and [p.name for p in (bare / "objects" / "pack").iterdir()] == []
    assert batch_check_all(bare) == {}


@pytest.mark.parametrize("code", [0, -1, 5, 7])
def test_an_unknown_type_code_is_refused_and_nothing_is_written(tmp_path, bare, code):
    """A type code outside commit..tag is InvalidInputError at add()/add_file(), naming the file (it used to
    index the label table: TypeError for 0, IndexError past 4, a negative code took another type's label);
    the batch stays usable and writes only what was added with a valid type."""
    repo = Repository.open(bare)
    f = tmp_path / "f.bin"
    f.write_bytes(b"content\n")
    with PackBatch(repo) as batch:
        with pytest.raises(InvalidInputError, match=f"unknown object type {code}"):
            batch.add(code, b"content\n")
        with pytest.raises(InvalidInputError, match=f"unknown object type {code}") as info:
            batch.add_file(f, f.stat().st_size, code)
        assert info.value.path == str(f)
        oid, result = batch.add(ObjectType.BLOB, b"content\n")
        assert result is WriteResult.QUEUED
        batch.commit()
    (pack,) = packs(bare)
    verify(pack)
    assert batch_check_all(bare) == {oid.hex(): ("blob", 8)}


def test_import_job_on_a_worker_takes_the_pack_path(store_root, incoming, celery_worker, celery_app, pk):
    repo = make_worktree_repo(store_root / "r")
    src = make_tree(incoming / "src", 1200)            # the default PACKYARD_PACK_THRESHOLD is 1000
    res = celery_app.send_task("packyard.import_tree", kwargs={"repo": str(repo), "ref": "refs/heads/main",
                                                               "source": str(src), "message": "a big import"})
    value = res.get(timeout=120, propagate=False)
    job = pk.job_row(res.id)
    assert job.state.value == "SUCCESS", job.error
    assert job.counters == value["counters"]
    c = job.counters
    assert c["write_path"] == "pack" and c["files"] == 1200 and c["deltas_computed"] > 0
    assert c["objects_written"] == 1200 + 10 + 1 + 1 and c["pack_bytes"] > 0
    assert git("rev-parse", "main", git_dir=repo).decode().strip() == value["commit"]
    fsck(repo)


def test_cli_import_says_which_path(tmp_path, bare):
    src = make_tree(tmp_path / "src", 30)
    env = {**os.environ, "PACKYARD_PACK_THRESHOLD": "10", "PACKYARD_STATE_DIR": str(tmp_path / "state")}
    cli = "import sys; from packyard.workers.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", cli, "import", "--repo", str(bare), "--ref", "refs/heads/main",
                           "--json", "--no-progress", str(src)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["counters"]["write_path"] == "pack" and len(packs(bare)) == 1
    fsck(bare)


def test_memory_held_by_a_pack_import_is_bounded(tmp_path, bare, monkeypatch):
    """Past PACK_MEMORY a directory import streams its further files into the pack whole; a tar import
    holding more than that is written loose (its members cannot be read again cheaply)."""
    import tarfile

    import packyard.store.importtree as it

    monkeypatch.setattr(it, "PACK_MEMORY", 4000)
    src = make_tree(tmp_path / "src", 200)
    held = []
    real_commit = PackBatch.commit

    def commit(self, ref_updates=()):
        held.append(self.held_bytes)
        return real_commit(self, ref_updates)

    monkeypatch.setattr(PackBatch, "commit", commit)
    expected = git_tree_of(src, tmp_path)
    res = import_tree(Repository.open(bare), "refs/heads/main", src, author=WHEN, pack_threshold=10)
    assert res.counters["write_path"] == "pack" and res.tree.hex() == expected
    assert held and held[0] <= 4000 + 40_000   # the trees and commit are held whatever their size
    fsck(bare)
    archive = tmp_path / "src.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(src, arcname=".")
    other = tmp_path / "tar.git"
    git("init", "-q", "--bare", str(other))
    res = import_tree(Repository.open(other), "refs/heads/main", archive, author=WHEN, pack_threshold=10)
    assert res.counters["write_path"] == "loose" and res.tree.hex() == expected
