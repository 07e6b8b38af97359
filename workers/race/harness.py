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

**Two hosts** (``hosts=2``, ``packyard race --hosts 2``): the run has ``phases`` phases (two halves by
default). In phase 1 every repack goes to host A's queue (the default one, which only host A's workers
consume) while every push goes to host B's worker's own queue and the readers and clone readers read
through host B's mount; in phase 2 the reverse, and so on. A phase lasts ``duration / phases`` seconds
and, when a repack mode has not run in it yet, until each has (at most three times as long); its
in-flight jobs land before the next phase starts, so no job of one phase runs in the next. After the
run the job rows say where each job really ran (``worker_hostname``): a job on the wrong host fails the
run. Each phase's record (hosts, jobs per host from the job rows, repacks per mode, ESTALE recoveries,
nfsim's ESTALE answers per mount) is printed, and kept in the run's job row (``params["phases"]``,
``phaseN_*`` counters). While a repack that deletes loose objects (full, loose) runs, the readers aim
cold reads at the loose objects pushed since the last one (:class:`.readers.AimedReads`): the reads
that meet ESTALE and recover are ``estale`` events.

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
from typing import Any, Callable, Iterable

from packyard.store.progress import Progress
from packyard.workers.race.clones import CLONE_FAILED, Cloner, CloneTotals, overlapping
from packyard.workers.race.pushes import PUSH_KINDS, Frontend, Push
from packyard.workers.race.readers import ESTALE, KINDS, LOST, ReaderConfig, reader_main
from packyard.workers.settings import Settings

REPACK_MODES = ("full", "loose", "geometric")
DELETES_LOOSE = ("full", "loose")   # repack modes that delete the loose files they packed
LOOSE_PUSHES = ("unpack_objects", "write_objects", "rewrite")   # pushes whose objects land as loose files
HOSTS = ("A", "B")
HOST_B_NAME = "race-host-b"         # host B's worker's host name (its own UTS namespace; cli/race.py HOST_B)
Say = Callable[[str], None]
NfsimCounters = Callable[[], dict[str, dict[str, Any]]]   # each host's nfsim counters, as of now


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
    host_b_queue: str | None = None  # --hosts 2: host B's worker's only queue (host A's consume the default one)
    clone_pause: float = 0.2         # seconds between one clone reader's clones
    phases: int = 2                  # --hosts 2: phase 1 repacks on A (reads, pushes on B), phase 2 the reverse, ...
    aim_threads: int = 0             # --hosts 2: threads per reader of aimed cold reads (see .readers.AimedReads)

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
    hosts: int = 1
    phases: list[dict[str, Any]] = field(default_factory=list)   # --hosts 2: what ran where, phase by phase
    nfsim: dict[str, dict[str, int]] = field(default_factory=dict)   # host -> its mount's counters (the run's)
    estale_store: int = 0     # ESTALE answers the readers' store took as "gone" (LooseObjects.estale)
    aims: int = 0
    aimed_reads: int = 0
    aimed_estale: int = 0
    aimed_gone: int = 0

    @property
    def lost(self) -> int:
        return self.events[LOST]

    @property
    def estale(self) -> int:
        """Reads that met ESTALE and still returned the object (recovered)."""
        return self.events[ESTALE]

    @property
    def recovered(self) -> int:
        return self.events["relisted"] + self.events["preserved"] + self.events[ESTALE]

    @property
    def clones_failed(self) -> int:
        return self.events[CLONE_FAILED]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.clones_failed == 0 and not self.failures and not self.reader_errors

    def counters(self) -> dict[str, Any]:
        out = {"lookups": self.lookups, "repacks": sum(self.repacks.values()), "ingests": sum(self.ingests.values()),
               **self.events, "reads": self.reads, "quick": self.quick, "probes": self.probes,
               **{f"repacks_{k}": v for k, v in self.repacks.items()},
               **{f"ingests_{k}": v for k, v in self.ingests.items()},
               **self.clones, "pushed_objects": self.pushed_objects, "final_missing": self.final_missing,
               "failures": len(self.failures), "readers": self.readers, "duration_s": round(self.duration, 1),
               "estale_store": self.estale_store, "aims": self.aims, "aimed_reads": self.aimed_reads,
               "aimed_estale": self.aimed_estale, "aimed_gone": self.aimed_gone}
        for host, c in sorted(self.nfsim.items()):
            for k in ("estale", "kept_reads", "metadata_calls"):
                out[f"nfsim_{k}_host_{host.lower()}"] = int(c.get(k, 0))
        for ph in self.phases:
            n = ph["phase"]
            out[f"phase{n}_repacks_on_a"] = ph["repacks_on"].get("A", 0)
            out[f"phase{n}_repacks_on_b"] = ph["repacks_on"].get("B", 0)
            out[f"phase{n}_ingests_on_a"] = ph["ingests_on"].get("A", 0)
            out[f"phase{n}_ingests_on_b"] = ph["ingests_on"].get("B", 0)
            out[f"phase{n}_estale"] = ph["estale"]
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(lost=self.lost, recovered=self.recovered, estale=self.estale, clones_failed=self.clones_failed,
                 ok=self.ok)
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
            f"    estale        {self.events[ESTALE]:>8,}  met ESTALE (deleted through another host after the open),"
            " recovered",
            f"    quick_absent  {self.events['quick_absent']:>8,}  a quick check said absent for an object that existed"
            " (expected)",
            f"    lost          {self.events['lost']:>8,}  an object that existed could not be read"
            + (f" ({self.final_missing} in the final check)" if self.final_missing else ""),
            f"  clones    {self.clones['clones']:,} by git through upload-pack, each fscked "
            f"({self.clones['clones_bitmap']:,} served through a bitmap, {self.clones['clones_during_repack']:,} "
            f"during a repack): {self.clones_failed:,} failed",
        ]
        if self.hosts > 1:
            lines.extend(self._render_hosts())
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

    def _render_hosts(self) -> list[str]:
        lines = []
        for ph in self.phases:
            r = ph["repacks"]
            lines.append(
                f"  phase {ph['phase']}   {ph['started_s']:.0f}-{ph['ended_s']:.0f} s: repacks on host "
                f"{ph['repack_host']} (full {r['full']}, loose {r['loose']}, geometric {r['geometric']}; job rows: "
                f"{_per_host(ph['repacks_on'])}), pushes on host {ph['reader_host']} ({ph['ingests']}; job rows: "
                f"{_per_host(ph['ingests_on'])}), readers on host {ph['reader_host']}; ESTALE recoveries "
                f"{ph['estale']}, nfsim ESTALE answers {_per_host(ph['nfsim_estale'])}, kept reads "
                f"{_per_host(ph['nfsim_kept_reads'])}")
        lines.append(f"  ESTALE    {self.estale:,} reads met ESTALE and recovered; the readers' store took "
                     f"{self.estale_store:,} ESTALE answers as gone; {self.aims} aims, {self.aimed_reads:,} aimed cold "
                     f"reads ({self.aimed_estale:,} met ESTALE, {self.aimed_gone:,} found the file gone); nfsim "
                     f"ESTALE answers {_per_host({h: c.get('estale', 0) for h, c in self.nfsim.items()})}")
        kept = _per_host({h: c.get('kept_reads', 0) for h, c in self.nfsim.items()})
        lines.append(f"  kept      nfsim served {kept} "
                     "reads of files another link kept after their name went (preserved packs, MIDXs, loose files): "
                     "each ESTALE (SIGBUS in a map) without that link")
        return lines


def _per_host(counts: dict[str, int]) -> str:
    return ", ".join(f"{h} {counts.get(h, 0)}" for h in HOSTS)


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
        self.estale_at: list[float] = []   # when each ESTALE recovery happened (epoch s): per phase
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
            if e["kind"] == ESTALE:
                self.estale_at.append(e["at"])
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
             progress: Progress | None = None, nfsim: NfsimCounters | None = None) -> RaceSummary:
    """One race run (see the module doc). Workers must be up; the repository must not exist yet.
    ``nfsim`` (--hosts 2): each host's nfsim counters as of now (per phase, and the run's in the summary)."""
    from packyard.workers.records import registry
    from packyard.workers.records.models import JobState
    from packyard.workers.records.recorder import record_run

    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 31)
    run_id = str(uuid.uuid4())
    repo = Path(options.repo).expanduser().absolute()
    summary = RaceSummary(run_id=run_id, repo=str(repo), mode=options.mode, seed=seed, readers=options.readers,
                          hosts=options.hosts)
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
        _race(settings, options, app, fe, summary, say, progress, nfsim)
        if nfsim is not None:
            try:
                kinds = ("estale", "kept_reads", "metadata_calls", "readdir", "readdir_hits")
                summary.nfsim = {h: {k: int(c.get(k, 0)) for k in kinds} for h, c in nfsim().items()}
            except (OSError, ValueError) as err:
                say(f"could not read the nfsim counters: {err}")
        if options.hosts > 1:
            _check_routing(settings, summary, say)
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
                           "seed": seed, "expire": options.expire, "hosts": options.hosts,
                           "phases": summary.phases, "aim_threads": options.aim_threads},
                   counters=summary.counters(), error=error, hostname=f"race@{socket.gethostname()}",
                   pid=os.getpid())
    except Exception as err:
        say(f"could not record the run's job row: {err}")
    return summary


def _race(settings: Settings, options: RaceOptions, app: Any, fe: Frontend, summary: RaceSummary, say: Say,
          progress: Progress | None, nfsim: NfsimCounters | None = None) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(options.readers)]
    two = options.hosts > 1 and options.reader_repo is not None
    # --hosts 2: every reader reads through the host that does not repack in the current phase (0: A, 1: B)
    hosts = _Hosts(options, fe.served, ctx.Value("i", 1 if two else 0), [ctx.Queue() for _ in range(options.readers)],
                   nfsim)
    procs = [ctx.Process(target=reader_main, name=f"race-reader-{i}", daemon=True, args=(
        ReaderConfig(repo=str(fe.served), index=i, seed=summary.seed * 1000 + i, run_mode=options.mode,
                     other_repo=str(options.reader_repo) if two else None,
                     unsafe_dir_cache=options.unsafe_dir_cache, rate=options.reader_rate,
                     aim_threads=options.aim_threads if two else 0),
        out, readies[i], stop, hosts.reading, hosts.aims[i]))
        for i in range(options.readers)]
    sink = _EventSink(settings, out, str(fe.served), summary.run_id, summary, say)
    sink.start()
    # clone readers: git's own clones through upload-pack (through the readers' host), events through the sink's queue
    cloners = [Cloner(hosts.reader_path, fe.work.parent / f"clones-{i}", options.mode,
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
        _schedule(options, app, fe, summary, say, progress, sink, repacks, hosts)
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
        for k in ("lookups", "reads", "quick", "probes", "estale_store", "aims", "aimed_reads", "aimed_estale",
                  "aimed_gone"):
            setattr(summary, k, getattr(summary, k) + int(t.get(k, 0)))
        for k, v in t["events"].items():
            summary.events[k] += v
    _clone_totals(summary, cloners, repacks)
    for ph in summary.phases:   # each phase's ESTALE recoveries, by when they happened (wall clock: the readers')
        start, end = ph.pop("wall_start"), ph.pop("wall_end")
        ph["estale"] = sum(1 for at in sink.estale_at if start <= at < end)


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
    n: int = -1   # a repack's number (its aim's)


class _Hosts:
    """--hosts 2: which host reads (a shared value the reader processes follow), the readers' aim queues,
    the queue each host's worker consumes, and the nfsim counters at phase boundaries. With one host:
    the default queue and the one path for everything."""

    def __init__(self, options: RaceOptions, served: Path, reading: Any, aims: list[Any],
                 nfsim: NfsimCounters | None) -> None:
        self.options, self.served, self.reading, self.aims, self.nfsim = options, served, reading, aims, nfsim
        self.two = options.hosts > 1 and options.reader_repo is not None

    def plan(self) -> list[tuple[str | None, str | None]]:
        """(repack host, reading host) per phase: A repacks first, then B, and so on (None: one host)."""
        if not self.two:
            return [(None, None)]
        return [(HOSTS[k % 2], HOSTS[(k + 1) % 2]) for k in range(max(1, self.options.phases))]

    def queue(self, host: str | None) -> str | None:
        """Host A's workers consume the default queue (None), host B's worker only its own."""
        return self.options.host_b_queue if host == "B" else None

    def read_through(self, host: str | None) -> None:
        if host is not None:
            self.reading.value = HOSTS.index(host)

    def reader_path(self) -> Path:
        if self.two and self.reading.value == 1:
            return Path(self.options.reader_repo)   # type: ignore[arg-type]
        return Path(self.served)

    def aim(self, n: int, ids: Iterable[str]) -> None:
        msg = ("aim", n, list(ids))
        for q in self.aims:
            q.put(msg)

    def stop_aim(self, n: int) -> None:
        for q in self.aims:
            q.put(("stop", n))

    def counters(self) -> dict[str, dict[str, Any]]:
        if self.nfsim is None:
            return {}
        try:
            return self.nfsim()
        except (OSError, ValueError):   # a counters file being replaced: this phase's figures are left out
            return {}


@dataclass
class _Phase:
    n: int
    repack_host: str | None
    reader_host: str | None
    started: float
    wall_start: float
    repacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPACK_MODES, 0))
    ingests: int = 0
    repack_jobs: list[str] = field(default_factory=list)
    push_jobs: list[str] = field(default_factory=list)
    aims: int = 0
    nfsim_before: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self, t0: float, ended: float, nfsim_after: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {"phase": self.n, "repack_host": self.repack_host, "reader_host": self.reader_host,
                "started_s": round(self.started - t0, 1), "ended_s": round(ended - t0, 1),
                "wall_start": self.wall_start, "wall_end": float("inf"),
                "repacks": dict(self.repacks), "ingests": self.ingests, "aims": self.aims,
                "repack_jobs": list(self.repack_jobs), "push_jobs": list(self.push_jobs),
                "repacks_on": {}, "ingests_on": {}, "estale": 0,
                "nfsim_estale": {h: int(nfsim_after.get(h, {}).get("estale", 0)) -
                                 int(self.nfsim_before.get(h, {}).get("estale", 0)) for h in nfsim_after},
                "nfsim_kept_reads": {h: int(nfsim_after.get(h, {}).get("kept_reads", 0)) -
                                     int(self.nfsim_before.get(h, {}).get("kept_reads", 0)) for h in nfsim_after},
                "nfsim_calls": {h: int(nfsim_after.get(h, {}).get("metadata_calls", 0)) -
                                int(self.nfsim_before.get(h, {}).get("metadata_calls", 0)) for h in nfsim_after}}


def _schedule(options: RaceOptions, app: Any, fe: Frontend, summary: RaceSummary, say: Say,
              progress: Progress | None, sink: _EventSink, repacks: list[tuple[float, float]],
              hosts: _Hosts) -> None:
    """Queue repacks and pushes on their timers, phase by phase, until the duration is over; wait for the last
    ones. Each repack job's (sent, seen ended) monotonic interval is appended to ``repacks``; each phase's
    record to ``summary.phases`` (--hosts 2)."""
    preserve_for = max(3600.0, options.duration * 2 + 600.0)   # longer than any reader's view is old
    t0 = time.monotonic()
    plan = hosts.plan()
    per = options.duration / len(plan)
    repack_n = push_n = 0
    loose: dict[str, None] = {}   # ids pushed as loose files since the last deleting repack was sent (ordered)
    last_report = t0
    for k, (repack_host, reader_host) in enumerate(plan, 1):
        start = time.monotonic()
        hosts.read_through(reader_host)
        phase = _Phase(k, repack_host, reader_host, start, time.time(), nfsim_before=hosts.counters())
        if reader_host is not None:
            say(f"phase {k}/{len(plan)}: repacks on host {repack_host}; readers, clones and pushes on host "
                f"{reader_host}")
        end = start + per
        # A phase lasts its share of --duration and, if a repack mode has not run in it by then (slow repacks on
        # a loaded machine), until each has run once: at most three times as long.
        hard_end = start + 3 * per
        next_repack, next_push = start + min(options.repack_every, 1.0), start
        repack: _InFlight | None = None
        push: _InFlight | None = None
        aimed: list[str] = []
        while True:
            now = time.monotonic()
            running = now < end or (now < hard_end and not all(phase.repacks.values()))
            if running and repack is None and now >= next_repack:
                mode = REPACK_MODES[repack_n % len(REPACK_MODES)]
                res = app.send_task("packyard.repack", queue=hosts.queue(repack_host), kwargs={
                    "repo": str(fe.served), "mode": mode, "expire": options.expire, "preserve_for": preserve_for,
                    "preserve": not options.unsafe_delete, "wait": options.job_timeout})
                if mode in DELETES_LOOSE and loose and options.aim_threads > 0 and reader_host is not None:
                    aimed = list(loose)[-400:]
                    hosts.aim(repack_n, aimed)
                    phase.aims += 1
                repack = _InFlight(res, f"repack {mode} {res.id[:8]}", mode=mode, sent=now, n=repack_n)
                phase.repack_jobs.append(res.id)
                repack_n += 1
                next_repack = now + options.repack_every
            if running and push is None and now >= next_push:
                p = fe.rewrite_topic() if push_n % max(1, options.rewrite_every) == 0 else None
                if p is None:
                    p = fe.next_push(PUSH_KINDS[push_n % len(PUSH_KINDS)])
                res = app.send_task(p.task, kwargs=p.kwargs, queue=hosts.queue(reader_host))
                push_n += 1
                push = _InFlight(res, f"{p.kind} {res.id[:8]} ({p.ref})", push=p, sent=now)
                phase.push_jobs.append(res.id)
                next_push = now + options.ingest_every
            for slot in ("repack", "push"):
                job = repack if slot == "repack" else push
                if job is None:
                    continue
                if job.result.ready():
                    _landed(job, fe, summary)
                    if job.result.successful():
                        if job.mode is not None:
                            phase.repacks[job.mode] += 1
                        else:
                            phase.ingests += 1
                            if job.push is not None and job.push.kind in LOOSE_PUSHES:
                                loose.update(dict.fromkeys(job.push.objects))
                elif now - job.sent > options.job_timeout:
                    summary.failures.append(f"{job.what}: no result after {options.job_timeout:.0f} s")
                else:
                    continue
                if slot == "repack":
                    repacks.append((job.sent, now))
                    if aimed:   # that repack is over: the aimed objects it packed are no longer loose
                        hosts.stop_aim(job.n)
                        for oid in aimed:
                            loose.pop(oid, None)
                        aimed = []
                    repack = None
                else:
                    push = None
            if now - last_report >= 5.0 and running:
                last_report = now
                say(f"{now - t0:5.0f} s: {sum(sink.lookups.values()):,} lookups, {sum(summary.repacks.values())} "
                    f"repacks, {sum(summary.ingests.values())} ingests; misses " +
                    " ".join(f"{k}={v}" for k, v in sink.seen.items()))
            if progress:
                progress("racing", int(min(now - t0, options.duration)), int(options.duration))
            if not running and repack is None and push is None:
                break
            if summary.failures and not running and k == len(plan):
                break   # (the run is failed: its last jobs are not waited for; a phase's always land before the next)
            time.sleep(0.05)
        if aimed:
            hosts.stop_aim(-1)
        summary.phases.append(phase.record(t0, time.monotonic(), hosts.counters()))
        if len(summary.phases) > 1:
            summary.phases[-2]["wall_end"] = phase.wall_start
    if summary.phases:
        summary.phases[0]["wall_start"] = float("-inf")
    summary.duration = time.monotonic() - t0


def _check_routing(settings: Settings, summary: RaceSummary, say: Say) -> None:
    """--hosts 2: where each phase's jobs really ran, from their job rows (``worker_hostname``: host B's worker
    runs with host name ``race-host-b``); a job on the other phase's host fails the run."""
    ids = [t for ph in summary.phases for t in ph["repack_jobs"] + ph["push_jobs"]]
    where = _job_hosts(settings, ids)
    for ph in summary.phases:
        for jobs, key, should in ((ph["repack_jobs"], "repacks_on", ph["repack_host"]),
                                  (ph["push_jobs"], "ingests_on", ph["reader_host"])):
            on: dict[str, int] = {}
            for t in jobs:
                host = where.get(t) or "?"
                on[host] = on.get(host, 0) + 1
            ph[key] = on
            wrong = {h: n for h, n in on.items() if h != should}
            if wrong:
                what = "repacks" if key == "repacks_on" else "pushes"
                summary.failures.append(f"phase {ph['phase']}: {what} meant for host {should} ran on "
                                        f"{', '.join(f'{h} ({n})' for h, n in sorted(wrong.items()))} (job rows)")
    for ph in summary.phases:
        say(f"phase {ph['phase']}: repacks on {_per_host(ph['repacks_on'])}, pushes on {_per_host(ph['ingests_on'])} "
            "(job rows' worker host)")


def _job_hosts(settings: Settings, task_ids: list[str], wait: float = 30.0) -> dict[str, str]:
    """task id -> "A" or "B" by the job row's worker host name; rows not yet written are waited for (bounded)."""
    from sqlalchemy import select

    from packyard.workers.records import session_scope
    from packyard.workers.records.models import Job

    found: dict[str, str] = {}
    deadline = time.monotonic() + wait
    while True:
        left = [t for t in task_ids if t not in found]
        if not left:
            return found
        with session_scope(settings) as s:
            for i in range(0, len(left), 500):
                for task_id, hostname in s.execute(select(Job.task_id, Job.worker_hostname)
                                                   .where(Job.task_id.in_(left[i:i + 500]))):
                    if hostname:
                        found[task_id] = "B" if hostname.endswith(f"@{HOST_B_NAME}") else "A"
        if time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


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
