"""Restore a repository from its backup directory: the chain's bundles in order, refs last, then one rename.

:func:`restore_repository`:

1. the chain up to the entry asked for (or the latest): its full entry and its incrementals in order
   (manifest.py's ``chain_upto``: a gap -- a parent the manifest lacks -- is refused naming the entry's file);
   every bundle is checked before any is used (present, SHA-256 as recorded: BackupChainError /
   BackupChecksumError naming the file);
2. a new bare repository in a temp sibling of the target (``.<name>.restoring-<hex>``, as ``Repository.init``
   lays one out); each bundle's pack goes in through index-pack (store/pack/indexpack.py) with its strict
   fsck, after its prerequisites are checked present;
3. the refs in one RefStore transaction, then HEAD (the entry's symref target, or its detached id);
4. the restored repository's checksum must be the entry's (else BackupChecksumError);
5. fault point ``restore.before_rename``; then the temp directory is renamed onto the target (an empty or
   absent target), or -- ``force`` and a non-empty target -- swapped with it atomically
   (``durable.exchange``; two renames where the filesystem cannot) and the old tree removed; the parent
   directory is fsynced.

Killed at any step before 5's rename, the target is untouched and the temp directory is a leftover the table
knows (``restore_tmp``): no half-restored repository is ever visible at the target's name.
"""
from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import durable
from ..errors import (
    BackupChainError,
    BackupChecksumError,
    BundleFormatError,
    InvalidInputError,
    PackFormatError,
)
from ..faults import fault_point
from ..leftovers import find_restore_temps, removable, remove
from ..pack.indexpack import index_pack
from ..progress import Progress
from ..refs import RefUpdate, check_ref_name
from ..repo import Repository
from .bundle import read_header_from
from .checksum import repository_checksum
from .manifest import load_manifest
from .run import check_entry_file

RESTORING_INFIX = ".restoring-"
REPLACED_INFIX = ".replaced-"


@dataclass(frozen=True)
class RestoreResult:
    target: Path
    entry: str
    refs: dict[str, str]
    checksum: str
    objects: int


def _is_empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except FileNotFoundError:
        return True
    except NotADirectoryError:
        return False


def restore_repository(backup_dir: Path, target: Path, *, upto: str | None = None, force: bool = False,
                       progress: Progress | None = None) -> RestoreResult:
    """Restore the backup ``upto`` (default: the latest) of ``backup_dir`` as a new repository at ``target``;
    see the module docstring."""
    backup_dir, target = Path(backup_dir), Path(target)
    manifest = load_manifest(backup_dir)
    entry = manifest.get(upto) if upto is not None else manifest.latest()
    if entry is None:
        raise BackupChainError(backup_dir / (upto or "manifest.json"),
                               f"no backup {upto} in the manifest" if upto else "the manifest holds no backup")
    chain = manifest.chain_upto(entry.id)
    if target.exists() and not target.is_dir():
        raise InvalidInputError("the restore target exists and is not a directory", path=target)
    if not force and not _is_empty_dir(target):
        raise InvalidInputError("the restore target exists and is not empty (restore with force to replace it)",
                                path=target)
    for name in entry.refs:
        if name != "HEAD":
            check_ref_name(name)   # (refused now, not after every pack is in)
    paths = [check_entry_file(backup_dir, e) for e in chain]   # every file checked before any is used
    remove(removable(find_restore_temps(target)))   # what dead restores of this target left (by the table's age)

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}{RESTORING_INFIX}{secrets.token_hex(4)}"
    counters = durable.DurabilityCounters()
    try:
        repo = Repository.init(tmp)
        objects = 0
        for path in paths:
            objects += _apply_bundle(repo, path, progress)
        refs = {k: bytes.fromhex(v) for k, v in entry.refs.items()}
        repo.refs.update([RefUpdate(name, None, oid) for name, oid in sorted(refs.items()) if name != "HEAD"],
                         counters)
        if entry.head is not None:
            repo.refs.set_symref("HEAD", entry.head)
        elif "HEAD" in refs:
            durable.write_file_durably(tmp / "HEAD", refs["HEAD"].hex().encode() + b"\n", mode=0o644,
                                       counters=counters)
        got = repository_checksum(tmp).hex
        if got != entry.checksum:
            raise BackupChecksumError(backup_dir / entry.file, entry.checksum, got)
        fault_point("restore.before_rename")
        _put_in_place(tmp, target, counters)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return RestoreResult(target=target, entry=entry.id, refs=dict(sorted(entry.refs.items())),
                         checksum=got, objects=objects)


def _apply_bundle(repo: Repository, path: Path, progress: Progress | None) -> int:
    """One bundle's pack into ``repo`` through index-pack (strict fsck), its prerequisites checked first;
    the number of objects it held."""
    with open(path, "rb") as f:
        header = read_header_from(f, path)
        missing = [p.hex() for p in header.prerequisites if not repo.objects.has(p)]
        if missing:
            raise BackupChainError(path, f"the chain so far lacks {len(missing)} prerequisite(s) of this bundle: "
                                         f"{', '.join(missing[:5])}")
        f.seek(header.pack_offset)
        try:
            result = index_pack(repo, f, strict=True, fix_thin=True, progress=progress)
        except PackFormatError as err:
            offset = None if err.offset is None else err.offset + header.pack_offset
            raise BundleFormatError(path, offset, f"its pack is refused: {err.message}") from err
    return result.objects


def _put_in_place(tmp: Path, target: Path, counters: durable.DurabilityCounters) -> None:
    parent = target.parent
    if _is_empty_dir(target):
        durable.rename(tmp, target, counters)   # (rename(2) replaces an empty directory)
        durable.fsync_dir(parent, counters)
        return
    if durable.exchange(tmp, target, counters):   # tmp now names the old repository
        durable.fsync_dir(parent, counters)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    aside = parent / f".{target.name}{REPLACED_INFIX}{secrets.token_hex(4)}"
    durable.rename(target, aside, counters)
    durable.rename(tmp, target, counters)
    durable.fsync_dir(parent, counters)
    shutil.rmtree(aside, ignore_errors=True)


__all__ = ["RestoreResult", "restore_repository", "RESTORING_INFIX", "REPLACED_INFIX"]
