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

Leftovers without an owner record (git's own temp files, an older packyard's) and those left to
the age rules fall back to ``packyard gc``'s rules (:mod:`.gc`): under the repository's
maintenance lease, which the janitor tries once (a repository whose lease is taken keeps them
for the next run). Every removal is listed with what, where and why; the job row of the run
(``packyard.janitor``) keeps the list.
"""
from __future__ import annotations

import enum
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packyard.store import lockfile
from packyard.store.owner import Liveness, Owner, liveness, read_owner

from packyard.store.progress import Progress

#: Items listed on the job row at most (the counters count them all).
MAX_LISTED = 200
_BATCH_MARKER_RE = re.compile(r"^(\d+)_([0-9a-f]{4})-([0-9a-f]{8})$")
_TMP_OBJ_RE = re.compile(r"^tmp_obj_(\d+)_([0-9a-f]{4})-([0-9a-f]{8})_(\d+)$")


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


@dataclass
class Leftover:
    what: str                 # keep | quarantine | pack_temps | batch | claim
    path: Path                # the claim itself (the quarantine dir, the owner/marker file, the lock)
    files: list[Path]         # everything that goes with it
    owner: Owner | None
    age: float

    def describe(self, git_dir: Path) -> str:
        try:
            return self.path.relative_to(git_dir).as_posix()
        except ValueError:
            return str(self.path)


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
    owner = item.owner
    if owner is None:
        return Decision.AGE_RULES, "no owner record (git's, or an older packyard's)"
    alive = liveness(owner)
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

def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def scan(git_dir: Path, now: float | None = None) -> list[Leftover]:
    """Every owned leftover candidate of the repository (unowned ones are left to the age rules)."""
    from packyard.store.pack.indexpack import QUARANTINE_OWNER, QUARANTINE_PREFIX
    from packyard.store.pack.write import OWNER_PREFIX, TMP_RE

    now = time.time() if now is None else now
    objects, pack_dir = git_dir / "objects", git_dir / "objects" / "pack"
    found: list[Leftover] = []
    # .keep files packyard wrote (an owner record on their first line); an operator's are not ours.
    for keep in sorted(pack_dir.glob("pack-*.keep")):
        owner = read_owner(keep)
        if owner is not None:
            found.append(Leftover("keep", keep, [keep], owner, _age(keep, now)))
    # Quarantines of ingests.
    for q in sorted(p for p in objects.glob(f"{QUARANTINE_PREFIX}*") if p.is_dir()):
        owner = read_owner(q / QUARANTINE_OWNER)
        untouched = min([_age(q, now)] + [_age(f, now) for f in q.iterdir()])   # since its last write
        found.append(Leftover("quarantine", q, [q], owner, untouched))
    # Pack writers' temp files, by tag.
    tags: dict[str, list[Path]] = {}
    for f in sorted(pack_dir.glob("tmp_*")):
        m = TMP_RE.match(f.name)
        if m is not None:
            tags.setdefault(f.name.split("_", 2)[2], []).append(f)
    for tag, files in tags.items():
        record = pack_dir / f"{OWNER_PREFIX}{tag}"
        owner = read_owner(record) if record.exists() else None
        if owner is not None:
            found.append(Leftover("pack_temps", record, [f for f in files if f != record] + [record], owner,
                                  min(_age(f, now) for f in files)))
    # Batch writes: the marker names the batch; its tmp objects lie in the fan-out directories.
    markers = git_dir / "packyard" / "batches"
    batches: dict[str, Path] = {}
    for marker in sorted(markers.iterdir()) if markers.is_dir() else []:
        m = _BATCH_MARKER_RE.match(marker.name)
        if m is not None:
            batches[f"{m.group(2)}-{m.group(3)}"] = marker
    if batches:
        tmp: dict[str, list[Path]] = {k: [] for k in batches}
        for fanout in objects.iterdir():
            if len(fanout.name) != 2 or not fanout.is_dir():
                continue
            for f in fanout.iterdir():
                m = _TMP_OBJ_RE.match(f.name)
                if m is not None and f"{m.group(2)}-{m.group(3)}" in tmp:
                    tmp[f"{m.group(2)}-{m.group(3)}"].append(f)
        for key, marker in batches.items():
            owner = read_owner(marker)
            if owner is not None:
                found.append(Leftover("batch", marker, sorted(tmp[key]) + [marker], owner, _age(marker, now)))
    # Claim files (ref locks, fence locks, their side files).
    for top in (git_dir / "refs", git_dir / "packyard"):
        for dirpath, _dirs, names in os.walk(top):
            for name in sorted(names):
                if name.endswith(".lock"):
                    path = Path(dirpath) / name
                    owner = read_owner(path)
                    if owner is not None:
                        found.append(Leftover("claim", path, [path], owner, _age(path, now)))
    # The commit-graph's and pack-refs' claims (packed-refs.lock, commit-graph-chain.lock).
    from packyard.store.maintenance.leftovers import serving_claims

    for path in serving_claims(git_dir):
        owner = read_owner(path)
        if owner is not None:
            found.append(Leftover("claim", path, [path], owner, _age(path, now)))
    return found


def remove(item: Leftover) -> bool:
    """Remove one leftover; a claim only if it still carries the judged owner record."""
    if item.what == "claim":
        return lockfile.remove_claim(item.path, item.owner)
    if item.what == "quarantine":
        shutil.rmtree(item.path, ignore_errors=True)
        return not item.path.exists()
    removed = False
    for f in item.files:   # the owner record / marker last: a crash midway leaves it to be judged again
        try:
            os.unlink(f)
            removed = True
        except FileNotFoundError:
            continue
    return removed


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
            entry = {"repo": str(git_dir), "what": item.what, "path": item.describe(git_dir), "why": why,
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
