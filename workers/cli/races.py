"""packyard races [--repo R] [--since 1d]: the races on record -- counts per repository and kind, lost reads in full.

``race_events`` rows come from the race harness's readers (``packyard race``: relisted, preserved,
quick_absent, lost) and from jobs that observed a race (``PackyardTask.record_race``). A ``lost``
row is an object that existed and could not be read: each is printed with its whole detail
(object, reader, operation, error, how long it had been in the reader's view, the run).
"""
from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from packyard.store.errors import InvalidInputError
from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.prepare import is_default_sqlite
from packyard.workers.durations import parse_duration
from packyard.workers.settings import get_settings

#: The harness's kinds first, in this order; any other kind a job recorded follows, by name.
KNOWN_KINDS = ("relisted", "preserved", "quick_absent", "lost")


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("races", help="race events on record: counts per repository and kind, lost reads",
                              description="Count race_events rows per repository and kind (relisted, preserved, "
                                          "quick_absent, lost, and any kind a job recorded), then print the "
                                          "most recent lost reads in full.")
    add_repo_arg(p, required=False)
    p.add_argument("--since", default="1d", metavar="WHEN",
                   help="how far back: 90s, 30m, 12h, 1d (default), 2w, or a date (2026-11-30[T12:00])")
    p.add_argument("--lost", type=int, default=20, metavar="N", help="lost reads to print in full (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.set_defaults(func=run, logs=False)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``1d`` / ``12h`` / ``30m`` / ``90s`` / ``2w`` (or git's ``2.days.ago``) before now, or an ISO date (UTC unless
    it says); the spans are read by workers/durations.py."""
    now = now or datetime.now(UTC)
    try:
        seconds = parse_duration(text, bare_seconds=False)   # a bare number is no span here: 20261130 is a date
    except InvalidInputError:
        pass
    else:
        if seconds != float("inf"):
            return now - timedelta(seconds=seconds)
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read --since {text!r}: want e.g. 1d, 12h, 30m or 2026-11-30") \
            from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def fetch(s, repo: str | None, since: datetime, lost_limit: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Counts per (repository, kind) since ``since``, and the newest ``lost_limit`` lost rows."""
    from sqlalchemy import func, select

    from packyard.workers.records import RaceEvent, Repository, session_scope
    from packyard.workers.records.recorder import normalize_repo_path

    with session_scope(s) as session:
        q = (select(Repository.path, RaceEvent.kind, func.count(), func.max(RaceEvent.observed_at))
             .select_from(RaceEvent).outerjoin(Repository, RaceEvent.repo_id == Repository.id)
             .where(RaceEvent.observed_at >= since).group_by(Repository.path, RaceEvent.kind))
        lq = (select(RaceEvent, Repository.path).outerjoin(Repository, RaceEvent.repo_id == Repository.id)
              .where(RaceEvent.observed_at >= since).where(RaceEvent.kind == "lost")
              .order_by(RaceEvent.id.desc()).limit(lost_limit))
        if repo:
            q = q.where(Repository.path == normalize_repo_path(repo))
            lq = lq.where(Repository.path == normalize_repo_path(repo))
        counts: dict[str, dict[str, int]] = {}
        last: dict[str, datetime] = {}
        for path, kind, n, at in session.execute(q):
            key = path or "(no repository)"
            counts.setdefault(key, {})[kind] = int(n)
            if at is not None and (key not in last or at > last[key]):
                last[key] = at
        lost = [{"at": ev.observed_at, "repo": path, "job": ev.job_id, "detail": ev.detail}
                for ev, path in session.execute(lq)]
    return {"since": since, "counts": counts, "last": last, "lost": lost}


def kinds_of(counts: dict[str, dict[str, int]]) -> list[str]:
    seen = {k for per in counts.values() for k in per}
    return [k for k in KNOWN_KINDS if k in seen or k in ("relisted", "preserved", "lost")] + \
        sorted(seen - set(KNOWN_KINDS))


def render(data: dict[str, Any]) -> str:
    counts = data["counts"]
    since = data["since"].strftime("%Y-%m-%d %H:%M:%S UTC")
    if not counts:
        return f"no race events since {since}"
    kinds = kinds_of(counts)
    header = ["repository", *kinds, "total", "last (UTC)"]
    rows = []
    for repo in sorted(counts):
        per = counts[repo]
        at = data["last"].get(repo)
        rows.append([repo, *(f"{per.get(k, 0):,}" for k in kinds), f"{sum(per.values()):,}",
                     at.strftime("%Y-%m-%d %H:%M:%S") if at else ""])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    out = [f"race events since {since}", fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)]
    lost = data["lost"]
    total_lost = sum(per.get("lost", 0) for per in counts.values())
    out.append("")
    if not lost:
        out.append("no lost reads")
    else:
        out.append(f"lost reads: {total_lost:,}; the newest {len(lost)} in full (an object that existed and could "
                   "not be read: a bug)")
        for ev in lost:
            d = dict(ev["detail"] or {})
            at = ev["at"].strftime("%Y-%m-%d %H:%M:%S") if ev["at"] else "?"
            out.append(f"  {at}  {ev['repo']}  run/job {(ev['job'] or '-')[:8]}  object {d.pop('oid', '?')}  "
                       f"op {d.pop('op', '?')}  reader {d.pop('reader', '-')}")
            error = d.pop("error", None)
            if error:
                out.append(f"      {error}")
            if d:
                out.append("      " + json.dumps(d, sort_keys=True, default=str))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    s = get_settings()
    if is_default_sqlite(s) and not (s.state_dir / "packyard.db").exists():
        print(f"no records yet ({s.state_dir / 'packyard.db'} does not exist)")
        return 0
    since = parse_since(args.since)
    data = fetch(s, args.repo, since, args.lost)
    if args.json:
        print(json.dumps(data, default=str))
    else:
        print(render(data))
    return 0
