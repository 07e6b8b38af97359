"""durable.publish_file, the one write-flush-rename of packed-refs, commit-graph layers and chains, and
write_file_durably: on a failure its temp file goes and, with ``what``, an OSError is a typed error."""
from __future__ import annotations

import pytest

from packyard.store import durable
from packyard.store.errors import WriteFailedError


def test_publish_file_renames_the_flushed_temp_onto_dst(tmp_path):
    counters = durable.DurabilityCounters()
    durable.publish_file(tmp_path / "tmp_x", tmp_path / "dst", b"data\n", mode=0o644, counters=counters)
    assert (tmp_path / "dst").read_bytes() == b"data\n"
    assert not (tmp_path / "tmp_x").exists()
    assert (counters.flushes, counters.renames) == (1, 1)
    assert (tmp_path / "dst").stat().st_mode & 0o777 == 0o644


def test_a_failed_rename_removes_the_temp_and_names_it(tmp_path):
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "inside").write_bytes(b"")      # a non-empty directory: the rename fails (EISDIR)
    with pytest.raises(WriteFailedError, match="writing packed-refs failed") as info:
        durable.publish_file(tmp_path / "tmp_x", tmp_path / "dst", b"data", what="packed-refs")
    assert info.value.errno is not None and str(tmp_path / "tmp_x") in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]


def test_without_what_the_oserror_is_raised_as_it_is(tmp_path):
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "inside").write_bytes(b"")
    with pytest.raises(IsADirectoryError):
        durable.publish_file(tmp_path / "tmp_x", tmp_path / "dst", b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]


def test_an_error_between_flush_and_rename_removes_the_temp(tmp_path):
    def fail() -> None:
        raise RuntimeError("injected")
    with pytest.raises(RuntimeError, match="injected"):
        durable.publish_file(tmp_path / "tmp_x", tmp_path / "dst", b"data", between=fail, what="x")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_temp_is_never_taken_over(tmp_path):
    (tmp_path / "tmp_x").write_bytes(b"another writer's")
    with pytest.raises(FileExistsError):
        durable.publish_file(tmp_path / "tmp_x", tmp_path / "dst", b"data", what="x")
    assert (tmp_path / "tmp_x").read_bytes() == b"another writer's"
