"""The loose batch's flush choice (store/flush.py, issue 22 goal 6): the rule as a table, the batches it
makes (counted durability calls, objects git reads back), the Settings override, and FUSE (nfsim),
where syncfs does not reach the backing filesystem and only per-file flushes are durable.

The crash safety of each method is tests/test_crash_flush.py; timings are `packyard bench loose
--noisy-neighbour` (docs/performance.md), never a test."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gitutil import batch_check_all, git
from packyard.store import Repository, durable
from packyard.store.batch.api import begin
from packyard.store.errors import InvalidInputError
from packyard.store.flush import (
    FUSE_SUPER_MAGIC,
    DirSync,
    FlushMethod,
    FlushPolicy,
    choose_flush,
    dir_sync_for,
    filesystem_type,
    parse_method,
)
from packyard.store.objects import ObjectType
from packyard.workers.settings import Settings, SettingsError

EXT4 = 0xEF53
EACH, SYNCFS = FlushMethod.FSYNC_EACH, FlushMethod.SYNCFS
MiB = 1 << 20

# (files, bytes, statfs type, policy, dirty bytes waiting, syncfs exists) -> method, or the error it raises
LOTS = 1 << 30
TABLE = [
    # the size rule on a filesystem whose syncfs reaches the disk, with a neighbour's GiB dirty
    (1, 100, EXT4, FlushPolicy(), LOTS, True, EACH),
    (10, 10_000, EXT4, FlushPolicy(), LOTS, True, EACH),
    (16, 4 * MiB, EXT4, FlushPolicy(), LOTS, True, EACH),          # both limits inclusive
    (17, 1_000, EXT4, FlushPolicy(), LOTS, True, SYNCFS),          # one file too many
    (2, 4 * MiB + 1, EXT4, FlushPolicy(), LOTS, True, SYNCFS),     # one byte too many
    (10_000, 3 * MiB, EXT4, FlushPolicy(), LOTS, True, SYNCFS),
    (0, 0, EXT4, FlushPolicy(), LOTS, True, EACH),                 # an empty batch flushes nothing either way
    (100, 1_000, None, FlushPolicy(max_files=100), LOTS, True, EACH),  # limits from the policy; unknown fs type
    (5, 1_000, EXT4, FlushPolicy(max_files=0), LOTS, True, SYNCFS),    # max_files 0: auto always syncfs
    # the dirty rule: a quiet machine's syncfs has little else to write
    (10, 10_000, EXT4, FlushPolicy(), 16 * MiB - 1, True, SYNCFS),
    (10, 10_000, EXT4, FlushPolicy(), 16 * MiB, True, EACH),       # inclusive
    (10, 10_000, EXT4, FlushPolicy(), 0, True, SYNCFS),
    (10, 10_000, EXT4, FlushPolicy(min_dirty=0), 0, True, EACH),   # min_dirty 0: small batches always per file
    # FUSE (nfsim) or no syncfs at all: per-file whatever the size and the dirty data
    (10_000, 100 * MiB, FUSE_SUPER_MAGIC, FlushPolicy(), 0, True, EACH),
    (10_000, 100 * MiB, EXT4, FlushPolicy(), 0, False, EACH),
    # forced by the server
    (10_000, 100 * MiB, EXT4, FlushPolicy(EACH), 0, True, EACH),
    (1, 10, EXT4, FlushPolicy(SYNCFS), LOTS, True, SYNCFS),
    (1, 10, FUSE_SUPER_MAGIC, FlushPolicy(EACH), 0, True, EACH),
    (1, 10, FUSE_SUPER_MAGIC, FlushPolicy(SYNCFS), 0, True, "not passed to the storage"),
    (1, 10, EXT4, FlushPolicy(SYNCFS), 0, False, "not available on this platform"),
]


@pytest.mark.parametrize("files,nbytes,fs_type,policy,dirty,have,want", TABLE)
def test_choose_flush_table(files, nbytes, fs_type, policy, dirty, have, want):
    if isinstance(want, str):
        with pytest.raises(InvalidInputError, match=want):
            choose_flush(files, nbytes, fs_type, policy, dirty=dirty, have_syncfs=have)
    else:
        assert choose_flush(files, nbytes, fs_type, policy, dirty=dirty, have_syncfs=have) is want


def test_dirty_bytes_reads_the_kernel_s_figure():
    got = durable.dirty_bytes()
    if not Path("/proc/meminfo").exists():
        assert got is None
        return
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert got is not None and got % 1024 == 0 and got >= 0
    assert {"Dirty", "Writeback"} <= set(fields)


def test_dir_step_follows_the_method_and_names_parse():
    assert dir_sync_for(SYNCFS) is DirSync.SYNCFS and dir_sync_for(EACH) is DirSync.EACH
    assert parse_method("auto") is None and parse_method("") is None
    assert parse_method("fsync_each") is EACH and parse_method("syncfs") is SYNCFS
    with pytest.raises(InvalidInputError, match="'fdatasync'"):
        parse_method("fdatasync")


def test_settings_override():
    assert Settings.from_env({}).flush_policy == FlushPolicy()
    s = Settings.from_env({"PACKYARD_FLUSH_METHOD": "syncfs", "PACKYARD_FLUSH_EACH_MAX_FILES": "64",
                           "PACKYARD_FLUSH_EACH_MAX_BYTES": "1000", "PACKYARD_FLUSH_EACH_MIN_DIRTY": "0"})
    assert s.flush_policy == FlushPolicy(SYNCFS, 64, 1000, 0)
    assert Settings.from_env(s.as_env()).flush_policy == s.flush_policy
    with pytest.raises(SettingsError, match="PACKYARD_FLUSH_METHOD"):
        Settings.from_env({"PACKYARD_FLUSH_METHOD": "sometimes"})
    with pytest.raises(SettingsError, match="PACKYARD_FLUSH_EACH_MAX_FILES"):
        Settings.from_env({"PACKYARD_FLUSH_EACH_MAX_FILES": "-1"})


@pytest.fixture
def empty_repo(tmp_path):
    git("init", "-q", "--bare", str(tmp_path / "e.git"))
    return tmp_path / "e.git"


def _fs_type(path: Path) -> int | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return filesystem_type(fd)
    finally:
        os.close(fd)


def _write(repo_path: Path, n: int, tag: str, **options) -> dict:
    repo = Repository.open(repo_path)
    with begin(repo, **options) as batch:
        oids = [batch.add(ObjectType.BLOB, f"{tag} {i}\n".encode())[0] for i in range(n)]
        res = batch.commit()
    assert {o.hex() for o in oids} <= set(batch_check_all(repo_path))
    return res.counters


def test_a_small_batch_flushes_its_own_files_and_a_large_one_the_filesystem(empty_repo):
    if not durable.HAVE_SYNCFS or _fs_type(empty_repo) == FUSE_SUPER_MAGIC:
        pytest.skip("needs a filesystem whose syncfs reaches the disk")
    # min_dirty=0: per file whatever the machine holds dirty right now (the default asks /proc/meminfo)
    small = _write(empty_repo, 10, "small", flush_policy=FlushPolicy(min_dirty=0))
    assert small["flush_fsync_each"] == 1 and "syncfs" not in small, small
    assert small["flushes"] == 10, small                # one fsync per tmp file
    assert small["dir_fsyncs"] >= 1, small              # each touched fan-out dir (+ objects/)
    assert small["writeouts"] == (10 if durable.HAVE_WRITEOUT else 0), small
    large = _write(empty_repo, 40, "large")
    assert large["flush_syncfs"] == 1 and large["syncfs"] == 2 and large["dir_fsyncs"] == 0, large
    forced = _write(empty_repo, 10, "forced", flush_policy=FlushPolicy(SYNCFS))
    assert forced["syncfs"] == 2, forced
    quiet = _write(empty_repo, 10, "quiet", flush_policy=FlushPolicy(min_dirty=1 << 60))   # "nothing dirty"
    assert quiet["flush_syncfs"] == 1 and quiet["syncfs"] == 2, quiet
    wider = _write(empty_repo, 40, "wider", flush_policy=FlushPolicy(max_files=64, min_dirty=0))
    assert wider["flush_fsync_each"] == 1 and wider["flushes"] == 40, wider
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=empty_repo)


def test_on_fuse_every_batch_flushes_per_file_and_syncfs_is_refused(tmp_path):
    from packyard.workers import nfsim

    reason = nfsim.unavailable()
    if reason is not None:
        pytest.skip(f"nfsim cannot mount here: {reason}")
    backing = tmp_path / "server"
    backing.mkdir()
    git("init", "-q", "--bare", str(backing / "r.git"))
    with nfsim.Mount(backing, tmp_path / "a", name="a", latency=0.0) as m:
        repo = m.mountpoint / "r.git"
        assert _fs_type(repo / "objects") == FUSE_SUPER_MAGIC
        before = m.counters()
        big = _write(repo, 40, "big")      # above the size limit: still per file, syncfs would not reach the disk
        calls = nfsim.delta(m.counters(), before)
        assert big["flush_fsync_each"] == 1 and "syncfs" not in big, big
        assert calls.get("fsync", 0) >= 40 + 1, calls   # 40 files + the directories, each a round trip
        with pytest.raises(InvalidInputError, match="not passed to the storage"):
            _write(repo, 3, "refused", flush_policy=FlushPolicy(SYNCFS))
    # what the refused batch wrote went nowhere: the backing repository has only the 40
    assert len(batch_check_all(backing / "r.git")) == 40
    assert not list((backing / "r.git" / "objects").glob("??/tmp_obj_*"))
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=backing / "r.git")
