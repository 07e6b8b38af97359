""".ci/postgres.sh for real (issue 39): a run killed with SIGKILL leaves its server running; the next run stops it
through its directory's marker, starts its own on a free port, and both servers answered queries.

Skipped without PostgreSQL's binaries (/usr/lib/postgresql/*/bin).
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PSQL_CHECK = ('python3 -c "import psycopg, os; '
              'print(psycopg.connect(os.environ[\'PACKYARD_TEST_POSTGRES_URL\'].replace(\'+psycopg\', \'\'))'
              '.execute(\'select 42\').fetchone()[0])"')

pytestmark = pytest.mark.skipif(not glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                                reason="no PostgreSQL binaries (/usr/lib/postgresql/*/bin)")


def test_second_start_after_sigkill_stops_the_leftover_and_works() -> None:
    base = Path(tempfile.mkdtemp(prefix="packyard-pgtest-"))
    base.chmod(0o711)   # the postgres user must reach its data directory
    env = {**os.environ, "CI_PG_TMP": str(base), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    first = subprocess.Popen(["bash", "-c", f"set -euo pipefail; . .ci/postgres.sh; ci_pg_start; {PSQL_CHECK}; "
                                            "echo ready; sleep 600"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert first.stdout is not None
        lines = []
        for _ in range(100):   # bounded: the first run's few lines, then "ready"
            line = first.stdout.readline()
            lines.append(line)
            if line.strip() in ("ready", ""):
                break
        assert lines[-1].strip() == "ready", lines
        assert "42\n" in lines
        (leftover,) = base.glob("packyard-ci-pg.*")
        assert (leftover / "data" / "postmaster.pid").exists()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        second = subprocess.run(["bash", "-c", f"set -euo pipefail; . .ci/postgres.sh; trap ci_pg_stop EXIT; "
                                               f"ci_pg_start; {PSQL_CHECK}"],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "an earlier run left behind" in second.stdout and str(leftover) in second.stdout
        assert second.stdout.rstrip().endswith("42")
        assert not leftover.exists()                    # the leftover stopped and removed
        assert list(base.glob("packyard-ci-pg.*")) == []  # and the second run's own, by its EXIT trap
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
        for _ in range(3):   # bounded clean-up of whatever is left if an assertion failed
            subprocess.run(["bash", "-c", ". .ci/postgres.sh; ci_pg_reap_leftovers"], cwd=ROOT, env=env,
                           capture_output=True, timeout=120)
            if not list(base.glob("packyard-ci-pg.*")):
                break
            time.sleep(1)
        shutil.rmtree(base, ignore_errors=True)
