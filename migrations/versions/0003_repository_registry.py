"""repository registry: enabled flag and maintenance history on repositories

Revision ID: 0003
Revises: 0001
Create Date: 2026-11-30

The nightly maintenance run plans the enabled repositories; the recorder counts ingests
since the last repack and remembers the last repacks and the last plan as jobs land.
(Written beside 0002_job_attempts: when both are merged this revision follows 0002.)
"""
from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("enabled", "ingests_since_repack", "last_repack_at", "last_full_repack_at", "last_planned_at",
           "last_plan")


def upgrade() -> None:
    # Plain ALTER TABLE ... ADD/DROP COLUMN (SQLite >= 3.35 has both): a batch "move and copy"
    # would drop and recreate repositories, and with foreign keys on that nulls every job's repo_id.
    op.add_column("repositories", sa.Column("enabled", sa.Boolean(), server_default=sa.true(), nullable=False))
    op.add_column("repositories", sa.Column("ingests_since_repack", sa.Integer(), server_default="0",
                                            nullable=False))
    op.add_column("repositories", sa.Column("last_repack_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("repositories", sa.Column("last_full_repack_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("repositories", sa.Column("last_planned_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("repositories", sa.Column("last_plan", sa.JSON(), nullable=True))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("repositories", name)
