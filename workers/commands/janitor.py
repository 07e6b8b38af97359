"""janitor as a plain function: remove what dead jobs left behind, judged by the job that owned it.

Everything packyard creates to claim or stage something carries an owner record
(:mod:`packyard.store.owner`: pid, host, job id, boot id, start time):

=======================  ========================================================  =====================
leftover                 where                                                     owner record in
=======================  ========================================================  =====================
``.keep``                ``objects/pack/pack-*.keep`` (an ingest asked for one)    its first line
quarantine               ``objects/incoming-*/``                                   ``packyard-owner``
pack writer temp files   ``objects/pack/tmp_{pack,idx,rev,mtimes,keep}_<tag>``     ``tmp_owner_<tag>``
batch tmp objects        ``objects/xx/tmp_obj_<pid>_<batch>_<n>``                  ``packyard/batches/<pid>_<batch>``
claim files              ``refs/**.lock``, ``packyard/*.lock``,                    the file itself
                         ``packed-refs.lock``, ``commit-graph-chain.lock``
=======================  ========================================================  =====================

Each owned leftover is judged (:func:`judge`) by its owner process and its job:

* owner process provably dead (same host: pid gone or reused, or the host rebooted) -> removed;
* the job's row says SUCCESS, FAILURE or LOST (or, with no row, its result in Redis says it
  finished) -> removed: a finished job's leftovers are nobody's;
* the job is pending (queued, running, waiting for a retry) -> kept, whatever its age: a paused or
  slow job is alive;
* a job neither the records nor Redis know -> removed once older than PACKYARD_JANITOR_SAFETY_AGE;
* a record without a job (an in-process CLI command) on another host -> left to the age rules.

The names, and the age rules below, are the one table of :mod:`packyard.store.leftovers` (whose
finders list what lies here); this module adds only the judging by job records.

Leftovers without an owner record (git's own temp files, an older packyard's) and those left to
the age rules fall back to ``packyard gc``'s rules (:mod:`.gc`): under the repository's
maintenance lease, which the janitor tries once (a repository whose lease is taken keeps them
for the next run). Every removal is listed with what, where and why; the job row of the run
(``packyard.janitor``) keeps the list.
"""
from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packyard.store import leftovers as lo
from packyard.store.leftovers import Kind, Leftover
from packyard.store.owner import Liveness
from packyard.store.progress import Progress

#: Items listed on the job row at most (the counters count them all).
MAX_LISTED = 200
#: What a removal is listed as, by the leftovers table's kind (the kinds that carry an owner record).
WHAT: dict[Kind, str] = {Kind.KEEP: "keep", Kind.QUARANTINE: "quarantine", Kind.PACK_TMP: "pack_temps",
                         Kind.BATCH_MARKER: "batch", Kind.REF_CLAIM: "claim", Kind.SERVING_LOCK: "claim"}


class JobVerdict(enum.Enum):
    """What the records and Redis say of a leftover's job."""

    FINISHED = "finished"   # SUCCESS
    FAILED = "failed"       # FAILURE
    LOST = "lost"           # LOST (the reconciler's verdict)
    PENDING = "pending"     # queued, running or waiting for a retry: alive
    UNKNOWN = "unknown"     # no row and no result


class Decision(enum.Enum):
    REMOVE = "remove"
    KEEP = "keep"
    AGE_RULES = "age-rules"   # not the janitor's to judge by owner: packyard gc's age rules decide


def describe(item: Leftover, git_dir: Path) -> str:
    try:
        return item.path.relative_to(git_dir).as_posix()
    except ValueError:
        return str(item.path)


class JobOracle:
    """The state of jobs by id: the records first, then Redis's result backend. Cached per run."""

    def __init__(self, settings: Any, redis_client: Any | None) -> None:
        self.settings, self.redis = settings, redis_client
        self.cache: dict[str, JobVerdict] = {}

    def verdict(self, job_id: str) -> JobVerdict:
        if job_id not in self.cache:
            self.cache[job_id] = self._ask(job_id)
        return self.cache[job_id]

    def _ask(self, job_id: str) -> JobVerdict:
        from packyard.workers.records.models import JobState
        from packyard.workers.records.recorder import job_state

        state = job_state(self.settings, job_id)
        by_state = {JobState.SUCCESS: JobVerdict.FINISHED, JobState.FAILURE: JobVerdict.FAILED,
                    JobState.LOST: JobVerdict.LOST}
        if state in by_state:
            return by_state[state]
        result = self._result_state(job_id)
        if result in ("SUCCESS", "FAILURE"):
            return JobVerdict.FINISHED if result == "SUCCESS" else JobVerdict.FAILED
        return JobVerdict.PENDING if state is not None else JobVerdict.UNKNOWN

    def _result_state(self, job_id: str) -> str | None:
        """The job's state in Celery's result backend (the same Redis), if it has one."""
        if self.redis is None:
            return None
        import redis

        try:
            raw = self.redis.get(f"celery-task-meta-{job_id}")
        except redis.RedisError:
            return None
        try:
            return json.loads(raw).get("status") if raw else None
        except (ValueError, AttributeError):
            return None


def judge(item: Leftover, oracle: JobOracle, safety_age: float) -> tuple[Decision, str]:
    """Pure of side effects (it asks, never changes): remove, keep or leave to the age rules, and why."""
    owner, alive = item.owner, item.alive
    if owner is None or alive is None:
        return Decision.AGE_RULES, "no owner record (git's, or an older packyard's)"
    if alive is Liveness.DEAD:
        return Decision.REMOVE, f"owner process dead ({owner.describe()})"
    if owner.job is None:
        if alive is Liveness.ALIVE:
            return Decision.KEEP, f"owner process alive ({owner.describe()}, no job)"
        return Decision.AGE_RULES, f"no job, owner on another host ({owner.describe()})"
    verdict = oracle.verdict(owner.job)
    if verdict in (JobVerdict.FINISHED, JobVerdict.FAILED, JobVerdict.LOST):
        return Decision.REMOVE, f"job {owner.job} {verdict.value} ({owner.describe()})"
    if verdict is JobVerdict.PENDING:
        return Decision.KEEP, f"job {owner.job} still pending ({alive.value} owner {owner.describe()})"
    if item.age >= safety_age:
        return Decision.REMOVE, (f"job {owner.job} unknown to the records and Redis, {item.age:.0f}s old "
                                 f"(safety age {safety_age:.0f}s)")
    return Decision.KEEP, f"job {owner.job} unknown to the records and Redis, only {item.age:.0f}s old"


# -- what lies in a repository ---------------------------------------------------------------------

def scan(git_dir: Path, now: float | None = None) -> list[Leftover]:
    """Every leftover of the repository that carries an owner record (the leftovers table's finders; the
    rest is left to the age rules): .keep files, quarantines, pack writers' temps by tag, batch markers
    with their tmp objects, claim files."""
    now = time.time() if now is None else now
    found = lo.find_keeps(git_dir, now=now) + lo.find_quarantines(git_dir, now=now)
    found += lo.find_pack_temps(git_dir, now=now) + lo.find_batch_markers(git_dir, now=now, files_of_kept=True)
    found += lo.find_ref_claims(git_dir, now=now) + lo.find_serving_locks(git_dir, now=now)
    return [item for item in found if item.owner is not None and item.kind in WHAT]


def remove(item: Leftover) -> bool:
    """Remove one leftover (a claim only if it still carries the judged owner record: :func:`lo.remove`)."""
    return bool(lo.remove([item]))


# -- one run ----------------------------------------------------------------------------------------

@dataclass
class JanitorReport:
    repositories: int = 0
    removed: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    age_rules: dict[str, Any] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def counters(self) -> dict[str, Any]:
        by_what: dict[str, int] = {}
        for r in self.removed:
            by_what[f"removed_{r['what']}"] = by_what.get(f"removed_{r['what']}", 0) + 1
        age_removed = sum(v for k, v in self.age_rules.items() if isinstance(v, int))
        return {"repositories": self.repositories, "removed": len(self.removed),
                "kept_live": sum(1 for k in self.kept if k["decision"] == "keep"), **by_what,
                "age_rule_removed": age_removed, "busy": len(self.busy), "errors": len(self.errors),
                "removed_items": self.removed[:MAX_LISTED], "kept_items": self.kept[:MAX_LISTED],
                "listing_truncated": int(len(self.removed) > MAX_LISTED or len(self.kept) > MAX_LISTED)}


def repositories_in_roots(settings: Any) -> list[str]:
    """Registered repositories (enabled or not) that exist and lie inside the storage roots."""
    from packyard.workers.records import registry

    roots = [root for _n, root in settings.storage_roots]
    out = []
    for row in registry.list_repositories(settings):
        path = Path(row["path"])
        if any(root in path.parents for root in roots) and (path / "objects").is_dir():
            out.append(str(path))
    return out


def confined(settings: Any, repos: list[str] | None) -> list[str] | None:
    """Repositories a queued janitor job names, each inside a storage root (InvalidInputError otherwise)."""
    if repos is None:
        return None
    from packyard.workers.confine import Confinement

    conf = Confinement.from_settings(settings)
    return [conf.repository(r) for r in repos]


def run_janitor(settings: Any, *, repos: list[str] | None = None, redis_client: Any | None = None,
                safety_age: float | None = None, age_rules: bool = True, job_id: str | None = None,
                progress: Progress | None = None) -> dict[str, Any]:
    """Judge and remove the leftovers of every repository in ``repos`` (default: the registry within the
    storage roots); then, under each repository's maintenance lease (tried once), ``packyard gc``'s age
    rules for what has no owner record. Returns ``{"counters": ..., "removed": [...], "kept": [...]}``."""
    from packyard.store.repo import find_git_dir

    safety = settings.janitor_safety_age if safety_age is None else safety_age
    oracle = JobOracle(settings, redis_client)
    report = JanitorReport()
    targets = repositories_in_roots(settings) if repos is None else list(repos)
    for n, repo in enumerate(targets):
        if progress:
            progress("repositories", n, len(targets))
        try:
            git_dir = find_git_dir(repo)
        except Exception as err:
            report.errors.append(f"{repo}: {err}")
            continue
        report.repositories += 1
        for item in scan(git_dir):
            decision, why = judge(item, oracle, safety)
            entry = {"repo": str(git_dir), "what": WHAT[item.kind], "path": describe(item, git_dir), "why": why,
                     "job": item.owner.job if item.owner else None, "age_s": round(item.age, 1)}
            if decision is Decision.REMOVE:
                try:
                    if remove(item):
                        report.removed.append(entry)
                except OSError as err:
                    report.errors.append(f"{entry['path']}: {err}")
            elif decision is Decision.KEEP:
                report.kept.append({**entry, "decision": "keep"})
        if age_rules:
            _age_rules(settings, git_dir, redis_client, job_id, report)
    if progress:
        progress("repositories", len(targets), len(targets))
    return {"counters": report.counters(), "removed": report.removed, "kept": report.kept,
            "age_rules": report.age_rules, "busy": report.busy, "errors": report.errors}


def _age_rules(settings: Any, git_dir: Path, redis_client: Any | None, job_id: str | None,
               report: JanitorReport) -> None:
    """``packyard gc``'s rules for leftovers without an owner record, under the maintenance lease."""
    from packyard.workers.commands.gc import remove_unowned_leftovers

    if redis_client is None:
        report.busy.append(f"{git_dir}: no lease service; age rules not applied")
        return
    from packyard.workers.locks import LeaseKind, db_event_recorder, hold, try_acquire

    lease = try_acquire(redis_client, git_dir, ttl=settings.lock_ttl, job_id=job_id,
                        on_event=db_event_recorder(settings), kind=LeaseKind.MAINTENANCE)
    if lease is None:
        report.busy.append(str(git_dir))   # a repack or gc runs: the next run applies them
        return
    with hold(lease, auto_renew=True):
        counts = remove_unowned_leftovers(git_dir, fence=lease.check)
    for k, v in counts.items():
        report.age_rules[k] = report.age_rules.get(k, 0) + v
