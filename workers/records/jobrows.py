"""The newest job rows, read through the database's own driver (sqlite3, psycopg) without SQLAlchemy.

``packyard status`` is run in loops and from scripts; importing SQLAlchemy's engine alone costs ~0.2 s
per start, several times the query (issue 39). This module reads the rows ``status`` lists -- the jobs
table left-joined to the repositories table, newest first -- with one plain SELECT and returns them in
the form :func:`packyard.workers.cli.status.fetch` returns (the same dictionaries: the JSON columns
decoded, the timestamps as datetimes, the enums as their stored strings). Writes, filters by repository
and every other query stay on the SQLAlchemy side (models, recorder, registry); the columns named
here are the models' (tests/workers/test_cli_imports.py checks them against ``models.Job`` and compares
the rows with the ORM query's on the same database).

:func:`newest` returns None for a URL it cannot read this way (another driver, a SQLite file that does
not exist yet): the caller then takes the SQLAlchemy path, which creates and reports as before.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Sequence

#: The params key that keeps the repository a job names while its row is linked to none (before the job
#: passed the boundary, or refused there): ``packyard status --repo`` finds unlinked rows by it (recorder.py
#: writes it).
REQUESTED_REPO = "repo"
#: the row dictionary's key -> the jobs column it comes from (``repo`` is the joined repositories.path, or the
#: repository the job's params named when it has no registered one)
JOB_COLUMNS: dict[str, str] = {
    "id": "id", "task_id": "task_id", "kind": "kind", "state": "state", "queued_at": "queued_at",
    "started_at": "started_at", "finished_at": "finished_at", "duration_ms": "duration_ms", "counters": "counters",
    "error": "error", "worker": "worker_hostname", "pid": "worker_pid", "attempts": "attempts", "retries": "retries",
    "first_started_at": "first_started_at", "last_started_at": "last_started_at", "lease": "lease",
    "lease_wait_ms": "lease_wait_ms",
}
_JSON = ("counters", "params")
_TIMES = ("queued_at", "started_at", "finished_at", "first_started_at", "last_started_at")


def _select(placeholder: str, task_ids: Sequence[str] | None) -> str:
    cols = ", ".join(f"j.{c}" for c in JOB_COLUMNS.values())
    where = f" WHERE j.task_id IN ({', '.join([placeholder] * len(task_ids))})" if task_ids is not None else ""
    return (f"SELECT {cols}, j.params, r.path FROM jobs j LEFT OUTER JOIN repositories r ON j.repo_id = r.id"
            f"{where} ORDER BY j.id DESC LIMIT {placeholder}")


def _connect(url: str) -> tuple[Any, str, bool] | None:
    """(a DB-API connection, its parameter placeholder, whether values come back as text), or None."""
    if url.startswith("sqlite:///"):
        import sqlite3
        from urllib.parse import quote

        path = url[len("sqlite:///"):]
        if not path or path == ":memory:" or "?" in path or not os.path.exists(path):
            return None
        # mode=rw: never create the file here (the SQLAlchemy side creates it 0600); timeout as db.make_engine's
        return sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=30), "?", True
    for prefix in ("postgresql://", "postgresql+psycopg://"):
        if url.startswith(prefix):
            import psycopg

            return psycopg.connect("postgresql://" + url[len(prefix):], autocommit=True), "%s", False
    return None


def _time(v: Any) -> datetime | None:
    return datetime.fromisoformat(v) if isinstance(v, str) else v


def newest(url: str, limit: int, task_ids: Sequence[str] | None = None) -> list[dict[str, Any]] | None:
    """The newest ``limit`` jobs (with one of ``task_ids``, when given) of the records at ``url``; None when this
    module cannot read ``url`` (see the module's docstring)."""
    if task_ids is not None:
        task_ids = list(task_ids)
        if not task_ids:
            return []
    found = _connect(url)
    if found is None:
        return None
    conn, placeholder, as_text = found
    try:
        cur = conn.cursor()
        cur.execute(_select(placeholder, task_ids), (*(task_ids or ()), int(limit)))
        fetched = cur.fetchall()
        cur.close()
    finally:
        conn.close()
    rows = []
    for values in fetched:
        r = dict(zip((*JOB_COLUMNS, "params", "path"), values))
        if as_text:
            for k in _JSON:
                r[k] = json.loads(r[k]) if r[k] is not None else None
            for k in _TIMES:
                r[k] = _time(r[k])
        params, path = r.pop("params"), r.pop("path")
        r["repo"] = path or (params or {}).get(REQUESTED_REPO)
        rows.append({k: r[k] for k in ("id", "task_id", "kind", "repo", *list(JOB_COLUMNS)[3:])})
    return rows


def failing_backups(url: str, limit: int) -> tuple[int, list[tuple[str, datetime | None, datetime | None]]] | None:
    """(how many enabled repositories' last backup failed after their newest good one, the ``limit`` most recent
    of them as ``(path, failed at, newest good at)``), for ``packyard status``'s footer; None when this module
    cannot read ``url`` or the records predate migration 0009."""
    found = _connect(url)
    if found is None:
        return None
    conn, placeholder, _as_text = found
    where = ("FROM repositories WHERE enabled AND last_backup_failed_at IS NOT NULL"
             " AND (last_backup_at IS NULL OR last_backup_failed_at > last_backup_at)")
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT count(*) {where}")
        (count,) = cur.fetchone()
        cur.execute(f"SELECT path, last_backup_failed_at, last_backup_at {where}"
                    f" ORDER BY last_backup_failed_at DESC LIMIT {placeholder}", (int(limit),))
        rows = [(path, _time(failed), _time(good)) for path, failed, good in cur.fetchall()]
        cur.close()
    except Exception as err:   # the driver's own error classes (no SQLAlchemy here): a missing column
        if "last_backup" in str(err) or "no such column" in str(err):
            return None
        raise
    finally:
        conn.close()
    return int(count), rows
