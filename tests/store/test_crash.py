"""Crash safety shown, not claimed: SIGKILL a writing process at every durability step and at random times.

A child process imports a small directory (blobs, trees, commit, ref CAS) into a fresh
copy of a repository. It is killed (fault points with hit counts, and random-time kills).
After each kill, with our own code (zlib + sha1, not the store under test):
* every object under its final name inflates and hashes to its name;
* the ref is either the old value or the new commit, and then every object of its tree is present;
* a rerun of the same import completes, removes the dead batch's tmp files, and gives the expected tree;
* `git fsck --full` on a sample of runs (every 8th), before and after the rerun.
"""
from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import time
import zlib
from pathlib import Path

import pytest

from gitutil import ROOT, fsck, git, write_source
from packyard.store import Repository
from packyard.store.importtree import Identity, import_tree
from packyard.store.owner import read_owner
from procutil import spawn_python

pytestmark = pytest.mark.slow

WHEN = Identity(name="Crash Test", email="crash@example.com", when=1700000000)
REF = "refs/heads/main"
N_FILES = 24

CHILD = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from packyard.store import Repository
from packyard.store.importtree import Identity, import_tree
if os.environ.get("PACKYARD_TEST_EARLY_FLUSH_EVERY"):   # background syncfs threads in flight when killed
    import packyard.store.batch.loose
    packyard.store.batch.loose.EARLY_FLUSH_EVERY = int(os.environ["PACKYARD_TEST_EARLY_FLUSH_EVERY"])
options = {}
if os.environ.get("PACKYARD_TEST_FLUSH_METHOD"):   # tests/test_crash_flush.py: each flush method forced
    from packyard.store.flush import FlushMethod, FlushPolicy
    options["flush_policy"] = FlushPolicy(FlushMethod(os.environ["PACKYARD_TEST_FLUSH_METHOD"]))
if os.environ.get("PACKYARD_TEST_PACK_THRESHOLD"):   # tests/test_crash_pack.py: the import written as a pack
    options["pack_threshold"] = int(os.environ["PACKYARD_TEST_PACK_THRESHOLD"])
ident = Identity(name="Crash Test", email="crash@example.com", when=1700000000)
repo = Repository.open(sys.argv[2])
print("ready", flush=True)
if sys.argv[4] == "wait":
    sys.stdin.readline()
import time
t0 = time.monotonic()
res = import_tree(repo, "refs/heads/main", sys.argv[3], message="crash test", author=ident, **options)
if "flush_policy" in options:
    print("flush", ",".join(sorted(k for k in res.counters if k.startswith("flush_"))), flush=True)
print(f"done {time.monotonic() - t0:.6f}", flush=True)
"""


def make_source(base: Path) -> Path:
    return write_source(base, N_FILES, 3, lambda i: f"file {i}\n" * (i + 1))


def loose_objects(bare: Path) -> dict[str, Path]:
    return {p.parent.name + p.name: p for p in (bare / "objects").glob("??/*")
            if len(p.name) == 38 and not p.name.startswith("tmp_")}


def check_object(path: Path, hexid: str) -> tuple[str, bytes]:
    raw = zlib.decompress(path.read_bytes())        # raises on truncated / corrupt
    header, _, data = raw.partition(b"\0")
    typ, size = header.split(b" ")
    assert int(size) == len(data), f"{hexid}: size mismatch"
    assert hashlib.sha1(raw).hexdigest() == hexid, f"{hexid}: content hashes elsewhere"
    return typ.decode(), data


def check_repo(bare: Path, old: str, expected_tree: str) -> str:
    """Own checks; returns the ref value."""
    objs = loose_objects(bare)
    content = {h: check_object(p, h) for h, p in objs.items()}
    ref_path = bare / REF
    ref = ref_path.read_text().strip()
    assert ref == old or ref in content, "ref names an object that is not there"
    if ref != old:
        typ, data = content[ref]
        assert typ == "commit"
        tree = data.split(b"\n", 1)[0].split(b" ")[1].decode()
        assert tree == expected_tree

        def walk(tree_hex: str) -> None:
            typ, data = content[tree_hex]           # KeyError = missing object
            assert typ == "tree"
            pos = 0
            while pos < len(data):
                nul = data.index(b"\0", pos)
                mode = data[pos:nul].split(b" ")[0]
                oid = data[nul + 1:nul + 21].hex()
                if mode == b"40000":
                    walk(oid)
                else:
                    assert content[oid][0] == "blob"
                pos = nul + 21
        walk(tree)
    return ref


def template_and_expected(base: Path, src: Path, **options):
    """The repository every run copies (``base/template.git``: REF an old tip of one small loose commit) and the
    expected import of ``src`` on top of it (``import_tree`` with ``options``), computed once in a scratch copy,
    not from the runs under test: (template, the old tip's result, the scratch copy, the expected result)."""
    bare = base / "template.git"
    git("init", "-q", "--bare", str(bare))
    first = base / "first"
    first.mkdir()
    (first / "README").write_text("old tip\n")
    old = import_tree(Repository.open(bare), REF, first, author=WHEN)
    scratch = base / "scratch.git"
    shutil.copytree(bare, scratch, symlinks=True)
    expected = import_tree(Repository.open(scratch), REF, src, author=WHEN, message="crash test", **options)
    return bare, old, scratch, expected


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash")
    src = make_source(base)
    bare, res, _scratch, expected = template_and_expected(base, src)
    return {"bare": bare, "src": src, "old": res.commit.hex(), "tree": expected.tree.hex(),
            "commit": expected.commit.hex(), "base": base}


class Runner:
    def __init__(self, template) -> None:
        self.t = template
        self.n = 0
        self.killed = 0
        self.phases: dict[str, int] = {}
        self.last_pid = 0

    def fresh(self) -> Path:
        self.n += 1
        dest = self.t["base"] / f"run{self.n}.git"
        shutil.copytree(self.t["bare"], dest, symlinks=True)
        return dest

    def spawn(self, bare: Path, fault: str | None, wait: bool, early_every: int | None = None) -> subprocess.Popen:
        proc = spawn_python(CHILD, str(ROOT), str(bare), str(self.t["src"]), "wait" if wait else "go", fault=fault,
                            env={"PACKYARD_TEST_EARLY_FLUSH_EVERY": str(early_every)} if early_every else None)
        self.last_pid = proc.pid
        return proc

    def after_kill(self, bare: Path, label: str) -> None:
        old = self.t["old"]
        ref = check_repo(bare, old, self.t["tree"])
        sample = self.n % 8 == 0
        if sample:
            fsck(bare)
        lock = bare / (REF + ".lock")
        repo = Repository.open(bare)
        if lock.exists():
            # The claim names its owner at every moment of the ref update (refs.py), so a kill
            # anywhere leaves a lock the rerun below breaks at once, never one nobody can judge.
            owner = read_owner(lock)
            assert owner is not None and owner.pid == self.last_pid, f"{label}: ref lock without its owner"
        elif label == "refs.before_rename":
            raise AssertionError("killed inside the ref update, yet no claim was left")
        # Rerun of the same import (stale_after=0: the dead batch's tmp files go now).
        res = import_tree(repo, REF, self.t["src"], author=WHEN, message="crash test", stale_after=0)
        assert res.tree.hex() == self.t["tree"]
        if ref == old:
            assert res.commit.hex() == self.t["commit"]
        else:
            assert ref == self.t["commit"] and res.parent.hex() == ref
        assert not list((bare / "objects").glob("??/tmp_obj_*")), f"{label}: stale tmp files left"
        assert not lock.exists(), f"{label}: the dead writer's ref claim was not broken"
        check_repo(bare, old, self.t["tree"])
        if sample:
            fsck(bare)
        self.phases[label] = self.phases.get(label, 0) + 1
        shutil.rmtree(bare)

    def state(self, bare: Path) -> str:
        """Where a random kill landed, judged from what it left behind."""
        tmp = list((bare / "objects").glob("??/tmp_obj_*"))
        new = len(loose_objects(bare)) - len(loose_objects(self.t["bare"]))
        if (bare / REF).read_text().strip() != self.t["old"]:
            return "ref-moved"
        if (bare / (REF + ".lock")).exists():
            return "in-ref-update"
        if new and tmp:
            return "mid-renames"
        if new:
            return "renamed"
        return "writing" if tmp else "before-first-write"

    def fault_run(self, point: str, early_every: int | None = None) -> None:
        bare = self.fresh()
        proc = self.spawn(bare, point, wait=False, early_every=early_every)
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"{point}: child was not killed there (rc {proc.returncode})"
        self.killed += 1
        self.after_kill(bare, point.split(":")[0] + (" (early flushes)" if early_every else ""))

    def random_run(self, rng: random.Random, lo: float, hi: float) -> float | None:
        """One import killed at a random time in [lo, hi) after it started.

        Returns None when the kill landed, else how long the import took (the child's own clock):
        the caller narrows its window to that, so a machine that got faster since calibration
        does not turn the remaining kills into kills of finished processes.
        """
        bare = self.fresh()
        proc = self.spawn(bare, None, wait=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.stdin.write("\n")
        proc.stdin.flush()
        time.sleep(rng.uniform(lo, hi))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        killed = proc.returncode == -signal.SIGKILL
        self.killed += killed
        self.after_kill(bare, f"random:{self.state(bare)}" if killed else "random:finished")
        if killed:
            return None
        return done_seconds(out)


def done_seconds(out: str) -> float:
    """The import's duration from the child's "done <seconds>" line (other lines, e.g. "flush ...", skipped)."""
    for line in out.splitlines():
        if line.startswith("done "):
            return float(line.split()[1])
    raise AssertionError(f"no done line in {out!r}")


def test_sigkill_at_every_step_and_random_times(template):
    rng = random.Random(int(os.environ.get("PACKYARD_CRASH_SEED", "4")))
    runner = Runner(template)
    n_objects = N_FILES + 4 + 1    # blobs + 3 subtrees + root tree + commit
    points: list[str] = []
    points += [f"bulk.write_object:kill@{rng.randint(1, n_objects)}" for _ in range(24)]
    points += ["bulk.write_object:kill@1", f"bulk.write_object:kill@{n_objects}"]
    points += ["bulk.after_writeout"] * 6 + ["bulk.after_barrier"] * 8
    points += [f"bulk.publish_rename:kill@{rng.randint(1, n_objects)}" for _ in range(22)]
    points += ["bulk.publish_rename:kill@1", f"bulk.publish_rename:kill@{n_objects}"]
    points += ["bulk.after_renames"] * 8 + ["bulk.after_fsync_dirs"] * 8
    points += ["refs.before_rename"] * 6 + ["bulk.after_update_refs"] * 6
    rng.shuffle(points)
    for point in points:
        runner.fault_run(point)
    # The same steps with a background syncfs started every 4 objects (threads in flight when killed).
    early_points = [f"bulk.write_object:kill@{rng.randint(5, n_objects)}" for _ in range(8)]
    early_points += ["bulk.after_writeout"] * 2 + ["bulk.after_barrier"] * 2
    for point in early_points:
        runner.fault_run(point, early_every=4)

    # Random-time kills: calibrate the window on one uninterrupted run (the child times its import).
    bare = runner.fresh()
    proc = runner.spawn(bare, None, wait=True)
    proc.stdout.readline()
    proc.stdin.write("\n")
    proc.stdin.flush()
    window = done_seconds(proc.communicate()[0])
    shutil.rmtree(bare)
    calibrated = window
    # Half uniform over the whole run, half over its tail (the commit steps are short). The window
    # follows the machine: a run that finished before its kill pulls it halfway to what that run took
    # (the calibration may have met a load spike), a tail kill that found the import still going
    # stretches it a little (the machine got slower). Runs go on until 30 kills landed in at least
    # 3 phases (a loaded machine stretches runs, so a fixed count would test less there), bounded.
    random_killed = attempts = 0

    def phases_landed() -> set[str]:
        return {k for k in runner.phases if k.startswith("random:")} - {"random:finished"}

    while (random_killed < 30 or len(phases_landed()) < 3) and attempts < 160:
        tail = attempts % 2 == 0
        finished = runner.random_run(rng, *((0.6 * window, window) if tail else (0, window)))
        if finished is None:
            random_killed += 1
            if tail:
                window *= 1.05
        else:
            window = (window + finished) / 2
        attempts += 1

    total = len(points) + len(early_points) + attempts
    print(f"\ncrash runs: {total}, killed: {runner.killed}, random-time kills landed: {random_killed}/{attempts}, "
          f"window {calibrated * 1000:.0f} -> {window * 1000:.0f} ms, per point: {runner.phases}")
    assert total >= 100
    assert random_killed >= 20, "random kills should mostly land before the import finishes"
    assert len(phases_landed()) >= 3, f"random kills should land in several phases: {runner.phases}"
