"""Crash safety of an import written as one pack (store/batch/pack.py): SIGKILL at every step.

A child process imports a directory into a fresh copy of a repository with ``pack_threshold=1``
(every import is a pack). It is killed at each fault point of the pack path -- while writing
entries, after the pack is written, between the install steps (write-out, flush, the .pack
rename, all renames with the .idx last, the directory fsync), inside the ref update and after
it -- and at random times. After each kill:

* git reads the repository: ``git fsck --full`` passes (a ``.pack`` left without its ``.idx`` is
  invisible to git and to packyard);
* the ref is either the old value, or the new commit with every object of its tree present;
* a rerun of the same import completes, gives the expected commit, leaves no temp file of the
  dead run, and ``git fsck --full`` passes again.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_crash import CHILD, template_and_expected

from gitutil import ROOT, git, write_source
from packyard.store import Repository
from packyard.store.importtree import Identity, import_tree
from procutil import spawn_python

pytestmark = pytest.mark.slow

WHEN = Identity(name="Crash Test", email="crash@example.com", when=1700000000)
REF = "refs/heads/main"
N_FILES = 60

def make_source(base: Path) -> Path:
    body = "".join(f"line {k} shared by every file of this import\n" for k in range(30))
    return write_source(base, N_FILES, 4, lambda i: body + f"file {i}\n" * (i % 5 + 1))


def ls_objects(bare: Path, ref: str) -> list[str]:
    return [line.split()[0] for line in git("rev-list", "--objects", ref, git_dir=bare).decode().splitlines()]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash-pack")
    src = make_source(base)
    # (the old tip is 3 objects, loose under any threshold; the import on top of it is a pack)
    bare, old, scratch, expected = template_and_expected(base, src, pack_threshold=1)
    assert expected.counters["write_path"] == "pack" and expected.counters["deltas_computed"] > 0
    return {"bare": bare, "src": src, "old": old.commit.hex(), "commit": expected.commit.hex(), "base": base,
            "objects": sorted(ls_objects(scratch, REF))}


class Runner:
    def __init__(self, t) -> None:
        self.t = t
        self.n = 0
        self.landed: dict[str, int] = {}

    def fresh(self) -> Path:
        self.n += 1
        dest = self.t["base"] / f"run{self.n}.git"
        shutil.copytree(self.t["bare"], dest)
        return dest

    def spawn(self, bare: Path, fault: str | None, wait: bool) -> subprocess.Popen:
        # tests/store/test_crash.py's child import, every import a pack.
        return spawn_python(CHILD, str(ROOT), str(bare), str(self.t["src"]), "wait" if wait else "go", fault=fault,
                            env={"PACKYARD_TEST_PACK_THRESHOLD": "1"})

    def check(self, bare: Path, label: str) -> None:
        git("fsck", "--full", "--no-dangling", git_dir=bare)
        ref = (bare / REF).read_text().strip()
        assert ref in (self.t["old"], self.t["commit"]), label
        if ref == self.t["commit"]:
            assert sorted(ls_objects(bare, REF)) == self.t["objects"], label
        # The rerun: completes, same commit, nothing of the dead run left behind but git-invisible names it replaced.
        res = import_tree(Repository.open(bare), REF, self.t["src"], author=WHEN, message="crash test",
                          pack_threshold=1)
        if ref == self.t["old"]:
            assert res.commit.hex() == self.t["commit"], label
        else:
            assert res.parent.hex() == self.t["commit"], label
        pack_dir = bare / "objects" / "pack"
        names = {p.name for p in pack_dir.iterdir()}
        assert not [n for n in names if n.startswith("tmp_")], (label, names)
        assert all(f"{n.rsplit('.', 1)[0]}.idx" in names for n in names if n.startswith("pack-")), (label, names)
        assert not (bare / (REF + ".lock")).exists(), label
        git("fsck", "--full", "--no-dangling", git_dir=bare)
        self.landed[label] = self.landed.get(label, 0) + 1
        shutil.rmtree(bare)

    def fault_run(self, point: str) -> None:
        bare = self.fresh()
        proc = self.spawn(bare, point, wait=False)
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, f"{point}: the child was not killed there (rc {proc.returncode})"
        self.check(bare, point.split(":")[0])

    def random_run(self, rng: random.Random, window: float) -> None:
        bare = self.fresh()
        proc = self.spawn(bare, None, wait=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.stdin.write("\n")
        proc.stdin.flush()
        time.sleep(rng.uniform(0, window))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
        self.check(bare, "random:" + ("killed" if proc.returncode == -signal.SIGKILL else "finished"))


def test_sigkill_at_every_step_of_a_pack_import(template):
    rng = random.Random(int(os.environ.get("PACKYARD_CRASH_SEED", "7")))
    runner = Runner(template)
    n_objects = len(template["objects"]) - 3   # what the import writes: not the old commit, its tree and blob
    points = ["packbatch.write_object:kill@1", f"packbatch.write_object:kill@{n_objects}"]
    points += [f"packbatch.write_object:kill@{rng.randint(2, n_objects - 1)}" for _ in range(3)]
    points += ["packbatch.after_write", "packbatch.after_writeout", "packbatch.after_flush", "packbatch.after_keep",
               "packbatch.after_pack_rename", "packbatch.after_renames", "packbatch.after_fsync_dirs",
               "refs.before_rename", "packbatch.after_update_refs"]
    for point in points:
        runner.fault_run(point)
    # Random-time kills over one uninterrupted run's length.
    bare = runner.fresh()
    proc = runner.spawn(bare, None, wait=True)
    proc.stdout.readline()
    t0 = time.monotonic()
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().startswith("done ")   # ("done <seconds>")
    window = time.monotonic() - t0
    proc.communicate()
    shutil.rmtree(bare)
    for _ in range(10):
        runner.random_run(rng, window)
    print(f"\npack import crash runs: {runner.n - 1}, per point: {runner.landed}")
    assert sum(v for k, v in runner.landed.items() if not k.startswith("random")) == len(points)
