"""the planner's due list in pages: (enabled, last_planned_at, path) instead of (enabled, last_planned_at)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Issue 21. The nightly planner reads the due list a page at a time by keyset (never planned in
path order, then oldest plan first, ties in path order): with ``path`` in the index each page is
an index walk from where the last one ended, with no sort. The new index leads with the two
columns of the one it replaces, so every query that used that one can use this one.

Downgrade: back to 0005's index.
"""
from __future__ import annotations

from typing import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_repositories_enabled_last_planned_at_path", "repositories",
                    ["enabled", "last_planned_at", "path"])
    op.drop_index("ix_repositories_enabled_last_planned_at", table_name="repositories")


def downgrade() -> None:
    op.create_index("ix_repositories_enabled_last_planned_at", "repositories", ["enabled", "last_planned_at"])
    op.drop_index("ix_repositories_enabled_last_planned_at_path", table_name="repositories")
