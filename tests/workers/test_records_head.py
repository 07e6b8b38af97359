"""upgrade_database's fast path: an embedded SQLite file at the head is not handed to alembic."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from packyard.workers.records import db


def _revision(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    finally:
        conn.close()


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


def test_head_revision_is_alembics_head() -> None:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(db.alembic_config("sqlite:///unused.db"))
    assert script.get_current_head() == db.HEAD_REVISION


def test_a_current_database_does_not_import_alembic(tmp_path: Path) -> None:
    path = tmp_path / "records.db"
    db.upgrade_database(f"sqlite:///{path}")
    assert _revision(path) == db.HEAD_REVISION
    code = ("import sys; from packyard.workers.records.db import upgrade_database; "
            f"upgrade_database({f'sqlite:///{path}'!r}); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ}).stdout.strip()
    assert out == "[]"


def test_a_database_one_behind_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "records.db"
    url = f"sqlite:///{path}"
    db.upgrade_database(url, "0007")
    assert _revision(path) == "0007"
    assert "pools" not in _tables(path)
    assert db._sqlite_revision(path) == "0007"
    db.upgrade_database(url)
    assert _revision(path) == db.HEAD_REVISION
    assert {"pools", "pool_members"} <= _tables(path)   # 0008 really ran, not just its version row


def test_a_file_that_is_not_a_database_goes_to_alembic(tmp_path: Path) -> None:
    path = tmp_path / "records.db"
    path.write_bytes(b"not a database\n" * 100)
    assert db._sqlite_revision(path) is None
    try:
        db.upgrade_database(f"sqlite:///{path}")
    except Exception as exc:   # alembic (SQLAlchemy) names the problem; the fast path did not pretend
        assert "not a database" in str(exc) or "file is" in str(exc)
    else:
        raise AssertionError("a corrupt records file passed as migrated")
