"""initial tables: repositories, jobs, lock_events, race_events

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "repositories",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(length=4096), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_verified_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_repositories")),
        sa.UniqueConstraint("path", name=op.f("uq_repositories_path")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("repo_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("counters", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_type", sa.String(length=128), nullable=True),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("worker_hostname", sa.String(length=255), nullable=True),
        sa.Column("worker_pid", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["repo_id"], ["repositories.id"], name=op.f("fk_jobs_repo_id_repositories"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("task_id", name=op.f("uq_jobs_task_id")),
    )
    op.create_index(op.f("ix_jobs_kind"), "jobs", ["kind"])
    op.create_index(op.f("ix_jobs_repo_id"), "jobs", ["repo_id"])
    op.create_index(op.f("ix_jobs_state"), "jobs", ["state"])
    op.create_table(
        "lock_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("repo_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.Column("lock_name", sa.String(length=255), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["repo_id"], ["repositories.id"],
                                name=op.f("fk_lock_events_repo_id_repositories"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lock_events")),
    )
    op.create_index(op.f("ix_lock_events_job_id"), "lock_events", ["job_id"])
    op.create_index(op.f("ix_lock_events_repo_id"), "lock_events", ["repo_id"])
    op.create_table(
        "race_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("repo_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["repo_id"], ["repositories.id"],
                                name=op.f("fk_race_events_repo_id_repositories"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_race_events")),
    )
    op.create_index(op.f("ix_race_events_job_id"), "race_events", ["job_id"])
    op.create_index(op.f("ix_race_events_kind"), "race_events", ["kind"])
    op.create_index(op.f("ix_race_events_repo_id"), "race_events", ["repo_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_race_events_repo_id"), table_name="race_events")
    op.drop_index(op.f("ix_race_events_kind"), table_name="race_events")
    op.drop_index(op.f("ix_race_events_job_id"), table_name="race_events")
    op.drop_table("race_events")
    op.drop_index(op.f("ix_lock_events_repo_id"), table_name="lock_events")
    op.drop_index(op.f("ix_lock_events_job_id"), table_name="lock_events")
    op.drop_table("lock_events")
    op.drop_index(op.f("ix_jobs_state"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_repo_id"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_kind"), table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("repositories")
