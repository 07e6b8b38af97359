"""The race run: readers read while real workers repack and ingest; every miss on record.

:func:`run_race` expects Celery workers answering on the configured broker (``packyard race``
starts embedded ones when the settings say embedded) and a repository path that does not exist
yet, inside a storage root. Step by step:

1. build the served repository with git (:mod:`.pushes`): history and topic branches in one old pack;
2. start N reader processes (:mod:`.readers`) and wait until each has sampled the refs;
3. for ``duration`` seconds, while a clone reader (:mod:`.clones`) clones the repository with git's
   ``upload-pack`` one clone after another and fscks each clone: a repack every ``repack_every``
   seconds (modes full, loose, geometric in turn, one at a time, each waiting for the maintenance lease), a push every
   ``ingest_every`` seconds (index_pack, unpack_objects, write_objects, a real ``git push`` in turn, one at a time;
   the first push and every ``rewrite_every``-th after it a force push of a topic while topics
   remain), all through the queue with ``app.send_task`` as a frontend would, except the ``git push``, which
   runs ``packyard receive-pack`` in its own process on this host (:mod:`.gitpush`); with ``backup_every``, a
   ``packyard.backup`` every ``backup_every`` seconds too, one at a time (:mod:`.backups`);
4. let the in-flight jobs finish, give the readers one more look at the refs, stop them;
5. the final check: a fresh Repository reads every object the pushes carried (a miss is lost); with
   backups, every manifest entry restored and compared with what it recorded (:meth:`.backups.BackupRace.check`);
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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packyard.store.progress import Progress
from packyard.workers.race.backups import BackupRace
from packyard.workers.race.clones import CLONE_FAILED, Cloner, CloneTotals, overlapping
from packyard.workers.race.gitpush import GitPushRun
from packyard.workers.race.hosts import Hosts, Phase, check_routing
from packyard.workers.race.pushes import PUSH_KINDS, Frontend, Push
from packyard.workers.race.readers import ESTALE, KINDS, LOST, ReaderConfig, reader_main
from packyard.workers.race.summary import HOSTS, REPACK_MODES, NfsimCounters, RaceOptions, RaceSummary, Say
from packyard.workers.settings import Settings

DELETES_LOOSE = ("full", "loose")   # repack modes that delete the loose files they packed
LOOSE_PUSHES = ("unpack_objects", "write_objects", "rewrite")   # pushes whose objects land as loose files


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
                          hosts=options.hosts, backup_every=options.backup_every)
    backups = BackupRace(options.backup_every) if options.backup_every > 0 else None
    if backups is not None:
        _no_old_backups(settings, repo)
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
        if backups is not None:
            backups.start(settings, repo, scratch)
            backups.saw_refs(fe.expected_refs())
        _race(settings, options, app, fe, summary, say, progress, nfsim, backups)
        if nfsim is not None:
            try:
                kinds = ("estale", "kept_reads", "metadata_calls", "readdir", "readdir_hits")
                summary.nfsim = {h: {k: int(c.get(k, 0)) for k in kinds} for h, c in nfsim().items()}
            except (OSError, ValueError) as err:
                say(f"could not read the nfsim counters: {err}")
        if options.hosts > 1:
            check_routing(settings, summary, say)
        _final_check(settings, fe, summary)
        if backups is not None:   # the workers are done: restore every backup the run wrote
            try:
                backups.check(fe.served, scratch, summary, say)
            except Exception as err:   # (an unreadable manifest, a full disk): the run fails, with its job row
                summary.failures.append(f"the backup check: {type(err).__name__}: {err}"[:400])
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
                           "phases": summary.phases, "aim_threads": options.aim_threads,
                           "backup_every": options.backup_every},
                   counters=summary.counters(), error=error, hostname=f"race@{socket.gethostname()}",
                   pid=os.getpid())
    except Exception as err:
        say(f"could not record the run's job row: {err}")
    return summary


def _no_old_backups(settings: Settings, repo: Path) -> None:
    """--backup-every: the new repository's backup directory must hold no manifest yet (an old run's chain
    would be built on, and its entries restored as this run's)."""
    from packyard.workers.commands.backup import backup_dir_for

    old = backup_dir_for(repo, settings) / "manifest.json"
    if old.exists():
        raise FileExistsError(f"{old} exists: backups of an earlier repository at {repo}; remove that directory "
                              "or name a new path")


def _race(settings: Settings, options: RaceOptions, app: Any, fe: Frontend, summary: RaceSummary, say: Say,
          progress: Progress | None, nfsim: NfsimCounters | None = None, backups: BackupRace | None = None) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(options.readers)]
    two = options.hosts > 1 and options.reader_repo is not None
    # --hosts 2: every reader reads through the host that does not repack in the current phase (0: A, 1: B)
    hosts = Hosts(options, fe.served, ctx.Value("i", 1 if two else 0), [ctx.Queue() for _ in range(options.readers)],
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
        _schedule(options, app, fe, summary, say, progress, sink, repacks, hosts, settings.as_env(), backups)
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
    backup: bool = False


def _schedule(options: RaceOptions, app: Any, fe: Frontend, summary: RaceSummary, say: Say,
              progress: Progress | None, sink: _EventSink, repacks: list[tuple[float, float]],
              hosts: Hosts, push_env: dict[str, str], backups: BackupRace | None = None) -> None:
    """Queue repacks, pushes (and backups) on their timers, phase by phase, until the duration is over; wait for
    the last ones. Each repack job's (sent, seen ended) monotonic interval is appended to ``repacks``; each phase's
    record to ``summary.phases`` (--hosts 2). ``push_env``: the settings a real ``git push``'s receive-pack runs
    with (this run's, so its lease and job row are the workers')."""
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
        phase = Phase(k, repack_host, reader_host, start, time.time(), nfsim_before=hosts.counters())
        if reader_host is not None:
            say(f"phase {k}/{len(plan)}: repacks on host {repack_host}; readers, clones and pushes on host "
                f"{reader_host}")
        end = start + per
        # A phase lasts its share of --duration and, if a repack mode has not run in it by then (slow repacks on
        # a loaded machine), until each has run once: at most three times as long.
        hard_end = start + 3 * per
        next_repack, next_push = start + min(options.repack_every, 1.0), start
        next_backup = start + min(options.backup_every, 1.5)
        repack: _InFlight | None = None
        push: _InFlight | None = None
        backup: _InFlight | None = None
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
                if p.kind == "git_push":   # a real client, through this host (see .gitpush)
                    res = GitPushRun(p, fe.work, fe.served, fe.work.parent / "git-push", push_env)
                else:
                    res = app.send_task(p.task, kwargs=p.kwargs, queue=hosts.queue(reader_host))
                push_n += 1
                push = _InFlight(res, f"{p.kind} {res.id[:8]} ({p.ref})", push=p, sent=now)
                if not isinstance(res, GitPushRun):   # (routed by no queue: --hosts 2 checks queued jobs' hosts)
                    phase.push_jobs.append(res.id)
                next_push = now + options.ingest_every
            if running and backups is not None and backup is None and now >= next_backup:
                res = app.send_task("packyard.backup", queue=hosts.queue(repack_host),
                                    kwargs=backups.kwargs(fe.served, options.job_timeout))
                backup = _InFlight(res, f"backup {res.id[:8]}", sent=now, backup=True)
                next_backup = now + options.backup_every
            for slot in ("repack", "push", "backup"):
                job = {"repack": repack, "push": push, "backup": backup}[slot]
                if job is None:
                    continue
                if job.result.ready():
                    _landed(job, fe, summary, backups)
                    if job.result.successful() and not job.backup:
                        if job.mode is not None:
                            phase.repacks[job.mode] += 1
                        else:
                            phase.ingests += 1
                            if job.push is not None and job.push.kind in LOOSE_PUSHES:
                                loose.update(dict.fromkeys(job.push.objects))
                elif now - job.sent > options.job_timeout:
                    summary.failures.append(f"{job.what}: no result after {options.job_timeout:.0f} s")
                    summary.backups_failed += int(job.backup)
                    if isinstance(job.result, GitPushRun):
                        job.result.kill()
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
                elif slot == "push":
                    push = None
                else:
                    backup = None
            if now - last_report >= 5.0 and running:
                last_report = now
                say(f"{now - t0:5.0f} s: {sum(sink.lookups.values()):,} lookups, {sum(summary.repacks.values())} "
                    f"repacks, {sum(summary.ingests.values())} ingests; misses " +
                    " ".join(f"{k}={v}" for k, v in sink.seen.items()))
            if progress:
                progress("racing", int(min(now - t0, options.duration)), int(options.duration))
            if not running and repack is None and push is None and backup is None:
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


def _landed(job: _InFlight, fe: Frontend, summary: RaceSummary, backups: BackupRace | None = None) -> None:
    res = job.result
    if not res.successful():
        summary.failures.append(f"{job.what}: {type(res.result).__name__}: {res.result}"[:400])
        summary.backups_failed += int(job.backup)
        return
    if job.backup:
        assert backups is not None
        backups.landed(res.result, summary)
        return
    if job.mode is not None:
        summary.repacks[job.mode] += 1
        return
    assert job.push is not None
    fe.landed(job.push)
    if backups is not None:   # a state the served refs passed through: a backup's snapshot must be one of them
        backups.saw_refs(fe.expected_refs())
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


__all__ = ["RaceOptions", "RaceSummary", "run_race", "REPACK_MODES", "HOSTS"]
