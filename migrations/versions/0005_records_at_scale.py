"""records at fleet scale: aggregate counters, plan statistics as columns, an index per query

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Issue 21. ``record_totals`` (since the records began) and ``record_daily`` (per UTC day) count
finished jobs (with a duration histogram), lock events and race events as they are written, so
a scrape reads a few dozen rows instead of grouping the whole history, and ``packyard records
prune`` can delete old rows without the dashboards losing their counts. The upgrade seeds both
from the rows already recorded (a few GROUP BYs, once).

``repositories`` gets the last plan's statistics as columns (``stat_packs``,
``stat_loose_objects``, ``stats_at``) and the action it calls for (``due_action``), filled from
``last_plan`` here (a plan whose job was already queued is not counted as due: that job has most
likely landed), so the exporter's top N and distributions are index reads. New indexes
serve ``status``, ``status --repo``, the reconciler, the planner and prune; two single-column
indexes that a composite one now leads are dropped (``ix_jobs_repo_id``, ``ix_jobs_state``).

Downgrade: the aggregate tables and the new columns go (the rows they counted stay); the
indexes return to 0004's.
"""
from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: workers/records/models.py DURATION_BUCKETS, in milliseconds (spelled out: a migration stays as written).
BUCKETS_MS = (100, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 900000, 3600000, 14400000)
BUCKETS = tuple(f"b{i}" for i in range(len(BUCKETS_MS)))
COUNTED = ("events", "timed", "duration_ms_sum", *BUCKETS)
MAINTENANCE_LOCK_PREFIX = "packyard:lock:maint:"

REPOSITORY_INDEXES = (
    ("ix_repositories_enabled_last_planned_at", ["enabled", "last_planned_at"]),
    ("ix_repositories_enabled_stat_packs", ["enabled", "stat_packs"]),
    ("ix_repositories_enabled_stat_loose_objects", ["enabled", "stat_loose_objects"]),
    ("ix_repositories_enabled_last_full_repack_at", ["enabled", "last_full_repack_at"]),
    ("ix_repositories_enabled_ingests_since_repack", ["enabled", "ingests_since_repack"]),
    ("ix_repositories_enabled_due_action", ["enabled", "due_action"]),
)
JOB_INDEXES = (
    ("ix_jobs_repo_id_id", ["repo_id", "id"]),
    ("ix_jobs_repo_id_kind_id", ["repo_id", "kind", "id"]),
    ("ix_jobs_state_kind", ["state", "kind"]),
    ("ix_jobs_finished_at_id", ["finished_at", "id"]),
)


def _counted_columns() -> list[sa.Column]:
    return [sa.Column(c, sa.BigInteger(), server_default=sa.text("0"), nullable=False) for c in COUNTED]


def upgrade() -> None:
    op.create_table(
        "record_totals",
        sa.Column("family", sa.String(length=8), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        *_counted_columns(),
        sa.PrimaryKeyConstraint("family", "kind", "state", name=op.f("pk_record_totals")),
    )
    op.create_table(
        "record_daily",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("family", sa.String(length=8), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        *_counted_columns(),
        sa.PrimaryKeyConstraint("day", "family", "kind", "state", name=op.f("pk_record_daily")),
    )
    op.add_column("repositories", sa.Column("stats_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("repositories", sa.Column("stat_packs", sa.Integer(), nullable=True))
    op.add_column("repositories", sa.Column("stat_loose_objects", sa.BigInteger(), nullable=True))
    op.add_column("repositories", sa.Column("due_action", sa.String(length=16), nullable=True))
    for name, cols in REPOSITORY_INDEXES:
        op.create_index(name, "repositories", cols)
    op.drop_index("ix_jobs_repo_id", table_name="jobs")
    op.drop_index("ix_jobs_state", table_name="jobs")
    for name, cols in JOB_INDEXES:
        op.create_index(name, "jobs", cols)
    op.create_index("ix_lock_events_at", "lock_events", ["at"])
    _seed_aggregates()
    _fill_plan_columns()


def _seed_aggregates() -> None:
    """Count what is already recorded, as the recorder would have counted it."""
    dialect = op.get_bind().dialect.name
    day = {"postgresql": "CAST({} AT TIME ZONE 'UTC' AS DATE)"}.get(dialect, "DATE({})")
    buckets, lower = [], None
    for bound in BUCKETS_MS:
        cond = f"duration_ms <= {bound}" if lower is None else f"duration_ms > {lower} AND duration_ms <= {bound}"
        buckets.append(f"SUM(CASE WHEN {cond} THEN 1 ELSE 0 END)")
        lower = bound
    job_counts = ("COUNT(*), COUNT(duration_ms), COALESCE(SUM(duration_ms), 0), "
                  + ", ".join(f"COALESCE({b}, 0)" for b in buckets))
    lease = f"CASE WHEN lock_name LIKE '{MAINTENANCE_LOCK_PREFIX}%' THEN 'maintenance' ELSE 'repo' END"
    zeros = ", ".join("0" for _ in range(len(COUNTED) - 1))
    cols = ", ".join(COUNTED)
    for table, key, key_sql in (("record_totals", "", ""), ("record_daily", "day, ", "{}, ")):
        op.execute(f"INSERT INTO {table} ({key}family, kind, state, {cols}) "
                   f"SELECT {key_sql.format(day.format('finished_at'))}'job', kind, state, {job_counts} FROM jobs "
                   "WHERE state IN ('SUCCESS', 'FAILURE') AND finished_at IS NOT NULL "
                   f"GROUP BY {key_sql.format(day.format('finished_at'))}kind, state")
        op.execute(f"INSERT INTO {table} ({key}family, kind, state, {cols}) "
                   f"SELECT {key_sql.format(day.format('at'))}'lock', {lease}, event, COUNT(*), {zeros} "
                   f"FROM lock_events GROUP BY {key_sql.format(day.format('at'))}{lease}, event")
        op.execute(f"INSERT INTO {table} ({key}family, kind, state, {cols}) "
                   f"SELECT {key_sql.format(day.format('observed_at'))}'race', kind, '', COUNT(*), {zeros} "
                   f"FROM race_events GROUP BY {key_sql.format(day.format('observed_at'))}kind")


def _fill_plan_columns() -> None:
    """Each repository's last plan's statistics into the new columns (read once, in batches of ids)."""
    bind = op.get_bind()
    from datetime import UTC, datetime

    repos = sa.table("repositories", sa.column("id", sa.Integer()), sa.column("last_plan", sa.JSON()),
                     sa.column("stats_at", sa.DateTime(timezone=True)),
                     sa.column("stat_packs", sa.Integer()), sa.column("stat_loose_objects", sa.BigInteger()),
                     sa.column("due_action", sa.String()))
    after = 0
    while True:   # bounded: each round moves past 1,000 ids
        rows = bind.execute(sa.select(repos.c.id, repos.c.last_plan).where(repos.c.id > after)
                            .where(repos.c.last_plan.is_not(None)).order_by(repos.c.id).limit(1000)).all()
        if not rows:
            return
        for rid, plan in rows:
            stats = (plan or {}).get("stats") or {}
            action = (plan or {}).get("action")
            at = (plan or {}).get("at")
            bind.execute(sa.update(repos).where(repos.c.id == rid).values(
                stats_at=datetime.fromtimestamp(at, UTC) if isinstance(at, (int, float)) and stats else None,
                stat_packs=stats.get("packs"), stat_loose_objects=stats.get("loose_estimate"),
                due_action=action if action and action != "nothing" and (plan or {}).get("outcome") != "queued"
                else None))
        after = rows[-1][0]


def downgrade() -> None:
    op.drop_index("ix_lock_events_at", table_name="lock_events")
    for name, _cols in reversed(JOB_INDEXES):
        op.drop_index(name, table_name="jobs")
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_repo_id", "jobs", ["repo_id"])
    for name, _cols in reversed(REPOSITORY_INDEXES):
        op.drop_index(name, table_name="repositories")
    op.drop_column("repositories", "due_action")
    op.drop_column("repositories", "stat_loose_objects")
    op.drop_column("repositories", "stat_packs")
    op.drop_column("repositories", "stats_at")
    op.drop_table("record_daily")
    op.drop_table("record_totals")
