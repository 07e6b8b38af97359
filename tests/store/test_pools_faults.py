"""Every pool step killed at every fault point it reaches loses nothing (issue 36's goal), proved by git.

The steps -- create, link, fetch, the pool's repack, disconnect, delete -- each run in a child process on a
fork network made with git (the source and two forks; the pool, and the other fork linked where the step needs
them). First the step runs once with a trace of the fault points it reaches (the store's own
``fault_point`` calls, counted: a point reached twice is killed at its first and at its second time), so no
point is left out, including those of the one install sequence and of the repack a link runs. Then, for each
point and each time it is reached, on a fresh copy of the network: the step is SIGKILLed there
(``PACKYARD_FAULT=<point>:kill@<n>``), and

* ``git fsck --full`` passes in the pool and in every member;
* each member's ``git rev-list --objects --all`` is what it was before (a member borrowing from the pool reads
  its objects there), and the pool's holds at least what it held before (it keeps more, never less);
* the step run again (a redelivered job) completes, after which the same holds and the step's effect is there.

A delete killed after its rename leaves ``<pool>.deleting-*``, which the leftovers rule finishes (the workers'
delete does that when it finds the pool gone).
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gitutil import fsck, git
from packyard.store import leftovers as lo
from packyard.store.maintenance.pool.layout import MEMBERS, member_key, read_members, write_members
from packyard.store.maintenance.pool.lifecycle import create_pool, disconnect_member, fetch_into_pool, link_member
from packyard.store.repo import Repository
from poolutil import commit, make_fork, make_source

#: The child: one pool step, optionally tracing the fault points it reaches (the faults module's table of armed
#: points is asked about every point reached: a dict that records the names it is asked for is a trace).
_STEP = r"""
import json, os, sys
from pathlib import Path
from packyard.store import faults

trace = []
if os.environ.get("POOL_FAULT_TRACE"):
    class _Trace(dict):
        def get(self, name, default=None):
            trace.append(name)
            return super().get(name, default)
    faults._armed = _Trace(faults._armed)
from packyard.store.maintenance.pool import lifecycle as lc
from packyard.store.maintenance.repack.options import RepackOptions
from packyard.store.repo import Repository

step, net = sys.argv[1], Path(sys.argv[2])
pool, source, fork = net / "pool.git", net / "src.git", net / "fork0.git"
if step == "create":
    lc.create_pool(pool, Repository.open(source))
elif step == "link":
    lc.link_member(Repository.open(fork), Repository.open(pool))
elif step == "fetch":
    lc.fetch_into_pool(Repository.open(pool), Repository.open(source))
elif step == "repack":
    lc.repack_pool(Repository.open(pool), RepackOptions(expire=0.0))
elif step == "disconnect":
    lc.disconnect_member(Repository.open(fork), Repository.open(pool))
elif step == "delete":
    lc.delete_pool(Repository.open(pool))
print(json.dumps(trace))
"""

#: Points each step must reach (the trace must find at least these: its own steps and its pack install).
_OWN = {
    "create": {"pool.create.after_marker", "pool.fetch.after_renames", "pool.fetch.after_copy"},
    "link": {"pool.link.after_members", "pool.link.after_alternates", "repack.after_write", "repack.after_delete"},
    "fetch": {"pool.fetch.after_flush", "pool.fetch.after_renames", "pool.fetch.after_copy"},
    "repack": {"repack.after_write", "repack.after_bitmap_rename", "repack.before_delete", "repack.after_delete"},
    "disconnect": {"pool.disconnect.after_renames", "pool.disconnect.after_copy", "pool.disconnect.after_check",
                   "pool.disconnect.after_alternates"},
    "delete": {"pool.delete.after_rename"},
}
MEMBER_NAMES = ("src.git", "fork0.git", "fork1.git")


def _network(tmp: Path, step: str) -> Path:
    """The network the step starts from, in ``tmp/template``."""
    net = tmp / "template"
    net.mkdir()
    source, work = make_source(net)
    forks = [make_fork(net, source, f"fork{i}") for i in range(2)]
    if step == "create":
        return net
    create_pool(net / "pool.git", Repository.open(source))
    pool = Repository.open(net / "pool.git")
    if step == "delete":   # a former member: linked, then disconnected
        link_member(Repository.open(forks[0]), pool)
        disconnect_member(Repository.open(forks[0]), pool)
        return net
    link_member(Repository.open(forks[1]), pool)
    if step == "link":
        return net
    link_member(Repository.open(source), pool)
    link_member(Repository.open(forks[0]), pool)
    if step in ("fetch", "repack"):
        commit(work, "late.txt", "late\n", "late")
        git("push", "-q", "origin", "main", cwd=work)
    if step == "repack":   # the source's main rewritten and fetched: the old main only the forks reach by a branch
        git("checkout", "-q", "--orphan", "rewritten", cwd=work)
        commit(work, "other.txt", "a history of its own\n", "rewritten root")
        git("push", "-q", "--force", "origin", "rewritten:main", cwd=work)
        fetch_into_pool(pool, Repository.open(source))
    return net


def _copy(template: Path, dest: Path) -> Path:
    """A copy of the network; the pool's members file names the copy's members (alternates are relative)."""
    shutil.copytree(template, dest, symlinks=True)
    if (dest / "pool.git" / MEMBERS).is_file():
        write_members(dest / "pool.git", [dest / m.name for m in read_members(template / "pool.git")])
    return dest


def _objects(repo: Path) -> set[str]:
    return set(git("rev-list", "--objects", "--all", git_dir=repo).decode().splitlines())


def _state(net: Path) -> dict[str, set[str]]:
    repos = [*MEMBER_NAMES, "pool.git"]
    return {name: _objects(net / name) for name in repos if (net / name / "objects").is_dir()}


def _run(step: str, net: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _STEP, step, str(net)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)


def _whole(net: Path, before: dict[str, set[str]], what: str) -> None:
    """git fsck --full in the pool and every member; no member's objects changed; the pool lost none."""
    for name in MEMBER_NAMES:
        fsck(net / name)
        assert _objects(net / name) == before[name], f"{what}: {name}'s rev-list --objects changed"
    pool = net / "pool.git"
    if (pool / "objects").is_dir():
        fsck(pool)
        assert before.get("pool.git", set()) <= _objects(pool), f"{what}: the pool lost objects"


def _done(step: str, net: Path) -> None:
    """The step's effect, after it ran to the end."""
    pool, source, fork = net / "pool.git", net / "src.git", net / "fork0.git"
    alternates = fork / "objects" / "info" / "alternates"
    if step == "create":
        ns = f"refs/virtual/{member_key(source)}/"
        assert git("rev-parse", f"{ns}heads/main", git_dir=pool) == git("rev-parse", "refs/heads/main", git_dir=source)
    elif step == "link":
        assert alternates.is_file() and fork.resolve() in read_members(pool)
    elif step == "fetch":
        ns = f"refs/virtual/{member_key(source)}/"
        assert git("rev-parse", f"{ns}heads/main", git_dir=pool) == git("rev-parse", "refs/heads/main", git_dir=source)
    elif step == "disconnect":
        assert not alternates.exists() and fork.resolve() not in read_members(pool)
    elif step == "delete":
        assert not pool.exists() and not list(net.glob("pool.git.deleting-*"))


def _finish_delete(net: Path) -> None:
    """A delete killed after its rename: the pool is gone from its path; the leftovers rule removes the rest
    (as workers/commands/pool.py's delete does when it finds the pool gone)."""
    found = lo.find_pool_deletions(net / "pool.git", rule=lo.RULES[lo.Kind.POOL_DELETING].aged(unjudged_after=0.0))
    assert len(found) == 1, found
    lo.remove(lo.removable(found), None)


@pytest.mark.parametrize("step", list(_OWN))
def test_every_pool_step_killed_at_every_fault_point_loses_nothing(tmp_path: Path, step: str) -> None:
    template = _network(tmp_path, step)
    before = _state(template)
    traced = _run(step, _copy(template, tmp_path / "traced"), POOL_FAULT_TRACE="1")
    assert traced.returncode == 0, traced.stderr[-3000:]
    reached = collections.Counter(json.loads(traced.stdout.splitlines()[-1]))
    assert _OWN[step] <= set(reached), f"{step} reached {sorted(reached)}"
    _done(step, tmp_path / "traced")
    kills = [(point, n) for point, count in sorted(reached.items()) for n in range(1, count + 1)]
    for point, n in kills:
        what = f"{step} killed at {point}@{n}"
        net = _copy(template, tmp_path / f"{point}-{n}")
        killed = _run(step, net, PACKYARD_FAULT=f"{point}:kill@{n}")
        assert killed.returncode == -9, f"{what}: exit {killed.returncode}\n{killed.stderr[-2000:]}"
        _whole(net, before, what)
        if step == "delete" and not (net / "pool.git").exists():
            _finish_delete(net)
        else:
            again = _run(step, net)
            assert again.returncode == 0, f"{what}, run again: {again.stderr[-2000:]}"
        _whole(net, before, f"{what}, run again")
        _done(step, net)
        shutil.rmtree(net)
    assert len(kills) >= len(_OWN[step])
