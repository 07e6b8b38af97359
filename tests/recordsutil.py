"""Helpers for the records tests: jobs written through the recorder and aged, one scrape as a dict."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from sqlalchemy import select, update


def settings_for(url, **kw):
    from packyard.workers.settings import Settings

    return replace(Settings.from_env(), database_url=url, **kw)


def finished_job(url, task_id, kind, repo, *, state=None, days_ago=0.0, duration_s=1.0):
    """A job queued, started and finished through the recorder, then moved ``days_ago`` back."""
    from packyard.workers.records import Job, JobState, session_scope, utcnow
    from packyard.workers.records.recorder import record_admitted, record_finished, record_queued, record_started

    state = state or JobState.SUCCESS
    record_queued(url, task_id=task_id, kind=kind, repo=repo)
    record_started(url, task_id=task_id, kind=kind, repo=repo, params=None, hostname="w@h", pid=1)
    if repo is not None:   # the job passed the boundary (a worker registers the repository only then)
        record_admitted(url, task_id=task_id, repo=repo)
    with session_scope(url) as s:   # a duration the histogram can place
        s.execute(update(Job).where(Job.task_id == task_id).values(started_at=utcnow() - timedelta(seconds=duration_s)))
    record_finished(url, task_id=task_id, kind=kind, repo=repo, state=state, counters={}, error=None,
                    error_type=None)
    age(url, task_id, days_ago)


def age(url, task_id, days_ago):
    from packyard.workers.records import Job, session_scope, utcnow

    if not days_ago:
        return
    at = utcnow() - timedelta(days=days_ago)
    with session_scope(url) as s:
        s.execute(update(Job).where(Job.task_id == task_id).values(queued_at=at, started_at=at, finished_at=at))


def task_ids(url):
    from packyard.workers.records import Job, session_scope

    with session_scope(url) as s:
        return set(s.scalars(select(Job.task_id)))


def scrape(url):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from packyard.workers.metrics import make_registry

    out = {}
    for fam in text_string_to_metric_families(generate_latest(make_registry(settings_for(url))).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
