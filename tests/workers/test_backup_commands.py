"""Backups and restores as the workers run them (workers/commands/backup.py), in this process, with git as the
oracle: the full/incremental/unchanged choice as a table, where a repository's backups live, a chain written
and brought back (``git bundle verify`` on every file, ``git fsck --full --strict`` and ``git for-each-ref``
of the restored copy, Gitaly's checksum computed from git's own ``show-ref``), retention, pools, and the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backuputil import gitaly_checksum_by_git
from gitutil import fsck_strict, git
from poolutil import commit, make_fork, make_source, refs

DAY = 86400.0


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A storage root and a backup root of this test's own (the settings are read from the environment)."""
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("PACKYARD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PACKYARD_STORAGE_ROOTS", f"main={root}")
    monkeypatch.setenv("PACKYARD_BACKUP_ROOT", str(tmp_path / "backups"))
    monkeypatch.delenv("PACKYARD_BACKUP_KEEP_FULL", raising=False)
    return root


def _entry(eid: str, kind: str, chain: str, created: float, refs: dict[str, str], parent: str | None = None,
           verified: bool = True):
    from packyard.store.backup.manifest import BackupEntry

    return BackupEntry(id=eid, kind=kind, chain=chain, parent=parent, file=f"{eid}.bundle", sha256="0" * 64,
                       size=1, objects=1, refs=refs, head="refs/heads/main", checksum="0" * 40, created=created,
                       verified=verified)


A = {"refs/heads/main": "aa" * 20}
B = {"refs/heads/main": "bb" * 20}


@pytest.mark.parametrize("entries, snap_refs, full, now, expect", [
    ([], A, False, 10.0, "full"),                                                    # no backup yet
    ([("f1", "full", "f1", 0.0, A)], A, False, DAY, "unchanged"),                    # same refs, same HEAD
    ([("f1", "full", "f1", 0.0, A)], B, False, DAY, "incremental"),                  # new refs on a young chain
    ([("f1", "full", "f1", 0.0, A)], A, True, DAY, "full"),                          # asked for
    ([("f1", "full", "f1", 0.0, A)], B, False, 8 * DAY, "full"),                     # chain older than the interval
    ([("f1", "full", "f1", 0.0, A)], A, False, 8 * DAY, "full"),                     # ... even with the same refs
    ([("i1", "incremental", "gone", 0.0, A)], B, False, DAY, "full"),                # chain start missing
    ([("f1", "full", "f1", 0.0, A), ("i1", "incremental", "f1", 5.0, B, "f1")], B, False, DAY, "unchanged"),
])
def test_the_backup_kind_is_chosen_from_the_manifest(entries, snap_refs, full, now, expect) -> None:
    from packyard.store.backup.manifest import Manifest
    from packyard.store.backup.run import RefSnapshot
    from packyard.workers.commands.backup import choose_kind

    manifest = Manifest(entries=tuple(_entry(*e) for e in entries))
    snapshot = RefSnapshot(refs={n: bytes.fromhex(v) for n, v in snap_refs.items()}, head="refs/heads/main")
    kind, reason = choose_kind(manifest, snapshot, full=full, now=now, full_interval=7 * DAY)
    assert kind == expect, reason
    assert reason


def test_backups_live_under_the_storage_name_and_path(env: Path, tmp_path: Path) -> None:
    from packyard.workers.commands.backup import backup_dir_for

    backups = tmp_path / "backups"
    assert backup_dir_for(env / "team" / "app.git") == backups / "main" / "team" / "app.git"
    assert backup_dir_for("main:team/app.git") == backups / "main" / "team" / "app.git"   # it need not exist
    assert backup_dir_for(tmp_path / "elsewhere.git") == backups / "_outside" / str(tmp_path / "elsewhere.git")[1:]


def _bundles_verify(backup_dir: Path, repo_for_prereqs: Path) -> list[str]:
    manifest = json.loads((backup_dir / "manifest.json").read_text())
    names = [e["file"] for e in manifest["entries"]]
    for name in names:   # git checks each bundle (an incremental's prerequisites against the source)
        git("bundle", "verify", str(backup_dir / name), git_dir=repo_for_prereqs)
    return names


def test_a_chain_written_and_restored_is_the_repository_again(env: Path) -> None:
    from packyard.workers.commands.backup import backup, backup_dir_for, restore

    source, work = make_source(env)
    first = backup(source)
    assert first["outcome"] == "written" and first["kind"] == "full"
    assert first["counters"]["checksum"] == gitaly_checksum_by_git(source)
    assert backup(source)["outcome"] == "unchanged"                         # nothing new: nothing written

    for i in range(3):                                                       # two incrementals on top
        commit(work, f"n{i}.txt", f"new {i}\n", f"n{i}")
        git("push", "-q", "origin", "main", cwd=work)
        git("branch", "-f", f"topic{i}", "HEAD", cwd=work)
        git("push", "-q", "origin", f"topic{i}", cwd=work)
        if i != 1:
            inc = backup(source)
            assert inc["kind"] == "incremental", inc
            assert inc["counters"]["checksum"] == gitaly_checksum_by_git(source)
    git("push", "-q", "origin", ":topic0", cwd=work)                         # a deleted ref goes too
    last = backup(source)
    assert last["kind"] == "incremental"
    names = _bundles_verify(backup_dir_for(source), source)
    assert len(names) == 4

    target = env / "restored.git"
    result = restore(target, source)
    assert result["entry"] == last["entry"]
    fsck_strict(target)
    assert refs(target) == refs(source)
    assert git("symbolic-ref", "HEAD", git_dir=target) == git("symbolic-ref", "HEAD", git_dir=source)
    assert result["checksum"] == gitaly_checksum_by_git(target) == gitaly_checksum_by_git(source)

    # Up to an older entry: the refs that entry recorded.
    older = env / "older.git"
    restore(older, source, entry=first["entry"])
    fsck_strict(older)
    assert gitaly_checksum_by_git(older) == first["counters"]["checksum"]


def test_a_restore_never_lands_on_a_repository_that_is_there(env: Path) -> None:
    from packyard.store.errors import StoreError
    from packyard.workers.commands.backup import backup, restore

    source, _work = make_source(env)
    backup(source)
    other, _ = make_source(env / "other")
    before = refs(other)
    with pytest.raises(StoreError) as err:
        restore(other, source)
    assert str(other.name) in str(err.value)
    assert refs(other) == before                                              # untouched
    restore(other, source, force=True)                                        # asked for: replaced, whole
    fsck_strict(other)
    assert refs(other) == refs(source)
    with pytest.raises(StoreError, match="no backups"):
        restore(env / "new.git", env / "never-backed-up.git")


def test_old_chains_expire_only_behind_a_newer_verified_full_backup(env: Path, monkeypatch) -> None:
    from packyard.workers.commands.backup import backup, backup_dir_for, list_backups, restore

    monkeypatch.setenv("PACKYARD_BACKUP_KEEP_FULL", "1")
    source, work = make_source(env)
    first = backup(source)
    commit(work, "x.txt", "x\n", "x")
    git("push", "-q", "origin", "main", cwd=work)
    backup(source)                                                            # an incremental on the first chain
    second = backup(source, full=True)
    assert second["kind"] == "full" and second["counters"]["expired"] == 2, second   # the old full and its incremental
    chains = list_backups(source)["chains"]
    assert [[e["id"] for e in c] for c in chains] == [[second["entry"]]]
    left = sorted(p.name for p in backup_dir_for(source).iterdir())
    assert left == sorted(["manifest.json", chains[0][0]["file"]]), left      # the old files are gone too
    assert first["entry"] not in json.dumps(list_backups(source))
    restore(env / "r.git", source)
    assert refs(env / "r.git") == refs(source)


def test_a_fork_is_backed_up_whole_and_restored_without_its_pool(env: Path) -> None:
    from packyard.store.maintenance.pool import lifecycle
    from packyard.store.maintenance.repack.options import RepackOptions
    from packyard.store.repo import Repository
    from packyard.workers.commands.backup import backup, restore

    source, _ = make_source(env)
    fork = make_fork(env, source, "fork")
    pool = env / "pool.git"
    Repository.init(pool)
    lifecycle.create_pool(pool, Repository.open(source))
    lifecycle.link_member(Repository.open(fork), Repository.open(pool), repack_options=RepackOptions())
    assert (fork / "objects" / "info" / "alternates").exists()
    assert backup(pool)["outcome"] == "skipped"                                  # the members do not need it
    backup(fork)
    target = env / "fork-restored.git"
    restore(target, fork)
    assert not (target / "objects" / "info" / "alternates").exists()             # whole on its own
    fsck_strict(target)
    assert refs(target) == refs(fork)


def test_the_cli_backs_up_lists_and_restores(env: Path, tmp_path: Path) -> None:
    import os

    source, _ = make_source(env)
    cli = [sys.executable, "-c", "import sys; from packyard.workers.cli import main; sys.exit(main())"]
    run_env = dict(os.environ)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *args], env=run_env, capture_output=True, text=True, timeout=120)

    out = run("backup", "--repo", str(source))
    assert out.returncode == 0 and out.stdout.startswith("full "), out.stderr
    listed = run("backup", "--repo", str(source), "--list", "--json")
    chains = json.loads(listed.stdout)["chains"]
    assert len(chains) == 1 and chains[0][0]["verified"]
    assert run("backup", "--repo", str(source)).stdout.startswith("unchanged ")
    restored = run("restore", "--from", str(source), "--to", str(env / "back.git"))
    assert restored.returncode == 0, restored.stderr
    assert refs(env / "back.git") == refs(source)
    again = run("restore", "--from", str(source), "--to", str(env / "back.git"))
    assert again.returncode == 1 and "packyard restore:" in again.stderr and "back.git" in again.stderr
