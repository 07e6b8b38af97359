"""backups: each repository's newest good backup and its last failed one (issue 38)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07

The backup root's manifests (store/backup/manifest.py) are the truth about what a backup holds; these
columns are what the service shows and alerts on without reading every manifest: ``packyard status``, the
exporter's age-of-newest-good-backup histogram and its top N oldest.

* ``last_backup_at``: when the repository's newest backup job succeeded (a backup that found nothing new
  counts: the chain is as current as the refs);
* ``last_backup_failed_at``: when its last backup job failed (left as it is by a later success, so status
  can tell "failed since the last good one" by comparing the two);
* ``backup_entry``, ``backup_checksum``: the manifest entry id and the repository checksum of the newest good
  backup (``packyard status --repo`` prints them; ``verify --against`` compares checksums).

``ix_repositories_enabled_last_backup_at`` serves the exporter's oldest-first top N and its GROUP BY.

Downgrade: the columns and the index go (the manifests keep every backup).
"""
from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("repositories", sa.Column("last_backup_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("repositories", sa.Column("last_backup_failed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("repositories", sa.Column("backup_entry", sa.String(length=64), nullable=True))
    op.add_column("repositories", sa.Column("backup_checksum", sa.String(length=64), nullable=True))
    op.create_index("ix_repositories_enabled_last_backup_at", "repositories", ["enabled", "last_backup_at"])


def downgrade() -> None:
    op.drop_index("ix_repositories_enabled_last_backup_at", table_name="repositories")
    # plain DROP COLUMN (SQLite >= 3.35 has it): a batch rebuild of the table would set the jobs' links to NULL
    for column in ("backup_checksum", "backup_entry", "last_backup_failed_at", "last_backup_at"):
        op.drop_column("repositories", column)
