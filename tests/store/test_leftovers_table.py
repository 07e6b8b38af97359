"""The leftovers table (store/leftovers/table.py), row by row, with real files: each kind young and old, its owner
alive, dead (gone, or its pid reused), on another host, or absent (git's own), and git's own leftovers made
for real by killing git (a ``tmp_pack_*`` of ``git index-pack``, the ``*.lock`` files of ``git update-ref``)."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import pytest

from gitutil import ROOT, git
from packyard.store import leftovers as lo
from packyard.store import lockfile
from packyard.store.leftovers import Kind, Verdict
from packyard.store.owner import current_owner, process_start_ticks, this_host_tag

V = Verdict
MIN, HOUR, DAY = 60.0, 3600.0, 86400.0


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


DEAD = _dead_pid()
ME = os.getpid()
OTHER_TAG = "0000" if this_host_tag() != "0000" else "1111"


def live():
    return current_owner()


def dead():
    return replace(current_owner(), pid=DEAD, start=None)


def reused():
    """Our own pid, but a record made by an earlier process that had it: a reused pid."""
    return replace(current_owner(), start=(process_start_ticks(ME) or 0) + 1)


def elsewhere():
    return replace(current_owner(), host="elsewhere.example")


def other_pidns():
    """This host's name, another PID namespace (a container, host B under ``unshare --pid``): our pid of the
    same number is somebody else."""
    return replace(current_owner(), pidns=(current_owner().pidns or 0) + 1)


def _write(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _claim(path: Path, owner) -> Path:
    return _write(path, owner.encode() if owner is not None else b"")


# -- builders: each makes one leftover in a bare repository and returns the path the finder reports --------

def loose_tmp(pid: int | None, tag: str | None = None) -> Callable[[Path], Path]:
    def build(g: Path) -> Path:
        name = f"tmp_obj_{pid}_{tag or this_host_tag()}-0123abcd_1" if pid is not None else "tmp_obj_Xy12Zq"
        return _write(g / "objects" / "ab" / name)
    return build


def marker(owner_fn, tag: str | None = None) -> Callable[[Path], Path]:
    def build(g: Path) -> Path:
        owner = owner_fn()
        batch = f"{tag or this_host_tag()}-0badc0de"
        _write(g / "objects" / "cd" / f"tmp_obj_{owner.pid}_{batch}_1")   # its batch's tmp object (young)
        return _claim(g / "packyard" / "batches" / f"{owner.pid}_{batch}", owner)
    return build


def pack_tmp(pid: int | None, tag: str | None = None, record=None) -> Callable[[Path], Path]:
    def build(g: Path) -> Path:
        d = g / "objects" / "pack"
        if pid is None:
            return _write(d / "tmp_pack_Ab12Cd")
        t = f"{pid}_{tag or this_host_tag()}-0000abcd"
        data = _write(d / f"tmp_pack_{t}")
        if record is None:
            return data
        _write(d / f"tmp_idx_{t}")
        return _claim(d / f"tmp_owner_{t}", record())
    return build


def orphan_pack(g: Path) -> Path:
    return _write(g / "objects" / "pack" / f"pack-{'1' * 40}.pack")


def half_preserved(g: Path) -> Path:
    _write(g / "objects" / "pack" / "preserved" / f"pack-{'2' * 40}.idx")
    _write(g / "objects" / "pack" / f"pack-{'2' * 40}.rev")
    return _write(g / "objects" / "pack" / f"pack-{'2' * 40}.pack")


def orphan_idx(g: Path) -> Path:
    return _write(g / "objects" / "pack" / f"pack-{'3' * 40}.idx")


def midx_lock(owner_fn) -> Callable[[Path], Path]:
    return lambda g: _claim(g / "objects" / "pack" / "multi-pack-index.lock", owner_fn() if owner_fn else None)


def quarantine(owner_fn) -> Callable[[Path], Path]:
    def build(g: Path) -> Path:
        q = g / "objects" / "incoming-abc123"
        _write(q / "tmp_pack_x")
        if owner_fn is not None:
            _claim(q / lo.QUARANTINE_OWNER, owner_fn())
        return q
    return build


def keep(owner_fn) -> Callable[[Path], Path]:
    return lambda g: _write(g / "objects" / "pack" / f"pack-{'4' * 40}.keep", owner_fn().encode() + b"receive-pack\n")


def serving_lock(owner_fn) -> Callable[[Path], Path]:
    return lambda g: _claim(g / "objects" / "info" / "commit-graphs" / "commit-graph-chain.lock",
                            owner_fn() if owner_fn else None)


def graph_tmp(pid: int | None) -> Callable[[Path], Path]:
    name = f"tmp_graph_{pid}_{this_host_tag()}-0000abcd" if pid is not None else "tmp_graph_Qz81Lm"
    return lambda g: _write(g / "objects" / "info" / "commit-graphs" / name)


def packed_refs_tmp(g: Path) -> Path:
    return _write(g / "packyard" / "tmp" / "packed-refs-1234-abcdef")


def packed_refs_new(g: Path) -> Path:
    return _write(g / "packed-refs.new")


def ref_claim(owner_fn) -> Callable[[Path], Path]:
    return lambda g: _claim(g / "refs" / "heads" / "topic.lock", owner_fn() if owner_fn else None)


def ref_tmp(g: Path) -> Path:
    return _write(g / "packyard" / "tmp" / "ref-1234-abcdef012345")


def durable_tmp(g: Path) -> Path:
    return _write(g / "objects" / "info" / ".tmp-1234-alternates")


def pool_deleting(g: Path) -> Path:
    """A pool's directory renamed aside by a delete killed before its rmtree (beside the repository)."""
    d = g.parent / f"{g.name}.deleting-0123abcd"
    _write(d / "objects" / "pack" / "pack-x.pack")
    return d


def backup_tmp(pid: int | None, record=None) -> Callable[[Path], Path]:
    """A bundle writer's temp files in a backup directory (here the directory given to the finder), or the
    manifest's temp file (``pid`` None)."""
    def build(g: Path) -> Path:
        if pid is None:
            return _write(g / ".tmp-1234-manifest.json")
        t = f"{pid}_{this_host_tag()}-0000abcd"
        data = _write(g / f"tmp_pack_{t}")
        return _claim(g / f"tmp_owner_{t}", record()) if record is not None else data
    return build


def restore_tmp(infix: str) -> Callable[[Path], Path]:
    """A restore's repository being built (or a replaced one being removed) beside the target ``g``."""
    def build(g: Path) -> Path:
        d = g.parent / f".{g.name}{infix}0123abcd"
        _write(d / "objects" / "pack" / "tmp_pack_x")
        return d
    return build


def preserved_loose(g: Path) -> Path:
    d = g / "objects" / "pack" / "preserved" / "loose-0123456789abcdef"
    _write(d / "a" / ("a" * 40))
    return d


def preserved_mapped(name: str) -> Callable[[Path], Path]:
    return lambda g: _write(g / "objects" / "pack" / "preserved" / f"{name}-0123456789abcdef.old")


@dataclass(frozen=True)
class Case:
    id: str
    kind: Kind
    build: Callable[[Path], Path]
    age: float
    expected: Verdict


CASES = [
    # loose batch temp objects: a lone file judged by the pid in its name
    Case("loose live pid, 15 days", Kind.LOOSE_TMP, loose_tmp(ME), 15 * DAY, V.KEEP_LIVE_OWNER),
    Case("loose dead pid, 5 s", Kind.LOOSE_TMP, loose_tmp(DEAD), 5, V.KEEP_YOUNG),
    Case("loose dead pid, 11 min", Kind.LOOSE_TMP, loose_tmp(DEAD), 11 * MIN, V.REMOVE_DEAD_OWNER),
    Case("loose impossible pid, 11 min", Kind.LOOSE_TMP, loose_tmp(4194304999), 11 * MIN, V.REMOVE_DEAD_OWNER),
    Case("loose other host, 1 day", Kind.LOOSE_TMP, loose_tmp(1, OTHER_TAG), DAY, V.KEEP_YOUNG),
    Case("loose other host, 15 days", Kind.LOOSE_TMP, loose_tmp(1, OTHER_TAG), 15 * DAY, V.REMOVE_EXPIRED),
    Case("loose git's, 1 day", Kind.LOOSE_TMP, loose_tmp(None), DAY, V.KEEP_YOUNG),
    Case("loose git's, 15 days", Kind.LOOSE_TMP, loose_tmp(None), 15 * DAY, V.REMOVE_EXPIRED),
    # batch markers (with an owner record)
    Case("marker live, 15 days", Kind.BATCH_MARKER, marker(live), 15 * DAY, V.KEEP_LIVE_OWNER),
    Case("marker dead, 5 s", Kind.BATCH_MARKER, marker(dead), 5, V.KEEP_YOUNG),
    Case("marker dead, 11 min", Kind.BATCH_MARKER, marker(dead), 11 * MIN, V.REMOVE_DEAD_OWNER),
    Case("marker pid reused, 11 min", Kind.BATCH_MARKER, marker(reused), 11 * MIN, V.REMOVE_DEAD_OWNER),
    Case("marker other host, 11 min", Kind.BATCH_MARKER, marker(elsewhere, OTHER_TAG), 11 * MIN, V.KEEP_YOUNG),
    Case("marker other pid namespace, 11 min", Kind.BATCH_MARKER, marker(other_pidns, OTHER_TAG), 11 * MIN,
         V.KEEP_YOUNG),
    Case("marker other host, 15 days", Kind.BATCH_MARKER, marker(elsewhere, OTHER_TAG), 15 * DAY,
         V.REMOVE_EXPIRED),
    # pack writers' temp files
    Case("pack tmp live, 15 days", Kind.PACK_TMP, pack_tmp(ME, record=live), 15 * DAY, V.KEEP_LIVE_OWNER),
    Case("pack tmp dead, 5 s", Kind.PACK_TMP, pack_tmp(DEAD), 5, V.REMOVE_DEAD_OWNER),
    Case("pack tmp pid reused, 5 s", Kind.PACK_TMP, pack_tmp(ME, record=reused), 5, V.REMOVE_DEAD_OWNER),
    Case("pack tmp other host, 1 day", Kind.PACK_TMP, pack_tmp(1, OTHER_TAG), DAY, V.KEEP_YOUNG),
    Case("pack tmp other host, 15 days", Kind.PACK_TMP, pack_tmp(1, OTHER_TAG), 15 * DAY, V.REMOVE_EXPIRED),
    Case("pack tmp git's name, 1 day", Kind.PACK_TMP, pack_tmp(None), DAY, V.KEEP_YOUNG),
    Case("pack tmp git's name, 15 days", Kind.PACK_TMP, pack_tmp(None), 15 * DAY, V.REMOVE_EXPIRED),
    # installed names half done
    Case("orphan pack, 1 min", Kind.ORPHAN_PACK, orphan_pack, MIN, V.KEEP_YOUNG),
    Case("orphan pack, 11 min", Kind.ORPHAN_PACK, orphan_pack, 11 * MIN, V.REMOVE_EXPIRED),
    Case("half preserved, 1 s", Kind.HALF_PRESERVED, half_preserved, 1, V.FINISH_MOVE),
    Case("orphan idx, 1 min", Kind.ORPHAN_IDX, orphan_idx, MIN, V.KEEP_YOUNG),
    Case("orphan idx, 11 min", Kind.ORPHAN_IDX, orphan_idx, 11 * MIN, V.REMOVE_EXPIRED),
    # the multi-pack-index's claim
    Case("midx lock live, 1 day", Kind.MIDX_LOCK, midx_lock(live), DAY, V.KEEP_LIVE_OWNER),
    Case("midx lock dead, 1 s", Kind.MIDX_LOCK, midx_lock(dead), 1, V.REMOVE_DEAD_OWNER),
    Case("midx lock other host, 1 min", Kind.MIDX_LOCK, midx_lock(elsewhere), MIN, V.KEEP_YOUNG),
    Case("midx lock git's, 1 min", Kind.MIDX_LOCK, midx_lock(None), MIN, V.KEEP_YOUNG),
    Case("midx lock git's, 11 min", Kind.MIDX_LOCK, midx_lock(None), 11 * MIN, V.REMOVE_EXPIRED),
    # index-pack quarantines
    Case("quarantine live, 2 h", Kind.QUARANTINE, quarantine(live), 2 * HOUR, V.KEEP_LIVE_OWNER),
    Case("quarantine dead, 50 min", Kind.QUARANTINE, quarantine(dead), 50 * MIN, V.KEEP_YOUNG),
    Case("quarantine dead, 61 min", Kind.QUARANTINE, quarantine(dead), 61 * MIN, V.REMOVE_DEAD_OWNER),
    Case("quarantine other host, 50 min", Kind.QUARANTINE, quarantine(elsewhere), 50 * MIN, V.KEEP_YOUNG),
    Case("quarantine other host, 61 min", Kind.QUARANTINE, quarantine(elsewhere), 61 * MIN, V.REMOVE_EXPIRED),
    Case("quarantine other pid namespace, 2 h", Kind.QUARANTINE, quarantine(other_pidns), 2 * HOUR,
         V.REMOVE_EXPIRED),
    Case("quarantine no record, 61 min", Kind.QUARANTINE, quarantine(None), 61 * MIN, V.REMOVE_EXPIRED),
    # an ingest's .keep
    Case("keep live, 15 days", Kind.KEEP, keep(live), 15 * DAY, V.KEEP_LIVE_OWNER),
    Case("keep dead, 1 s", Kind.KEEP, keep(dead), 1, V.REMOVE_DEAD_OWNER),
    Case("keep other host, 15 days", Kind.KEEP, keep(elsewhere), 15 * DAY, V.KEEP_NOT_OURS),
    # the commit-graph's and pack-refs' leftovers
    Case("chain lock live, 1 day", Kind.SERVING_LOCK, serving_lock(live), DAY, V.KEEP_LIVE_OWNER),
    Case("chain lock dead, 1 s", Kind.SERVING_LOCK, serving_lock(dead), 1, V.REMOVE_DEAD_OWNER),
    Case("chain lock git's, 11 min", Kind.SERVING_LOCK, serving_lock(None), 11 * MIN, V.REMOVE_EXPIRED),
    Case("graph tmp live, 15 days", Kind.GRAPH_TMP, graph_tmp(ME), 15 * DAY, V.KEEP_LIVE_OWNER),
    Case("graph tmp dead, 1 s", Kind.GRAPH_TMP, graph_tmp(DEAD), 1, V.REMOVE_DEAD_OWNER),
    Case("graph tmp git's, 1 day", Kind.GRAPH_TMP, graph_tmp(None), DAY, V.KEEP_YOUNG),
    Case("graph tmp git's, 15 days", Kind.GRAPH_TMP, graph_tmp(None), 15 * DAY, V.REMOVE_EXPIRED),
    Case("packed-refs tmp, 1 min", Kind.PACKED_REFS_TMP, packed_refs_tmp, MIN, V.KEEP_YOUNG),
    Case("packed-refs tmp, 11 min", Kind.PACKED_REFS_TMP, packed_refs_tmp, 11 * MIN, V.REMOVE_EXPIRED),
    Case("packed-refs.new, 1 min", Kind.PACKED_REFS_NEW, packed_refs_new, MIN, V.KEEP_YOUNG),
    Case("packed-refs.new, 11 min", Kind.PACKED_REFS_NEW, packed_refs_new, 11 * MIN, V.REMOVE_EXPIRED),
    # ref claims and ref temp files
    Case("ref lock live, 1 day", Kind.REF_CLAIM, ref_claim(live), DAY, V.KEEP_LIVE_OWNER),
    Case("ref lock dead, 1 s", Kind.REF_CLAIM, ref_claim(dead), 1, V.REMOVE_DEAD_OWNER),
    Case("ref lock pid reused, 1 s", Kind.REF_CLAIM, ref_claim(reused), 1, V.REMOVE_DEAD_OWNER),
    Case("ref lock other host, 1 min", Kind.REF_CLAIM, ref_claim(elsewhere), MIN, V.KEEP_YOUNG),
    Case("ref lock other pid namespace, 1 min", Kind.REF_CLAIM, ref_claim(other_pidns), MIN, V.KEEP_YOUNG),
    Case("ref lock other host, 11 min", Kind.REF_CLAIM, ref_claim(elsewhere), 11 * MIN, V.REMOVE_EXPIRED),
    Case("ref tmp, 1 min", Kind.REF_TMP, ref_tmp, MIN, V.KEEP_YOUNG),
    Case("ref tmp, 11 min", Kind.REF_TMP, ref_tmp, 11 * MIN, V.REMOVE_EXPIRED),
    # old inodes of the files git maps, kept for readers on other hosts for the preserve time
    Case("preserved midx, 59 min", Kind.PRESERVED_MAPPED, preserved_mapped("multi-pack-index"), 59 * MIN,
         V.KEEP_YOUNG),
    Case("preserved midx, 61 min", Kind.PRESERVED_MAPPED, preserved_mapped("multi-pack-index"), 61 * MIN,
         V.REMOVE_EXPIRED),
    Case("preserved commit-graph, 61 min", Kind.PRESERVED_MAPPED, preserved_mapped("commit-graph"), 61 * MIN,
         V.REMOVE_EXPIRED),
    Case("preserved packed-refs, 59 min", Kind.PRESERVED_MAPPED, preserved_mapped("packed-refs"), 59 * MIN,
         V.KEEP_YOUNG),
    Case("preserved loose files, 59 min", Kind.PRESERVED_LOOSE, preserved_loose, 59 * MIN, V.KEEP_YOUNG),
    Case("preserved loose files, 61 min", Kind.PRESERVED_LOOSE, preserved_loose, 61 * MIN, V.REMOVE_EXPIRED),
    # single files written durably (temp, rename), and a pool's delete killed after its rename
    Case("durable tmp, 1 min", Kind.DURABLE_TMP, durable_tmp, MIN, V.KEEP_YOUNG),
    Case("durable tmp, 11 min", Kind.DURABLE_TMP, durable_tmp, 11 * MIN, V.REMOVE_EXPIRED),
    Case("pool deleting, 1 min", Kind.POOL_DELETING, pool_deleting, MIN, V.KEEP_YOUNG),
    Case("pool deleting, 11 min", Kind.POOL_DELETING, pool_deleting, 11 * MIN, V.REMOVE_EXPIRED),
    Case("backup tmp live, 15 days", Kind.BACKUP_TMP, backup_tmp(ME, record=live), 15 * DAY, V.KEEP_LIVE_OWNER),
    Case("backup tmp dead, 5 s", Kind.BACKUP_TMP, backup_tmp(DEAD, record=dead), 5, V.REMOVE_DEAD_OWNER),
    Case("backup manifest tmp, 1 day", Kind.BACKUP_TMP, backup_tmp(None), DAY, V.KEEP_YOUNG),
    Case("backup manifest tmp, 15 days", Kind.BACKUP_TMP, backup_tmp(None), 15 * DAY, V.REMOVE_EXPIRED),
    Case("restoring, 5 min", Kind.RESTORE_TMP, restore_tmp(".restoring-"), 5 * MIN, V.KEEP_YOUNG),
    Case("restoring, 2 h", Kind.RESTORE_TMP, restore_tmp(".restoring-"), 2 * HOUR, V.REMOVE_EXPIRED),
    Case("replaced, 2 h", Kind.RESTORE_TMP, restore_tmp(".replaced-"), 2 * HOUR, V.REMOVE_EXPIRED),
]


def _age(path: Path, seconds: float, now: float) -> None:
    for p in [*(path.rglob("*") if path.is_dir() else []), path]:
        os.utime(p, (now - seconds, now - seconds), follow_symlinks=False)


@pytest.fixture
def bare(tmp_path) -> Path:
    g = tmp_path / "r.git"
    git("init", "-q", "--bare", str(g))
    return g


def test_every_kind_has_a_rule_a_finder_a_reason_and_cases():
    assert set(lo.RULES) == set(Kind) == set(lo.FINDERS)
    assert all(len(r.reason) > 40 and r.where for r in lo.RULES.values())
    covered = {c.kind for c in CASES}
    assert covered == set(Kind), set(Kind) - covered
    for kind in Kind:   # each kind is seen both kept and removed
        assert {c.expected.removes for c in CASES if c.kind is kind} == {True, False} or kind is Kind.HALF_PRESERVED


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_table_row_by_row(bare, case):
    path = case.build(bare)
    now = time.time()
    group = {Kind.PACK_TMP: bare / "objects" / "pack", Kind.BACKUP_TMP: bare}.get(case.kind)
    for p in [path] + (list(group.glob("tmp_*")) if group is not None else []):
        _age(p, case.age, now)   # a writer's temp files grouped by tag: all of one age
    found = lo.FINDERS[case.kind](bare, now=now)
    (item,) = [f for f in found if f.path == path]
    assert item.kind is case.kind and item.verdict is case.expected, (item.verdict, item.alive)
    assert abs(item.age - case.age) < 2
    companions = list(item.files)
    removed = lo.remove(lo.removable(found))
    if case.expected.removes:
        assert removed == [item] and not path.exists() and not any(f.exists() for f in companions)
        if case.kind is Kind.HALF_PRESERVED:   # finished, not undone: every file now in preserved/
            assert sorted(p.name for p in (bare / "objects" / "pack" / "preserved").iterdir()) == [
                f"pack-{'2' * 40}.{ext}" for ext in ("idx", "pack", "rev")]
        if case.kind is Kind.BATCH_MARKER:    # the dead batch's young tmp object went with its marker
            assert companions and not list((bare / "objects" / "cd").iterdir())
    else:
        assert removed == [] and path.exists()
    assert lo.removable(lo.FINDERS[case.kind](bare, now=now)) == []


def test_a_claim_renewed_after_it_was_judged_is_not_removed(bare):
    """remove() takes a claim only while it carries the judged owner record (a fresh claim made meanwhile stays)."""
    lock = ref_claim(dead)(bare)
    (item,) = lo.find_ref_claims(bare)
    assert item.verdict is V.REMOVE_DEAD_OWNER
    lock.unlink()
    claim = lockfile.acquire(lock, "topic")
    try:
        assert lo.remove([item]) == [] and lock.exists()
    finally:
        lockfile.release(claim)


def test_a_lost_lease_stops_removal_before_the_next_item(bare):
    class Lost(Exception):
        pass

    for n in range(3):
        _age(_write(bare / "objects" / "pack" / f"tmp_pack_git{n}"), 15 * DAY, time.time())
    found = lo.removable(lo.find_pack_temps(bare))
    calls = []

    def fence():
        calls.append(1)
        if len(calls) == 2:
            raise Lost

    with pytest.raises(Lost):
        lo.remove(found, fence)
    assert len(list((bare / "objects" / "pack").glob("tmp_pack_git*"))) == 2


def test_a_nudge_left_in_preserved_by_a_killed_repack_is_a_pack_temp(bare):
    """A repack's move to preserved/ changes the directory once more a tick later (install.advance_listing,
    a temp file made and removed); killed in between, the temp file is found there and judged as a pack
    writer's: by its name's pid."""
    from packyard.store.owner import this_host_tag

    preserved = bare / "objects" / "pack" / "preserved"
    preserved.mkdir(parents=True, exist_ok=True)
    nudge = _write(preserved / f"tmp_pack_{DEAD}_{this_host_tag()}-0a1b2c3d")
    (item,) = lo.find_pack_temps(bare)
    assert item.path == nudge and item.verdict is V.REMOVE_DEAD_OWNER
    assert lo.remove([item]) == [item] and not nudge.exists()


# -- git's own leftovers, made by killing git ----------------------------------------------------------------

@pytest.fixture
def source(tmp_path) -> Path:
    w = tmp_path / "w"
    git("init", "-q", str(w))
    (w / "f").write_text("one\n")
    git("-C", str(w), "add", "f")
    git("-C", str(w), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "one")
    git("-C", str(w), "branch", "b")
    return w


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_killed_git_index_pack_leaves_a_tmp_pack_judged_by_prune_expiry(bare, source):
    pack = subprocess.run(["git", "-C", str(source), "pack-objects", "--stdout", "--all"], input=b"",
                          capture_output=True, check=True).stdout
    proc = subprocess.Popen(["git", f"--git-dir={bare}", "index-pack", "--stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)
    assert proc.stdin is not None
    proc.stdin.write(pack[: len(pack) // 2])
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while not glob.glob(str(bare / "objects" / "pack" / "tmp_pack_*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    _kill(proc)
    (tmp,) = (bare / "objects" / "pack").glob("tmp_pack_*")
    (item,) = lo.find_pack_temps(bare)
    assert (item.path, item.owner, item.alive, item.verdict) == (tmp, None, None, V.KEEP_YOUNG)
    assert lo.removable(lo.find_pack_temps(bare, now=time.time() + 13 * DAY)) == []
    (old,) = lo.removable(lo.find_pack_temps(bare, now=time.time() + 15 * DAY))
    assert old.verdict is V.REMOVE_EXPIRED and lo.remove([old]) == [old] and not tmp.exists()
    git("fsck", "--full", "--strict", git_dir=bare)


def test_a_killed_git_update_ref_leaves_locks_and_packed_refs_new_judged_by_the_claim_age(tmp_path, source):
    g = source / ".git"
    git("pack-refs", "--all", git_dir=g)
    proc = subprocess.Popen(["git", f"--git-dir={g}", "update-ref", "--stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("start\ndelete refs/heads/b\nprepare\n")
    proc.stdin.flush()
    assert [proc.stdout.readline().strip() for _ in range(2)] == ["start: ok", "prepare: ok"]
    _kill(proc)
    left = [g / "refs" / "heads" / "b.lock", g / "packed-refs.lock", g / "packed-refs.new"]
    assert all(p.exists() for p in left)
    # What git itself says of them: the next packed-refs write fails until they go.
    assert b"packed-refs" in subprocess.run(["git", f"--git-dir={g}", "pack-refs", "--all"],
                                            capture_output=True).stderr
    now = time.time()
    for find, kind in ((lo.find_ref_claims, Kind.REF_CLAIM), (lo.find_serving_locks, Kind.SERVING_LOCK),
                       (lo.find_packed_refs_new, Kind.PACKED_REFS_NEW)):
        (item,) = find(g, now=now)
        assert item.kind is kind and item.owner is None and item.verdict is V.KEEP_YOUNG
        (old,) = find(g, now=now + 11 * MIN)
        assert old.verdict is V.REMOVE_EXPIRED and lo.remove([old]) == [old]
    assert not any(p.exists() for p in left)
    git("update-ref", "-d", "refs/heads/b", git_dir=g)   # git takes its locks again: nothing of them is left
    git("fsck", "--full", "--strict", git_dir=g)


def test_the_operating_docs_list_every_row():
    doc = (ROOT / "docs" / "operating.md").read_text()
    assert all(f"| `{kind.value}` | `{lo.RULES[kind].where}` |" in doc for kind in Kind)
