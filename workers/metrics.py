"""Prometheus metrics read from the records database on each scrape (``packyard metrics --port P``).

A custom collector, not counters kept in a process: every worker host writes the same
database, so one exporter anywhere shows the whole fleet, and a restart loses nothing.
Each scrape runs a handful of aggregate queries (GROUP BY over indexed columns), and
gathers repository statistics (store/maintenance/stats.py: a few listings and idx headers
per repository) at most once per ``stats_ttl`` seconds per repository.

========================================================  ==========================================
metric                                                    what
========================================================  ==========================================
packyard_jobs{kind,state}                                 job rows by kind and state
packyard_job_duration_seconds{kind} (histogram)           finished jobs' durations
packyard_lock_events_total{lease,event}                   lease events (acquired, renewed, released,
                                                          lost, expired, and any kind added later)
packyard_race_events_total{kind}                          races the workers observed
packyard_maintenance_jobs_in_flight                       repack/gc jobs queued, started or retrying
packyard_repositories{enabled}                            registered repositories
packyard_repository_packs{repo}                           installed packs
packyard_repository_loose_objects_estimate{repo}          loose objects (sampled estimate)
packyard_repository_last_full_repack_age_seconds{repo}    since the last full repack (absent: never)
packyard_repository_ingests_since_repack{repo}            ingests landed since the last repack
packyard_repository_maintenance_due{repo,action}          1 when a plan made now would queue a job
packyard_records_up                                       0 when the records database did not answer
========================================================  ==========================================
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from packyard.workers.settings import Settings

#: Histogram buckets for job durations, in seconds (a small write to a long full repack).
DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)


def lease_of(lock_name: str) -> str:
    """``maintenance`` or ``repo``, from a lock_events row's key name."""
    from packyard.workers.locks import LeaseKind

    return "maintenance" if lock_name.startswith(LeaseKind.MAINTENANCE.key_prefix) else "repo"


class RecordsCollector(Collector):
    """Reads the records (and, cached, each registered repository's statistics) at scrape time."""

    def __init__(self, settings: Settings, stats_ttl: float = 300.0) -> None:
        self.settings = settings
        self.stats_ttl = stats_ttl
        self._stats: dict[str, tuple[float, Any, Any]] = {}  # path -> (gathered at, stats, plan)
        self._lock = threading.Lock()

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
        from sqlalchemy import case, func, select

        from packyard.workers.records import Job, LockEvent, RaceEvent, Repository, session_scope
        from packyard.workers.records.registry import LIVE_STATES, MAINTENANCE_KINDS

        out: list[Metric] = []
        with session_scope(self.settings) as s:
            jobs = GaugeMetricFamily("packyard_jobs", "Job rows by kind and state", labels=["kind", "state"])
            for kind, state, n in s.execute(select(Job.kind, Job.state, func.count()).group_by(Job.kind, Job.state)):
                jobs.add_metric([kind, state.value], n)
            out.append(jobs)

            ms = [b * 1000 for b in DURATION_BUCKETS]
            cols = [func.sum(case((Job.duration_ms <= b, 1), else_=0)) for b in ms]
            q = (select(Job.kind, func.count(), func.sum(Job.duration_ms), *cols)
                 .where(Job.duration_ms.is_not(None)).group_by(Job.kind))
            hist = HistogramMetricFamily("packyard_job_duration_seconds", "Durations of finished jobs",
                                         labels=["kind"])
            for kind, count, total, *cum in s.execute(q):
                buckets = [(_le(b), int(c or 0)) for b, c in zip(DURATION_BUCKETS, cum)] + [("+Inf", int(count))]
                hist.add_metric([kind], buckets, (total or 0) / 1000.0)
            out.append(hist)

            locks = CounterMetricFamily("packyard_lock_events", "Lease events from lock_events",
                                        labels=["lease", "event"])
            by_lease: dict[tuple[str, str], int] = {}
            for name, kind, n in s.execute(select(LockEvent.lock_name, LockEvent.event, func.count())
                                           .group_by(LockEvent.lock_name, LockEvent.event)):
                key = (lease_of(name), getattr(kind, "value", str(kind)))
                by_lease[key] = by_lease.get(key, 0) + n
            for (lease, event), n in sorted(by_lease.items()):
                locks.add_metric([lease, event], n)
            out.append(locks)

            races = CounterMetricFamily("packyard_race_events", "Races the workers observed", labels=["kind"])
            for kind, n in s.execute(select(RaceEvent.kind, func.count()).group_by(RaceEvent.kind)):
                races.add_metric([kind], n)
            out.append(races)

            live = s.scalar(select(func.count()).select_from(Job).where(Job.kind.in_(sorted(MAINTENANCE_KINDS)))
                            .where(Job.state.in_(LIVE_STATES))) or 0
            inflight = GaugeMetricFamily("packyard_maintenance_jobs_in_flight",
                                         "Repack and gc jobs queued, started or retrying")
            inflight.add_metric([], live)
            out.append(inflight)

            repos = list(s.execute(select(Repository.path, Repository.enabled, Repository.ingests_since_repack,
                                          Repository.last_full_repack_at)))
        count = GaugeMetricFamily("packyard_repositories", "Registered repositories", labels=["enabled"])
        for flag in (True, False):
            count.add_metric([str(flag).lower()], sum(1 for r in repos if bool(r.enabled) is flag))
        out.append(count)
        out.extend(self._repository_families([r for r in repos if r.enabled]))
        return out

    def _repository_families(self, repos: list[Any]) -> list[Metric]:
        from packyard.workers.records.registry import epoch

        packs = GaugeMetricFamily("packyard_repository_packs", "Installed packs", labels=["repo"])
        loose = GaugeMetricFamily("packyard_repository_loose_objects_estimate",
                                  "Loose objects, estimated from sampled fan-out directories", labels=["repo"])
        age = GaugeMetricFamily("packyard_repository_last_full_repack_age_seconds",
                                "Seconds since the last full repack (absent: never)", labels=["repo"])
        ingests = GaugeMetricFamily("packyard_repository_ingests_since_repack", "Ingests since the last repack",
                                    labels=["repo"])
        due = GaugeMetricFamily("packyard_repository_maintenance_due",
                                "1 when a plan made now would queue a job, by the action it would take",
                                labels=["repo", "action"])
        now = time.time()
        for r in repos:
            ingests.add_metric([r.path], r.ingests_since_repack or 0)
            full = epoch(r.last_full_repack_at)
            if full is not None:
                age.add_metric([r.path], max(0.0, now - full))
            assessed = self._assess(r.path, now)
            if assessed is None:
                continue
            stats, plan = assessed
            packs.add_metric([r.path], len(stats.packs))
            loose.add_metric([r.path], stats.loose_estimate)
            due.add_metric([r.path, plan.action.value], 1 if plan.needs_job else 0)
        return [packs, loose, age, ingests, due]

    def _assess(self, path: str, now: float) -> tuple[Any, Any] | None:
        from packyard.store.errors import StoreError
        from packyard.workers.commands.plan_maintenance import assess

        with self._lock:
            cached = self._stats.get(path)
            if cached is not None and now - cached[0] < self.stats_ttl:
                return cached[1], cached[2]
        try:
            stats, plan = assess(self.settings, path, now)
        except (StoreError, OSError):
            return None
        with self._lock:
            self._stats[path] = (now, stats, plan)
        return stats, plan


def _le(bound: float) -> str:
    return repr(float(bound))


def make_registry(settings: Settings, stats_ttl: float = 300.0) -> CollectorRegistry:
    """A registry holding only packyard's collector (no process metrics of the exporter itself)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RecordsCollector(settings, stats_ttl))
    return reg
