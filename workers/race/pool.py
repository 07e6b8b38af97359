"""The pool race (``packyard race --pool``): a fork network's every job racing readers and clones of every member.

:func:`run_pool_race` expects Celery workers answering on the configured broker (``packyard race`` starts
embedded ones when the settings say embedded) and a directory that does not exist yet, inside a storage root.
Step by step:

1. build the network with git (:mod:`.pushes`): the source repository (history and topic branches in one old
   pack) and ``forks`` forks of it (``git clone --bare``), each with its frontend's work repository (the oracle);
2. through the queue, as an operator would: ``pool_create`` from the source, then ``pool_link`` of the source
   and of every fork (each drops what the pool holds: ``git repack -a -d -l``); git's ``rev-list --objects
   --all`` of every member is taken now (the "before");
3. start ``readers`` reader processes (:mod:`.readers`) per member and on the pool, and the clone readers
   (:mod:`.clones`: ``git clone --no-local`` of the members in turn, each clone fscked);
4. for ``duration`` seconds, each on its own timer and one of each kind at a time, all through the queue: the
   pool's full repack (delta islands, every member's reach kept), a member's repack (members in turn; full,
   loose, geometric in turn), a push to a member (members in turn; thin ``index_pack`` with ``fix_thin`` and
   thin ``unpack_objects``, whose bases are in the pool; every other push to the source is a force push of a
   topic, so that once fetched the pool's own refs no longer reach objects the forks still do), a ``pool_fetch``
   of the source into the pool, and once, at ``disconnect_at`` of the run, the last fork's ``pool_disconnect``;
5. let the in-flight jobs land, give the readers a last look, stop them;
6. git's verdicts: ``git fsck --full --strict`` of the pool and of every member; every object each member's
   work repository reaches (the before, minus what the member's own force pushes dropped, plus what its
   pushes carried) must be in the member (``cat-file --batch-check``: a missing one is LOST, a ``race_events``
   row) and its ``rev-list --objects --all`` must be exactly that set; its refs the work repository's.

**The negative control** (``unsafe_pool_prune``, ``--unsafe-pool-prune``): the pool's repacks run as a plain
repository's (``unsafe_ignore_pool_members``: the pool's refs only, expiring the rest after ``expire``). The
topics the source force-pushed and the pool fetched are then unreachable from the pool's refs while the forks
still reach them -- and linking dropped the forks' own copies -- so they are pruned, and the run must report
them lost (and git's fsck of the forks fails). The repacks keep preserving replaced packs, so the readers may
well recover from ``preserved/``: git, which knows no ``preserved/``, is what catches it.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packyard.store.progress import Progress
from packyard.workers.race.clones import Cloner
from packyard.workers.race.harness import _clone_totals, _EventSink
from packyard.workers.race.poolsummary import PoolRaceOptions, PoolRaceSummary
from packyard.workers.race.pushes import GIT_ENV, Frontend, Push, git
from packyard.workers.race.readers import LOST, ReaderConfig, reader_main
from packyard.workers.race.summary import REPACK_MODES, Say
from packyard.workers.settings import Settings

THIN_PUSHES = ("index_pack", "unpack_objects")   # both thin: their bases are in the pool while a member is linked
MAX_FORKS = 16


def run_pool_race(settings: Settings, options: PoolRaceOptions, app: Any, *, say: Say = print,
                  progress: Progress | None = None) -> PoolRaceSummary:
    """One pool race (see the module doc). Workers must be up; ``options.repo`` must not exist yet."""
    import random

    from packyard.workers.records import registry
    from packyard.workers.records.models import JobState
    from packyard.workers.records.recorder import record_run

    if not 1 <= options.forks <= MAX_FORKS:
        raise ValueError(f"a pool race has 1 to {MAX_FORKS} forks, not {options.forks}")
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 31)
    run_id = str(uuid.uuid4())
    net = Path(options.repo).expanduser().absolute()
    if net.exists() and any(net.iterdir()):
        raise FileExistsError(f"{net} exists and is not empty: packyard race --pool builds its own network there")
    net.mkdir(parents=True, exist_ok=True)
    net = net.resolve()
    summary = PoolRaceSummary(run_id=run_id, repo=str(net), mode=options.mode, seed=seed, forks=options.forks,
                              pool=str(net / "pool.git"))
    started = datetime.now(UTC)
    scratch = settings.state_dir / "race" / run_id[:8]
    incoming = settings.incoming_path / f"race-{run_id[:8]}"
    for d in (scratch, incoming):
        d.mkdir(parents=True, exist_ok=True)
    try:
        src = Frontend(net / "source.git", scratch / "source-work.git", incoming / "source", seed, commits=40,
                       topics=4)
        (incoming / "source").mkdir()
        shape = src.build()
        fes = [src] + [src.fork(net / f"fork-{i}.git", scratch / f"fork-{i}-work.git", incoming / f"fork-{i}",
                                seed + 1 + i) for i in range(options.forks)]
        pool = net / "pool.git"
        summary.members = [str(fe.served) for fe in fes]
        say(f"built {net}: the source ({shape['objects']} objects, {shape['topics']} topics) and "
            f"{options.forks} forks; seed {seed}")
        _job(app, "packyard.pool_create", {"repo": str(pool), "source": str(src.served)}, options)
        for path in [pool] + [fe.served for fe in fes]:
            registry.register(settings, path, enabled=False)   # the harness's own: out of nightly maintenance
        for fe in fes:
            _job(app, "packyard.pool_link", {"repo": str(fe.served), "pool": str(pool)}, options)
        for fe in fes:
            summary.objects_before[str(fe.served)] = len(_rev_list(fe.served))
        say(f"pool {pool} made from the source and {len(fes)} members linked (each repacked -a -d -l); racing "
            f"{options.readers} reader(s) per member and on the pool for {options.duration:.0f} s ({options.mode})")
        _race(settings, options, app, fes, pool, summary, say, progress)
        _final_check(settings, fes, pool, summary)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(incoming, ignore_errors=True)
    state = JobState.SUCCESS if summary.ok else JobState.FAILURE
    error = None if summary.ok else summary.render().splitlines()[-1].split("verdict", 1)[1].strip()
    try:
        record_run(settings, task_id=run_id, kind="packyard.race", repo=str(pool), state=state, started=started,
                   params={"pool": True, "mode": options.mode, "forks": options.forks, "seed": seed,
                           "duration": options.duration, "readers": options.readers, "expire": options.expire},
                   counters=summary.counters(), error=error, hostname=f"race@{socket.gethostname()}",
                   pid=os.getpid())
    except Exception as err:
        say(f"could not record the run's job row: {err}")
    return summary


def _job(app: Any, name: str, kwargs: dict[str, Any], options: PoolRaceOptions) -> Any:
    """One set-up job through the queue, waited for (RuntimeError naming it if it failed)."""
    res = app.send_task(name, kwargs={**kwargs, "wait": options.job_timeout})
    try:
        return res.get(timeout=options.job_timeout, propagate=True)
    except Exception as err:
        raise RuntimeError(f"{name} {kwargs.get('repo')}: {type(err).__name__}: {err}") from err


@dataclass
class _InFlight:
    slot: str
    result: Any
    what: str
    sent: float
    fe: Frontend | None = None
    push: Push | None = None


class _Network:
    """What the schedule sends, slot by slot (pool_repack, member_repack, push, fetch, disconnect)."""

    def __init__(self, options: PoolRaceOptions, app: Any, fes: list[Frontend], pool: Path,
                 summary: PoolRaceSummary) -> None:
        self.options, self.app, self.fes, self.pool, self.summary = options, app, fes, pool, summary
        self.n = dict.fromkeys(("member_repack", "push", "source_push"), 0)
        self.preserve_for = max(3600.0, options.duration * 2 + 600.0)   # longer than any reader's view is old

    def send(self, slot: str, now: float) -> _InFlight:
        o, app = self.options, self.app
        if slot == "pool_repack":
            kwargs: dict[str, Any] = {"repo": str(self.pool), "mode": "full", "expire": o.expire,
                                      "preserve_for": self.preserve_for, "wait": o.job_timeout}
            if o.unsafe_pool_prune:
                kwargs["unsafe_ignore_pool_members"] = True
            return _InFlight(slot, app.send_task("packyard.repack", kwargs=kwargs), "pool repack", now)
        if slot == "member_repack":
            k = self.n[slot]
            self.n[slot] += 1
            fe = self.fes[k % len(self.fes)]
            mode = REPACK_MODES[(k // len(self.fes)) % len(REPACK_MODES)]
            res = app.send_task("packyard.repack", kwargs={"repo": str(fe.served), "mode": mode, "expire": o.expire,
                                                           "preserve_for": self.preserve_for, "wait": o.job_timeout})
            return _InFlight(slot, res, f"repack {mode} of {fe.served.name}", now, fe=fe)
        if slot == "push":
            k = self.n[slot]
            self.n[slot] += 1
            fe = self.fes[k % len(self.fes)]
            p = None
            if fe is self.fes[0]:
                if self.n["source_push"] % 2 == 0:
                    p = fe.rewrite_topic()   # the source's force push (fetched, the pool's refs leave the topic)
                self.n["source_push"] += 1
            if p is None:
                p = fe.next_push(THIN_PUSHES[(k // len(self.fes)) % len(THIN_PUSHES)])
            if p.kind in THIN_PUSHES and str(fe.served) not in self.summary.disconnected:
                self.summary.thin_bases_in_pool += 1
            res = app.send_task(p.task, kwargs=p.kwargs)
            return _InFlight(slot, res, f"{p.kind} to {fe.served.name} ({p.ref})", now, fe=fe, push=p)
        if slot == "fetch":
            return _InFlight(slot, app.send_task("packyard.pool_fetch", kwargs={"repo": str(self.pool),
                                                                               "wait": o.job_timeout}),
                             "pool fetch", now)
        fe = self.fes[-1]
        res = app.send_task("packyard.pool_disconnect", kwargs={"repo": str(fe.served), "pool": str(self.pool),
                                                                "wait": o.job_timeout})
        return _InFlight(slot, res, f"disconnect of {fe.served.name}", now, fe=fe)

    def landed(self, job: _InFlight) -> None:
        s, res = self.summary, job.result
        if not res.successful():
            s.failures.append(f"{job.what}: {type(res.result).__name__}: {res.result}"[:400])
            return
        s.jobs[job.slot] += 1
        if job.slot == "pool_repack" and self.options.unsafe_pool_prune:
            s.pool_repacks_ignoring_members += 1
        if job.slot == "disconnect" and job.fe is not None:
            s.disconnected.append(str(job.fe.served))
        if job.push is not None and job.fe is not None:
            job.fe.landed(job.push)
            s.ingests[job.push.kind] += 1
            s.pushed_objects += len(job.push.objects)
            s.pushed_ids.extend(job.push.objects)
            key = str(job.fe.served)
            s.pushes_per_member[key] = s.pushes_per_member.get(key, 0) + 1


def _race(settings: Settings, options: PoolRaceOptions, app: Any, fes: list[Frontend], pool: Path,
          summary: PoolRaceSummary, say: Say, progress: Progress | None) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    stop = ctx.Event()
    targets = [fe.served for fe in fes] + [pool]
    configs = [ReaderConfig(repo=str(t), index=i, seed=summary.seed * 1000 + i, run_mode=options.mode,
                            rate=options.reader_rate)
               for i, t in enumerate(t for t in targets for _ in range(max(1, options.readers)))]
    readies = [ctx.Event() for _ in configs]
    procs = [ctx.Process(target=reader_main, name=f"race-pool-reader-{c.index}", daemon=True,
                         args=(c, out, readies[c.index], stop)) for c in configs]
    summary.readers = len(procs)
    sink = _EventSink(settings, out, str(pool), summary.run_id, summary, say)
    sink.start()
    members = itertools.cycle([fe.served for fe in fes])
    scratch = fes[0].work.parent
    cloners = [Cloner(lambda: next(members), scratch / f"clones-{i}", options.mode,
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
        _schedule(options, _Network(options, app, fes, pool, summary), summary, say, progress, sink, repacks)
        time.sleep(0.5)   # one more look at the refs for every reader (they re-sample every 0.2 s)
    finally:
        for c in cloners:
            c.stop()
        for c in cloners:
            c.join(180)
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
    for cfg in configs:
        t = sink.totals.get(cfg.index)
        if t is None:
            summary.reader_errors.append(f"reader {cfg.index} ({cfg.repo}) sent no totals")
            continue
        if t.get("error"):
            summary.reader_errors.append(f"reader {cfg.index} ({cfg.repo}): {t['error']}")
        for k in ("lookups", "reads", "quick", "probes"):
            setattr(summary, k, getattr(summary, k) + int(t.get(k, 0)))
        for k, v in t["events"].items():
            summary.events[k] += v
    _clone_totals(summary, cloners, repacks)


def _schedule(options: PoolRaceOptions, net: _Network, summary: PoolRaceSummary, say: Say,
              progress: Progress | None, sink: _EventSink, repacks: list[tuple[float, float]]) -> None:
    t0 = time.monotonic()
    end = t0 + options.duration
    every = {"pool_repack": options.pool_repack_every, "member_repack": options.member_repack_every,
             "push": options.push_every, "fetch": options.fetch_every}
    next_at = {"pool_repack": t0 + min(1.0, options.pool_repack_every), "member_repack": t0 + 0.5, "push": t0,
               "fetch": t0 + min(1.5, options.fetch_every)}
    disconnect_at = t0 + options.duration * options.disconnect_at if options.disconnect_at >= 0 else None
    inflight: dict[str, _InFlight] = {}
    last_report = t0
    while True:
        now = time.monotonic()
        running = now < end
        if running:
            for slot, at in next_at.items():
                if slot not in inflight and now >= at:
                    inflight[slot] = net.send(slot, now)
                    next_at[slot] = now + every[slot]
            if disconnect_at is not None and now >= disconnect_at and "disconnect" not in inflight:
                inflight["disconnect"] = net.send("disconnect", now)
                disconnect_at = None
        for slot, job in list(inflight.items()):
            if job.result.ready():
                net.landed(job)
            elif now - job.sent > options.job_timeout:
                summary.failures.append(f"{job.what}: no result after {options.job_timeout:.0f} s")
            else:
                continue
            if slot in ("pool_repack", "member_repack"):
                repacks.append((job.sent, now))
            del inflight[slot]
        if running and now - last_report >= 5.0:
            last_report = now
            say(f"{now - t0:5.0f} s: {sum(sink.lookups.values()):,} lookups; jobs " +
                " ".join(f"{k}={v}" for k, v in summary.jobs.items()) + "; misses " +
                " ".join(f"{k}={v}" for k, v in sink.seen.items()))
        if progress:
            progress("racing", int(min(now - t0, options.duration)), int(options.duration))
        if not running and not inflight:
            break
        time.sleep(0.05)
    summary.duration = time.monotonic() - t0


def _rev_list(repo: Path) -> set[str]:
    out = git("rev-list", "--objects", "--all", git_dir=repo).decode()
    return {line.split()[0] for line in out.splitlines() if line}


def _fsck(repo: Path) -> str | None:
    """git fsck --full --strict's complaint about ``repo`` (None: clean)."""
    proc = subprocess.run(["git", "--git-dir", str(repo), "fsck", "--full", "--strict", "--no-dangling",
                           "--no-progress"], capture_output=True, env={**os.environ, **GIT_ENV, "LC_ALL": "C"},
                          timeout=600)
    if proc.returncode == 0:
        return None
    words = (proc.stderr + proc.stdout).decode(errors="replace").strip().splitlines()
    return f"{repo.name}: exit {proc.returncode}: " + " | ".join(words[:4])


def _missing(repo: Path, ids: list[str]) -> list[str]:
    out = git("cat-file", "--batch-check", git_dir=repo, input="".join(f"{o}\n" for o in ids).encode()).decode()
    return [line.split()[0] for line in out.splitlines() if line.endswith(" missing")]


def _final_check(settings: Settings, fes: list[Frontend], pool: Path, summary: PoolRaceSummary) -> None:
    """git's verdicts on the pool and every member (see the module doc); a missing object is a lost read."""
    from sqlalchemy.exc import SQLAlchemyError

    from packyard.workers.records.recorder import record_race_events

    lost: list[dict[str, Any]] = []
    for fe in fes:
        key = str(fe.served)
        expected = set(fe.all_objects())
        gone = _missing(fe.served, sorted(expected))
        summary.missing_per_member[key] = len(gone)
        for oid in gone:
            detail = {"oid": oid, "op": "final", "reader": fe.served.name,
                      "error": f"git cat-file: {oid} missing in {fe.served.name}, which reaches it"}
            lost.append({"kind": LOST, "at": time.time(), "detail": detail})
            if len(summary.lost_examples) < 20:
                summary.lost_examples.append(detail)
        complaint = _fsck(fe.served)
        if complaint:
            summary.fsck_failed.append(complaint)
        try:
            after = _rev_list(fe.served)
        except Exception as err:   # (git stops at the first missing object)
            summary.rev_list_differs.append(f"{fe.served.name}: {err}")
            continue
        summary.objects_after[key] = len(after)
        if after != expected:
            extra, short = sorted(after - expected)[:3], sorted(expected - after)[:3]
            summary.rev_list_differs.append(f"{fe.served.name}: {len(after - expected)} more than its work "
                                            f"repository (e.g. {extra}), {len(expected - after)} fewer ({short})")
        served = {line.split()[1]: line.split()[0] for line in git(
            "for-each-ref", "--format=%(objectname) %(refname)", git_dir=fe.served).decode().splitlines()}
        if served != fe.expected_refs():
            summary.failures.append(f"{fe.served.name}: its refs differ from its frontend's")
    complaint = _fsck(pool)
    if complaint:
        summary.fsck_failed.append(complaint)
    summary.final_missing = len(lost)
    summary.events[LOST] += len(lost)
    try:
        summary.events_recorded += record_race_events(settings, repo=str(pool), job_id=summary.run_id, events=lost)
    except SQLAlchemyError:
        pass   # counted in the summary all the same


__all__ = ["PoolRaceOptions", "PoolRaceSummary", "run_pool_race"]
