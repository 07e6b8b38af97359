"""the LOST jobs as a level in record_totals, so a scrape reads no LOST row

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

Issue 21. The exporter counted LOST jobs from their rows (``GROUP BY state, kind`` over
``ix_jobs_state_kind``): those rows are bounded only by the retention, so a scrape's cost grew
with the history kept. From this revision ``record_totals`` holds, per job kind, how many job
rows are LOST now (``family = 'level'``, ``state = 'LOST'``, in ``events``), moved by the
recorder in the same transaction as each row that enters LOST (the reconciler's mark) or
leaves it (a re-queue, a retry, a start, a finish, prune). ``record_daily`` gets no level: its
``(job, kind, LOST)`` rows count the jobs marked LOST each day (events).

The upgrade seeds the level from the LOST rows already recorded and the daily marks from those
rows' ``finished_at`` (the time of their mark); rows of either a newer recorder wrote before
this revision was applied are replaced by the counts from the rows.

Downgrade: the level rows and the daily LOST rows go (0006's exporter counts LOST rows again).
"""
from __future__ import annotations

from typing import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The other counted columns (timed, duration_ms_sum, b0..b11) take their server default, 0.
    dialect = op.get_bind().dialect.name
    day = {"postgresql": "CAST(finished_at AT TIME ZONE 'UTC' AS DATE)"}.get(dialect, "DATE(finished_at)")
    op.execute("DELETE FROM record_totals WHERE family = 'level'")
    op.execute("INSERT INTO record_totals (family, kind, state, events) "
               "SELECT 'level', kind, 'LOST', COUNT(*) FROM jobs WHERE state = 'LOST' GROUP BY kind")
    op.execute("DELETE FROM record_daily WHERE family = 'job' AND state = 'LOST'")
    op.execute("INSERT INTO record_daily (day, family, kind, state, events) "
               f"SELECT {day}, 'job', kind, 'LOST', COUNT(*) FROM jobs "
               f"WHERE state = 'LOST' AND finished_at IS NOT NULL GROUP BY {day}, kind")


def downgrade() -> None:
    op.execute("DELETE FROM record_daily WHERE family = 'job' AND state = 'LOST'")
    op.execute("DELETE FROM record_totals WHERE family = 'level'")
