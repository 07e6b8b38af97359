"""A queued repack or gc may not weaken what protects concurrent readers (issue 8's hostile caller,
issue 11's weak point): deleting replaced packs at once (``preserve=false``) or sooner than the
operator's PACKYARD_MAINTENANCE_PRESERVE_FOR is refused unless the workers run with
PACKYARD_ALLOW_UNSAFE_MAINTENANCE=1 (the race harness's --unsafe-delete control)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gitutil import git, make_worktree_repo
from packyard.store.errors import InvalidInputError
from packyard.workers.app import app
from packyard.workers.settings import Settings
from packyard.workers.tasks.boundary import check_safety


def _settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path), "PACKYARD_MAINTENANCE_PRESERVE_FOR": "3600",
                              **env})


@pytest.mark.parametrize("task, arguments, refused", [
    ("packyard.repack", {"preserve": False}, "'preserve' false deletes replaced packs at once"),
    ("packyard.repack", {"preserve_for": 0}, "'preserve_for' (0 s) is shorter than"),
    ("packyard.repack", {"preserve_for": 3599.5}, "'preserve_for' (3599.5 s) is shorter than"),
    ("packyard.gc", {"preserve_for": 0}, "'preserve_for' (0 s) is shorter than"),
    ("packyard.repack", {"unsafe_ignore_pool_members": True}, "prunes a pool's objects that only its members reach"),
    ("packyard.repack", {"unsafe_ignore_pool_members": False}, None),
    ("packyard.repack", {"preserve": True, "preserve_for": 3600}, None),
    ("packyard.repack", {"preserve_for": 86400}, None),          # longer than the operator's: fine
    ("packyard.repack", {"preserve_for": None}, None),           # the setting's own value
    ("packyard.gc", {"preserve_for": 7200.0}, None),
    ("packyard.index_pack", {"preserve": False}, None),          # no rule declared: not this check's business
])
def test_unsafe_arguments_are_refused_by_default(tmp_path, task, arguments, refused):
    s = _settings(tmp_path)
    if refused is None:
        check_safety(app.tasks[task], arguments, s)
        return
    with pytest.raises(InvalidInputError) as info:
        check_safety(app.tasks[task], arguments, s)
    assert refused in str(info.value) and task in str(info.value)
    assert "PACKYARD_ALLOW_UNSAFE_MAINTENANCE" in str(info.value)
    # The operator's explicit opt-in (the race harness's negative control) allows each of them.
    check_safety(app.tasks[task], arguments, _settings(tmp_path, PACKYARD_ALLOW_UNSAFE_MAINTENANCE="1"))


@pytest.mark.parametrize("raw, expected", [("", False), ("0", False), ("1", True), ("true", True), ("off", False)])
def test_the_opt_in_reads_as_a_flag(tmp_path, raw, expected):
    assert _settings(tmp_path, PACKYARD_ALLOW_UNSAFE_MAINTENANCE=raw).allow_unsafe_maintenance is expected


def test_the_opt_in_rejects_other_values(tmp_path):
    with pytest.raises(ValueError, match="PACKYARD_ALLOW_UNSAFE_MAINTENANCE"):
        _settings(tmp_path, PACKYARD_ALLOW_UNSAFE_MAINTENANCE="maybe")


def test_submit_refuses_before_queueing(store_root, pk):
    """``packyard submit repack -p preserve=false`` on a shell without the opt-in: exit 2 naming the argument,
    nothing queued, the repository's packs untouched."""
    repo = make_worktree_repo(store_root / "unsafe-submit")
    git("repack", "-q", "-d", git_dir=repo)
    packs = sorted(p.name for p in (repo / "objects" / "pack").iterdir())
    env = {**pk.cli_env(), "PACKYARD_ALLOW_UNSAFE_MAINTENANCE": "0"}
    for param in ("preserve=false", "preserve_for=0"):
        proc = subprocess.run(["packyard", "submit", "repack", "--repo", str(repo), "-p", param], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "refused" in proc.stderr and param.split("=")[0] in proc.stderr and "queued" not in proc.stdout
    assert sorted(p.name for p in (repo / "objects" / "pack").iterdir()) == packs
