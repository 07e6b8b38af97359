"""object pools: which pool a fork network's repositories borrow from (issue 36)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05

A pool (store/maintenance/pool) is a repository that holds the objects its members share; each
member reads them through ``objects/info/alternates``. The disk is the truth (the pool's
``packyard/members`` file, the members' alternates files); these rows are what the service shows
and plans with (``packyard pool list``, ``packyard status``, the nightly planner) and what
``pool delete`` refuses on, written by the pool jobs after each step landed on disk.

* ``pools``: one row per pool repository (``repo_id``, unique), the repository it was made from
  (``source_id``), when it was created and last fetched into, and how many fetches.
* ``pool_members``: one row per member (``repo_id`` unique: a repository borrows from one pool at
  most), its ref namespace key in the pool, when it was linked.

Both reference ``repositories``: a pool row goes with its repository's row (CASCADE), and its
member rows with it.

Downgrade: both tables go (the disk keeps every pool and member as it is).
"""
from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("repo_id", sa.Integer(), nullable=False),
        sa.Column("source_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_fetched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("fetches", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(["repo_id"], ["repositories.id"], name=op.f("fk_pools_repo_id_repositories"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["source_id"], ["repositories.id"], name=op.f("fk_pools_source_id_repositories"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pools")),
        sa.UniqueConstraint("repo_id", name=op.f("uq_pools_repo_id")),
    )
    op.create_table(
        "pool_members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pool_id", sa.Integer(), nullable=False),
        sa.Column("repo_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("linked_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["pool_id"], ["pools.id"], name=op.f("fk_pool_members_pool_id_pools"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["repo_id"], ["repositories.id"],
                                name=op.f("fk_pool_members_repo_id_repositories"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pool_members")),
        sa.UniqueConstraint("repo_id", name=op.f("uq_pool_members_repo_id")),
    )
    op.create_index(op.f("ix_pool_members_pool_id"), "pool_members", ["pool_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_pool_members_pool_id"), table_name="pool_members")
    op.drop_table("pool_members")
    op.drop_table("pools")
