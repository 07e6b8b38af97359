"""Backups among the race's repacks and pushes, and the restore of every one of them afterwards (issue 38).

With ``--backup-every T`` the harness (:mod:`.harness`) queues a ``packyard.backup`` of the served repository
every ``T`` seconds, one at a time like the repacks, on the repacking host's queue; every third one asks for a
full backup (``full=True``), so the manifest holds several chains; the others are whatever the command decides
(incremental on the newest entry, or ``unchanged``). A backup waits for the maintenance lease as a repack does
(``wait``): a job retried because the lease stayed busy is still in flight, not failed; one that ends FAILURE
is a failed job of the run (``backups_failed``).

The frontend's refs after every landed push are kept (:meth:`BackupRace.saw_refs`): every state the served
repository's refs really passed through. Later backups' retention (PACKYARD_BACKUP_KEEP_FULL) expires the
older chains during the run, so when a backup job lands the harness keeps what the manifest holds then
(:meth:`BackupRace.keep`): each new entry, and a hard link (or a copy) of its bundle in the run's scratch
dir. After the workers are done, :meth:`BackupRace.check` restores EVERY backup written
(``workers/commands/backup.py``'s ``restore``, in process, into a fresh directory under the scratch dir): an
entry the manifest still holds from the backup directory itself (retention left its chain whole), an expired
one from the kept copies. Then it asks git about each restored repository:

a. its refs (``git for-each-ref``, and HEAD: ``git symbolic-ref`` or the detached id) must equal the entry's
   recorded ``refs`` and ``head`` exactly, and the recorded refs must be one of the states the frontend saw
   (a snapshot is one consistent moment of the served repository, not a mix of two);
b. ``git fsck --full --strict`` must pass (on at most :data:`FSCK_AT_MOST` entries: the first, a middle one
   and the newest; the refs are compared for all);
c. Gitaly's checksum computed from ``git show-ref --head``'s own lines must be the entry's ``checksum``.

An entry still in the manifest must be the entry as it was kept (its bundle's SHA-256 is checked by the
restore); an entry that left the manifest must be among the ids a later backup's retention reported expired;
a job's entry the manifest never showed is a mismatch, and so is a restore that raises.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packyard.workers.race.pushes import GIT_ENV, git
from packyard.workers.race.summary import RaceSummary, Say
from packyard.workers.settings import Settings

FULL_EVERY = 3          # every third backup job asks for a full backup
FSCK_AT_MOST = 3        # restored repositories git fscks (the refs of every one are compared)
GIT_TIMEOUT = 120.0     # seconds, per git command on a restored repository
MAX_STATES = 100_000    # ref states kept (a push a second for a day); past it the oldest go


@dataclass
class BackupRace:
    """The backup jobs of one run: what they wrote, what their retention expired, the refs states seen."""

    every: float
    sent: int = 0
    written: list[str] = field(default_factory=list)      # entry ids, in the order written
    kinds: dict[str, int] = field(default_factory=lambda: {"full": 0, "incremental": 0})
    unchanged: int = 0
    expired: set[str] = field(default_factory=set)
    states: list[dict[str, str]] = field(default_factory=list)
    backup_dir: Path | None = None                         # the served repository's (:meth:`start`)
    kept_dir: Path | None = None                           # the kept bundles and their manifest
    kept: dict[str, Any] = field(default_factory=dict)     # id -> BackupEntry, every entry seen, in order

    def start(self, settings: Settings, served: Path, scratch: Path) -> None:
        from packyard.workers.commands.backup import backup_dir_for

        self.backup_dir = backup_dir_for(served, settings)
        self.kept_dir = scratch / "backups-kept"
        self.kept_dir.mkdir(parents=True, exist_ok=True)

    def kwargs(self, repo: Path, wait: float) -> dict[str, Any]:
        """The next backup job's kwargs (every FULL_EVERY-th asks for a full backup, the first one included)."""
        full = self.sent % FULL_EVERY == 0
        self.sent += 1
        return {"repo": str(repo), "full": full, "wait": wait}

    def saw_refs(self, refs: dict[str, str]) -> None:
        if not self.states or self.states[-1] != refs:
            self.states.append(dict(refs))
            del self.states[:-MAX_STATES]

    def landed(self, result: dict[str, Any], summary: RaceSummary) -> None:
        """A backup job's SUCCESS result."""
        outcome = result.get("outcome")
        if outcome == "written":
            self.written.append(str(result["entry"]))
            self.kinds[str(result.get("kind"))] = self.kinds.get(str(result.get("kind")), 0) + 1
            self.expired.update(str(e) for e in result.get("expired") or ())
            summary.backups += 1
            try:
                self.keep()
            except Exception as err:   # (BackupChainError, OSError): that backup cannot be checked: a mismatch
                self._mismatch(summary, f"backup {result['entry']}: could not keep it: {type(err).__name__}: {err}")
        elif outcome == "unchanged":
            self.unchanged += 1
            summary.backups_unchanged += 1
        else:
            summary.failures.append(f"backup: unexpected outcome {outcome!r}: {str(result)[:300]}")

    def keep(self) -> None:
        """The manifest's entries not kept yet, and their bundles (linked, or copied across filesystems):
        called as each backup job lands, before the next one's retention can expire them."""
        from packyard.store.backup.manifest import load_manifest

        assert self.backup_dir is not None and self.kept_dir is not None
        for entry in load_manifest(self.backup_dir).entries:
            if entry.id in self.kept:
                continue
            src, dst = self.backup_dir / entry.file, self.kept_dir / entry.file
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
            self.kept[entry.id] = entry

    def check(self, served: Path, scratch: Path, summary: RaceSummary, say: Say) -> None:
        """Restore every backup of ``served`` written in the run under ``scratch`` and compare it (see the
        module doc)."""
        from packyard.store.backup.manifest import Manifest, load_manifest, save_manifest

        assert self.backup_dir is not None and self.kept_dir is not None
        manifest = load_manifest(self.backup_dir)
        save_manifest(self.kept_dir, Manifest(tuple(self.kept.values())))
        summary.backups_expired = len(self.expired)
        live = {e.id: e for e in manifest.entries}
        for entry_id in self.written:
            if entry_id not in self.kept:
                self._mismatch(summary, f"backup {entry_id} was written but the manifest never held it")
        for entry_id in self.kept:
            if entry_id not in live and entry_id not in self.expired:
                self._mismatch(summary, f"backup {entry_id} left the manifest but no retention expired it")
        for entry_id in live:
            if entry_id not in self.kept:
                self._mismatch(summary, f"backup {entry_id} is in the manifest but no job of the run wrote it")
        states = [sorted(s.items()) for s in self.states]
        entries = list(self.kept.values())
        n = len(entries)
        fsck_at = {round(k * (n - 1) / max(1, FSCK_AT_MOST - 1)) for k in range(FSCK_AT_MOST)} if n else set()
        root = scratch / "restores"
        root.mkdir(parents=True, exist_ok=True)
        for i, entry in enumerate(entries):   # (bounded: the entries the run's jobs wrote)
            target = root / f"{i:04d}.git"
            source = self.backup_dir if entry.id in live else self.kept_dir
            try:
                if entry.id in live and live[entry.id].sha256 != entry.sha256:
                    raise ValueError(f"the manifest's entry changed since it was written: {live[entry.id]}")
                problems = self._check_one(served, source, entry, target, states, fsck=i in fsck_at)
            except Exception as err:   # a failed restore is a mismatch, whatever raised
                problems = [f"restore failed: {type(err).__name__}: {err}"[:400]]
            summary.restores_checked += 1
            summary.restores_from_kept += int(source == self.kept_dir)
            summary.restores_fscked += int(i in fsck_at and not problems)
            for p in problems:
                self._mismatch(summary, f"backup {entry.id} ({entry.kind}): {p}")
            shutil.rmtree(target, ignore_errors=True)
        say(f"backups: {summary.backups} written ({self.kinds.get('full', 0)} full, "
            f"{self.kinds.get('incremental', 0)} incremental), {summary.backups_unchanged} unchanged, "
            f"{summary.backups_expired} expired by retention; {summary.restores_checked} restored and compared "
            f"({summary.restores_from_kept} from kept copies, {summary.restores_fscked} fscked): "
            f"{summary.restore_mismatches} mismatches")

    @staticmethod
    def _mismatch(summary: RaceSummary, what: str) -> None:
        summary.restore_mismatches += 1
        if len(summary.restore_examples) < 20:
            summary.restore_examples.append(what)

    @staticmethod
    def _check_one(served: Path, backup_dir: Path, entry: Any, target: Path, states: list[list[tuple[str, str]]],
                   *, fsck: bool) -> list[str]:
        from packyard.store.backup.checksum import checksum_of_lines
        from packyard.workers.commands.backup import restore

        restore(target, served, entry=entry.id, backup_dir=backup_dir)
        problems = []
        got = restored_refs(target)
        want = dict(entry.refs)
        if entry.head is not None:
            want["HEAD"] = f"ref: {entry.head}"
        if got != want:
            differ = sorted(set(got.items()) ^ set(want.items()))[:4]
            problems.append(f"the restored refs are not the recorded ones: {differ}")
        recorded = sorted((k, v) for k, v in entry.refs.items() if k != "HEAD")
        if recorded not in states:
            problems.append("the recorded refs are no state the served repository's refs passed through")
        lines = git("show-ref", "--head", git_dir=target).splitlines()
        checksum = checksum_of_lines(lines).hex
        if checksum != entry.checksum:
            problems.append(f"checksum {checksum} (git show-ref --head) is not the recorded {entry.checksum}")
        if fsck:
            proc = subprocess.run(["git", "--git-dir", str(target), "fsck", "--full", "--strict", "--no-progress"],
                                  capture_output=True, timeout=GIT_TIMEOUT, env={**os.environ, **GIT_ENV})
            if proc.returncode != 0:
                problems.append(f"git fsck --full --strict: exit {proc.returncode}: "
                                f"{proc.stderr.decode(errors='replace').strip()[:300]}")
        return problems


def restored_refs(git_dir: Path) -> dict[str, str]:
    """The repository's refs by git (name -> hex), HEAD as ``ref: <target>`` or its detached id."""
    out = git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=git_dir).decode()
    refs = {name: oid for oid, name in (line.split(" ", 1) for line in out.splitlines())}
    proc = subprocess.run(["git", "--git-dir", str(git_dir), "symbolic-ref", "-q", "HEAD"], capture_output=True,
                          timeout=GIT_TIMEOUT, env={**os.environ, **GIT_ENV})
    if proc.returncode == 0:
        refs["HEAD"] = "ref: " + proc.stdout.decode().strip()
    else:
        refs["HEAD"] = git("rev-parse", "--verify", "-q", "HEAD", git_dir=git_dir).decode().strip()
    return refs


__all__ = ["BackupRace", "FULL_EVERY", "FSCK_AT_MOST", "restored_refs"]
