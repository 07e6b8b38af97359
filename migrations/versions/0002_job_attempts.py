"""jobs: count deliveries (attempts, first and last start) and remember when a pending job went unseen

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

A redelivered job (worker killed, broker restarted, visibility timeout) used to overwrite
``started_at`` and leave no trace. ``attempts`` counts every delivery, ``first_started_at`` /
``last_started_at`` bracket them. ``unseen_since`` is the reconciler's memory: a pending job
(QUEUED/STARTED/RETRY) whose message no queue holds and no worker runs is marked LOST only
after it was unseen for the grace period. The LOST state itself needs no DDL (states are
stored as plain strings).

Rows that had started before this revision count one delivery.
"""
from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False))
        batch.add_column(sa.Column("first_started_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("last_started_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("unseen_since", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE jobs SET attempts = 1, first_started_at = started_at, last_started_at = started_at "
               "WHERE started_at IS NOT NULL")


def downgrade() -> None:
    op.execute("UPDATE jobs SET state = 'FAILURE', error = 'LOST: ' || coalesce(error, '') WHERE state = 'LOST'")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("unseen_since")
        batch.drop_column("last_started_at")
        batch.drop_column("first_started_at")
        batch.drop_column("attempts")
