"""The race harness's backup check (workers/race/backups.py) in this process, without workers: two real backups
of a repository git made (workers/commands/backup.py), checked clean; then each way the check must fail --
a recorded snapshot that no state of the refs was, a flipped bundle byte, a job's entry the manifest never
held, an entry gone from the manifest without retention -- is a mismatch, so ``packyard race --backup-every``
can fail (tests/service/test_race_backup.py runs the whole race)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gitutil import git
from poolutil import commit, make_source


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("PACKYARD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PACKYARD_STORAGE_ROOTS", f"main={root}")
    monkeypatch.setenv("PACKYARD_BACKUP_ROOT", str(tmp_path / "backups"))
    monkeypatch.delenv("PACKYARD_BACKUP_KEEP_FULL", raising=False)
    return root


def git_refs(repo: Path) -> dict[str, str]:
    out = git("for-each-ref", "--format=%(refname) %(objectname)", git_dir=repo).decode()
    return dict(line.split() for line in out.splitlines())


@pytest.mark.parametrize("spoil", [None, "forgotten_state", "flipped_byte", "never_in_manifest",
                                   "dropped_from_manifest"])
def test_the_backup_check_passes_real_backups_and_catches_each_fault(env: Path, spoil: str | None) -> None:
    from packyard.store.backup.manifest import Manifest, load_manifest, save_manifest
    from packyard.workers.commands.backup import backup
    from packyard.workers.race.backups import BackupRace
    from packyard.workers.race.summary import RaceSummary
    from packyard.workers.settings import get_settings

    source, work = make_source(env)
    scratch = env.parent / "scratch"
    race = BackupRace(every=1.0)
    race.start(get_settings(), source, scratch)
    summary = RaceSummary(run_id="t", repo=str(source), mode="safe", seed=0, backup_every=1.0)
    race.saw_refs(git_refs(source))
    race.landed(backup(source, full=race.kwargs(source, 10.0)["full"]), summary)   # the first: full
    commit(work, "new.txt", "new\n" * 10, "new")
    git("push", "-q", "origin", "main", cwd=work)
    race.saw_refs(git_refs(source))
    second = backup(source, full=race.kwargs(source, 10.0)["full"])
    race.landed(second, summary)
    assert second["kind"] == "incremental" and summary.backups == 2

    dest = race.backup_dir
    assert dest is not None
    if spoil == "forgotten_state":
        race.states = race.states[:1]
    elif spoil == "flipped_byte":
        bundle = dest / second["file"]
        data = bytearray(bundle.read_bytes())
        data[len(data) // 2] ^= 0x40
        bundle.write_bytes(bytes(data))
    elif spoil == "never_in_manifest":
        race.written.append("20261207T000000Z-00000000")
    elif spoil == "dropped_from_manifest":
        manifest = load_manifest(dest)
        save_manifest(dest, Manifest(manifest.entries[1:]))
    said: list[str] = []
    race.check(source, scratch, summary, said.append)

    assert summary.restores_checked == 2 and said
    if spoil is None:
        assert summary.restore_mismatches == 0 and summary.ok, summary.restore_examples
        assert summary.restores_fscked == 2 and summary.restores_from_kept == 0
        return
    assert summary.restore_mismatches >= 1 and not summary.ok
    want = {"forgotten_state": "no state the served repository's refs passed through",
            "flipped_byte": "BackupChecksumError", "never_in_manifest": "the manifest never held it",
            "dropped_from_manifest": "left the manifest but no retention expired it"}[spoil]
    assert any(want in m for m in summary.restore_examples), summary.restore_examples
