"""Crash safety of each flush method (store/flush.py): the import of tests/test_crash.py with the method
forced, SIGKILLed at every durability step, then the same checks (objects under their final names
inflate and hash to them, the ref is old or names a complete tree, a rerun finishes and cleans up,
`git fsck --full` on a sample).

Without a forced method the 29-object import is above the per-file limit and flushes with syncfs: that
is tests/test_crash.py itself. Here both methods run every step, so the per-file flush that small
pushes now take is killed at each point too."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from test_crash import CHILD, N_FILES, Runner, template  # noqa: F401  (the fixture)

from gitutil import ROOT
from packyard.store import durable

pytestmark = pytest.mark.slow

METHODS = ["fsync_each"] + (["syncfs"] if durable.HAVE_SYNCFS else [])


def points(n_objects: int) -> list[str]:
    """Every step of the loose batch's commit, the first/last object of the loops, and the ref update."""
    return ["bulk.write_object:kill@1", f"bulk.write_object:kill@{n_objects}",
            "bulk.after_writeout", "bulk.after_barrier",
            "bulk.publish_rename:kill@1", f"bulk.publish_rename:kill@{n_objects // 2}",
            f"bulk.publish_rename:kill@{n_objects}",
            "bulk.after_renames", "bulk.after_fsync_dirs", "refs.before_rename", "bulk.after_update_refs"]


@pytest.mark.parametrize("method", METHODS)
def test_sigkill_at_every_step_with_each_flush_method(template, monkeypatch, method):  # noqa: F811
    monkeypatch.setenv("PACKYARD_TEST_FLUSH_METHOD", method)
    runner = Runner(template)
    # The method really is the forced one: an uninterrupted run reports it.
    bare = runner.fresh()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(bare), str(template["src"]), "go"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert f"flush flush_{method}\n" in proc.stdout, proc.stdout
    shutil.rmtree(bare)
    n_objects = N_FILES + 4 + 1    # blobs + 3 subtrees + root tree + commit
    for point in points(n_objects):
        runner.fault_run(point)
    assert runner.killed == len(points(n_objects))   # each child died of SIGKILL at its point (fault_run)
    assert set(runner.phases) == {p.split(":")[0] for p in points(n_objects)}, runner.phases
