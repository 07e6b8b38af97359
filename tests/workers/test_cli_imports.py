"""What ``packyard status`` and ``packyard --help`` import (issue 39), and the light job-row reader status uses.

The import sets are read from a real process, as an operator starts it (``python -X importtime``, the
installed script's own ``main()``): SQLAlchemy, Celery, kombu, Redis, structlog and the store's C
extensions stay out of ``status --no-reconcile`` on SQLite, and ``--help`` imports no command module. The
reader (records/jobrows.py) must give the rows the ORM query gives, on the same database.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from packyard.store.native import EXTENSIONS
from packyard.workers.cli import COMMANDS, build_parser
from packyard.workers.records import Job, JobState, Repository, jobrows, session_scope, upgrade_database, utcnow
from packyard.workers.records.models import LeaseOutcome
from packyard.workers.settings import Settings

ENTRY = "import sys; from packyard.workers.cli import main; sys.exit(main())"
#: modules (and their submodules) whose import is the start-up cost issue 39 removed
HEAVY = ("sqlalchemy", "alembic", "celery", "kombu", "redis", "structlog", "psycopg", "packyard.workers.app",
         *EXTENSIONS.values())


def imported(args: list[str], state: Path) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules a ``packyard <args>`` process imported (from -X importtime's report on stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACKYARD_")}
    env["PACKYARD_STATE_DIR"] = str(state)
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", ENTRY, *args], env=env, cwd=state.parent,
                         capture_output=True, text=True, timeout=120)
    names = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    names.discard("package")   # the report's header line
    assert "packyard.workers.cli" in names, out.stderr[-2000:]
    return names, out


def heavy(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY))


def test_status_no_reconcile_imports_no_orm_celery_or_extensions(tmp_path: Path) -> None:
    state = tmp_path / "state"
    upgrade_database(f"sqlite:///{state / 'packyard.db'}")
    names, out = imported(["status", "--no-reconcile"], state)
    assert out.returncode == 0 and out.stdout == "no jobs recorded\n", out.stderr[-2000:]
    assert heavy(names) == []
    assert "sqlite3" in names   # it did read the database


def test_status_without_database_imports_nothing_heavy(tmp_path: Path) -> None:
    names, out = imported(["status", "--no-reconcile"], tmp_path / "state")
    assert out.returncode == 0 and out.stdout.startswith("no job records yet"), out.stderr[-2000:]
    assert heavy(names) == []


def test_help_imports_no_command_module(tmp_path: Path) -> None:
    names, out = imported(["--help"], tmp_path / "state")
    assert out.returncode == 0 and all(name in out.stdout for name in COMMANDS)
    assert heavy(names) == []
    commands = sorted(n for n in names if n.startswith("packyard.workers.cli."))
    assert commands == [], commands
    assert not any(n.startswith("packyard.store.") for n in names)


def test_commands_table_lines_are_the_modules_help() -> None:
    """``--help`` shows COMMANDS' lines without importing the modules: each must equal its module's help=."""
    full = []
    for name, entry in COMMANDS.items():
        parser = build_parser(only=name)
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        (action,) = sub._choices_actions
        assert action.dest == name
        if not isinstance(entry, str):
            assert entry[1] == action.help, name
        full.append((name, action.help))
    stub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert [(a.dest, a.help) for a in stub._choices_actions] == full


def test_reader_columns_are_the_models() -> None:
    columns = set(Job.__table__.columns.keys())
    assert set(jobrows.JOB_COLUMNS.values()) | {"params", "repo_id"} <= columns
    assert set(Repository.__table__.columns.keys()) >= {"id", "path"}


@pytest.fixture
def filled(records_url: str) -> Settings:
    """Jobs of every shape status lists: linked and unlinked (params naming a repository), running, finished with
    counters, a lease and an error, and one with no params at all."""
    from packyard.workers.cli.status import fetch_orm

    t0 = utcnow() - timedelta(hours=1)
    with session_scope(records_url) as s:
        repo = Repository(path="/srv/r.git")
        s.add(repo)
        s.flush()
        for i in range(30):
            s.add(Job(
                task_id=f"task-{i:03d}", kind="packyard.index_pack" if i % 2 else "packyard.repack",
                repo_id=repo.id if i % 3 == 0 else None, state=list(JobState)[i % len(JobState)],
                params=None if i % 5 == 0 else {"repo": f"/srv/other-{i}.git", "n": i},
                queued_at=t0 + timedelta(seconds=i, microseconds=0 if i % 4 else 1234),
                started_at=None if i % 7 == 0 else t0 + timedelta(seconds=i + 1),
                finished_at=t0 + timedelta(seconds=i + 2) if i % 2 else None,
                duration_ms=i * 10 if i % 2 else None, counters={"objects": i, "bytes": i << 20} if i % 2 else None,
                error="boom\nsecond line" if i % 6 == 1 else None, retries=i % 3,
                worker_hostname=f"w{i % 2}@host" if i % 7 else None, worker_pid=1000 + i if i % 7 else None,
                attempts=i % 4, first_started_at=t0 if i % 7 else None, last_started_at=t0 if i % 7 else None,
                lease=list(LeaseOutcome)[i % len(LeaseOutcome)] if i % 4 == 0 else None,
                lease_wait_ms=i * 100 if i % 4 == 0 else None))
    s = replace(Settings.from_env(), database_url=records_url)
    assert len(fetch_orm(s, None, 50)) == 30
    return s


def test_reader_gives_the_orm_rows(filled: Settings) -> None:
    from packyard.workers.cli.status import fetch, fetch_orm

    url = filled.database_url
    for limit in (1, 7, 50):
        rows = jobrows.newest(url, limit)
        assert rows is not None
        assert rows == fetch_orm(filled, None, limit)
        assert fetch(filled, None, limit) == rows
    picked = ["task-004", "task-017", "task-029", "no-such-task"]
    assert jobrows.newest(url, 20, picked) == fetch_orm(filled, None, 20, picked)
    assert [r["task_id"] for r in jobrows.newest(url, 20, picked) or []] == ["task-029", "task-017", "task-004"]
    assert jobrows.newest(url, 20, []) == fetch_orm(filled, None, 20, []) == []


def test_reader_never_creates_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "absent.db"
    assert jobrows.newest(f"sqlite:///{missing}", 5) is None   # the caller's SQLAlchemy path creates it 0600
    assert not missing.exists()
    assert jobrows.newest("mysql://h/db", 5) is None


def test_lazy_package_names_are_the_modules() -> None:
    """store/ and records/ load their names on first use: each listed name is there, and is the module's own."""
    import importlib

    import packyard.store
    import packyard.workers.records

    for pkg in (packyard.store, packyard.workers.records):
        assert sorted(pkg.__all__) == sorted(pkg._EXPORTS)  # type: ignore[attr-defined]
        for name, module in pkg._EXPORTS.items():  # type: ignore[attr-defined]
            assert getattr(pkg, name) is getattr(importlib.import_module(f"{pkg.__name__}.{module}"), name)
        with pytest.raises(AttributeError):
            pkg.no_such_name  # type: ignore[attr-defined]  # noqa: B018


#: what ``packyard index-pack`` needs none of on a local disk (each was a few ms of every push's start-up):
#: dulwich's pack module (the idx is read by store/pack/idxread.py), multiprocessing (the forked resolvers share
#: a PipeLock), concurrent.futures (fsparallel's pool: shared filesystems only), socket, uuid.
INDEX_PACK_UNUSED = ("dulwich.pack", "multiprocessing", "concurrent.futures", "socket", "uuid", "logging")


def test_index_pack_imports_only_what_it_uses(tmp_path: Path) -> None:
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    src = tmp_path / "src.git"
    subprocess.run(["git", "init", "-q", "--bare", str(src)], check=True)
    blob = subprocess.run(["git", "--git-dir", str(src), "hash-object", "-w", "--stdin"], input=b"hello\n",
                          capture_output=True, check=True).stdout
    pack = tmp_path / "p.pack"
    pack.write_bytes(subprocess.run(["git", "--git-dir", str(src), "pack-objects", "--stdout", "-q"], input=blob,
                                    capture_output=True, check=True).stdout)
    names, out = imported(["index-pack", "--repo", str(repo), "--strict", "--json", "--no-progress", str(pack)],
                          tmp_path / "state")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "packyard.store.pack.indexpack" in names
    assert sorted(n for n in names if any(n == u or n.startswith(u + ".") for u in INDEX_PACK_UNUSED)) == []
