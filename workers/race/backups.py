"""Backups among the race's repacks and pushes, and the restore of every one of them afterwards (issue 38).

With ``--backup-every T`` the harness (:mod:`.harness`) queues a ``packyard.backup`` of the served repository
every ``T`` seconds, one at a time like the repacks, on the repacking host's queue; every third one asks for a
full backup (``full=True``), so the manifest holds several chains; the others are whatever the command decides
(incremental on the newest entry, or ``unchanged``). A backup waits for the maintenance lease as a repack does
(``wait``): a job retried because the lease stayed busy is still in flight, not failed; one that ends FAILURE
is a failed job of the run (``backups_failed``).

The frontend's refs after every landed push are kept (:meth:`BackupRace.saw_refs`): every state the served
repository's refs really passed through. After the workers are done, :meth:`BackupRace.check` reads the
manifest and restores EVERY entry (``workers/commands/backup.py``'s ``restore``, in process, into a fresh
directory under the run's scratch dir), then asks git about the restored repository:

a. its refs (``git for-each-ref``, and HEAD: ``git symbolic-ref`` or the detached id) must equal the entry's
   recorded ``refs`` and ``head`` exactly, and the recorded refs must be one of the states the frontend saw
   (a snapshot is one consistent moment of the served repository, not a mix of two);
b. ``git fsck --full --strict`` must pass (on at most :data:`FSCK_AT_MOST` entries: the first, a middle one
   and the newest; the refs are compared for all);
c. Gitaly's checksum computed from ``git show-ref --head``'s own lines must be the entry's ``checksum``.

Each written entry must be in the manifest at the end or among the ids a later backup's retention expired
(PACKYARD_BACKUP_KEEP_FULL); one that is neither is a mismatch. A restore that raises counts as a mismatch too.
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
        elif outcome == "unchanged":
            self.unchanged += 1
            summary.backups_unchanged += 1
        else:
            summary.failures.append(f"backup: unexpected outcome {outcome!r}: {str(result)[:300]}")

    def check(self, settings: Settings, served: Path, scratch: Path, summary: RaceSummary, say: Say) -> None:
        """Restore every manifest entry of ``served`` under ``scratch`` and compare it (see the module doc)."""
        from packyard.store.backup.manifest import load_manifest
        from packyard.workers.commands.backup import backup_dir_for

        backup_dir = backup_dir_for(served, settings)
        manifest = load_manifest(backup_dir)
        summary.backups_expired = len(self.expired)
        ids = {e.id for e in manifest.entries}
        for entry_id in self.written:
            if entry_id not in ids and entry_id not in self.expired:
                self._mismatch(summary, f"backup {entry_id} was written but is neither in the manifest nor expired")
        states = [sorted(s.items()) for s in self.states]
        n = len(manifest.entries)
        fsck_at = {round(k * (n - 1) / max(1, FSCK_AT_MOST - 1)) for k in range(FSCK_AT_MOST)} if n else set()
        root = scratch / "restores"
        root.mkdir(parents=True, exist_ok=True)
        for i, entry in enumerate(manifest.entries):   # (bounded: the manifest's entries, MAX_ENTRIES at most)
            target = root / f"{i:04d}.git"
            try:
                problems = self._check_one(served, backup_dir, entry, target, states, fsck=i in fsck_at)
            except Exception as err:   # a failed restore is a mismatch, whatever raised
                problems = [f"restore failed: {type(err).__name__}: {err}"[:400]]
            summary.restores_checked += 1
            summary.restores_fscked += int(i in fsck_at and not problems)
            for p in problems:
                self._mismatch(summary, f"backup {entry.id} ({entry.kind}): {p}")
            shutil.rmtree(target, ignore_errors=True)
        say(f"backups: {summary.backups} written ({self.kinds.get('full', 0)} full, "
            f"{self.kinds.get('incremental', 0)} incremental), {summary.backups_unchanged} unchanged, "
            f"{summary.backups_expired} expired by retention; {summary.restores_checked} restored and compared "
            f"({summary.restores_fscked} fscked): {summary.restore_mismatches} mismatches")

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
