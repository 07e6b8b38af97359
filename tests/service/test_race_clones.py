"""The race harness's clone reader: git's own clones (upload-pack, pack-objects with bitmaps) during repacks.

* the check can fail: ``clone_once`` on a repository git built, then with one blob removed (the clone's
  pack-objects cannot send it): a failed clone naming the object; the intact repository clones and fscks,
served through its bitmap ("pack-reused");
* a short safe race (the clone reader on, as by default): clones ran, overlapped repack jobs, were served
  through bitmaps (pack and MIDX ones the repacks wrote), and none failed; the counts are in the run's job
  row and the summary, and there are no clone_failed race_events rows.

No existing negative control of the harness fails clones (docs/maintenance.md says why: git re-reads the
pack directory when an object is not in the packs it listed, and each clone's view lasts one clone), so the
first test is the control of the check itself.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sqlalchemy import func, select

from gitutil import git
from packyard.workers.race.clones import CloneResult, clone_once, overlapping

RACE_SECONDS = float(os.environ.get("PACKYARD_TEST_CLONE_RACE_SECONDS", "25"))
ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _served(tmp_path: Path) -> tuple[Path, list[str]]:
    """A bare repository with three commits, packed by git with a bitmap; returns it and the blob ids."""
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True, env=ENV)
    blobs = []
    for i in range(3):
        (work / f"f{i}.txt").write_text(f"content {i}\n" * 20)
        subprocess.run(["git", "-C", str(work), "add", "."], check=True, env=ENV)
        subprocess.run(["git", "-C", str(work), "commit", "-qm", f"c{i}"], check=True, env=ENV)
        blobs.append(subprocess.run(["git", "-C", str(work), "rev-parse", f"HEAD:f{i}.txt"], check=True,
                                    capture_output=True, text=True, env=ENV).stdout.strip())
    served = tmp_path / "served.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--no-local", str(work), str(served)], check=True, env=ENV)
    git("repack", "-a", "-d", "-b", "-q", git_dir=served)
    return served, blobs


def test_clone_check_fails_on_a_repository_missing_an_object(tmp_path):
    served, blobs = _served(tmp_path)
    good = clone_once(served, tmp_path / "c0.git")
    assert good.ok and good.objects == 9 and good.pack_reused == 9, good      # through the bitmap
    assert not (tmp_path / "c0.git").exists()                                  # the clone is removed
    # One blob gone from the packs (a pack of every other object replaces them); main still reaches it.
    objs = subprocess.run(["git", "--git-dir", str(served), "cat-file", "--batch-all-objects",
                           "--batch-check=%(objectname)"], check=True, capture_output=True, text=True).stdout.split()
    rest = "".join(f"{o}\n" for o in objs if o != blobs[1]).encode()
    new = subprocess.run(["git", "--git-dir", str(served), "pack-objects", "-q", str(served / "objects/pack/pack")],
                         input=rest, check=True, capture_output=True).stdout.decode().strip()
    for f in (served / "objects" / "pack").iterdir():
        if new not in f.name:
            f.unlink()
    bad = clone_once(served, tmp_path / "c1.git")
    assert not bad.ok and bad.step == "clone" and not (tmp_path / "c1.git").exists(), bad
    assert blobs[1] in bad.error, bad.error


def test_overlap_counts_clones_inside_repack_intervals():
    rs = [CloneResult(True, 0.0, 1.0), CloneResult(True, 2.0, 3.0), CloneResult(True, 5.0, 6.0)]
    assert overlapping(rs, [(0.5, 2.5)]) == 2
    assert overlapping(rs, [(3.0, 5.0)]) == 0 and overlapping(rs, []) == 0


def test_safe_race_serves_every_clone(celery_worker, store_root, pk, settings):
    from packyard.workers.records import RaceEvent, session_scope

    repo = store_root / "race-clones.git"
    proc = subprocess.run(["packyard", "race", "--repo", str(repo), "--json", "--readers", "2", "--duration",
                           str(RACE_SECONDS), "--repack-every", "2", "--ingest-every", "1", "--seed", "5"],
                          env=pk.cli_env(), capture_output=True, text=True, timeout=RACE_SECONDS + 240)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    out = json.loads(lines[-1])
    shown = json.dumps({k: v for k, v in out.items() if k != "pushed_ids"})[:3000]
    assert proc.returncode == 0 and out["ok"], shown
    c = out["clones"]
    assert out["clones_failed"] == 0 and c["clones_failed"] == 0 and out["events"]["clone_failed"] == 0, shown
    assert c["clones"] >= 5, shown
    assert c["clones_during_repack"] >= 1, "no clone overlapped a repack job: no race"
    assert c["clones_bitmap"] >= 1, "no clone was served through a bitmap"
    assert all(n >= 1 for n in out["repacks"].values()), out["repacks"]
    job = pk.job_row(out["run_id"])
    assert job.state.value == "SUCCESS"
    assert {k: job.counters[k] for k in c} == c
    with session_scope(settings) as s:
        n = s.execute(select(func.count()).where(RaceEvent.job_id == out["run_id"])
                      .where(RaceEvent.kind == "clone_failed")).scalar_one()
    assert n == 0
    git("fsck", "--full", "--strict", git_dir=repo)
