"""The repository registry: which repositories the nightly run maintains, and what the records know about them.

Every repository a job touches has a ``repositories`` row (``recorder.repository_id``), enabled
by default; ``packyard repos`` adds, removes, enables and disables them. As job rows are
finished (:func:`landed`, written by ``recorder.record_finished``, the one place jobs finish):

* a successful ingest (index_pack, unpack_objects, import_tree, write_objects) adds one to
  ``ingests_since_repack``;
* a successful repack resets it and sets ``last_repack_at`` (and ``last_full_repack_at`` for
  ``mode=full``);
* a backup sets ``last_backup_at`` with its manifest entry and checksum when it succeeds, and
  ``last_backup_failed_at`` when it fails (migration 0009).

The planner reads a repository's :class:`~packyard.store.maintenance.planning.stats.RepackHistory` from
here, claims a repository once per window (:func:`claim_for_planning`, a compare-and-set so two
planners never plan it twice) and leaves the plan on the row (:func:`record_plan`).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Table, bindparam, delete, func, or_, select, update

from packyard.store.maintenance.planning.stats import RepackHistory
from packyard.workers.records.db import session_scope
from packyard.workers.records.models import PENDING_STATES, Job, JobState, Repository
from packyard.workers.records.models import normalize_repo_path as normalize
from packyard.workers.settings import Settings

INGEST_KINDS = frozenset({"packyard.index_pack", "packyard.unpack_objects", "packyard.import_tree",
                          "packyard.write_objects", "packyard.receive_pack"})
REPACK_KIND = "packyard.repack"
GC_KIND = "packyard.gc"
BACKUP_KIND = "packyard.backup"
PLAN_KIND = "packyard.plan_maintenance"
#: Jobs that take the maintenance lease and a fleet slot when the planner queues them.
MAINTENANCE_KINDS = frozenset({REPACK_KIND, GC_KIND})
#: Queued, started or retrying (models.PENDING_STATES, under the name the exporter reads).
LIVE_STATES = PENDING_STATES
#: The repositories table, for Core statements (no ORM bookkeeping on the hot paths).
REPOSITORIES: Table = Repository.__table__  # type: ignore[assignment]  # a declarative class's Table


def epoch(t: datetime | None) -> float | None:
    """Seconds since the epoch; SQLite hands back naive datetimes, which are UTC here."""
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def from_epoch(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


# -- counting as jobs land (in record_finished's UPDATE of the repository) ---------------------------

def landed(*, kind: str, state: JobState, params: dict[str, Any] | None, now: datetime,
           counters: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """How a finished job moves the registry's counters: (the repository row's new values, whether the
    ingest count moved), for the one ``UPDATE`` that ``recorder.record_finished`` writes with its own.

    The increment is an expression (``ingests_since_repack + 1``) returned by that ``UPDATE ...
    RETURNING``, so two ingests landing at once both count and each sees its own number (the
    planning trigger fires exactly once per multiple of M).
    """
    if kind == BACKUP_KIND:
        return _after_backup(state, now, counters or {}), False
    if state is not JobState.SUCCESS:
        return {}, False
    if kind in INGEST_KINDS:
        return {"ingests_since_repack": Repository.ingests_since_repack + 1}, True
    if kind == REPACK_KIND:
        values: dict[str, Any] = {"ingests_since_repack": 0, "last_repack_at": now, "due_action": None,
                                  **_after_repack(counters or {})}
        if (params or {}).get("mode") == "full":
            values["last_full_repack_at"] = now
        return values, False
    if kind == GC_KIND:   # the plan's gc is done: not due until a plan says so again
        return {"due_action": None}, False
    return {}, False


def _after_backup(state: JobState, now: datetime, counters: dict[str, Any]) -> dict[str, Any]:
    """A backup job's mark on its repository: a success is its newest good backup (entry and checksum), a
    failure its last failed one; a success leaves the failure time as it is (status compares the two)."""
    if state is JobState.SUCCESS:
        return {"last_backup_at": now, "backup_entry": counters.get("entry"),
                "backup_checksum": counters.get("checksum")}
    if state is JobState.FAILURE:
        return {"last_backup_failed_at": now}
    return {}


def _after_repack(counters: dict[str, Any]) -> dict[str, Any]:
    """The recorded statistics moved by what a repack did (packs replaced and written, loose files deleted),
    so the exporter does not show the last plan's figures until the next plan (NULL stays NULL)."""
    from sqlalchemy import case

    def moved(column: Any, delta: int) -> Any:
        return case((column + delta < 0, 0), else_=column + delta)

    written, merged = int(counters.get("packs_written") or 0), int(counters.get("packs_merged") or 0)
    return {"stat_packs": moved(Repository.stat_packs, written - merged),
            "stat_loose_objects": moved(Repository.stat_loose_objects, -int(counters.get("loose_deleted") or 0))}


# -- packyard repos -----------------------------------------------------------------------------------

def _row(repo: Repository) -> dict[str, Any]:
    return {
        "id": repo.id, "path": repo.path, "enabled": bool(repo.enabled),
        "ingests_since_repack": repo.ingests_since_repack,
        "last_repack_at": repo.last_repack_at, "last_full_repack_at": repo.last_full_repack_at,
        "last_planned_at": repo.last_planned_at, "last_verified_at": repo.last_verified_at,
        "last_job_at": repo.last_job_at, "last_plan": repo.last_plan,
        "stats_at": repo.stats_at, "stat_packs": repo.stat_packs, "stat_loose_objects": repo.stat_loose_objects,
        "due_action": repo.due_action,
        "last_backup_at": repo.last_backup_at, "last_backup_failed_at": repo.last_backup_failed_at,
        "backup_entry": repo.backup_entry, "backup_checksum": repo.backup_checksum,
    }


def register(settings: Settings | str, path: str | Path, *, enabled: bool = True) -> tuple[dict[str, Any], bool]:
    """Add (or find) the repository's row and set ``enabled``; (row, created)."""
    from packyard.workers.records.recorder import repository_id

    norm = normalize(path)
    with session_scope(settings) as s:
        existed = s.scalar(select(Repository.id).where(Repository.path == norm)) is not None
        rid = repository_id(s, norm)
        repo = s.get(Repository, rid)
        assert repo is not None, "repository_id created the row"
        repo.enabled = enabled
        s.flush()
        return _row(repo), not existed


def remove(settings: Settings | str, path: str | Path) -> int | None:
    """Forget a repository: its row goes, its jobs stay (their repo_id becomes NULL). Jobs unlinked, or None."""
    norm = normalize(path)
    with session_scope(settings) as s:
        rid = s.scalar(select(Repository.id).where(Repository.path == norm))
        if rid is None:
            return None
        jobs = s.scalar(select(func.count()).select_from(Job).where(Job.repo_id == rid)) or 0
        s.execute(update(Job).where(Job.repo_id == rid).values(repo_id=None))
        s.execute(delete(Repository).where(Repository.id == rid))
        return jobs


def set_enabled(settings: Settings | str, path: str | Path, enabled: bool) -> bool:
    """Enable or disable a registered repository; False if it is not registered."""
    with session_scope(settings) as s:
        res = s.execute(update(Repository).where(Repository.path == normalize(path)).values(enabled=enabled))
        return bool(res.rowcount)  # type: ignore[attr-defined]  # DML: a CursorResult


def list_repositories(settings: Settings | str, *, enabled_only: bool = False) -> list[dict[str, Any]]:
    with session_scope(settings) as s:
        q = select(Repository).order_by(Repository.path)
        if enabled_only:
            q = q.where(Repository.enabled.is_(True))
        return [_row(r) for r in s.scalars(q)]


def get(settings: Settings | str, path: str | Path) -> dict[str, Any] | None:
    with session_scope(settings) as s:
        repo = s.scalar(select(Repository).where(Repository.path == normalize(path)))
        return None if repo is None else _row(repo)


def history(row: dict[str, Any] | None) -> RepackHistory:
    """What the planner needs from a registry row."""
    if row is None:
        return RepackHistory()
    return RepackHistory(last_full_repack_at=epoch(row["last_full_repack_at"]),
                         last_repack_at=epoch(row["last_repack_at"]),
                         ingests_since_repack=row["ingests_since_repack"] or 0)


def count_enabled(settings: Settings | str) -> int:
    with session_scope(settings) as s:
        return int(s.scalar(select(func.count()).select_from(Repository).where(Repository.enabled.is_(True))) or 0)


def enabled_paths_page(settings: Settings | str, after: str | None, limit: int) -> list[str]:
    """Up to ``limit`` enabled repositories' paths after ``after`` in path order (keyset: the backup fleet's
    pages; the unique index on ``path`` serves it)."""
    with session_scope(settings) as s:
        q = select(Repository.path).where(Repository.enabled.is_(True))
        if after is not None:
            q = q.where(Repository.path > after)
        return list(s.scalars(q.order_by(Repository.path).limit(limit)))


# -- planning -----------------------------------------------------------------------------------------

def due_for_planning(settings: Settings | str, window_start: float) -> list[dict[str, Any]]:
    """Enabled repositories not yet planned in the window that opened at ``window_start``.

    Oldest plan first (never planned before all), so the ones a short window did not reach
    come first in the next.
    """
    start = from_epoch(window_start)
    with session_scope(settings) as s:
        # Two index searches (ix_repositories_enabled_last_planned_at_path), not one OR over the whole table:
        # a round that finds nothing left to plan costs nothing, however many repositories are registered.
        enabled = Repository.enabled.is_(True)
        never = select(Repository).where(enabled, Repository.last_planned_at.is_(None)).order_by(Repository.path)
        before = (select(Repository).where(enabled, Repository.last_planned_at < start)
                  .order_by(Repository.last_planned_at, Repository.path))
        return [_row(r) for q in (never, before) for r in s.scalars(q)]


# -- the window's pass, a page at a time (commands/plan_maintenance.sweep) -------------------------------

@dataclass(frozen=True)
class DueCursor:
    """Where a page of the due list ended: the never-planned part is in path order, then the planned part in
    (last_planned_at, path) order (the order of :func:`due_for_planning`)."""

    planned_at: datetime | None   # None: still in the never-planned part
    path: str


def count_due(settings: Settings | str, window_start: float) -> int:
    """How many enabled repositories are not yet planned in the window (two index counts)."""
    start = from_epoch(window_start)
    enabled = Repository.enabled.is_(True)
    with session_scope(settings) as s:
        never = s.scalar(select(func.count()).select_from(Repository)
                         .where(enabled, Repository.last_planned_at.is_(None))) or 0
        before = s.scalar(select(func.count()).select_from(Repository)
                          .where(enabled, Repository.last_planned_at < start)) or 0
    return int(never) + int(before)


def due_page(settings: Settings | str, window_start: float, after: DueCursor | None,
             limit: int) -> list[dict[str, Any]]:
    """The next ``limit`` rows of :func:`due_for_planning`'s list after ``after`` (keyset: each page is an index
    walk from where the last one ended, ``ix_repositories_enabled_last_planned_at_path``)."""
    start = from_epoch(window_start)
    enabled = Repository.enabled.is_(True)
    rows: list[Repository] = []
    with session_scope(settings) as s:
        if after is None or after.planned_at is None:
            never = select(Repository).where(enabled, Repository.last_planned_at.is_(None))
            if after is not None:
                never = never.where(Repository.path > after.path)
            rows = list(s.scalars(never.order_by(Repository.path).limit(limit)))
            after = None
        if len(rows) < limit:
            before = select(Repository).where(enabled, Repository.last_planned_at < start)
            if after is not None and after.planned_at is not None:
                at = after.planned_at
                before = before.where(Repository.last_planned_at >= at,
                                      or_(Repository.last_planned_at > at, Repository.path > after.path))
            rows += list(s.scalars(before.order_by(Repository.last_planned_at, Repository.path)
                                   .limit(limit - len(rows))))
        return [_row(r) for r in rows]


def cursor_after(row: dict[str, Any]) -> DueCursor:
    return DueCursor(row["last_planned_at"], row["path"])


def in_flight_of(settings: Settings | str, repo_ids: list[int]) -> set[int]:
    """Which of these repositories have a maintenance job (repack, gc) queued, started or retrying: one query."""
    if not repo_ids:
        return set()
    with session_scope(settings) as s:
        return {rid for rid in s.scalars(
            select(Job.repo_id).distinct().where(Job.repo_id.in_(repo_ids), Job.kind.in_(sorted(MAINTENANCE_KINDS)),
                                                 Job.state.in_(LIVE_STATES))) if rid is not None}


def claim_page(settings: Settings | str, repo_ids: list[int], window_start: float, now: float) -> set[int]:
    """:func:`claim_for_planning` for many repositories in one statement: the ids this planner claimed."""
    if not repo_ids:
        return set()
    start = from_epoch(window_start)
    table = REPOSITORIES
    with session_scope(settings) as s:
        return set(s.scalars(
            update(table).where(table.c.id.in_(repo_ids))
            .where(or_(table.c.last_planned_at.is_(None), table.c.last_planned_at < start))
            .values(last_planned_at=from_epoch(now)).returning(table.c.id)))


def unclaim(settings: Settings | str, claims: list[tuple[int, datetime | None]], claimed_at: float) -> None:
    """Give back claims :func:`claim_page` made that no plan followed (a send failed): each repository's
    ``last_planned_at`` as it was, unless something wrote it since."""
    if not claims:
        return
    at = from_epoch(claimed_at)
    with session_scope(settings) as s:
        for rid, before in claims:
            s.execute(update(Repository).where(Repository.id == rid, Repository.last_planned_at == at)
                      .values(last_planned_at=before).execution_options(synchronize_session=False))


def record_plans(settings: Settings | str, plans: list[tuple[int, dict[str, Any], float]],
                 annotations: list[tuple[str, dict[str, Any]]] | None = None) -> None:
    """:func:`record_plan` (planned) for a page of repositories, by id, and :func:`annotate_job` for the jobs
    queued, in one transaction; rows that set the same columns go in one executemany."""
    if not plans and not annotations:
        return
    table = REPOSITORIES
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for rid, plan, now in plans:
        values = {"last_plan": plan, **plan_columns(plan, now), "last_planned_at": from_epoch(now)}
        groups.setdefault(tuple(sorted(values)), []).append({"rid": rid, **{f"v_{c}": v for c, v in values.items()}})
    with session_scope(settings) as s:
        for columns, rows in groups.items():
            s.execute(update(table).where(table.c.id == bindparam("rid"))
                      .values({c: bindparam(f"v_{c}", type_=table.c[c].type) for c in columns}), rows)
        for task_id, extra in annotations or ():
            job = s.scalar(select(Job).where(Job.task_id == task_id))
            if job is not None:
                job.params = {**(job.params or {}), **extra}


def claim_for_planning(settings: Settings | str, repo_id: int, window_start: float, now: float) -> bool:
    """Mark the repository planned in this window, unless another planner did (compare-and-set)."""
    start = from_epoch(window_start)
    with session_scope(settings) as s:
        res = s.execute(update(Repository).where(Repository.id == repo_id)
                        .where(or_(Repository.last_planned_at.is_(None), Repository.last_planned_at < start))
                        .values(last_planned_at=from_epoch(now)))
        return bool(res.rowcount)  # type: ignore[attr-defined]  # DML: a CursorResult


def record_plan(settings: Settings | str, path: str | Path, plan: dict[str, Any], now: float,
                planned: bool = True) -> None:
    """Leave the plan (action, reasons, stats, outcome) on the repository's row.

    ``planned=False`` (a plan that found no free slot): the plan is kept, but the repository
    still counts as not planned, so the window's planner takes it up again.
    """
    from packyard.workers.records.recorder import repository_id

    values: dict[str, Any] = {"last_plan": plan, **plan_columns(plan, now)}
    if planned:
        values["last_planned_at"] = from_epoch(now)
    with session_scope(settings) as s:
        rid = repository_id(s, normalize(path))
        s.execute(update(Repository).where(Repository.id == rid).values(**values))


def plan_columns(plan: dict[str, Any], now: float) -> dict[str, Any]:
    """The columns a plan's record sets (the exporter reads these, not the JSON): its statistics and,
    when it calls for a job, the action (``due_action``, cleared when a repack or gc of it lands)."""
    stats = plan.get("stats") or {}
    action = plan.get("action")
    values: dict[str, Any] = {"due_action": action if action and action != "nothing" else None}
    if stats:
        values.update(stats_at=from_epoch(now), stat_packs=stats.get("packs"),
                      stat_loose_objects=stats.get("loose_estimate"))
    return values


def maintenance_in_flight(settings: Settings | str, path: str | Path | None = None,
                          newer_than: float | None = None) -> list[str]:
    """Task ids of maintenance jobs (repack, gc) queued, started or retrying — of one repository, or all."""
    with session_scope(settings) as s:
        q = select(Job.task_id).where(Job.kind.in_(sorted(MAINTENANCE_KINDS))).where(Job.state.in_(LIVE_STATES))
        if path is not None:
            q = q.join(Repository, Job.repo_id == Repository.id).where(Repository.path == normalize(path))
        if newer_than is not None:
            q = q.where(Job.queued_at >= from_epoch(newer_than))
        return list(s.scalars(q))


def annotate_job(settings: Settings | str, task_id: str, **extra: Any) -> bool:
    """Merge ``extra`` into a job row's params (the plan a maintenance job was queued for)."""
    with session_scope(settings) as s:
        job = s.scalar(select(Job).where(Job.task_id == task_id))
        if job is None:
            return False
        job.params = {**(job.params or {}), **extra}
        return True
