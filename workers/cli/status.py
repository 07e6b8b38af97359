"""packyard status: recent jobs from the records database, as a table."""
from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from workers.cli import common

COLUMNS = ("job", "task id", "kind", "repo", "state", "queued (UTC)", "ms", "worker", "counters", "error")


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("status", help="recent jobs as a table",
                              description="Recent jobs from PACKYARD_DATABASE_URL, newest first.")
    common.add_repo_arg(p, required=False)
    p.add_argument("--limit", type=int, default=20, help="number of jobs (default 20)")
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.set_defaults(func=run)


def _counters(c: dict[str, Any] | None) -> str:
    if not c:
        return ""
    keys = [k for k in ("objects", "commits", "trees", "blobs", "tags", "refs") if k in c] or list(c)[:6]
    return " ".join(f"{k}={c[k]}" for k in keys)


def _time(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else ""


def fetch(s, repo: str | None, limit: int) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from workers.records import Job, Repository, session_scope
    from workers.records.recorder import normalize_repo_path

    with session_scope(s) as session:
        q = select(Job, Repository.path).outerjoin(Repository, Job.repo_id == Repository.id)
        if repo:
            q = q.where(Repository.path == normalize_repo_path(repo))
        q = q.order_by(Job.id.desc()).limit(limit)
        return [{
            "id": job.id, "task_id": job.task_id, "kind": job.kind, "repo": path, "state": job.state.value,
            "queued_at": job.queued_at, "started_at": job.started_at, "finished_at": job.finished_at,
            "duration_ms": job.duration_ms, "counters": job.counters, "error": job.error,
            "worker": job.worker_hostname, "pid": job.worker_pid,
        } for job, path in session.execute(q)]


def render_table(rows: Sequence[dict[str, Any]], width: int = 60) -> str:
    cells = [(str(r["id"]), r["task_id"][:8], r["kind"].removeprefix("packyard."),
              _short_path(r["repo"]), r["state"], _time(r["queued_at"] or r["started_at"]),
              "" if r["duration_ms"] is None else str(r["duration_ms"]),
              f"{(r['worker'] or '').split('@')[0]}/{r['pid']}" if r["worker"] else "", _counters(r["counters"]),
              _clip((r["error"] or "").replace("\n", " "), width)) for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(COLUMNS)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(COLUMNS), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    return "\n".join(out)


def _short_path(p: str | None) -> str:
    if not p:
        return ""
    try:
        return str(Path(p).relative_to(Path.cwd()))
    except ValueError:
        return p


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def run(args: argparse.Namespace) -> int:
    s = common.settings()
    if common.is_default_sqlite(s) and not (s.state_dir / "packyard.db").exists():
        print(f"no job records yet ({s.state_dir / 'packyard.db'} does not exist)")
        return 0
    rows = fetch(s, args.repo, args.limit)
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
        return 0
    if not rows:
        print("no jobs recorded" + (f" for {args.repo}" if args.repo else ""))
        return 0
    print(render_table(rows))
    return 0
