"""Prometheus metrics read from the records database on each scrape (``packyard metrics --port P``).

A custom collector, not counters kept in a process: every worker host writes the same
database, so one exporter anywhere shows the whole fleet, and a restart loses nothing.
A scrape costs the same whatever the history holds (issue 21):

* counts and durations come from ``record_totals``, counters the recorder moves in the same
  transaction as each finished job, lock event and race event (workers/records/aggregates.py);
  so do the LOST jobs: a level (``family = 'level'``) moved by +1 when the reconciler marks a job
  LOST and by -1 when a LOST row is overwritten (the job re-queued, retried, started or finished)
  or pruned, each in the transaction that writes the row; only pending jobs (queued, started,
  retrying: bounded by the queues, not by the history) are counted from their rows, through
  ``ix_jobs_state_kind``: a scrape reads no other job row;
* per-repository values come from the statistics the planner recorded on each repository's row
  (``stat_packs``, ``stat_loose_objects``, ``due_action``: at most one window old; never the disk
  of every repository): the top PACKYARD_METRICS_TOP_REPOS repositories of each family by an
  index, and every enabled repository in a distribution (histograms of packs, loose objects and
  days since the last full repack), so the number of series does not grow with the fleet.

=====================================================  ==============================================
metric                                                 what
=====================================================  ==============================================
packyard_jobs{kind,state}                              finished jobs (SUCCESS, FAILURE) since the
                                                       records began; pending (from their rows) and
                                                       LOST job rows now (from the LOST level)
packyard_job_duration_seconds{kind} (histogram)        finished jobs' durations
packyard_lock_events_total{lease,event}                lease events (acquired, renewed, released, ...)
packyard_race_events_total{kind}                       races the workers observed
packyard_maintenance_jobs_in_flight                    repack/gc jobs queued, started or retrying
packyard_repositories{enabled}                         registered repositories
packyard_repositories_maintenance_due{action}          enabled repositories whose last plan called for
                                                       a job not landed yet, by action
packyard_repositories_without_statistics               enabled repositories never planned yet
packyard_repositories_packs (histogram)                packs per enabled repository (last plan)
packyard_repositories_loose_objects (histogram)        loose-object estimates (last plan)
packyard_repositories_days_since_full_repack (hist.)   days since the last full repack (never: only
                                                       in +Inf, and not in _sum)
packyard_repository_packs{repo}                        installed packs: the top N repositories
packyard_repository_loose_objects_estimate{repo}       loose objects (sampled estimate): the top N
packyard_repository_last_full_repack_age_seconds{repo} since the last full repack: the N oldest
packyard_repository_ingests_since_repack{repo}         ingests landed since the last repack: the top N
packyard_repositories_days_since_backup (histogram)    days since the newest good backup (never: only
                                                       in +Inf)
packyard_repositories_without_backup                   enabled repositories with no good backup
packyard_repositories_backup_failing                   enabled repositories whose last backup failed
                                                       after their newest good one
packyard_repository_backup_age_seconds{repo}           since the newest good backup: the N oldest
packyard_records_up                                    0 when the records database did not answer
=====================================================  ==============================================
"""
from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from packyard.workers.records.aggregates import lease_of
from packyard.workers.records.models import BUCKET_COLUMNS, DURATION_BUCKETS
from packyard.workers.settings import Settings

__all__ = ["DURATION_BUCKETS", "RecordsCollector", "lease_of", "make_registry"]

#: Distribution buckets of the per-repository statistics (upper bounds; +Inf is added).
PACK_BUCKETS = (1, 2, 4, 8, 16, 32, 50, 100, 200, 500)
LOOSE_BUCKETS = (0, 100, 500, 1024, 5000, 10_000, 50_000, 100_000, 1_000_000)
AGE_DAYS_BUCKETS = (1, 2, 5, 7, 14, 30, 60, 90, 180, 365)


class RecordsCollector(Collector):
    """Reads the records at scrape time: counters, the LOST level, pending rows, and the repositories' recorded
    statistics."""

    def __init__(self, settings: Settings, top: int | None = None) -> None:
        self.settings = settings
        self.top = settings.metrics_top_repos if top is None else top

    def describe(self) -> list[Metric]:
        return []  # dynamic: never collected at registration (no database query at start-up)

    def collect(self) -> Iterator[Metric]:
        try:
            families = self._collect_records()
        except Exception:  # a database outage is a metric, not a failed scrape
            up = GaugeMetricFamily("packyard_records_up", "1 when the records database answered this scrape")
            up.add_metric([], 0)
            yield up
            return
        yield from families
        up = GaugeMetricFamily("packyard_records_up", "1 when the records database answered this scrape")
        up.add_metric([], 1)
        yield up

    def _collect_records(self) -> list[Metric]:
        from packyard.workers.records import session_scope

        with session_scope(self.settings) as s:
            return [*self._counters(s), *self._repositories(s)]

    def _counters(self, s: Any) -> list[Metric]:
        from sqlalchemy import func, select

        from packyard.workers.records import Job
        from packyard.workers.records.aggregates import totals
        from packyard.workers.records.registry import LIVE_STATES, MAINTENANCE_KINDS

        rows = totals(s)
        jobs = GaugeMetricFamily("packyard_jobs", "Finished jobs since the records began (SUCCESS, FAILURE); "
                                 "pending and LOST job rows now", labels=["kind", "state"])
        # Pending rows only: the queues bound them. LOST rows (bounded only by the retention) are the level below.
        for kind, state, n in s.execute(select(Job.kind, Job.state, func.count()).where(Job.state.in_(LIVE_STATES))
                                        .group_by(Job.state, Job.kind)):
            jobs.add_metric([kind, state.value], n)
        durations: dict[str, dict[str, int]] = {}
        locks = CounterMetricFamily("packyard_lock_events", "Lease events since the records began",
                                    labels=["lease", "event"])
        races = CounterMetricFamily("packyard_race_events", "Races the workers observed since the records began",
                                    labels=["kind"])
        for r in sorted(rows, key=lambda r: (r["family"], r["kind"], r["state"])):
            if r["family"] == "level":   # job rows in a state now (LOST): a level, 0 once they are gone
                jobs.add_metric([r["kind"], r["state"]], r["events"])
            elif r["family"] == "job":
                jobs.add_metric([r["kind"], r["state"]], r["events"])
                acc = durations.setdefault(r["kind"], dict.fromkeys(("timed", "duration_ms_sum", *BUCKET_COLUMNS), 0))
                for c in acc:
                    acc[c] += r[c]
            elif r["family"] == "lock":
                locks.add_metric([r["kind"], r["state"]], r["events"])
            elif r["family"] == "race":
                races.add_metric([r["kind"]], r["events"])
        hist = HistogramMetricFamily("packyard_job_duration_seconds", "Durations of finished jobs", labels=["kind"])
        for kind, acc in sorted(durations.items()):
            cumulative, buckets = 0, []
            for bound, col in zip(DURATION_BUCKETS, BUCKET_COLUMNS):
                cumulative += acc[col]
                buckets.append((_le(bound), cumulative))
            hist.add_metric([kind], [*buckets, ("+Inf", acc["timed"])], acc["duration_ms_sum"] / 1000.0)
        live = s.scalar(select(func.count()).select_from(Job).where(Job.state.in_(LIVE_STATES))
                        .where(Job.kind.in_(sorted(MAINTENANCE_KINDS)))) or 0
        inflight = GaugeMetricFamily("packyard_maintenance_jobs_in_flight",
                                     "Repack and gc jobs queued, started or retrying")
        inflight.add_metric([], live)
        return [jobs, hist, locks, races, inflight]

    def _repositories(self, s: Any) -> list[Metric]:
        from sqlalchemy import func, select

        from packyard.workers.records import Repository
        from packyard.workers.records.registry import epoch

        R = Repository
        now = time.time()
        out: list[Metric] = []
        count = GaugeMetricFamily("packyard_repositories", "Registered repositories", labels=["enabled"])
        by_flag = {bool(flag): n for flag, n in s.execute(select(R.enabled, func.count()).group_by(R.enabled))}
        for flag in (True, False):
            count.add_metric([str(flag).lower()], by_flag.get(flag, 0))
        out.append(count)

        enabled = R.enabled.is_(True)
        due = GaugeMetricFamily("packyard_repositories_maintenance_due",
                                "Enabled repositories whose last plan called for a job that has not landed yet",
                                labels=["action"])
        for action, n in s.execute(select(R.due_action, func.count()).where(R.due_action.is_not(None), enabled)
                                   .group_by(R.due_action)):
            due.add_metric([action], n)
        out.append(due)

        # The three distributions: each one GROUP BY over its covering index (enabled, column), never the rows
        # (their plans' JSON): a pass over small index entries, one CASE each.
        total = by_flag.get(True, 0)
        pack_n, pack_cum, pack_sum = _distribution(s, R.stat_packs, enabled, PACK_BUCKETS)
        loose_n, loose_cum, loose_sum = _distribution(s, R.stat_loose_objects, enabled, LOOSE_BUCKETS)
        age_cum, repacked, epoch_sum = _age_distribution(s, R.last_full_repack_at, enabled, now)
        without = GaugeMetricFamily("packyard_repositories_without_statistics",
                                    "Enabled repositories no plan has recorded statistics for yet")
        without.add_metric([], total - pack_n)
        packs = HistogramMetricFamily("packyard_repositories_packs", "Packs per enabled repository (last plan)")
        packs.add_metric([], [*((str(b), n) for b, n in zip(PACK_BUCKETS, pack_cum)), ("+Inf", pack_n)],
                         float(pack_sum))
        loose = HistogramMetricFamily("packyard_repositories_loose_objects",
                                      "Loose objects (sampled estimate) per enabled repository (last plan)")
        loose.add_metric([], [*((str(b), n) for b, n in zip(LOOSE_BUCKETS, loose_cum)), ("+Inf", loose_n)],
                         float(loose_sum))
        age = HistogramMetricFamily("packyard_repositories_days_since_full_repack",
                                    "Days since each enabled repository's last full repack (never: only in +Inf)")
        age.add_metric([], [*((str(d), n) for d, n in zip(AGE_DAYS_BUCKETS, age_cum)), ("+Inf", total)],
                       max(0.0, (repacked * now - float(epoch_sum)) / 86400.0))
        out += [without, packs, loose, age]

        # Backups (migration 0009): the age of each enabled repository's newest good backup as a histogram, how
        # many have none and how many failed since their newest good one; the oldest N below (never all).
        backup_cum, backed_up, backup_epoch_sum = _age_distribution(s, R.last_backup_at, enabled, now)
        backup_age = HistogramMetricFamily("packyard_repositories_days_since_backup",
                                           "Days since each enabled repository's newest good backup "
                                           "(never backed up: only in +Inf)")
        backup_age.add_metric([], [*((str(d), n) for d, n in zip(AGE_DAYS_BUCKETS, backup_cum)), ("+Inf", total)],
                              max(0.0, (backed_up * now - float(backup_epoch_sum)) / 86400.0))
        never = GaugeMetricFamily("packyard_repositories_without_backup",
                                  "Enabled repositories with no good backup on record")
        never.add_metric([], total - backed_up)
        failing = GaugeMetricFamily("packyard_repositories_backup_failing",
                                    "Enabled repositories whose last backup failed after their newest good one")
        failing.add_metric([], s.scalar(select(func.count()).select_from(R).where(
            enabled, R.last_backup_failed_at.is_not(None),
            (R.last_backup_at.is_(None)) | (R.last_backup_failed_at > R.last_backup_at))) or 0)
        out += [backup_age, never, failing]

        top = self.top

        def per_repo(name: str, doc: str, column: Any, where: Any, order: Any,
                     value: Callable[[Any], float] = lambda v: v) -> GaugeMetricFamily:
            """One gauge labelled ``repo``: the ``top`` enabled repositories by ``order`` (never all of them)."""
            fam = GaugeMetricFamily(name, doc, labels=["repo"])
            for path, v in s.execute(select(R.path, column).where(enabled, where).order_by(order).limit(top)):
                fam.add_metric([path], value(v))
            return fam

        return out + [
            per_repo("packyard_repository_packs", f"Installed packs (the top {top} repositories, last plan)",
                     R.stat_packs, R.stat_packs.is_not(None), R.stat_packs.desc()),
            per_repo("packyard_repository_loose_objects_estimate",
                     f"Loose objects, estimated (the top {top} repositories, last plan)",
                     R.stat_loose_objects, R.stat_loose_objects.is_not(None), R.stat_loose_objects.desc()),
            per_repo("packyard_repository_last_full_repack_age_seconds",
                     f"Seconds since the last full repack (the {top} oldest; never: absent)",
                     R.last_full_repack_at, R.last_full_repack_at.is_not(None), R.last_full_repack_at,
                     lambda at: max(0.0, now - (epoch(at) or now))),
            per_repo("packyard_repository_backup_age_seconds",
                     f"Seconds since the newest good backup (the {top} oldest; never backed up: absent)",
                     R.last_backup_at, R.last_backup_at.is_not(None), R.last_backup_at,
                     lambda at: max(0.0, now - (epoch(at) or now))),
            per_repo("packyard_repository_ingests_since_repack",
                     f"Ingests since the last repack (the top {top} repositories)",
                     R.ingests_since_repack, R.ingests_since_repack > 0, R.ingests_since_repack.desc()),
        ]


def _cumulate(per_bucket: dict[int, int], buckets: int) -> list[int]:
    out, acc = [], 0
    for i in range(buckets):
        acc += per_bucket.get(i, 0)
        out.append(acc)
    return out


def _distribution(s: Any, column: Any, enabled: Any, bounds: tuple[int, ...]) -> tuple[int, list[int], float]:
    """(repositories with a value, cumulative count per bound, sum of the values) of the enabled repositories."""
    from sqlalchemy import case, func, select

    bucket = case(*((column <= b, i) for i, b in enumerate(bounds)), else_=len(bounds)).label("bucket")
    per: dict[int, int] = {}
    n, total = 0, 0.0
    for b, count, value in s.execute(select(bucket, func.count(), func.sum(column))
                                     .where(enabled, column.is_not(None)).group_by(bucket)):
        per[int(b)] = int(count)
        n += int(count)
        total += float(value or 0)
    return n, _cumulate(per, len(bounds)), total


def _age_distribution(s: Any, column: Any, enabled: Any, now: float) -> tuple[list[int], int, float]:
    """(cumulative count of repositories fully repacked at most d days ago per bound, how many ever were, the
    sum of their repack times in epoch seconds)."""
    from sqlalchemy import case, func, select

    cut = [datetime.fromtimestamp(now, UTC) - timedelta(days=d) for d in AGE_DAYS_BUCKETS]
    bucket = case(*((column >= c, i) for i, c in enumerate(cut)), else_=len(cut)).label("bucket")
    per: dict[int, int] = {}
    n, total = 0, 0.0
    for b, count, value in s.execute(select(bucket, func.count(), _epoch_sum(s, column))
                                     .where(enabled, column.is_not(None)).group_by(bucket)):
        per[int(b)] = int(count)
        n += int(count)
        total += float(value or 0)
    return _cumulate(per, len(cut)), n, total


def _epoch_sum(s: Any, column: Any) -> Any:
    """SUM of a timestamp column in seconds since the epoch (each database spells it its own way)."""
    from sqlalchemy import Float, cast, extract, func

    if s.get_bind().dialect.name == "postgresql":
        return func.coalesce(func.sum(extract("epoch", column)), 0)
    return func.coalesce(func.sum(cast(func.strftime("%s", column), Float)), 0)


def _le(bound: float) -> str:
    return repr(float(bound))


def make_registry(settings: Settings, top: int | None = None) -> CollectorRegistry:
    """A registry holding only packyard's collector (no process metrics of the exporter itself)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RecordsCollector(settings, top))
    return reg
