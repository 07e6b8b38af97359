"""The packyard CLI as a user runs it: --help everywhere, init, verify, submit, status, beat schedule."""
from __future__ import annotations

import argparse
import json
import subprocess

import pytest

from gitutil import batch_check_all, git, make_worktree_repo, snapshot_tree
from packyard.workers.cli import build_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


# Command names as registered (a module's name need not be its command's name).
COMMANDS = list(_subcommands(build_parser()))
BENCHMARKS = list(_subcommands(_subcommands(build_parser(only="bench"))["bench"]))


def run(pk, *args, timeout=120, **env):
    return subprocess.run(["packyard", *args], env=pk.cli_env(**env), capture_output=True, text=True,
                          timeout=timeout, cwd=pk.session_dir)


@pytest.mark.parametrize("argv", [[c] for c in COMMANDS] + [["bench", b] for b in BENCHMARKS])
def test_every_subcommand_has_help(argv, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser(only=argv[0]).parse_args([*argv, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: packyard {' '.join(argv)}")


def test_command_table_names_every_registered_command():
    """main() builds only the asked-for command from COMMANDS: the table must match what registers."""
    from packyard.workers.cli import COMMANDS as TABLE
    assert set(TABLE) == set(COMMANDS)
    for name in TABLE:
        assert list(_subcommands(build_parser(only=name))) == [name]


def test_repo_convention_is_shared(capsys):
    """Every command acting on one repository spells it --repo PATH."""
    for cmd in ("init", "verify", "submit", "status"):
        with pytest.raises(SystemExit):
            build_parser(only=cmd).parse_args([cmd, "--help"])
        assert "--repo PATH" in capsys.readouterr().out, cmd


def test_installed_entry_point_help(pk):
    out = run(pk, "--help")
    assert out.returncode == 0 and all(c in out.stdout for c in COMMANDS)
    assert {"init", "worker", "beat", "flower", "migrate", "up", "submit", "status", "verify", "demo",
            "bench"} <= set(COMMANDS)


def test_init_creates_a_repository_git_accepts(pk, tmp_path):
    out = run(pk, "init", "--repo", str(tmp_path / "new.git"))
    assert out.returncode == 0, out.stderr
    git("fsck", "--full", git_dir=tmp_path / "new.git")
    assert git("symbolic-ref", "HEAD", git_dir=tmp_path / "new.git").strip() == b"refs/heads/main"


def test_verify_in_process(pk, tmp_path):
    repo = make_worktree_repo(tmp_path)
    out = run(pk, "verify", "--repo", str(repo), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["counters"]["objects"] == len(batch_check_all(repo))

    loose = next(p for p in (repo / "objects").glob("??/*"))
    loose.chmod(0o644)
    loose.write_bytes(loose.read_bytes()[:5])
    before = snapshot_tree(repo)
    out = run(pk, "verify", "--repo", str(repo))
    assert out.returncode == 1
    assert str(loose) in out.stderr
    assert snapshot_tree(repo) == before

    out = run(pk, "verify", "--repo", str(tmp_path / "absent.git"))
    assert out.returncode == 1 and "NotARepositoryError" in out.stderr


@pytest.mark.slow
def test_submit_wait_then_status_table(pk, store_root, celery_worker):
    repo = make_worktree_repo(store_root)
    out = run(pk, "submit", "verify-repo", "--repo", str(repo), "--wait", "--timeout", "60")
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.startswith("queued packyard.verify_repo ")
    task_id = out.stdout.split()[2]
    result = json.loads(out.stdout[out.stdout.index("{"):])
    assert result["state"] == "SUCCESS" and result["task_id"] == task_id
    assert result["result"]["counters"]["objects"] == len(batch_check_all(repo))

    bad = store_root / "not-a-repo"
    bad.mkdir()
    out = run(pk, "submit", "verify_repo", "--repo", str(bad), "--wait", "--timeout", "60")
    assert out.returncode == 1
    assert "NotARepositoryError" in out.stdout or str(bad) in out.stdout

    out = run(pk, "status", "--repo", str(repo), "--limit", "5")
    assert out.returncode == 0, out.stderr
    head, table = out.stdout.split("\n\n", 1)
    assert head.startswith(f"repository {repo.resolve()} (enabled for maintenance; 0 ingest(s)")
    assert "\nplan if planned now: " in head
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["job", "task", "id"] and set(lines[1]) <= {"-", " "}
    assert len(lines) == 3 and task_id[:8] in lines[2] and "SUCCESS" in lines[2] and "verify_repo" in lines[2]
    assert f"objects={len(batch_check_all(repo))}" in lines[2]

    out = run(pk, "status", "--limit", "50")
    assert "FAILURE" in out.stdout and task_id[:8] in out.stdout

    out = run(pk, "status", "--repo", str(repo), "--json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["task_id"] for r in rows] == [task_id]


def test_submit_unknown_task(pk, tmp_path):
    out = run(pk, "submit", "no-such-task", "--repo", str(tmp_path))
    assert out.returncode == 2 and "verify_repo" in out.stderr


def test_status_on_empty_database(pk, tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert run(pk, "migrate", PACKYARD_DATABASE_URL=url).returncode == 0
    out = run(pk, "status", PACKYARD_DATABASE_URL=url)
    assert out.returncode == 0 and "no jobs recorded" in out.stdout


def test_beat_schedule_is_what_is_configured(pk, tmp_path):
    out = run(pk, "beat", "--show-schedule", PACKYARD_LOST_AFTER="120")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    (line,) = [ln for ln in lines if ln.startswith("maintenance-window")]
    assert line.startswith("maintenance-window: packyard.plan_maintenance {'trigger': 'window'} at cron '0 2 * * *'")
    assert "open for 14400 s, at most 2 maintenance job(s) in flight" in line
    assert any("reconcile-jobs: packyard.reconcile_jobs every 60s" in ln for ln in lines), lines
    assert any(ln.startswith("backup-fleet: packyard.backup_fleet at cron '0 7 * * *' (UTC)") for ln in lines), lines
    off = run(pk, "beat", "--show-schedule", PACKYARD_BACKUP_CRON="off")
    assert off.returncode == 0 and "backup-fleet" not in off.stdout, off.stdout
    out = run(pk, "beat", "--show-schedule", PACKYARD_MAINTENANCE_CRON="30 1 * * 6", PACKYARD_MAINTENANCE_WINDOW="600",
              PACKYARD_MAINTENANCE_CONCURRENCY="5")
    assert "at cron '30 1 * * 6' (UTC), open for 600 s, at most 5 maintenance job(s)" in out.stdout
    out = run(pk, "beat", "--show-schedule", PACKYARD_MAINTENANCE_CRON="every night")
    assert out.returncode != 0 and "PACKYARD_MAINTENANCE_CRON" in out.stderr
