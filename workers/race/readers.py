"""A race-harness reader: one process, one long-lived Repository, lookups of objects that exist.

The reader's *view* is what it knows existed: every object reachable from the refs when it sampled
them (at start, then every ``resample`` seconds: a ref that moved is walked from its new tip down to
objects already in the view). Objects stay in the view for the whole run even when a force push
makes them unreachable -- as a frontend serving a fetch of the refs it advertised keeps reading
them -- so the harness's repacks keep replaced packs in ``preserved/`` for longer than the run.

Each lookup is one of

* ``read``: the object's content through the object directory's lookup rules, hash checked;
* ``quick``: ``has(oid, quick=True)`` (no re-listing: absent for an object a repack just moved is
  the documented answer, counted as ``quick_absent``);
* ``probe``: ``has(oid)`` for an id that does not exist -- every such miss re-lists
  ``objects/pack`` (what a frontend's negotiation, or index-pack's collision check, does
  constantly; seed 000), so the reader's pack list follows the directory closely.

A ``read`` that needed a fresh listing (a pack vanished, or the object was only in a pack the
reader had not listed) is ``relisted``; one found in ``objects/pack/preserved/`` is ``preserved``;
one that met ESTALE on the way (the store's ``LooseObjects.estale`` counter moved: over NFS, a file
another host deleted after this read opened it) and still returned the object is ``estale``; one
that raised is ``lost``. Events go to the harness in batches through a queue (the harness writes
them to ``race_events``), with the reader's totals at the end.

**Two hosts** (``packyard race --hosts 2``): the reader holds one Repository per host's mount of the
repository and reads through the one the harness names (``host``, a shared value: the host that does
not repack in the current phase), each kept for the whole run (its listing as old as its last use).

**Aimed reads** (:class:`AimedReads`). A loose file another host deletes answers ESTALE only to a read
that opened it before the delete and asks the server for its data after -- and a host asks the server
only for pages it has not cached: a loose object is read from the server once per host, right after
its push, seconds before any repack deletes it. So the harness aims: when it sends the other host a
repack that deletes loose objects (full, loose), it hands every reader the ids of the loose objects
pushed since the last such repack, and the reader's ``aim_threads`` threads each take an
:class:`~packyard.store.objdir.ObjectSnapshot` (a bulk reader's: a fetch's, index-pack's) before the
repack installs its pack, wait until a new pack appears in ``objects/pack`` (the repack's install: its
deletes come next), then read those objects through the snapshot one after another until the files
are gone -- each read *cold*: the file's cached pages dropped first (``posix_fadvise(DONTNEED)``, as a
host under memory pressure would have evicted them), so that each read asks the server, as a host's
first read of the object does. A read whose file was deleted between its open and its read meets
ESTALE; the snapshot falls back to the object directory's lookup (re-listing), which finds the new
pack. Without aiming, 2-minute two-host races met no ESTALE at all. Since 2026-12-04 a repack that preserves
(the default) keeps each loose file it deletes linked in ``objects/pack/preserved/loose-<hex>/`` (git maps
loose objects: store/maintenance/preserved/loose.py), so such a read is served through that link instead --
nfsim counts it as a kept read (``kept_reads``) -- and only ``--unsafe-delete`` (or an expired object's
delete) still makes it meet ESTALE.

Nothing here imports Celery, Redis or SQLAlchemy: the reader is what a frontend would run.
"""
from __future__ import annotations

import os
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packyard.store.errors import StoreError
from packyard.store.objects import ObjectType, hash_object
from packyard.store.parse import object_links
from packyard.store.repo import Repository

#: Event kinds (race_events.kind), in the order the summary prints them.
RELISTED = "relisted"          # recovered by re-listing objects/pack (a pack vanished, or a newer pack held it)
PRESERVED = "preserved"        # recovered from objects/pack/preserved/
ESTALE = "estale"              # met ESTALE (a file deleted through another host after the open) and recovered
QUICK_ABSENT = "quick_absent"  # a quick existence check said "absent" for an object that existed (expected)
LOST = "lost"                  # an object that existed could not be read: a bug
KINDS = (RELISTED, PRESERVED, ESTALE, QUICK_ABSENT, LOST)


@dataclass(frozen=True)
class ReaderConfig:
    repo: str
    index: int
    seed: int
    other_repo: str | None = None     # --hosts 2: the same repository through host B's mount (``repo``: host A's)
    unsafe_dir_cache: bool = False
    run_mode: str = "safe"            # what the run is (safe, or which negative control): on lost events
    rate: float = 1500.0              # lookups per second, at most (the workers need the CPU too)
    weights: tuple[float, float, float] = (0.62, 0.33, 0.05)  # read, quick, probe
    resample: float = 0.2             # seconds between looks at the refs
    flush: float = 0.25               # seconds between event batches sent to the harness
    hot: int = 60                     # half the picks come from the newest objects of the view
    aim_threads: int = 0              # threads of aimed reads while the other host's repack deletes loose objects
    aim_seconds: float = 1.5          # aimed reads go on this long after a new pack appeared (then wait for another)
    aim_reads: int = 20_000           # at most this many aimed reads per thread per aim


@dataclass
class ReaderTotals:
    index: int
    lookups: int = 0
    reads: int = 0
    quick: int = 0
    probes: int = 0
    walked: int = 0
    samples: int = 0
    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    view: int = 0
    rescans: int = 0
    rescans_skipped: int = 0
    estale_store: int = 0      # ESTALE answers the store's loose reads took as "gone" (LooseObjects.estale, all repos)
    aims: int = 0              # aims taken (a repack on the other host about to delete loose objects)
    aimed_reads: int = 0       # cold reads of those objects
    aimed_gone: int = 0        # ... that found the file already gone at open (ENOENT: read from the new pack)
    aimed_estale: int = 0      # ... that met ESTALE (and were read from the new pack)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "lookups": self.lookups, "reads": self.reads, "quick": self.quick,
                "probes": self.probes, "walked": self.walked, "samples": self.samples, "events": dict(self.events),
                "view": self.view, "rescans": self.rescans, "rescans_skipped": self.rescans_skipped,
                "estale_store": self.estale_store, "aims": self.aims, "aimed_reads": self.aimed_reads,
                "aimed_gone": self.aimed_gone, "aimed_estale": self.aimed_estale, "error": self.error}


class Reader:
    """The reader's state; :func:`reader_main` drives it in its own process."""

    def __init__(self, cfg: ReaderConfig, send, host=None) -> None:  # type: ignore[no-untyped-def]
        self.cfg = cfg
        self.send = send
        self.host = host                        # shared value: 0 reads through ``repo``, 1 through ``other_repo``
        self.rng = random.Random(cfg.seed)
        self.paths = [cfg.repo] + ([cfg.other_repo] if cfg.other_repo else [])
        self.repos: list[Repository | None] = [None] * len(self.paths)
        self.repo = self._repo(self.host_index())
        self.view: list[bytes] = []
        self.known: dict[bytes, float] = {}     # oid -> when it entered the view
        self.tips: dict[str, bytes] = {}
        self.totals = ReaderTotals(cfg.index)
        self.pending: list[dict[str, Any]] = []
        self.lock = threading.Lock()            # pending and totals: the aimed-read threads report here too
        self.last_flush = time.monotonic()

    # -- hosts --------------------------------------------------------------------------------------
    def host_index(self) -> int:
        return min(int(self.host.value), len(self.paths) - 1) if self.host is not None else 0

    def _repo(self, i: int) -> Repository:
        repo = self.repos[i]
        if repo is None:
            repo = self.repos[i] = Repository.open(self.paths[i], unsafe_trust_dir_mtime=self.cfg.unsafe_dir_cache)
        return repo

    def current(self) -> Repository:
        """The Repository of the host the reader reads through now (switched by the harness per phase)."""
        self.repo = self._repo(self.host_index())
        return self.repo

    # -- events -----------------------------------------------------------------------------------
    def event(self, kind: str, oid: bytes, op: str, **detail: Any) -> None:
        if kind == LOST:
            detail["run_mode"] = self.cfg.run_mode
        entered = self.known.get(oid)
        ev = {"kind": kind, "at": time.time(), "detail": {
            "reader": self.cfg.index, "pid": os.getpid(), "oid": oid.hex(), "op": op,
            "host": "AB"[self.host_index()] if len(self.paths) > 1 else None,
            "in_view_s": round(time.time() - entered, 3) if entered is not None else None,
            "packs_listed": len(self.repo.objects.packs.prepare()), **detail}}
        with self.lock:
            self.totals.events[kind] += 1
            self.pending.append(ev)

    def flush(self, force: bool = False) -> None:
        """Send the events of the last ``flush`` seconds (and the lookup count: the harness's progress)."""
        now = time.monotonic()
        if force or now - self.last_flush >= self.cfg.flush:
            with self.lock:
                pending, self.pending = self.pending, []
            self.send(("events", self.cfg.index, pending, self.totals.lookups))
            self.last_flush = now

    # -- lookups ----------------------------------------------------------------------------------
    def read(self, oid: bytes, op: str = "read") -> tuple[ObjectType, bytes] | None:
        """Read ``oid`` (which exists); classify a miss. None if it could not be read (LOST)."""
        repo = self.current()
        c = repo.objects.counters
        before = (c.relisted_hits, c.packs_vanished, c.preserved_hits, repo.objects.loose.estale)
        self.totals.lookups += 1
        try:
            obj_type, data = repo.objects.read(oid)
            if hash_object(obj_type, data) != oid:
                raise StoreError("object read back with content that does not hash to its name", oid=oid)
        except (StoreError, OSError) as err:
            self.event(LOST, oid, op, error=f"{type(err).__name__}: {err}"[:400],
                       estale=repo.objects.loose.estale - before[3])
            return None
        if repo.objects.loose.estale > before[3]:
            self.event(ESTALE, oid, op, relisted=c.relisted_hits > before[0], preserved=c.preserved_hits > before[2])
        elif c.preserved_hits > before[2]:
            self.event(PRESERVED, oid, op)
        elif c.relisted_hits > before[0] or c.packs_vanished > before[1]:
            self.event(RELISTED, oid, op, packs_vanished=c.packs_vanished - before[1])
        return obj_type, data

    def quick(self, oid: bytes) -> None:
        self.totals.lookups += 1
        self.totals.quick += 1
        if not self.current().objects.has(oid, quick=True):
            self.event(QUICK_ABSENT, oid, "quick")

    def probe(self) -> None:
        """An existence check for an id that does not exist: re-lists objects/pack on the miss."""
        self.totals.lookups += 1
        self.totals.probes += 1
        self.current().objects.has(self.rng.randbytes(20))

    # -- the view -----------------------------------------------------------------------------------
    def sample(self) -> None:
        """Read the refs; walk every tip not seen before down to objects already in the view."""
        self.totals.samples += 1
        try:
            refs = self.current().refs.as_dict()
        except (StoreError, OSError) as err:   # a ref being replaced right now: try at the next sample
            self.totals.error = f"reading refs: {err}"[:300]
            return
        for name, tip in sorted(refs.items()):
            if self.tips.get(name) == tip:
                continue
            if self.walk(tip):
                self.tips[name] = tip

    def walk(self, tip: bytes) -> bool:
        """Add everything ``tip`` reaches that is not in the view yet; False if a read was lost."""
        stack = [tip]
        now = time.time()
        while stack:
            oid = stack.pop()
            if oid in self.known:
                continue
            got = self.read(oid, op="walk")
            self.totals.walked += 1
            if got is None:
                return False   # lost: the ref names it, so it existed (recorded); walk again later
            obj_type, data = got
            self.known[oid] = now
            self.view.append(oid)
            for link, _t in object_links(obj_type, data, oid):
                if link not in self.known:
                    stack.append(link)
        return True

    def pick(self) -> bytes:
        view = self.view
        if len(view) > self.cfg.hot and self.rng.random() < 0.5:
            return view[self.rng.randrange(len(view) - self.cfg.hot, len(view))]
        return view[self.rng.randrange(len(view))]

    def step(self) -> None:
        op = self.rng.choices(("read", "quick", "probe"), self.cfg.weights)[0]
        if op == "probe" or not self.view:
            self.probe()
        elif op == "quick":
            self.quick(self.pick())
        else:
            self.totals.reads += 1
            self.read(self.pick())

    def finish(self) -> dict[str, Any]:
        self.flush(force=True)
        t = self.totals
        t.view = len(self.view)
        t.rescans = sum(r.objects.packs.rescans for r in self.repos if r is not None)
        t.rescans_skipped = sum(r.objects.packs.rescans_skipped for r in self.repos if r is not None)
        t.estale_store += sum(r.objects.loose.estale for r in self.repos if r is not None)
        return t.as_dict()


class AimedReads:
    """One aim (see the module doc): ``threads`` threads of cold reads of ``ids`` (loose objects the other
    host's repack is about to delete) through the reader's current host, until :meth:`stop`. A watcher lists
    ``objects/pack`` every 10 ms; a pack that was not there (the repack's install: its deletes come next, within
    tens of milliseconds) opens a window of ``aim_seconds`` in which the threads read as fast as they can. (A
    push's pack opens one too, for nothing; the repack's own install opens the next.)"""

    def __init__(self, reader: Reader, aim: int, ids: list[bytes], threads: int) -> None:
        self.reader, self.aim, self.ids = reader, aim, ids
        self.path = reader.paths[reader.host_index()]
        self.stopped = threading.Event()
        self.window = threading.Event()   # set while aimed reads go on (a new pack appeared)
        self.until = 0.0
        self.running = threads
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(self._watch,), name=f"race-aim-{aim}-watch",
                                         daemon=True)]
        self.threads += [threading.Thread(target=self._run, args=(self._aim, t), name=f"race-aim-{aim}-{t}",
                                          daemon=True) for t in range(threads)]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(60)

    def _run(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        try:
            fn(*args)
        except BaseException as err:   # noqa: B036 - a harness fault, not a lost read: reported as a reader error
            with self.reader.lock:
                self.reader.totals.error = f"aimed reads: {type(err).__name__}: {err}"[:500]

    def _packs(self) -> set[str]:
        return {n for n in os.listdir(Path(self.path) / "objects" / "pack") if n.endswith(".idx")}

    def _watch(self) -> None:
        seen = self._packs()
        while not self.stopped.is_set() and self.running > 0:
            now = time.monotonic()
            names = self._packs()
            if names - seen:
                seen |= names
                self.until = now + self.reader.cfg.aim_seconds
                self.window.set()
            elif self.window.is_set() and now >= self.until:
                self.window.clear()
            self.stopped.wait(0.01)

    def _aim(self, t: int) -> None:
        try:
            self._aim_reads(t)
        finally:
            with self.lock:
                self.running -= 1

    def _aim_reads(self, t: int) -> None:
        cfg, totals = self.reader.cfg, self.reader.totals
        rng = random.Random(cfg.seed * 7919 + self.aim * 31 + t)
        repo = Repository.open(self.path)   # this thread's own: its counters are this thread's reads
        snap = repo.objects.snapshot()      # before the repack installs its pack: the loose copies are what it lists
        fds: dict[bytes, int] = {}
        for oid in self.ids:
            # Loose now, and in no pack this snapshot lists (a copy a repack packed from a push that landed during
            # it, not from its listing, stays loose too: the snapshot reads that one from the pack).
            if oid in snap.loose_ids and snap.packs.find(oid) is None:
                try:
                    fds[oid] = os.open(repo.objects.loose.path_for(oid), os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    pass
        left = list(fds)
        reads = 0
        try:
            while left and not self.stopped.is_set() and reads < cfg.aim_reads:
                if not self.window.wait(0.05) or time.monotonic() >= self.until:
                    continue
                oid = left[rng.randrange(len(left))]
                os.posix_fadvise(fds[oid], 0, 0, os.POSIX_FADV_DONTNEED)   # cold: this read asks the server
                c = repo.objects.counters
                before = (repo.objects.loose.estale, c.snapshot_fallbacks)
                reads += 1
                try:
                    obj_type, data = snap.read(oid)
                    if hash_object(obj_type, data) != oid:
                        raise StoreError("object read back with content that does not hash to its name", oid=oid)
                except (StoreError, OSError) as err:
                    self.reader.event(LOST, oid, "aimed", error=f"{type(err).__name__}: {err}"[:400], aim=self.aim,
                                      estale=repo.objects.loose.estale - before[0])
                    left.remove(oid)
                    continue
                met_estale = repo.objects.loose.estale > before[0]
                gone = c.snapshot_fallbacks > before[1]
                with self.reader.lock:
                    totals.aimed_reads += 1
                    totals.aimed_estale += met_estale
                    totals.aimed_gone += gone and not met_estale
                if met_estale:
                    self.reader.event(ESTALE, oid, "aimed", aim=self.aim, thread=t)
                if gone:
                    left.remove(oid)   # its loose file is gone: the new pack has it
        finally:
            for fd in fds.values():
                os.close(fd)
            with self.reader.lock:
                totals.estale_store += repo.objects.loose.estale


def reader_main(cfg: ReaderConfig, out, ready, stop, host=None, aims=None) -> None:  # type: ignore[no-untyped-def]
    """The reader process: sample, say ready, look objects up until ``stop`` is set, send the totals.
    ``host``: a shared value naming the host to read through (0: ``cfg.repo``, 1: ``cfg.other_repo``);
    ``aims``: a queue of ``("aim", n, [hex ids])`` / ``("stop", n)`` from the harness (aimed reads)."""
    reader = Reader(cfg, out.put, host)
    aiming: AimedReads | None = None
    try:
        reader.sample()
        reader.flush(force=True)
        ready.set()
        next_sample = time.monotonic() + cfg.resample
        batch = max(1, int(cfg.rate / 50))            # 50 batches a second, then sleep off the rest
        while not stop.is_set():
            t0 = time.monotonic()
            if aims is not None:
                aiming = _take_aims(reader, aims, aiming)
            if t0 >= next_sample:
                reader.sample()
                next_sample = t0 + cfg.resample
            for _ in range(batch):
                reader.step()
            reader.flush()
            spare = batch / cfg.rate - (time.monotonic() - t0)
            if spare > 0:
                stop.wait(spare)
        if aiming is not None:
            aiming.stop()
            aiming = None
        reader.sample()   # a last look, so pushes of the last moments are read too
    except BaseException as err:
        reader.totals.error = f"{type(err).__name__}: {err}"[:500]
        ready.set()
    finally:
        if aiming is not None:
            aiming.stop()
    out.put(("totals", cfg.index, reader.finish()))


def _take_aims(reader: Reader, aims, aiming: AimedReads | None) -> AimedReads | None:  # type: ignore[no-untyped-def]
    """The harness's aim messages since the last batch: a new aim replaces the running one; a stop ends it."""
    while True:
        try:
            msg = aims.get_nowait()
        except queue.Empty:
            return aiming
        if aiming is not None:
            aiming.stop()
            aiming = None
        if msg[0] == "aim" and reader.cfg.aim_threads > 0 and msg[2]:
            reader.totals.aims += 1
            aiming = AimedReads(reader, msg[1], [bytes.fromhex(h) for h in msg[2]], reader.cfg.aim_threads)
