"""The maintenance planner as plain functions: assess a repository, plan it, queue what is due.

* :func:`assess` — statistics (store/maintenance/planning/stats.py, with the history the records keep)
  and the plan the pure strategy makes of them (store/maintenance/planning/strategy.py);
* :func:`plan_repository` — assess one repository and act on the plan: a repack or gc job is
  queued only if a fleet slot is free (workers/slots.py) and no maintenance job of that
  repository is already in flight; the plan, the statistics and the reasons go on the queued
  job's row (``params.plan``) and on the repository's row (``last_plan``), "nothing" included;
* :func:`sweep` — one round of the nightly window over the enabled registered repositories,
  oldest plan first; it stops at the first repository that needs a job when every slot is
  taken (the task queues the next round after PACKYARD_MAINTENANCE_TICK seconds) and when the
  window closes (the rest wait for the next window: they come first then).

Jobs are queued by name (``packyard.repack``, ``packyard.gc``) through ``send``, so this module
needs no task code; a queued job starts after a random delay up to PACKYARD_MAINTENANCE_JITTER.
"""
from __future__ import annotations

import enum
import random
import time
import uuid
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any, Callable

from packyard.store.errors import StoreError
from packyard.store.maintenance.planning.stats import RepackHistory, RepoStats, gather_stats
from packyard.store.maintenance.planning.strategy import Action, MaintenancePlan, plan_maintenance
from packyard.store.progress import Progress
from packyard.workers.records import registry
from packyard.workers.repos import storage_roots
from packyard.workers.settings import Settings
from packyard.workers.slots import FleetSlots

#: ``send(task name, kwargs, task id, countdown seconds)`` — queue one job (the task passes app.send_task).
Send = Callable[[str, dict[str, Any], str, float], None]

TASK_FOR_ACTION = {Action.LOOSE: registry.REPACK_KIND, Action.GEOMETRIC: registry.REPACK_KIND,
                   Action.FULL: registry.REPACK_KIND, Action.GC: registry.GC_KIND,
                   Action.POOL_FETCH: "packyard.pool_fetch"}


class Outcome(str, enum.Enum):
    """What the planner did with a repository's plan."""

    QUEUED = "queued"            # a job was queued under a fleet slot
    NOTHING = "nothing"          # the plan is "nothing": recorded, no job
    BUSY = "busy"                # a maintenance job of this repository is already in flight
    NO_SLOT = "no_slot"          # every fleet slot is taken: planned again later
    DISABLED = "disabled"        # the registry says not to maintain it
    TAKEN = "taken"              # another planner planned it in this window
    UNREADABLE = "unreadable"    # the statistics could not be gathered (the reason is recorded)


@dataclass(frozen=True)
class Planned:
    repo: str
    outcome: Outcome
    stats: RepoStats | None
    plan: MaintenancePlan | None
    job_id: str | None = None
    in_flight: int | None = None
    error: str | None = None

    def record(self, trigger: str, now: float) -> dict[str, Any]:
        """The JSON kept on the repository's row (``last_plan``) and the queued job's ``params.plan``."""
        return {
            "at": round(now, 3), "trigger": trigger, "outcome": self.outcome.value,
            **(self.plan.as_dict() if self.plan else {"action": None, "reasons": [], "params": {}, "deferred": []}),
            "stats": self.stats.as_dict() if self.stats else None,
            "job": self.job_id, "in_flight": self.in_flight, "error": self.error,
        }

    def counters(self) -> dict[str, Any]:
        s = self.stats.as_dict() if self.stats else {}
        return {"action": self.plan.action.value if self.plan else None, "outcome": self.outcome.value,
                "queued": int(self.outcome is Outcome.QUEUED), "packs": s.get("packs"),
                "loose_estimate": s.get("loose_estimate"), "in_flight": self.in_flight}


def assess(settings: Settings, repo: str | Path, now: float | None = None,
           history: RepackHistory | None = None) -> tuple[RepoStats, MaintenancePlan]:
    """The repository's statistics now and the plan the strategy makes of them (no side effect).

    ``history``: what the records say of its repacks (read from the registry when not given)."""
    now = time.time() if now is None else now
    if history is None:
        history = registry.history(registry.get(settings, repo))
    stats = gather_stats(repo, history=history, now=now, roots=storage_roots(settings))
    return stats, plan_maintenance(stats, settings.maintenance_policy, now)


def job_for(plan: MaintenancePlan, repo: str) -> tuple[str, dict[str, Any]]:
    """The task a plan queues and its kwargs (``packyard.repack`` mode/factor/expire, ``packyard.gc``).

    A scheduled job never waits for the repository's maintenance lease: if another maintenance
    job holds it when it starts, it is recorded as skipped (``on_busy="skip"``).
    """
    if plan.action is Action.POOL_FETCH:   # (pool jobs take their leases in the pool order; a busy one retries)
        return TASK_FOR_ACTION[plan.action], {"repo": repo, **dict(plan.params)}
    return TASK_FOR_ACTION[plan.action], {"repo": repo, **dict(plan.params), "on_busy": "skip"}


def plan_repository(repo: str | Path, *, settings: Settings, send: Send, slots: FleetSlots, trigger: str,
                    now: float | None = None, window_start: float | None = None,
                    rng: random.Random | None = None, progress: Progress | None = None) -> Planned:
    """Assess one repository and act on its plan (see the module docstring).

    ``window_start`` (the sweep): claim the repository for that window before recording or
    queueing anything, and leave it unclaimed when no slot is free.
    """
    now = time.time() if now is None else now
    path = registry.normalize(repo)
    row = registry.get(settings, path)
    if row is not None and not row["enabled"] and trigger != "manual":
        return Planned(path, Outcome.DISABLED, None, None)
    try:
        stats, plan = assess(settings, path, now, history=registry.history(row))
    except (StoreError, OSError) as err:
        planned = Planned(path, Outcome.UNREADABLE, None, None, error=f"{type(err).__name__}: {err}")
        _finish(settings, planned, trigger, now, window_start, row)
        if window_start is None:  # one repository's plan job fails with the reason; a sweep goes on
            raise
        return planned
    if progress:
        progress("plan", 1, 1)
    if not plan.needs_job:
        return _finish(settings, Planned(path, Outcome.NOTHING, stats, plan), trigger, now, window_start, row)
    if registry.maintenance_in_flight(settings, path):
        return _finish(settings, Planned(path, Outcome.BUSY, stats, plan), trigger, now, window_start, row)
    job_id = str(uuid.uuid4())
    in_flight = slots.try_acquire(job_id, now)
    if in_flight is None:
        planned = Planned(path, Outcome.NO_SLOT, stats, plan)
        if window_start is None:  # an ingest-triggered plan says so; the window plans it again
            registry.record_plan(settings, path, planned.record(trigger, now), now, planned=False)
        return planned
    if window_start is not None and not registry.claim_for_planning(settings, _row_id(row), window_start, now):
        slots.release(job_id)
        return Planned(path, Outcome.TAKEN, stats, plan)
    planned = Planned(path, Outcome.QUEUED, stats, plan, job_id=job_id, in_flight=in_flight)
    name, kwargs = job_for(plan, path)
    countdown = (rng or random).uniform(0.0, max(0.0, settings.maintenance_jitter))
    try:
        send(name, kwargs, job_id, countdown)
    except Exception:
        slots.release(job_id)
        raise
    record = planned.record(trigger, now)
    registry.annotate_job(settings, job_id, plan=record)
    registry.record_plan(settings, path, record, now)
    return planned


def _finish(settings: Settings, planned: Planned, trigger: str, now: float, window_start: float | None,
            row: dict[str, Any] | None) -> Planned:
    """Record a plan that queues nothing (claimed first when a window plans it)."""
    if window_start is not None and row is not None:
        if not registry.claim_for_planning(settings, row["id"], window_start, now):
            return Planned(planned.repo, Outcome.TAKEN, planned.stats, planned.plan)
    registry.record_plan(settings, planned.repo, planned.record(trigger, now), now)
    return planned


def window_bounds(settings: Settings, now: float) -> tuple[float, float]:
    """The window ``now`` falls in: (its cron occurrence, + PACKYARD_MAINTENANCE_WINDOW).

    A planner started inside a window (beat restarted at 02:30 for a 02:00 window) keeps that
    window's end; one started outside any window (by hand) opens one now.
    """
    from datetime import datetime

    schedule = maintenance_crontab(settings)
    schedule.nowfun = lambda: datetime.fromtimestamp(now, UTC)
    length = settings.maintenance_window

    def next_after(t: float) -> float:
        return now + schedule.remaining_estimate(datetime.fromtimestamp(t, UTC)).total_seconds()

    occurrence = next_after(now - length)
    if not now - length < occurrence <= now:
        return now, now + length
    for _ in range(10_000):  # a cron firing more often than the window: its latest occurrence
        later = next_after(occurrence)
        if later > now or later <= occurrence:
            break
        occurrence = later
    return occurrence, occurrence + length


def maintenance_crontab(settings: Settings):  # type: ignore[no-untyped-def]
    """PACKYARD_MAINTENANCE_CRON as a Celery crontab (minute hour day-of-month month day-of-week, UTC)."""
    from celery.schedules import crontab

    minute, hour, dom, month, dow = settings.maintenance_cron.split()
    return crontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow)


def prune_finished_slots(settings: Settings, slots: FleetSlots) -> int:
    """Release slots whose jobs' rows are finished (a release that was lost); how many."""
    from sqlalchemy import select

    from packyard.workers.records import Job, session_scope

    holders = slots.holders()
    if not holders:
        return 0
    with session_scope(settings) as s:
        finished = [tid for tid, state in s.execute(select(Job.task_id, Job.state).where(Job.task_id.in_(holders)))
                    if state.finished]
    return sum(slots.release(tid) for tid in finished)


def sweep(*, settings: Settings, send: Send, slots: FleetSlots, window_start: float, window_end: float,
          now: Callable[[], float] = time.time, rng: random.Random | None = None,
          progress: Progress | None = None) -> dict[str, Any]:
    """One round of the window over the enabled repositories not yet planned in it.

    A page (PACKYARD_PLANNER_PAGE repositories) at a time, each in a few transactions whatever its size: the
    page read by keyset, one in-flight query for the page, the repositories assessed and their slots taken
    in order (what :func:`plan_repository` decides for each, from the page's rows), one claim of the page,
    the jobs queued, and the plans (and the queued jobs' ``params.plan``) written in one transaction.
    """
    for path in settings.nightly_repos:  # PACKYARD_NIGHTLY_REPOS: registered (as they were), enabled if new
        if registry.get(settings, path) is None:
            registry.register(settings, path)
    pruned = prune_finished_slots(settings, slots)
    due = registry.count_due(settings, window_start)
    page_size = settings.planner_page
    counts = {o.value: 0 for o in Outcome}
    waiting = not_reached = 0
    repos: list[dict[str, Any]] = []
    done = 0
    after: registry.DueCursor | None = None
    for _ in range(due // page_size + 2):  # bound: the pages the due count makes, and one found meanwhile
        page = registry.due_page(settings, window_start, after, page_size)
        if not page:
            break
        after = registry.cursor_after(page[-1])
        busy = registry.in_flight_of(settings, [int(r["id"]) for r in page])
        decided: list[tuple[dict[str, Any], Planned, float]] = []
        stop = False
        for row in page:
            t = now()
            if t >= window_end:
                not_reached = max(0, due - done - len(decided))
                stop = True
                break
            planned = _decide(row, settings=settings, slots=slots, busy=busy, now=t)
            if planned.outcome is Outcome.NO_SLOT:
                waiting = max(0, due - done - len(decided))
                stop = True
                break
            decided.append((row, planned, t))
        for planned in _act_on_page(decided, settings=settings, send=send, slots=slots,
                                    window_start=window_start, rng=rng):
            done += 1
            counts[planned.outcome.value] += 1
            repos.append({"repo": planned.repo, "outcome": planned.outcome.value,
                          "action": planned.plan.action.value if planned.plan else None, "job": planned.job_id})
            if progress:
                progress("planning", done, due)
        if stop:
            break
    return {
        "window_start": window_start, "window_end": window_end, "repos": repos,
        "counters": {"due": due, **{k: v for k, v in counts.items() if k != Outcome.NO_SLOT.value},
                     "waiting": waiting, "not_reached": not_reached, "slots_pruned": pruned,
                     "in_flight": slots.in_flight()},
    }


def _decide(row: dict[str, Any], *, settings: Settings, slots: FleetSlots, busy: set[int], now: float) -> Planned:
    """What :func:`plan_repository` decides for a due repository, from its page row and the page's in-flight
    set, before anything is claimed or written: a slot is taken for a job (QUEUED), or none is free (NO_SLOT)."""
    path = registry.normalize(row["path"])
    try:
        stats, plan = assess(settings, path, now, history=registry.history(row))
    except (StoreError, OSError) as err:
        return Planned(path, Outcome.UNREADABLE, None, None, error=f"{type(err).__name__}: {err}")
    if not plan.needs_job:
        return Planned(path, Outcome.NOTHING, stats, plan)
    if int(row["id"]) in busy:
        return Planned(path, Outcome.BUSY, stats, plan)
    job_id = str(uuid.uuid4())
    in_flight = slots.try_acquire(job_id, now)
    if in_flight is None:
        return Planned(path, Outcome.NO_SLOT, stats, plan)
    return Planned(path, Outcome.QUEUED, stats, plan, job_id=job_id, in_flight=in_flight)


def _act_on_page(decided: list[tuple[dict[str, Any], Planned, float]], *, settings: Settings, send: Send,
                 slots: FleetSlots, window_start: float, rng: random.Random | None) -> list[Planned]:
    """Claim the page's decided repositories (one statement), queue the claimed ones' jobs, record every claimed
    plan (one transaction); a repository another planner claimed first is TAKEN (its slot given back).

    A send that fails gives its slot back and raises, as :func:`plan_repository` does, after the plans
    before it are recorded and the claims after it given back (those repositories are planned again)."""
    if not decided:
        return []
    claim_at = decided[0][2]
    claimed = registry.claim_page(settings, [int(row["id"]) for row, _p, _t in decided], window_start, claim_at)
    out: list[Planned] = []
    plans: list[tuple[int, dict[str, Any], float]] = []
    annotations: list[tuple[str, dict[str, Any]]] = []
    unsent = 0   # decided[unsent:] is not yet claimed-and-acted-on
    try:
        for k, (row, planned, t) in enumerate(decided):
            unsent = k
            rid = int(row["id"])
            if rid not in claimed:
                if planned.job_id is not None:
                    slots.release(planned.job_id)
                out.append(Planned(planned.repo, Outcome.TAKEN, planned.stats, planned.plan))
                continue
            record = planned.record("window", t)
            if planned.outcome is Outcome.QUEUED:
                assert planned.plan is not None and planned.job_id is not None
                name, kwargs = job_for(planned.plan, planned.repo)
                countdown = (rng or random).uniform(0.0, max(0.0, settings.maintenance_jitter))
                try:
                    send(name, kwargs, planned.job_id, countdown)
                except Exception:
                    slots.release(planned.job_id)
                    raise
                annotations.append((planned.job_id, {"plan": record}))
            plans.append((rid, record, t))
            out.append(planned)
        unsent = len(decided)
    finally:
        registry.record_plans(settings, plans, annotations)
        # A send raised at decided[unsent]: that one stays claimed (as plan_repository leaves it); the ones
        # after it were claimed for nothing: their slots and claims are given back.
        rest = decided[unsent + 1:]
        for _row, planned, _t in rest:
            if planned.job_id is not None:
                slots.release(planned.job_id)
        registry.unclaim(settings, [(int(row["id"]), row["last_planned_at"]) for row, _p, _t in rest
                                    if int(row["id"]) in claimed], claim_at)
    return out


def _row_id(row: dict[str, Any] | None) -> int:
    """A window plans registered repositories only: their registry row exists."""
    assert row is not None, "a repository planned in a window is registered"
    return int(row["id"])
