"""The fault points' in-process modes (the environment's are exercised by the crash tests)."""
from __future__ import annotations

import pytest

from gitutil import git, write_blobs
from packyard.store import faults
from packyard.store.errors import ObjectMissingError
from packyard.store.repo import Repository


def test_arm_call_runs_once_at_the_chosen_hit_then_disarms():
    calls: list[int] = []
    faults.arm_call("test.point", lambda: calls.append(1), at=2)
    try:
        faults.fault_point("test.point")
        assert calls == []                  # the first time: not yet
        faults.fault_point("test.point")
        assert calls == [1]                 # the second: once
        faults.fault_point("test.point")
        assert calls == [1]                 # and never again
    finally:
        faults.disarm("test.point")


def test_disarm_all_drops_armed_calls_and_raises(tmp_path):
    faults.arm_call("test.call", lambda: pytest.fail("disarmed call ran"))
    faults.arm("test.raise")
    faults.disarm()
    faults.fault_point("test.call")
    faults.fault_point("test.raise")


def test_a_loose_file_deleted_between_open_and_read_is_gone_not_an_error(tmp_path):
    """``loose.after_open``: the point between a loose read's open and its read. On a local disk an unlinked file
    still reads (the open handle keeps the inode), so the object is read; the ESTALE case needs a mount that
    answers it (tests/service/test_nfsim.py)."""
    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    oid, = write_blobs(bare, tmp_path, 1, "one")
    path = bare / "objects" / oid[:2] / oid[2:]
    repo = Repository(bare)
    faults.arm_call("loose.after_open", path.unlink)
    try:
        _, data = repo.objects.read(bytes.fromhex(oid), verify=True)
    finally:
        faults.disarm("loose.after_open")
    assert data == b"one blob 0\n"
    assert not path.exists()
    with pytest.raises(ObjectMissingError):
        repo.objects.read(bytes.fromhex(oid))
