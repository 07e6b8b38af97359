"""Issue 16: `packyard status --repo` takes `<storage>:<path>` and shows a repository's statistics before any
records database exists; `packyard submit <task> --help` lists the task's parameters."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gitutil import git, make_worktree_repo


@pytest.fixture
def fresh_env(pk):
    """A state dir with no database and no Redis, one storage root."""
    base = Path(tempfile.mkdtemp(prefix="pks-", dir="/tmp")).resolve()
    env = pk.cli_env(PACKYARD_STATE_DIR=str(base / "state"), PACKYARD_STORAGE_ROOTS=f"default={base / 'root'}",
                     PACKYARD_INCOMING_DIR=str(base / "incoming"))
    for key in ("PACKYARD_REDIS_URL", "PACKYARD_DATABASE_URL"):
        env.pop(key, None)
    yield base, env
    shutil.rmtree(base, ignore_errors=True)


def _run(env, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["packyard", *argv], env=env, capture_output=True, text=True, timeout=120)


def test_status_repo_by_storage_address_before_any_records(fresh_env):
    base, env = fresh_env
    repo = make_worktree_repo(base / "root" / "team")          # <root>/team/repo.git, all loose
    git("repack", "-q", "-a", "-d", git_dir=repo)
    git("hash-object", "-w", "--stdin", git_dir=repo, input=b"one more loose object\n")
    counts = dict(line.split(": ") for line in git("count-objects", "-v", git_dir=repo).decode().splitlines())

    out = _run(env, "status", "--repo", "default:team/repo.git")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith(f"repository {repo.resolve()} (no records yet)\n"), out.stdout
    packed = int(git("show-index", input=next((repo / "objects" / "pack").glob("*.idx")).read_bytes())
                 .decode().count("\n"))
    assert f"  packs: {counts['packs']} (0 .keep, 0 cruft), " in out.stdout
    assert f", {packed:,} objects;" in out.stdout
    assert re.search(r"\n  loose objects: ~\d+ \(\d in \d+ of 256 fan-out directories sampled\)\n", out.stdout)
    assert counts["count"] == "1"
    assert "\nplan if planned now: " in out.stdout
    assert out.stdout.endswith(f"no job records yet ({base / 'state' / 'packyard.db'} does not exist)\n")
    assert not (base / "state").exists(), "status created the state dir (or a database) as a side effect"

    # The same repository by its path gives the same statistics.
    by_path = _run(env, "status", "--repo", str(repo))
    assert by_path.returncode == 0 and by_path.stdout == out.stdout

    bad = _run(env, "status", "--repo", "archive:team/repo.git")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr == ("packyard status: InvalidInputError: repository 'archive:team/repo.git' names storage "
                          f"'archive', which is not configured (PACKYARD_STORAGE_ROOTS: default={base / 'root'})\n")


def test_status_repo_by_storage_address_with_records(pk, store_root, migrated_db):
    repo = make_worktree_repo(store_root)
    relative = repo.relative_to(pk.storage_root)
    out = _run(pk.cli_env(), "status", "--repo", f"default:{relative}", "--no-reconcile")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"repository {repo.resolve()} (not registered)\n"), out.stdout
    assert out.stdout.rstrip().endswith(f"no jobs recorded for {repo.resolve()}")


def test_submit_task_help_lists_its_parameters(pk):
    import inspect

    import packyard.workers.tasks  # noqa: F401
    from packyard.workers.app import app

    out = _run(pk.cli_env(), "submit", "write_objects", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: packyard submit ")
    assert ("parameters (-p KEY=VALUE, VALUE parsed as JSON when it is JSON; repo is --repo):\n"
            "  repo: str                       required (--repo)\n"
            "  objects: list[dict] | None      default null\n"
            "  ref_updates: list[dict] | None  default null\n"
            "  objects_file: str | None        default null; a regular file in PACKYARD_INCOMING_DIR\n") in out.stdout

    out = _run(pk.cli_env(), "submit", "repack", "--help")
    assert re.search(r"\n  preserve: bool +default true\n", out.stdout) and re.search(
        r"\n  mode: str +default \"full\"\n", out.stdout), out.stdout
    # Every packyard task: each parameter of its signature, with its annotation, in order.
    for name in (n for n, t in app.tasks.items() if n.startswith("packyard.")
                 and t.__module__.startswith("packyard.workers.tasks.")):   # not the session's test-only tasks
        out = _run(pk.cli_env(), "submit", name.removeprefix("packyard."), "--help")
        listed = [line.split(":")[0].strip() for line in out.stdout.split(" repo is --repo):\n", 1)[1].splitlines()]
        params = inspect.signature(app.tasks[name].run).parameters.values()
        assert listed == [p.name for p in params], (name, out.stdout)
        for p in params:
            assert f"  {p.name}: {p.annotation}" in out.stdout, (name, p)

    out = _run(pk.cli_env(), "submit", "no-such-task", "--help")
    assert out.returncode == 0 and "unknown task 'no-such-task'; known: " in out.stdout

