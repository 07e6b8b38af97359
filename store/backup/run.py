"""One repository's backup: a bundle of its refs as one snapshot, then its manifest entry.

:func:`backup_repository` takes the refs the caller read under the repository's lease (:func:`snapshot_refs`)
and writes, into the repository's backup directory:

1. the bundle (store/backup/bundle.py): full -- every object the refs reach -- when asked for or when the
   manifest is empty; else incremental on the manifest's latest entry, whose ref tips (those that still exist
   here as objects, peeled to commits) are its prerequisites, so only new objects are written. The bundle is
   durable (temp file, flush, rename, directory fsync) before anything names it; fault points
   ``backup.bundle.after_walk`` (walked, nothing written),
   ``backup.bundle.after_flush``, ``backup.bundle.after_rename``, then ``backup.after_bundle``;
2. the manifest (store/backup/manifest.py) with the new entry, durably: ``backup.after_manifest`` follows.

Killed before step 2 completes, no manifest entry names a partial bundle: the temp files are leftovers the table
knows (``backup_tmp``), and a renamed bundle without an entry is an orphan ``<id>.bundle`` no chain uses (the next
retention pass removes bundles no entry names: :func:`orphan_bundles`). A missing or corrupt object a ref needs is
a typed error (ObjectMissingError / CorruptObjectError naming it) and nothing is recorded.

:func:`verify_backup` re-reads one entry's bundle (SHA-256, header refs, pack trailer) and marks it verified.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import durable
from ..errors import BackupChainError, BackupChecksumError
from ..faults import fault_point
from ..leftovers import find_backup_temps, removable, remove
from ..progress import Progress
from .bundle import check_pack, read_header, sha256_of, write_bundle
from .checksum import checksum_of_lines, show_ref_lines
from .manifest import BackupEntry, Manifest, load_manifest, new_entry_id, save_manifest

BUNDLE_SUFFIX = ".bundle"


@dataclass(frozen=True)
class RefSnapshot:
    refs: dict[str, bytes]    # every ref under refs/ (and "HEAD" when HEAD is detached)
    head: str | None          # HEAD's symref target; None when detached or not a symref

    def head_oid(self) -> bytes | None:
        """What HEAD resolves to in this snapshot (None: unborn)."""
        if self.head is not None:
            return self.refs.get(self.head)
        return self.refs.get("HEAD")

    def bundle_refs(self) -> list[tuple[str, bytes]]:
        """The refs a bundle of this snapshot carries: HEAD first when it resolves (as ``git bundle --all``),
        then every ref in name order."""
        out: list[tuple[str, bytes]] = []
        head = self.head_oid()
        if head is not None:
            out.append(("HEAD", head))
        out += [(name, oid) for name, oid in sorted(self.refs.items()) if name != "HEAD"]
        return out

    def checksum(self) -> str:
        """The repository checksum (store/backup/checksum.py) of this snapshot."""
        refs = {k: v for k, v in self.refs.items() if k != "HEAD"}
        return checksum_of_lines(show_ref_lines(refs, self.head_oid())).hex


def snapshot_refs(repo) -> RefSnapshot:
    """The repository's refs in one read (packed-refs and the loose refs) and HEAD; the caller holds the lease."""
    refs = dict(repo.refs.as_dict())
    raw = repo.refs.read_raw("HEAD")
    head: str | None = None
    if isinstance(raw, str):
        head = raw
    elif isinstance(raw, bytes):
        refs["HEAD"] = raw
    return RefSnapshot(refs=refs, head=head)


def entry_bundle_refs(entry: BackupEntry) -> dict[str, bytes]:
    """The refs (with HEAD) the entry's bundle must carry."""
    snap = RefSnapshot({k: bytes.fromhex(v) for k, v in entry.refs.items()}, entry.head)
    return dict(snap.bundle_refs())


def backup_repository(repo, backup_dir: Path, snapshot: RefSnapshot, *, full: bool = False,
                      progress: Progress | None = None, now: float | None = None) -> BackupEntry:
    """Back ``snapshot`` of ``repo`` up into ``backup_dir`` (created if missing); see the module docstring.
    Returns the new manifest entry (``verified`` False)."""
    backup_dir = Path(backup_dir)
    _make_dir(backup_dir)
    remove(removable(find_backup_temps(backup_dir)))   # dead writers' temp files (the leftovers table's rule)
    manifest = load_manifest(backup_dir)
    created = time.time() if now is None else now
    eid = new_entry_id(created)
    latest = manifest.latest()
    prerequisites: list[bytes] = []
    if full or latest is None:
        kind, chain, parent = "full", eid, None
    else:
        kind, chain, parent = "incremental", latest.chain, latest.id
        _check_present(backup_dir, latest)
        seen: set[bytes] = set()
        for hexid in latest.refs.values():
            oid = bytes.fromhex(hexid)
            if oid not in seen and repo.objects.has(oid):
                seen.add(oid)
                prerequisites.append(oid)
    name = eid + BUNDLE_SUFFIX
    written = write_bundle(repo, backup_dir / name, snapshot.bundle_refs(), prerequisites, progress=progress)
    fault_point("backup.after_bundle")
    entry = BackupEntry(id=eid, kind=kind, chain=chain, parent=parent, file=name, sha256=written.sha256,
                        size=written.size, objects=written.objects,
                        refs={k: v.hex() for k, v in sorted(snapshot.refs.items())}, head=snapshot.head,
                        checksum=snapshot.checksum(), created=created, verified=False)
    save_manifest(backup_dir, load_manifest(backup_dir).with_entry(entry))
    fault_point("backup.after_manifest")
    return entry


def _make_dir(path: Path) -> None:
    if path.is_dir():
        return
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for p in reversed(missing):   # (each new directory's entry made durable in its parent)
        durable.fsync_dir(p.parent)


def _check_present(backup_dir: Path, entry: BackupEntry) -> None:
    """The entry an incremental builds on must still have its bundle (same size): else BackupChainError."""
    path = backup_dir / entry.file
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise BackupChainError(path, f"the latest backup {entry.id}'s bundle is missing: an incremental backup "
                                     f"cannot build on it (take a full one)") from None
    if size != entry.size:
        raise BackupChainError(path, f"the latest backup {entry.id}'s bundle has {size} bytes, the manifest "
                                     f"recorded {entry.size}: an incremental cannot build on it (take a full one)")


def check_entry_file(backup_dir: Path, entry: BackupEntry) -> Path:
    """The entry's bundle, after checking it exists and its SHA-256 is the manifest's (BackupChainError /
    BackupChecksumError naming the file)."""
    path = Path(backup_dir) / entry.file
    if not path.is_file():
        raise BackupChainError(path, f"backup {entry.id}'s bundle is missing")
    digest = sha256_of(path)
    if digest != entry.sha256:
        raise BackupChecksumError(path, entry.sha256, digest)
    return path


def verify_backup(backup_dir: Path, entry_id: str) -> BackupEntry:
    """Re-read ``entry_id``'s bundle: its SHA-256, its header's refs against the entry's, its pack trailer; then
    mark the entry verified in the manifest (durably) and return it. A mismatch: BackupChecksumError naming the
    file; a malformed bundle: BundleFormatError."""
    backup_dir = Path(backup_dir)
    manifest = load_manifest(backup_dir)
    entry = manifest.get(entry_id)
    if entry is None:
        raise BackupChainError(backup_dir / entry_id, "no backup with this id in the manifest")
    path = check_entry_file(backup_dir, entry)
    header = read_header(path)
    want = entry_bundle_refs(entry)
    got = dict(header.refs)
    if got != want or len(header.refs) != len(got):
        raise BackupChecksumError(path, f"{len(want)} refs as recorded", f"{len(header.refs)} refs, "
                                        f"{len(set(got.items()) ^ set(want.items()))} differing")
    check_pack(path, header)
    done = dataclasses.replace(entry, verified=True)
    save_manifest(backup_dir, load_manifest(backup_dir).with_entry(done))
    return done


def orphan_bundles(backup_dir: Path, manifest: Manifest) -> list[Path]:
    """``*.bundle`` files of the directory that no entry names (a backup killed between its bundle's rename and
    its manifest entry, or a retention pass killed after the manifest was rewritten)."""
    named = {e.file for e in manifest.entries}
    try:
        names = os.listdir(backup_dir)
    except FileNotFoundError:
        return []
    return sorted(Path(backup_dir) / n for n in names if n.endswith(BUNDLE_SUFFIX) and n not in named)


__all__ = ["RefSnapshot", "snapshot_refs", "backup_repository", "verify_backup", "check_entry_file",
           "entry_bundle_refs", "orphan_bundles", "BUNDLE_SUFFIX"]
