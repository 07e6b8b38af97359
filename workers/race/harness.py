"""The race run: readers read while real workers repack and ingest; every miss on record.

:func:`run_race` expects Celery workers answering on the configured broker (``packyard race``
starts embedded ones when the settings say embedded) and a repository path that does not exist
yet, inside a storage root. Step by step:

1. build the served repository with git (:mod:`.pushes`): history and topic branches in one old pack;
2. start N reader processes (:mod:`.readers`) and wait until each has sampled the refs;
3. for ``duration`` seconds, while a clone reader (:mod:`.clones`) clones the repository with git's
   ``upload-pack`` one clone after another and fscks each clone: a repack every ``repack_every``
   seconds (modes full, loose, geometric in turn, one at a time, each waiting for the maintenance lease), a push every
   ``ingest_every`` seconds (index_pack, unpack_objects, write_objects in turn, one at a time;
   the first push and every ``rewrite_every``-th after it a force push of a topic while topics
   remain), all through the queue with ``app.send_task`` as a frontend would;
4. let the in-flight jobs finish, give the readers one more look at the refs, stop them;
5. the final check: a fresh Repository reads every object the pushes carried (a miss is lost);
6. the summary, the ``packyard.race`` job row (counters), the ``race_events`` rows (written in
   batches as the readers report them).

The repacks expire unreachable objects quickly (``expire``, default 5 s) so that the force-pushed
topics' objects are really deleted while readers still read them, and keep replaced packs in
``preserved/`` for longer than the run (readers hold views as old as the run). With
``unsafe_delete`` they unlink replaced packs at once (``preserve=False``): the readers then lose
those objects. With ``unsafe_dir_cache`` the readers trust the pack directory's stat data: a
pack installed in the second they last listed it stays invisible, and objects a repack moved
into it (loose objects, a push's objects) are lost. Neither control fails git's clones (the clone
reader's): ``upload-pack`` re-reads the pack directory when an object is not in the packs it listed,
keeps the packs it opened mapped after an unlink, and each clone's view of the refs lasts one clone.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import random
import shutil
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable

from packyard.store.progress import Progress
from packyard.workers.race.clones import CLONE_FAILED, Cloner, CloneTotals, overlapping
from packyard.workers.race.pushes import PUSH_KINDS, Frontend, Push
from packyard.workers.race.readers import KINDS, LOST, ReaderConfig, reader_main
from packyard.workers.settings import Settings

REPACK_MODES = ("full", "loose", "geometric")
Say = Callable[[str], None]


@dataclass(frozen=True)
class RaceOptions:
    repo: Path
    readers: int = 4
    duration: float = 60.0
    repack_every: float = 3.0
    ingest_every: float = 1.0
    seed: int | None = None
    unsafe_dir_cache: bool = False
    unsafe_delete: bool = False
    expire: float = 5.0              # seconds: unreachable objects older than this are deleted by full repacks
    rewrite_every: int = 4           # every Nth push is a force push of a topic (while topics remain)
    reader_rate: float = 1500.0      # lookups per second per reader, at most
    job_timeout: float = 300.0       # seconds a job may take before the run gives up on it
    reader_repo: Path | None = None  # --hosts 2: the same repository through host B's mount (None: ``repo``)
    hosts: int = 1                   # 2: workers and readers on both hosts' nfsim mounts (even readers on B)
    nfsim_trust_listing: bool = False  # NEGATIVE CONTROL (--hosts 2): host B's mount trusts cached listings
    cloners: int = 1                 # clone readers (git clone --no-local + fsck, one after another); 0: none
    host_b_queue: str | None = None  # --hosts 2: host B's worker's only queue (host A's consume the default one);
                                     # the first push and every other one after go there, and so do the repacks
                                     # (but with --nfsim-trust-listing: there every repack is host A's)
    clone_pause: float = 0.2         # seconds between one clone reader's clones

    @property
    def mode(self) -> str:
        unsafe = [n for n, on in (("unsafe-dir-cache", self.unsafe_dir_cache), ("unsafe-delete", self.unsafe_delete),
                                  ("nfsim-trust-listing", self.nfsim_trust_listing)) if on]
        return "+".join(unsafe) if unsafe else "safe"


@dataclass
class RaceSummary:
    run_id: str
    repo: str
    mode: str
    seed: int
    duration: float = 0.0
    readers: int = 0
    lookups: int = 0
    reads: int = 0
    quick: int = 0
    probes: int = 0
    repacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPACK_MODES, 0))
    ingests: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*PUSH_KINDS, "rewrite"), 0))
    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*KINDS, CLONE_FAILED), 0))
    events_recorded: int = 0
    clones: dict[str, int] = field(default_factory=lambda: CloneTotals().counters())
    clone_examples: list[dict[str, Any]] = field(default_factory=list)   # the first failed clones' details
    pushed_objects: int = 0
    final_missing: int = 0
    failures: list[str] = field(default_factory=list)
    reader_errors: list[str] = field(default_factory=list)
    lost_examples: list[dict[str, Any]] = field(default_factory=list)
    pushed_ids: list[str] = field(default_factory=list)   # every object a landed push carried (hex)

    @property
    def lost(self) -> int:
        return self.events[LOST]

    @property
    def recovered(self) -> int:
        return self.events["relisted"] + self.events["preserved"]

    @property
    def clones_failed(self) -> int:
        return self.events[CLONE_FAILED]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.clones_failed == 0 and not self.failures and not self.reader_errors

    def counters(self) -> dict[str, Any]:
        return {"lookups": self.lookups, "repacks": sum(self.repacks.values()), "ingests": sum(self.ingests.values()),
                **self.events, "reads": self.reads, "quick": self.quick, "probes": self.probes,
                **{f"repacks_{k}": v for k, v in self.repacks.items()},
                **{f"ingests_{k}": v for k, v in self.ingests.items()},
                **self.clones, "pushed_objects": self.pushed_objects, "final_missing": self.final_missing,
                "failures": len(self.failures), "readers": self.readers, "duration_s": round(self.duration, 1)}

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(lost=self.lost, recovered=self.recovered, clones_failed=self.clones_failed, ok=self.ok)
        return d

    def render(self) -> str:
        r, i = self.repacks, self.ingests
        lines = [
            f"packyard race {self.run_id[:8]}: {self.duration:.0f} s, {self.readers} readers ({self.mode}), "
            f"seed {self.seed}, {self.repo}",
            f"  lookups   {self.lookups:,} (reads {self.reads:,}, quick checks {self.quick:,}, "
            f"absent-id probes {self.probes:,})",
            f"  repacks   {sum(r.values())} (full {r['full']}, loose {r['loose']}, geometric {r['geometric']})",
            f"  ingests   {sum(i.values())} (index_pack {i['index_pack']}, unpack_objects {i['unpack_objects']}, "
            f"write_objects {i['write_objects']}, force pushes {i['rewrite']}); {self.pushed_objects} objects pushed",
            "  misses (race_events rows: `packyard races`):",
            f"    relisted      {self.events['relisted']:>8,}  recovered by re-listing objects/pack",
            f"    preserved     {self.events['preserved']:>8,}  recovered from objects/pack/preserved/",
            f"    quick_absent  {self.events['quick_absent']:>8,}  a quick check said absent for an object that existed"
            " (expected)",
            f"    lost          {self.events['lost']:>8,}  an object that existed could not be read"
            + (f" ({self.final_missing} in the final check)" if self.final_missing else ""),
            f"  clones    {self.clones['clones']:,} by git through upload-pack, each fscked "
            f"({self.clones['clones_bitmap']:,} served through a bitmap, {self.clones['clones_during_repack']:,} "
            f"during a repack): {self.clones_failed:,} failed",
        ]
        shown: set[str] = set()
        for ex in self.lost_examples:
            oid = str(ex.get("oid"))
            if oid in shown or len(shown) >= 3:
                continue
            shown.add(oid)
            lines.append(f"      e.g. {ex.get('oid')} ({ex.get('op')}, reader {ex.get('reader')}): "
                         f"{ex.get('error', '')[:140]}")
        for ex in self.clone_examples[:3]:
            lines.append(f"      clone failed ({ex.get('op')}, {ex.get('step')}): {str(ex.get('error', ''))[:200]}")
        for f in self.failures[:5]:
            lines.append(f"  job failed: {f}")
        for e in self.reader_errors[:5]:
            lines.append(f"  reader error: {e}")
        if self.ok:
            verdict = "PASS: no lost reads" + ("" if self.recovered else " (but no miss was recovered: no race?)") + \
                (f", no failed clone of {self.clones['clones']}" if self.clones["clones"] else "")
        else:
            verdict = "FAIL: " + ", ".join(filter(None, (
                f"{self.lost} lost reads" if self.lost else "",
                f"{self.clones_failed} failed clones" if self.clones_failed else "",
                f"{len(self.failures)} failed jobs" if self.failures
                else "", f"{len(self.reader_errors)} reader errors" if self.reader_errors else "")))
        lines.append(f"  verdict   {verdict}")
        return "\n".join(lines)


class _EventSink(threading.Thread):
    """Drains the readers' queue: events to ``race_events`` in batches, lookup counts, final totals."""

    def __init__(self, settings: Settings, out: Any, repo: str, run_id: str, summary: RaceSummary,
                 say: Say) -> None:
        super().__init__(name="race-events", daemon=True)
        self.settings, self.out, self.repo, self.run_id, self.summary, self.say = settings, out, repo, run_id, \
            summary, say
        self.totals: dict[int, dict[str, Any]] = {}
        self.lookups: dict[int, int] = {}
        self.seen: dict[str, int] = dict.fromkeys((*KINDS, CLONE_FAILED), 0)
        self.stopped = threading.Event()
        self.warned = False

    def run(self) -> None:
        while not (self.stopped.is_set() and self.out.empty()):
            try:
                msg = self.out.get(timeout=0.2)
            except queue.Empty:
                continue
            self.handle(msg)

    def handle(self, msg: tuple) -> None:
        if msg[0] == "totals":
            self.totals[msg[1]] = msg[2]
            return
        _tag, index, events, lookups = msg
        self.lookups[index] = lookups
        for e in events:
            self.seen[e["kind"]] += 1
            if e["kind"] == LOST and len(self.summary.lost_examples) < 20:
                self.summary.lost_examples.append(e["detail"])
            if e["kind"] == CLONE_FAILED and len(self.summary.clone_examples) < 20:
                self.summary.clone_examples.append(e["detail"])
        self.write(events)

    def write(self, events: list[dict[str, Any]]) -> None:
        from sqlalchemy.exc import SQLAlchemyError

        from packyard.workers.records.recorder import record_race_events

        try:
            self.summary.events_recorded += record_race_events(self.settings, repo=self.repo, job_id=self.run_id,
                                                               events=events)
        except SQLAlchemyError as err:   # counted in the summary all the same; said once
            if not self.warned:
                self.warned = True
                self.say(f"could not record race events ({err}); counting them only")


def run_race(settings: Settings, options: RaceOptions, app: Any, *, say: Say = print,
             progress: Progress | None = None) -> RaceSummary:
    """One race run (see the module doc). Workers must be up; the repository must not exist yet."""
    from packyard.workers.records import registry
    from packyard.workers.records.models import JobState
    from packyard.workers.records.recorder import record_run

    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 31)
    run_id = str(uuid.uuid4())
    repo = Path(options.repo).expanduser().absolute()
    summary = RaceSummary(run_id=run_id, repo=str(repo), mode=options.mode, seed=seed, readers=options.readers)
    started = datetime.now(UTC)
    scratch = settings.state_dir / "race" / run_id[:8]
    incoming = settings.incoming_path / f"race-{run_id[:8]}"
    for d in (scratch, incoming):
        d.mkdir(parents=True, exist_ok=True)
    fe = Frontend(repo, scratch / "work.git", incoming, seed)
    try:
        shape = fe.build()
        repo = repo.resolve()
        summary.repo = str(repo)
        registry.register(settings, repo, enabled=False)   # the harness's own: out of nightly maintenance
        say(f"built {repo}: {shape['objects']} objects in one pack dated a day back, {shape['topics']} topic "
            f"branches; {options.readers} readers ({options.mode}), seed {seed}")
        _race(settings, options, app, fe, summary, say, progress)
        _final_check(settings, fe, summary)
        summary.pushed_ids = list(fe.pushed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(incoming, ignore_errors=True)
    state = JobState.SUCCESS if summary.ok else JobState.FAILURE
    error = None if summary.ok else summary.render().splitlines()[-1].split("verdict", 1)[1].strip()
    try:
        record_run(settings, task_id=run_id, kind="packyard.race", repo=str(repo), state=state, started=started,
                   params={"mode": options.mode, "readers": options.readers, "duration": options.duration,
                           "repack_every": options.repack_every, "ingest_every": options.ingest_every,
                           "seed": seed, "expire": options.expire},
                   counters=summary.counters(), error=error, hostname=f"race@{socket.gethostname()}",
                   pid=os.getpid())
    except Exception as err:
        say(f"could not record the run's job row: {err}")
    return summary


def _race(settings: Settings, options: RaceOptions, app: Any, fe: Frontend, summary: RaceSummary, say: Say,
          progress: Progress | None) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(options.readers)]
    # --hosts 2: even readers read through host B's mount, odd ones through host A's (the workers' path)
    paths = [str(options.reader_repo if options.reader_repo and i % 2 == 0 else fe.served)
             for i in range(options.readers)]
    procs = [ctx.Process(target=reader_main, name=f"race-reader-{i}", daemon=True, args=(
        ReaderConfig(repo=paths[i], index=i, seed=summary.seed * 1000 + i, run_mode=options.mode,
                     unsafe_dir_cache=options.unsafe_dir_cache, rate=options.reader_rate), out, readies[i], stop))
        for i in range(options.readers)]
    sink = _EventSink(settings, out, str(fe.served), summary.run_id, summary, say)
    sink.start()
    # clone readers: git's own clones through upload-pack (host A's path), events through the sink's queue
    cloners = [Cloner(fe.served, fe.work.parent / f"clones-{i}", options.mode,
                      lambda events, i=i: out.put(("events", f"clone-{i}", events, 0)), pause=options.clone_pause)
               for i in range(max(0, options.cloners))]
    repacks: list[tuple[float, float]] = []
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 120
        for ev in readies:
            if not ev.wait(max(0.1, deadline - time.monotonic())):
                raise RuntimeError("a reader did not finish sampling the refs within 120 s")
        for c in cloners:
            c.start()
        say(f"readers ready (pids {', '.join(str(p.pid) for p in procs)}), {len(cloners)} clone reader(s); "
            f"racing for {options.duration:.0f} s")
        _schedule(options, app, fe, summary, say, progress, sink, repacks)
        time.sleep(0.5)   # one more look at the refs for every reader (they re-sample every 0.2 s)
    finally:
        for c in cloners:
            c.stop()
        for c in cloners:
            if c.is_alive():
                c.join(180)   # a clone in flight finishes (clone_once's own timeout is 120 s per git command)
            if c.is_alive():
                summary.reader_errors.append(f"{c.name} did not stop")
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
                summary.reader_errors.append(f"reader {p.name} did not stop; killed")
        sink.stopped.set()
        sink.join(30)
    for i in range(options.readers):
        t = sink.totals.get(i)
        if t is None:
            summary.reader_errors.append(f"reader {i} sent no totals (exit code {procs[i].exitcode})")
            continue
        if t.get("error"):
            summary.reader_errors.append(f"reader {i}: {t['error']}")
        for k in ("lookups", "reads", "quick", "probes"):
            setattr(summary, k, getattr(summary, k) + int(t[k]))
        for k, v in t["events"].items():
            summary.events[k] += v
    _clone_totals(summary, cloners, repacks)


def _clone_totals(summary: RaceSummary, cloners: list[Cloner], repacks: list[tuple[float, float]]) -> None:
    """The clone readers' counts into the summary (their failed clones were events through the sink)."""
    total = CloneTotals()
    for c in cloners:
        if c.error:
            summary.reader_errors.append(f"{c.name}: {c.error}")
        t = c.totals
        total.clones += t.clones
        total.failed += t.failed
        total.bitmap += t.bitmap
        total.during_repack += overlapping(t.results, repacks)
    summary.clones = total.counters()
    summary.events[CLONE_FAILED] = total.failed


@dataclass
class _InFlight:
    result: Any
    what: str
    push: Push | None = None
    mode: str | None = None
    sent: float = 0.0


def _host_queue(options: RaceOptions, n: int, repack: bool = False) -> str | None:
    """Where the n-th repack or push goes with --hosts 2: n = 0, 2, 4, ... to host B's queue, the others to the
    default queue (None), which only host A's workers consume; so both hosts repack and ingest whatever the
    load (when both took from one queue, on a loaded machine host A's worker once took every repack). The
    --nfsim-trust-listing control keeps every repack on host A: what it shows is host B's readers, on a mount
    that trusts its cached listing, missing host A's new packs (host B's own writes update its own cache)."""
    if options.host_b_queue is None or (repack and options.nfsim_trust_listing):
        return None
    return options.host_b_queue if n % 2 == 0 else None


def _schedule(options: RaceOptions, app: Any, fe: Frontend, summary: RaceSummary, say: Say,
              progress: Progress | None, sink: _EventSink, repacks: list[tuple[float, float]]) -> None:
    """Queue repacks and pushes on their timers until the duration is over; wait for the last ones.
    Each repack job's (sent, seen ended) monotonic interval is appended to ``repacks``."""
    preserve_for = max(3600.0, options.duration * 2 + 600.0)   # longer than any reader's view is old
    t0 = time.monotonic()
    end = t0 + options.duration
    # The run lasts --duration and, if a repack mode has not run by then (slow repacks on a loaded machine),
    # until each has run once: at most three times as long.
    hard_end = t0 + 3 * options.duration
    next_repack, next_push = t0 + min(options.repack_every, 1.0), t0
    repack_n = push_n = 0
    repack: _InFlight | None = None
    push: _InFlight | None = None
    last_report = t0
    while True:
        now = time.monotonic()
        running = now < end or (now < hard_end and not all(summary.repacks.values()))
        if running and repack is None and now >= next_repack:
            mode = REPACK_MODES[repack_n % len(REPACK_MODES)]
            res = app.send_task("packyard.repack", queue=_host_queue(options, repack_n, repack=True), kwargs={
                "repo": str(fe.served), "mode": mode, "expire": options.expire, "preserve_for": preserve_for,
                "preserve": not options.unsafe_delete, "wait": options.job_timeout})
            repack_n += 1
            repack = _InFlight(res, f"repack {mode} {res.id[:8]}", mode=mode, sent=now)
            next_repack = now + options.repack_every
        if running and push is None and now >= next_push:
            p = fe.rewrite_topic() if push_n % max(1, options.rewrite_every) == 0 else None
            if p is None:
                p = fe.next_push(PUSH_KINDS[push_n % len(PUSH_KINDS)])
            res = app.send_task(p.task, kwargs=p.kwargs, queue=_host_queue(options, push_n))
            push_n += 1
            push = _InFlight(res, f"{p.kind} {res.id[:8]} ({p.ref})", push=p, sent=now)
            next_push = now + options.ingest_every
        for slot in ("repack", "push"):
            job = repack if slot == "repack" else push
            if job is None:
                continue
            if job.result.ready():
                _landed(job, fe, summary)
            elif now - job.sent > options.job_timeout:
                summary.failures.append(f"{job.what}: no result after {options.job_timeout:.0f} s")
            else:
                continue
            if slot == "repack":
                repacks.append((job.sent, now))
                repack = None
            else:
                push = None
        if now - last_report >= 5.0 and running:
            last_report = now
            say(f"{now - t0:5.0f} s: {sum(sink.lookups.values()):,} lookups, {sum(summary.repacks.values())} "
                f"repacks, {sum(summary.ingests.values())} ingests; misses " +
                " ".join(f"{k}={v}" for k, v in sink.seen.items()))
        if progress:
            progress("racing", int(min(now, end) - t0), int(options.duration))
        if not running and repack is None and push is None:
            break
        if summary.failures and not running:
            break
        time.sleep(0.05)
    summary.duration = time.monotonic() - t0


def _landed(job: _InFlight, fe: Frontend, summary: RaceSummary) -> None:
    res = job.result
    if not res.successful():
        summary.failures.append(f"{job.what}: {type(res.result).__name__}: {res.result}"[:400])
        return
    if job.mode is not None:
        summary.repacks[job.mode] += 1
        return
    assert job.push is not None
    fe.landed(job.push)
    summary.ingests[job.push.kind] += 1
    summary.pushed_objects += len(job.push.objects)


def _final_check(settings: Settings, fe: Frontend, summary: RaceSummary) -> None:
    """A fresh reader (the safe rules) reads every object a push carried; the refs are where git says.
    A missing object is a lost read (recorded like the readers')."""
    from sqlalchemy.exc import SQLAlchemyError

    from packyard.store.errors import StoreError
    from packyard.store.repo import Repository
    from packyard.workers.records.recorder import record_race_events

    repo = Repository.open(fe.served)
    missing = []
    for hexid in fe.pushed:
        try:
            repo.objects.read(bytes.fromhex(hexid), verify=True)
        except (StoreError, OSError) as err:
            detail = {"oid": hexid, "op": "final", "reader": None, "error": f"{type(err).__name__}: {err}"[:400]}
            missing.append({"kind": LOST, "at": time.time(), "detail": detail})
            if len(summary.lost_examples) < 20:
                summary.lost_examples.append(detail)
    summary.final_missing = len(missing)
    summary.events[LOST] += len(missing)
    try:
        summary.events_recorded += record_race_events(settings, repo=str(fe.served), job_id=summary.run_id,
                                                      events=missing)
    except SQLAlchemyError:
        pass   # counted in the summary all the same
    served = {name: oid.hex() for name, oid in repo.refs.as_dict().items()}
    expected = fe.expected_refs()
    if served != expected:
        differ = sorted(set(served.items()) ^ set(expected.items()))[:4]
        summary.failures.append(f"the served refs differ from the frontend's: {differ}")
