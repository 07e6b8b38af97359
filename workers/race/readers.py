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
one that raised is ``lost``. Events go to the harness in batches through a queue (the harness
writes them to ``race_events``), with the reader's totals at the end.

Nothing here imports Celery, Redis or SQLAlchemy: the reader is what a frontend would run.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from packyard.store.errors import StoreError
from packyard.store.objects import ObjectType, hash_object
from packyard.store.parse import object_links
from packyard.store.repo import Repository

#: Event kinds (race_events.kind), in the order the summary prints them.
RELISTED = "relisted"          # recovered by re-listing objects/pack (a pack vanished, or a newer pack held it)
PRESERVED = "preserved"        # recovered from objects/pack/preserved/
QUICK_ABSENT = "quick_absent"  # a quick existence check said "absent" for an object that existed (expected)
LOST = "lost"                  # an object that existed could not be read: a bug
KINDS = (RELISTED, PRESERVED, QUICK_ABSENT, LOST)


@dataclass(frozen=True)
class ReaderConfig:
    repo: str
    index: int
    seed: int
    unsafe_dir_cache: bool = False
    run_mode: str = "safe"            # what the run is (safe, or which negative control): on lost events
    rate: float = 1500.0              # lookups per second, at most (the workers need the CPU too)
    weights: tuple[float, float, float] = (0.62, 0.33, 0.05)  # read, quick, probe
    resample: float = 0.2             # seconds between looks at the refs
    flush: float = 0.25               # seconds between event batches sent to the harness
    hot: int = 60                     # half the picks come from the newest objects of the view


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
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "lookups": self.lookups, "reads": self.reads, "quick": self.quick,
                "probes": self.probes, "walked": self.walked, "samples": self.samples, "events": dict(self.events),
                "view": self.view, "rescans": self.rescans, "rescans_skipped": self.rescans_skipped,
                "error": self.error}


class Reader:
    """The reader's state; :func:`reader_main` drives it in its own process."""

    def __init__(self, cfg: ReaderConfig, send) -> None:  # type: ignore[no-untyped-def]
        self.cfg = cfg
        self.send = send
        self.rng = random.Random(cfg.seed)
        self.repo = Repository.open(cfg.repo, unsafe_trust_dir_mtime=cfg.unsafe_dir_cache)
        self.view: list[bytes] = []
        self.known: dict[bytes, float] = {}     # oid -> when it entered the view
        self.tips: dict[str, bytes] = {}
        self.totals = ReaderTotals(cfg.index)
        self.pending: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()

    # -- events -----------------------------------------------------------------------------------
    def event(self, kind: str, oid: bytes, op: str, **detail: Any) -> None:
        self.totals.events[kind] += 1
        if kind == LOST:
            detail["run_mode"] = self.cfg.run_mode
        entered = self.known.get(oid)
        self.pending.append({"kind": kind, "at": time.time(), "detail": {
            "reader": self.cfg.index, "pid": os.getpid(), "oid": oid.hex(), "op": op,
            "in_view_s": round(time.time() - entered, 3) if entered is not None else None,
            "packs_listed": len(self.repo.objects.packs.prepare()), **detail}})

    def flush(self, force: bool = False) -> None:
        """Send the events of the last ``flush`` seconds (and the lookup count: the harness's progress)."""
        now = time.monotonic()
        if force or now - self.last_flush >= self.cfg.flush:
            self.send(("events", self.cfg.index, self.pending, self.totals.lookups))
            self.pending = []
            self.last_flush = now

    # -- lookups ----------------------------------------------------------------------------------
    def read(self, oid: bytes, op: str = "read") -> tuple[ObjectType, bytes] | None:
        """Read ``oid`` (which exists); classify a miss. None if it could not be read (LOST)."""
        c = self.repo.objects.counters
        before = (c.relisted_hits, c.packs_vanished, c.preserved_hits)
        self.totals.lookups += 1
        try:
            obj_type, data = self.repo.objects.read(oid)
            if hash_object(obj_type, data) != oid:
                raise StoreError("object read back with content that does not hash to its name", oid=oid)
        except (StoreError, OSError) as err:
            self.event(LOST, oid, op, error=f"{type(err).__name__}: {err}"[:400])
            return None
        if c.preserved_hits > before[2]:
            self.event(PRESERVED, oid, op)
        elif c.relisted_hits > before[0] or c.packs_vanished > before[1]:
            self.event(RELISTED, oid, op, packs_vanished=c.packs_vanished - before[1])
        return obj_type, data

    def quick(self, oid: bytes) -> None:
        self.totals.lookups += 1
        self.totals.quick += 1
        if not self.repo.objects.has(oid, quick=True):
            self.event(QUICK_ABSENT, oid, "quick")

    def probe(self) -> None:
        """An existence check for an id that does not exist: re-lists objects/pack on the miss."""
        self.totals.lookups += 1
        self.totals.probes += 1
        self.repo.objects.has(self.rng.randbytes(20))

    # -- the view -----------------------------------------------------------------------------------
    def sample(self) -> None:
        """Read the refs; walk every tip not seen before down to objects already in the view."""
        self.totals.samples += 1
        try:
            refs = self.repo.refs.as_dict()
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
        t.rescans = self.repo.objects.packs.rescans
        t.rescans_skipped = self.repo.objects.packs.rescans_skipped
        return t.as_dict()


def reader_main(cfg: ReaderConfig, out, ready, stop) -> None:  # type: ignore[no-untyped-def]
    """The reader process: sample, say ready, look objects up until ``stop`` is set, send the totals."""
    reader = Reader(cfg, out.put)
    try:
        reader.sample()
        reader.flush(force=True)
        ready.set()
        next_sample = time.monotonic() + cfg.resample
        batch = max(1, int(cfg.rate / 50))            # 50 batches a second, then sleep off the rest
        while not stop.is_set():
            t0 = time.monotonic()
            if t0 >= next_sample:
                reader.sample()
                next_sample = t0 + cfg.resample
            for _ in range(batch):
                reader.step()
            reader.flush()
            spare = batch / cfg.rate - (time.monotonic() - t0)
            if spare > 0:
                stop.wait(spare)
        reader.sample()   # a last look, so pushes of the last moments are read too
    except BaseException as err:
        reader.totals.error = f"{type(err).__name__}: {err}"[:500]
        ready.set()
    out.put(("totals", cfg.index, reader.finish()))
