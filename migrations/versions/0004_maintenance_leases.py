"""maintenance leases on the records: lease outcome and wait on jobs, wait and detail on lock events

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Issue 11: repack and gc of one repository never run at once. A job that waited for the
maintenance lease, skipped because it was taken (a scheduled run), took it over from a holder
whose lease ran out, or lost it while working says so on its row (``jobs.lease``,
``jobs.lease_wait_ms``); every acquire records how long it waited (``lock_events.waited_ms``)
and the holder it found, replaced or the step it aborted (``lock_events.detail``). The new
event kinds (taken_over, skipped, aborted, wait_timeout) need no DDL (stored as strings).
``race_events.observed_at`` gets an index: ``packyard races --since`` filters on it.

Downgrade: the columns go; lock events of the new kinds are deleted (the code before this
revision cannot read those kinds, and no older kind means the same thing).
"""
from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NEW_EVENT_KINDS = ("taken_over", "skipped", "aborted", "wait_timeout")


def upgrade() -> None:
    # Plain ADD/DROP COLUMN (SQLite >= 3.35): a batch "move and copy" would recreate the tables.
    op.add_column("jobs", sa.Column("lease", sa.String(length=16), nullable=True))
    op.add_column("jobs", sa.Column("lease_wait_ms", sa.BigInteger(), nullable=True))
    op.add_column("lock_events", sa.Column("waited_ms", sa.BigInteger(), nullable=True))
    op.add_column("lock_events", sa.Column("detail", sa.JSON(), nullable=True))
    op.create_index(op.f("ix_race_events_observed_at"), "race_events", ["observed_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_race_events_observed_at"), table_name="race_events")
    kinds = ", ".join(f"'{k}'" for k in NEW_EVENT_KINDS)
    op.execute(f"DELETE FROM lock_events WHERE event IN ({kinds})")
    op.drop_column("lock_events", "detail")
    op.drop_column("lock_events", "waited_ms")
    op.drop_column("jobs", "lease_wait_ms")
    op.drop_column("jobs", "lease")
