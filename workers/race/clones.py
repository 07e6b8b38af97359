"""A race-harness clone reader: git's own clones of the served repository while it is repacked.

A hosting frontend serves clones and fetches with git's ``upload-pack``, which reads refs, packs,
bitmaps (pack and MIDX) and the multi-pack-index packyard's repacks write. The packyard readers
(:mod:`.readers`) use packyard's lookup rules; this one uses git's. One thread in the harness runs,
one after another until told to stop,

    git clone --no-local --bare --progress <served> <scratch>/clone-N.git

(``--no-local`` makes the clone go through ``upload-pack`` and ``pack-objects --revs`` with the
bitmap, as a remote client's would; the clone's ``index-pack`` checks every object's hash and
clone checks connectivity), then ``git fsck --full --strict`` of the clone. A clone is **failed**
when either git command fails: the served repository handed out an incomplete or broken pack, or
none (a ref advertised whose objects upload-pack could not find). Every failed clone becomes a
``clone_failed`` race event (the detail: git's exit code and the tail of its stderr); the counts --
clones, failed, served through a bitmap (``pack-reused`` > 0 in upload-pack's progress), and
clones that overlapped a repack job -- go into the run's job row.

:func:`clone_once` is the check itself (a test runs it on a repository with an object removed, and
it fails), :class:`Cloner` the loop.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from packyard.workers.race.pushes import GIT_ENV

CLONE_FAILED = "clone_failed"   # race_events.kind of a failed clone
_PACK_REUSED = re.compile(rb"pack-reused (\d+)")
_TOTAL = re.compile(rb"Total (\d+)")


@dataclass
class CloneResult:
    ok: bool
    started: float                 # time.monotonic() at the start (overlap with repack jobs)
    ended: float
    objects: int = 0               # upload-pack's "Total N"
    pack_reused: int = 0           # objects sent verbatim because the bitmap found them
    step: str = ""                 # which git command failed: clone or fsck
    error: str = ""

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, capture_output=True, timeout=timeout,
                          env={**os.environ, **GIT_ENV, "LC_ALL": "C"})


def clone_once(served: Path, dest: Path, *, timeout: float = 120.0) -> CloneResult:
    """Clone ``served`` through upload-pack into ``dest`` (which must not exist), fsck the clone, remove it."""
    t0 = time.monotonic()
    try:
        proc = _run(["git", "clone", "--no-local", "--bare", "--progress", "--no-hardlinks", str(served), str(dest)],
                    timeout)
        if proc.returncode != 0:
            return CloneResult(False, t0, time.monotonic(), step="clone",
                               error=f"exit {proc.returncode}: {_tail(proc.stderr)}")
        reused = _PACK_REUSED.findall(proc.stderr)
        total = _TOTAL.findall(proc.stderr)
        fsck = _run(["git", "--git-dir", str(dest), "fsck", "--full", "--strict", "--no-dangling", "--no-progress"],
                    timeout)
        if fsck.returncode != 0:
            return CloneResult(False, t0, time.monotonic(), step="fsck",
                               error=f"exit {fsck.returncode}: {_tail(fsck.stderr + fsck.stdout)}")
        return CloneResult(True, t0, time.monotonic(), objects=int(total[-1]) if total else 0,
                           pack_reused=int(reused[-1]) if reused else 0)
    except subprocess.TimeoutExpired as err:
        return CloneResult(False, t0, time.monotonic(), step="timeout", error=f"no answer in {err.timeout:.0f} s")
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _tail(stderr: bytes) -> str:
    lines = [ln for ln in stderr.decode(errors="replace").replace("\r", "\n").splitlines()
             if ln.strip() and not ln.startswith(("remote: Counting", "remote: Compressing", "remote: Enumerating",
                                                  "Receiving objects", "Resolving deltas", "Checking"))]
    wanted = [ln for ln in lines if "fatal" in ln or "error" in ln] or lines   # git's own words first
    return " | ".join(dict.fromkeys(ln.strip().strip("\x00") for ln in wanted[:6]))[:600]


@dataclass
class CloneTotals:
    clones: int = 0
    failed: int = 0
    bitmap: int = 0                # clones served with pack-reused > 0 (the bitmap found their objects)
    during_repack: int = 0         # clones that overlapped a repack job (counted by the harness)
    seconds: float = 0.0
    results: list[CloneResult] = field(default_factory=list)

    def counters(self) -> dict[str, Any]:
        return {"clones": self.clones, "clones_failed": self.failed, "clones_bitmap": self.bitmap,
                "clones_during_repack": self.during_repack}


class Cloner(threading.Thread):
    """Clones ``served`` one after another (``pause`` seconds between) until :meth:`stop`; at most
    ``limit`` clones. Failed clones are handed to ``on_failed`` as race events as they happen."""

    def __init__(self, served: Path | Callable[[], Path], scratch: Path, run_mode: str, on_failed: Any, *,
                 pause: float = 0.2, limit: int = 100_000) -> None:
        super().__init__(name="race-cloner", daemon=True)
        # ``served``: the repository, or what names it at each clone (--hosts 2: the reading host's mount of it)
        self.served_of: Callable[[], Path] = served if callable(served) else (lambda: Path(served))
        self.scratch, self.run_mode, self.on_failed = Path(scratch), run_mode, on_failed
        self.pause, self.limit = pause, limit
        self.totals = CloneTotals()
        self._stop_event = threading.Event()
        self.error: str | None = None

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True)
        try:
            for n in range(self.limit):
                if self._stop_event.is_set():
                    break
                res = clone_once(self.served_of(), self.scratch / f"clone-{n}.git")
                t = self.totals
                t.clones += 1
                t.seconds += res.seconds
                t.bitmap += res.pack_reused > 0
                t.results.append(res)
                if not res.ok:
                    t.failed += 1
                    self.on_failed([{"kind": CLONE_FAILED, "at": time.time(), "detail": {
                        "reader": "clone", "op": f"clone {n}", "step": res.step, "run_mode": self.run_mode,
                        "seconds": round(res.seconds, 3), "error": res.error}}])
                self._stop_event.wait(self.pause)
        except Exception as err:   # a harness fault, not a failed clone: reported as a reader error
            self.error = f"{type(err).__name__}: {err}"[:400]


def overlapping(results: list[CloneResult], intervals: list[tuple[float, float]]) -> int:
    """How many clones ran (in part) while one of ``intervals`` (repack jobs: sent, landed) was open."""
    return sum(1 for r in results if any(r.started < end and start < r.ended for start, end in intervals))
