"""A repack's round trips on an NFS mount (issue 22): no call for a file that is not there, and the calls that
do not depend on each other in flight together (store/fsparallel.py), on an nfsim mount whose counters see
every round trip the server is asked.

The repository is made by git on the backing directory: packs from pushes (a pack's ``.rev``, no ``.mtimes``
or ``.bitmap``) and loose objects from a later push spread over many fan-out directories; a full repack moves
the packs to ``preserved/`` and deletes the loose files. git checks the result on the backing directory.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from gitutil import commit_blobs, git
from packyard.store import fsparallel
from packyard.store import leftovers as lo
from packyard.store.errors import ObjectMissingError
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.repo import Repository


def _pushed_repo(backing: Path, scratch: Path, packs: int, loose_files: int) -> tuple[Path, int]:
    """``packs`` packs of two commits each, then one commit of ``loose_files`` loose blobs; (repo, loose count)."""
    bare = backing / "r.git"
    git("init", "-q", "--bare", str(bare))
    tip = None
    for _push in range(packs):
        tip = commit_blobs(bare, scratch, "main", 3, parent=tip)
        tip = commit_blobs(bare, scratch, "main", 3, parent=tip)
        git("repack", "-q", "-d", git_dir=bare)          # (the loose objects of this push into a pack of its own)
    commit_blobs(bare, scratch, "main", loose_files, parent=tip)
    loose = sum(1 for d in (bare / "objects").iterdir() if len(d.name) == 2 for _ in d.iterdir())
    return bare, loose


def test_a_full_repack_asks_for_no_missing_file_and_overlaps_its_round_trips(nfsim_hosts, tmp_path, pk):
    bare, loose = _pushed_repo(nfsim_hosts.backing, tmp_path, packs=6, loose_files=40)
    assert loose >= 40 and len(list((bare / "objects" / "pack").glob("*.idx"))) == 6
    listing = git("rev-list", "--objects", "--all", git_dir=bare)
    trace = tmp_path / "a.trace"
    a = nfsim_hosts("a", ac_attr=3.0, ac_dir=3.0, latency=0.005, trace=trace)
    assert fsparallel.is_shared(str(a.mountpoint)) and not fsparallel.is_shared(str(tmp_path))
    proc = subprocess.run(["packyard", "repack", "--repo", str(a.mountpoint / bare.name), "--mode", "full",
                           "--json", "--no-progress"], env=pk.cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    counters = json.loads(proc.stdout)["counters"]
    calls = a.counters()
    print({k: v for k, v in calls.items() if v})

    # Every replaced pack's files were moved, every loose file deleted, and nothing was asked of a file that
    # is not there (before: a rename of each pack's .mtimes and .bitmap, answered ENOENT).
    assert counters["packs_merged"] == 6 and counters["loose_deleted"] == loose
    assert calls["failed_renames"] == 0 and calls["failed_unlinks"] == 0
    assert counters["loose_prefetched"] == loose      # read together before the walk, each once
    # The loose reads and deletes (over many fan-out directories) and the idx opens overlapped.
    assert calls["max_in_flight"] >= 4
    # A temp file renamed into place is not asked for again (the writer's clean-up once unlinked every temp name,
    # each a LOOKUP answering ENOENT).
    lines = [line.split(" ", 1) for line in trace.read_text().splitlines()]
    renamed = {path: i for i, (kind, path) in enumerate(lines) if kind == "rename" and "/tmp_" in path}
    assert len(renamed) >= 3
    assert [(kind, path) for path, i in renamed.items() for kind, p in lines[i + 1:] if p == path] == []
    # The pack moves and the loose deletes went at once (fsparallel.together: they wait on different directories'
    # locks): the first loose file went before the last old pack file (one after the other, every loose unlink
    # came after the last pack's).
    first_loose = min(i for i, (kind, p) in enumerate(lines)
                      if kind == "unlink" and re.search(r"/objects/[0-9a-f]{2}/", p))
    last_pack = max(i for i, (kind, p) in enumerate(lines) if kind == "unlink" and "/objects/pack/pack-" in p)
    assert first_loose < last_pack
    # The old packs' .pack files were linked into preserved/ while the new pack was written (preserved/packs.py's
    # link_ahead, in a child process): each before the new idx was renamed into place; their idx files only in
    # the delete, after it. preserved/ then holds every old pack whole.
    new_idx = max(i for i, (kind, p) in enumerate(lines) if kind == "rename" and "/tmp_idx_" in p)
    links = {Path(p).name: i for i, (kind, p) in enumerate(lines) if kind == "link" and "/preserved/pack-" in p}
    assert counters["preserved_ahead"] == counters["preserved_moved"] == 6
    assert sorted(n for n, i in links.items() if i < new_idx and n.endswith(".pack")) == sorted(
        n for n in links if n.endswith(".pack")) and len(links) == 12
    assert all(i > new_idx for n, i in links.items() if n.endswith(".idx"))
    kept = bare / "objects" / "pack" / "preserved"
    assert {p.suffix for p in kept.glob("pack-*")} == {".idx", ".pack"} and len(list(kept.glob("pack-*"))) == 12
    # Every loose file was linked into one preserved/loose-<hex>/ by the same child, before the new idx (git on
    # another host may be reading one through its map: preserved/loose.py), then unlinked from objects/.
    (keep,) = kept.glob("loose-*")
    loose_links = {Path(p).name: i for i, (kind, p) in enumerate(lines)
                   if kind == "link" and f"/preserved/{keep.name}/" in p}
    loose_unlinks = {Path(p).parent.name + Path(p).name: i for i, (kind, p) in enumerate(lines)
                     if kind == "unlink" and re.search(r"/objects/[0-9a-f]{2}/", p)}
    assert counters["loose_preserved"] == loose == len(loose_links) == len(loose_unlinks)
    assert all(loose_links[h] < i for h, i in loose_unlinks.items())   # each file's second name before its unlink
    assert len([f for f in keep.glob("?/*") if f.stat().st_nlink == 1]) == loose
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert git("rev-list", "--objects", "--all", git_dir=bare) == listing
    assert not [d for d in (bare / "objects").iterdir() if len(d.name) == 2 and any(d.iterdir())]


def test_a_repack_killed_after_linking_ahead_leaves_only_links_that_expire(nfsim_hosts, tmp_path, pk):
    """SIGKILLed once the new pack is written (fault point ``repack.after_write``), the repack has linked the old
    packs' .pack files into preserved/ (link_ahead) and installed nothing: every old pack is still whole in
    objects/pack, no leftovers rule removes or "finishes" one of them, and the rerun moves them all."""
    bare, _loose = _pushed_repo(nfsim_hosts.backing, tmp_path, packs=4, loose_files=8)
    listing = git("rev-list", "--objects", "--all", git_dir=bare)
    pack_dir = bare / "objects" / "pack"
    old = sorted(p.stem for p in pack_dir.glob("pack-*.idx"))
    a = nfsim_hosts("a", ac_attr=3.0, ac_dir=3.0, latency=0.001)
    cmd = ["packyard", "repack", "--repo", str(a.mountpoint / bare.name), "--mode", "full", "--json", "--no-progress"]
    killed = subprocess.run(cmd, env=pk.cli_env(PACKYARD_FAULT="repack.after_write"), capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr

    kept = pack_dir / "preserved"
    assert sorted(p.stem for p in pack_dir.glob("pack-*.idx")) == old
    # The links the child made before the kill (all of them, unless it was slower than the plan and the write):
    # second names of the live .pack files, no idx.
    linked = sorted(p.name for p in kept.glob("pack-*"))
    assert linked and set(linked) <= {f"{s}.pack" for s in old}, linked
    assert all((kept / n).stat().st_ino == (pack_dir / n).stat().st_ino for n in linked)
    found = [item for finder in lo.FINDERS.values() for item in finder(bare)]
    assert not [item for item in found if item.path.name.startswith("pack-") and item.verdict.removes], found
    # The loose files' second names (preserved/loose.py): a young preserved_loose directory, kept until it expires.
    (keep,) = kept.glob("loose-*")
    assert [(item.kind, item.verdict) for item in found if item.path == keep] == [
        (lo.Kind.PRESERVED_LOOSE, lo.Verdict.KEEP_YOUNG)]
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)

    rerun = subprocess.run(cmd, env=pk.cli_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    counters = json.loads(rerun.stdout)["counters"]
    assert counters["preserved_moved"] == counters["preserved_ahead"] == 4
    assert counters["loose_preserved"] == counters["loose_deleted"] > 0
    assert keep.is_dir() and len(list(kept.glob("loose-*"))) == 2   # the killed run's stays until it expires
    assert sorted(p.name for p in kept.glob("pack-*")) == sorted(f"{s}{e}" for s in old for e in (".idx", ".pack"))
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert git("rev-list", "--objects", "--all", git_dir=bare) == listing


def _children() -> set[int]:
    """This process's child processes, reaped or not (a zombie is listed until it is waited for)."""
    out: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        out.update(int(pid) for pid in (task / "children").read_text().split())
    return out


def test_a_repack_that_fails_in_its_plan_leaves_no_link_child_behind(nfsim_hosts, tmp_path):
    """The child that links ahead is started before the plan; a plan that fails (a ref naming a missing object)
    ends the repack, and the child is killed and reaped with it: no zombie, no pipe left in a worker that runs
    repack after repack. Its links are the live .pack files' second names."""
    bare, _loose = _pushed_repo(nfsim_hosts.backing, tmp_path, packs=4, loose_files=8)
    (bare / "refs" / "heads" / "ghost").write_text("1" * 40 + "\n")
    a = nfsim_hosts("a", ac_attr=3.0, ac_dir=3.0, latency=0.001)
    before = _children()
    with pytest.raises(ObjectMissingError):
        repack(Repository.open(a.mountpoint / bare.name), RepackOptions(mode=RepackMode.FULL))
    assert _children() == before
    pack_dir = bare / "objects" / "pack"
    kept = pack_dir / "preserved"
    linked = sorted(p.name for p in kept.glob("pack-*")) if kept.exists() else []
    assert all(n.endswith(".pack") and (kept / n).stat().st_ino == (pack_dir / n).stat().st_ino for n in linked)
    assert len(list(pack_dir.glob("pack-*.idx"))) == 4
