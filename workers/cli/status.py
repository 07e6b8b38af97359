"""packyard status: recent jobs from the records database, as a table.

With ``--repo R`` (a path, or ``<storage>:<relative path>`` as jobs name it): first the
repository's statistics, the plan the maintenance strategy would make if it were planned now
(with its reasons), then its recent jobs. The statistics come from the repository itself, so
they are shown before any records database exists ("no records yet").

Before listing, one reconciler pass (workers/reconcile.py) checks the pending jobs against the
broker and the workers: a job whose message is nowhere is marked LOST once it stayed unseen for
PACKYARD_LOST_AFTER; ``--no-reconcile`` lists the rows as they are.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.prepare import is_default_sqlite
from packyard.workers.settings import get_settings

COLUMNS = ("job", "task id", "kind", "repo", "state", "lease", "tries", "queued (UTC)", "ms", "worker", "counters",
           "error")


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("status", help="recent jobs as a table",
                              description="Recent jobs from PACKYARD_DATABASE_URL, newest first. With --repo: "
                                          "the repository's statistics and the maintenance plan it would get "
                                          "now, with its reasons, before its jobs.")
    add_repo_arg(p, required=False)
    p.add_argument("--limit", type=int, default=20, help="number of jobs (default 20)")
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.add_argument("--no-reconcile", action="store_true",
                   help="do not check pending jobs against the broker and workers first (no LOST marking)")
    p.set_defaults(func=run, logs=False)   # run() configures logging unless it only lists (issue 39)


# The counters worth a glance, per job kind, in this order; the job row keeps all of them (--json).
KEY_COUNTERS: dict[str, tuple[str, ...]] = {
    "verify_repo": ("objects", "commits", "trees", "blobs", "tags", "refs"),
    "index_pack": ("objects", "deltas", "thin_bases_added", "bytes", "peak_rss"),
    "unpack_objects": ("objects", "deltas", "objects_written", "objects_skipped", "flushes"),
    "import_tree": ("files", "objects_written", "objects_skipped", "flushes", "renames"),
    "write_objects": ("objects_written", "objects_skipped", "flushes", "renames"),
    "plan_maintenance": ("action", "outcome", "packs", "loose_estimate", "queued", "waiting"),
    "gc": ("stale_tmp_removed", "stale_quarantines_removed", "stale_pack_temps_removed", "preserved_packs_expired"),
    "repack": ("skipped", "objects_out", "packs_merged", "loose_deleted", "cruft_kept", "fence_token"),
    "janitor": ("repositories", "removed", "kept_live", "age_rule_removed", "busy", "errors"),
    "race": ("lookups", "repacks", "ingests", "relisted", "preserved", "quick_absent", "lost"),
    "backup": ("entry", "objects", "bytes", "refs", "unchanged", "expired"),
    "restore": ("entry", "objects", "refs", "checksum"),
    "prune_records": ("jobs_removed", "lock_events_removed", "race_events_removed", "batches", "more"),
}
BYTE_COUNTERS = frozenset({"bytes", "bytes_in", "bytes_written", "received_bytes", "peak_rss", "peak_rss_workers"})
MAX_COUNTERS = 6


def _counters(c: dict[str, Any] | None, kind: str = "") -> str:
    """``objects=12233 deltas=8423 bytes=3.3MiB``: the kind's key counters (unknown kinds: the first few)."""
    if not c:
        return ""
    keys = [k for k in KEY_COUNTERS.get(kind.removeprefix("packyard."), ()) if k in c]
    if not keys:  # a kind without a list: the first plain counters, not the per-phase timings
        keys = [k for k in c if not k.startswith("elapsed_")][:MAX_COUNTERS]
    return " ".join(f"{k}={_human_bytes(c[k]) if k in BYTE_COUNTERS else c[k]}" for k in keys)


def _human_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return str(n)
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"


def _time(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else ""


#: How many of the newest unlinked job rows ``status --repo`` looks through for ones naming the repository.
UNLINKED_SCAN = 10_000


def _unlinked(session, path: str, limit: int, task_ids: Sequence[str] | None) -> list[Any]:  # type: ignore[no-untyped-def]
    """The newest unlinked rows (no registered repository) whose params name ``path`` (recorder.REQUESTED_REPO)."""
    from sqlalchemy import select

    from packyard.workers.records import Job
    from packyard.workers.records.recorder import REQUESTED_REPO

    recent = (select(Job.id).where(Job.repo_id.is_(None)).order_by(Job.id.desc()).limit(UNLINKED_SCAN)
              .subquery())
    q = select(Job, Job.repo_id).where(Job.id.in_(select(recent.c.id)),
                                       Job.params[REQUESTED_REPO].as_string() == path)
    if task_ids is not None:
        q = q.where(Job.task_id.in_(list(task_ids)))
    return [(job, None) for job, _ in session.execute(q.order_by(Job.id.desc()).limit(limit))]


def fetch(s, repo: str | None, limit: int,  # type: ignore[no-untyped-def]
          task_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Newest first: the last ``limit`` jobs (of ``repo``, or with one of ``task_ids``, when given).

    Without ``repo``, through the database's own driver (records/jobrows.py: no SQLAlchemy import, the cost
    of a ``status`` start); by repository, or for a URL jobrows cannot read, through the models."""
    if not repo:
        from packyard.workers.records import jobrows

        rows = jobrows.newest(s.database_url, limit, task_ids)
        if rows is not None:
            return rows
    return fetch_orm(s, repo, limit, task_ids)


def fetch_orm(s, repo: str | None, limit: int,  # type: ignore[no-untyped-def]
              task_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """:func:`fetch` through the models (SQLAlchemy's ORM)."""
    from sqlalchemy import select

    from packyard.workers.records import Job, Repository, session_scope
    from packyard.workers.records.recorder import REQUESTED_REPO, normalize_repo_path

    with session_scope(s) as session:
        q = select(Job, Repository.path).outerjoin(Repository, Job.repo_id == Repository.id)
        if repo:
            q = q.where(Repository.path == normalize_repo_path(repo))
        if task_ids is not None:
            q = q.where(Job.task_id.in_(list(task_ids)))
        q = q.order_by(Job.id.desc()).limit(limit)
        found = list(session.execute(q))
        if repo:   # jobs that name it but were never admitted (queued, refused, unknown task): unlinked rows
            found = sorted(found + _unlinked(session, normalize_repo_path(repo), limit, task_ids),
                           key=lambda row: row[0].id, reverse=True)[:limit]
        return [{
            "id": job.id, "task_id": job.task_id, "kind": job.kind,
            "repo": path or (job.params or {}).get(REQUESTED_REPO), "state": job.state.value,
            "queued_at": job.queued_at, "started_at": job.started_at, "finished_at": job.finished_at,
            "duration_ms": job.duration_ms, "counters": job.counters, "error": job.error,
            "worker": job.worker_hostname, "pid": job.worker_pid, "attempts": job.attempts, "retries": job.retries,
            "first_started_at": job.first_started_at, "last_started_at": job.last_started_at,
            "lease": job.lease.value if job.lease is not None else None, "lease_wait_ms": job.lease_wait_ms,
        } for job, path in found]


def render_table(rows: Sequence[dict[str, Any]], width: int = 60) -> str:
    cells = [(str(r["id"]), r["task_id"][:8], r["kind"].removeprefix("packyard."),
              _short_path(r["repo"]), r["state"], lease_mark(r), _tries(r), _time(r["queued_at"] or r["started_at"]),
              "" if r["duration_ms"] is None else str(r["duration_ms"]),
              f"{(r['worker'] or '').split('@')[0]}/{r['pid']}" if r["worker"] else "",
              _counters(r["counters"], r["kind"]),
              _clip((r["error"] or "").replace("\n", " "), width)) for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(COLUMNS)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(COLUMNS), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    return "\n".join(out)


def lease_mark(r: dict[str, Any]) -> str:
    """What the job's maintenance lease did: ``waited 3.2s``, ``skipped``, ``took over``, ``LOST``, ``busy``."""
    lease = r.get("lease")
    if not lease:
        return ""
    if lease == "waited":
        return f"waited {(r.get('lease_wait_ms') or 0) / 1000:.1f}s"
    return {"took_over": "took over", "lost": "LOST lease", "busy": "busy (gave up)"}.get(lease, lease)


def _tries(r: dict[str, Any]) -> str:
    """Deliveries of the job's message (a redelivery shows as 2+), with retries when there were any."""
    tries = str(r.get("attempts") or 0)
    return f"{tries} ({r['retries']} retries)" if r.get("retries") else tries


def reconcile_first(s) -> str | None:  # type: ignore[no-untyped-def]
    """One reconciler pass against the configured broker; a one-line summary, or why it was skipped."""
    import redis

    from packyard.workers.embedded import EmbeddedRedis

    if s.embedded_redis and not EmbeddedRedis.for_settings(s).ping():
        return "reconcile skipped: the embedded Redis is not running"
    from packyard.workers.app import app
    from packyard.workers.reconcile import reconcile

    try:
        return "reconcile: " + reconcile(s, app).summary()
    except (redis.RedisError, OSError) as err:
        return f"reconcile skipped: broker unreachable ({err})"
    except Exception as err:
        return f"reconcile failed: {type(err).__name__}: {err}"


def _short_path(p: str | None) -> str:
    if not p:
        return ""
    try:
        return str(Path(p).relative_to(Path.cwd()))
    except ValueError:
        return p


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def repo_path(s, value: str) -> str:  # type: ignore[no-untyped-def]
    """The path ``--repo`` names: ``<storage>:<relative path>`` expanded (an unknown storage is an
    InvalidInputError naming the configured ones), a plain path resolved like every other command's."""
    import os

    from packyard.workers.confine import Confinement

    if not value.startswith("/") and ":" in value.split("/", 1)[0] and not os.path.exists(value):
        return os.path.realpath(Confinement.from_settings(s).spelled_path(value))
    return str(Path(value).expanduser().resolve())


def run(args: argparse.Namespace) -> int:
    s = get_settings()
    if args.repo or not args.no_reconcile:
        # A plain ``status --no-reconcile`` only lists rows and logs nothing: it skips structlog's import.
        from packyard.workers import logs as plog

        plog.configure_from_settings(s)
    repo = None
    if args.repo:
        from packyard.store.errors import InvalidInputError

        try:
            repo = repo_path(s, args.repo)
        except InvalidInputError as err:
            print(f"packyard status: {type(err).__name__}: {err}", file=sys.stderr)
            return 2
    if is_default_sqlite(s) and not (s.state_dir / "packyard.db").exists():
        if repo and not args.json:
            print(render_repository(s, repo, records=False))
            print()
        print(f"no job records yet ({s.state_dir / 'packyard.db'} does not exist)")
        return 0
    note = None if args.no_reconcile else reconcile_first(s)
    if note:
        print(note, file=sys.stderr)   # stdout stays the table (or JSON lines)
    rows = fetch(s, repo, args.limit)
    if repo and not args.json:
        print(render_repository(s, repo))
        print()
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
        return 0
    if not rows:
        print("no jobs recorded" + (f" for {repo}" if repo else ""))
        return 0
    print(render_table(rows))
    if not repo:
        footer = failing_backups_line(s)
        if footer:
            print(footer)
    return 0


def failing_backups_line(s) -> str:  # type: ignore[no-untyped-def]
    """``backups failing: N repositories ...`` when enabled repositories' last backup failed after their newest
    good one ("" when none, or the records cannot say)."""
    from packyard.workers.records import jobrows

    found = jobrows.failing_backups(s.database_url, 5)
    if not found or not found[0]:
        return ""
    count, rows = found
    shown = "; ".join(f"{_short_path(p)} failed {_time(failed)}, newest good {_time(good) or 'never'}"
                      for p, failed, good in rows)
    more = f" (and {count - len(rows)} more)" if count > len(rows) else ""
    return f"backups failing: {count} repositor{'y' if count == 1 else 'ies'}: {shown}{more}"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit} ago"
    return f"{seconds:.0f} seconds ago"


def network_lines(d: dict[str, Any]) -> list[str]:
    """The fork-network lines of ``status --repo`` from the statistics (planning/poolstats.py)."""
    if d.get("pool_role") == "member":
        return [f"  fork network: borrows from {d['pool']} ({_human_bytes(d['pool_pack_bytes'])} there), "
                f"{_human_bytes(d['own_pack_bytes'])} of its own"]
    if d.get("pool_role") != "pool":
        return []
    behind = d["source_refs_behind"]
    ratio = d["dedupe_ratio"]
    return [f"  fork network: a pool of {d['pool_members']} member(s), {_human_bytes(d['pool_pack_bytes'])} shared, "
            f"{_human_bytes(d['own_pack_bytes'])} in the members' own packs; dedupe "
            + (f"{ratio:.2f}x (full copies over shared)" if ratio is not None else "-")
            + "; source " + (f"{d['pool_source']}: {behind} of {d['source_refs']} ref(s) behind" if behind is not None
                             else f"{d['pool_source']} not read (outside the storage roots or gone)")]


def pool_line(s, path: str) -> str:  # type: ignore[no-untyped-def]
    """``\n  pool: ...``: the pool the repository borrows from, or the members it lends to ("" for neither),
    by the records (migration 0008)."""
    from packyard.workers.records import pools

    lender = pools.pool_of(s, path)
    if lender is not None:
        return f"\n  pool: member of {lender}"
    found = pools.get_pool(s, path)
    if found is not None:
        members = found.members
        shown = ", ".join(members[:5]) + (f", ... ({len(members)} in all)" if len(members) > 5 else "")
        return f"\n  pool: an object pool with {len(members)} member(s){': ' + shown if members else ''}"
    return ""


def checksum_line(repo: str) -> str:
    """``  checksum: <hex> (...)``: Gitaly's repository checksum of the refs as they are now."""
    from packyard.store.errors import StoreError
    from packyard.workers.commands.checksum import checksum_repo

    try:
        c = checksum_repo(repo)
    except (StoreError, OSError) as err:
        return f"  checksum: {type(err).__name__}: {err}"
    return f"  checksum: {c['checksum']} ({c['counted']} of {c['refs']} show-ref line(s) counted)"


def backup_line(row: dict[str, Any], now: float) -> str:
    """``  backup: ...``: the newest good backup by the records (migration 0009), and a failure since."""
    from packyard.workers.records.registry import epoch

    good, failed = epoch(row.get("last_backup_at")), epoch(row.get("last_backup_failed_at"))
    text = "  backup: " + ("none on record" if good is None else
                           f"newest good {_ago(now - good)} (entry {row.get('backup_entry')}, "
                           f"checksum {row.get('backup_checksum')})")
    if failed is not None and (good is None or failed > good):
        text += f"; FAILED {_ago(now - failed)} (packyard status lists the job's reason)"
    return text


def render_repository(s, repo: str, records: bool = True) -> str:  # type: ignore[no-untyped-def]
    """The repository's statistics and the plan it would get now, in words; ``records=False``: no records
    database yet, so no registry row (planned as a repository with no maintenance on record)."""
    import time

    from packyard.store.errors import StoreError
    from packyard.store.maintenance.planning.stats import gather_stats
    from packyard.store.maintenance.planning.strategy import plan_maintenance
    from packyard.workers.records import registry
    from packyard.workers.repos import storage_roots

    row = registry.get(s, repo) if records else None
    path = registry.normalize(repo)
    if not records:
        head = f"repository {path} (no records yet)"
    elif row is None:
        head = f"repository {path} (not registered)"
    else:
        head = (f"repository {path} ({'enabled' if row['enabled'] else 'DISABLED'} for maintenance; "
                f"{row['ingests_since_repack']} ingest(s) since the last repack)")
    if records:
        head += pool_line(s, path)
    try:
        now = time.time()
        stats = gather_stats(repo, history=registry.history(row), now=now, roots=storage_roots(s))
        plan = plan_maintenance(stats, s.maintenance_policy, now)
    except (StoreError, OSError) as err:
        return f"{head}\n  statistics: {type(err).__name__}: {err}"
    d = stats.as_dict(s.maintenance_geometric_factor)
    lines = [
        head,
        f"  packs: {d['packs']} ({d['keep_packs']} .keep, {d['cruft_packs']} cruft), "
        f"{_human_bytes(d['pack_bytes'])}, {d['packed_objects']:,} objects; {d['packs_outside_progression']} "
        f"outside the geometric progression (factor {s.maintenance_geometric_factor})",
        f"  loose objects: ~{d['loose_estimate']:,} ({d['loose_sampled']:,} in {d['loose_sample_dirs']} of 256 "
        f"fan-out directories sampled)",
        f"  leftovers: {d['stale_tmp_objects']} stale tmp objects (sampled), {d['stale_pack_temps']} old pack "
        f"temps, {d['stale_quarantines']} abandoned quarantines; {d['preserved_packs']} preserved pack(s)",
        f"  last full repack: {_ago(d['since_full_repack'])}; last repack: {_ago(d['since_repack'])}",
        f"  commit-graph: {d['graph_layers']} layer(s), {d['graph_commits']:,} commits, generation data "
        f"{'yes' if d['graph_generation_data'] else 'no'}, Bloom filters {'yes' if d['graph_bloom'] else 'no'}, "
        f"{d['graph_tips_missing']} branch tip(s) not in it; loose refs: {d['loose_refs']} (packed at > "
        f"{d['loose_refs_threshold']}), packed-refs {_human_bytes(d['packed_refs_bytes'])}",
    ]
    lines += network_lines(d)
    lines.append(checksum_line(repo))
    if row is not None:
        lines.append(backup_line(row, now))
    last = (row or {}).get("last_plan")
    if row and last:
        lines.append(f"  last planned: {_time(row['last_planned_at']) or '-'} ({last.get('trigger')}): "
                     f"{last.get('action')} -> {last.get('outcome')}"
                     + (f" job {last['job'][:8]}" if last.get('job') else ""))
    params = " ".join(f"{k}={v}" for k, v in plan.params)
    lines.append(f"plan if planned now: {plan.action.value}" + (f" ({params})" if params else ""))
    lines += [f"  - {r}" for r in plan.reasons]
    lines += [f"  deferred: {r}" for r in plan.deferred]
    return "\n".join(lines)
