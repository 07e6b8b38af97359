"""Import a directory or a tar archive as one commit: blobs, trees, commit, then the ref (CAS).

The "tar -xf; git add .; git commit" case from seed 001_b60f0a0927ea1ee2.txt,
written through one :class:`packyard.store.batch.loose.LooseBatch` (one durable flush, renames
at the end, ref last).

Everything is validated before the first object is written: names git cannot
store (empty, NUL, '/', '.', '..', '.git' in any case), paths escaping the root
(absolute or '..' in a tar, symlinks whose target leaves the root), special
files. A file that cannot be read aborts the batch (tmp files removed, ref
untouched).

Memory. A directory's files up to ``large_file_threshold`` bytes (LARGE_FILE_THRESHOLD)
are read whole and handed to ``LooseBatch.add``; bigger ones go through
``LooseBatch.add_file``, which streams the file twice (hash, then re-hash +
compress into the tmp file) and so holds one chunk, not the file. A file that
changes between the two passes is an InvalidInputError naming it (nothing of the
import is published, the ref stays). Tar members are *not* streamed: a member
can only be re-read by seeking the (possibly compressed) archive back, which for
.tar.gz/.xz means decompressing it again from the start for every big member.
So a member is read into memory as before, but only up to ``max_tar_member_bytes``
(MAX_TAR_MEMBER_BYTES); a larger member is a LimitExceededError raised by the scan,
before anything is written. Extract such an archive and import the directory, or
raise the limit if the memory is there.

Bounds. The scan stops with a LimitExceededError, before anything is written, past
``max_files`` entries (files, symlinks, directories, tar members) or ``max_bytes`` of
content (the sum of file and member sizes), and a directory nested deeper than MAX_DEPTH
is an InvalidInputError: a source that never ends (a huge tree, a tar bomb) is cut at
the scan. Queued jobs pass PACKYARD_IMPORT_MAX_FILES / PACKYARD_IMPORT_MAX_BYTES.
"""
from __future__ import annotations

import functools
import operator
import os
import posixpath
import stat
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .batch.api import PACK_THRESHOLD, begin, fsck_objects
from .batch.contract import BatchCounters, open_source
from .batch.pack import PACK_MEMORY, PackBatch
from .errors import InvalidInputError, LimitExceededError, StoreError
from .fsck import STRICT, FsckOptions
from .fsck.paths import is_hfs_dotgitattributes, is_hfs_dotgitmodules, is_ntfs_dotgitattributes, is_ntfs_dotgitmodules
from .objects import ObjectType
from .progress import Progress
from .refs import RefUpdate, check_ref_name
from .tuning import gc_paused

MODE_FILE = b"100644"
MODE_EXEC = b"100755"
MODE_LINK = b"120000"
MODE_TREE = b"40000"   # as stored in tree objects (git ls-tree shows 040000)

#: Directory files bigger than this are streamed (LooseBatch.add_file) instead of read whole.
LARGE_FILE_THRESHOLD = 8 << 20
#: Tar members are read into memory; a bigger member is refused (LimitExceededError).
MAX_TAR_MEMBER_BYTES = 256 << 20
#: Directories nested deeper than this are refused (the scan recurses once per level).
MAX_DEPTH = 256


@dataclass(slots=True)
class _Budget:
    """What the scan may still accept: entries and content bytes (None: unbounded)."""

    max_files: int | None
    max_bytes: int | None
    files: int = 0
    bytes: int = 0

    def take(self, size: int, where: str) -> None:
        self.files += 1
        self.bytes += size
        if self.max_files is not None and self.files > self.max_files:
            raise LimitExceededError(f"import source has more than {self.max_files} entries (files, links, "
                                     "directories; PACKYARD_IMPORT_MAX_FILES)", path=where)
        if self.max_bytes is not None and self.bytes > self.max_bytes:
            raise LimitExceededError(f"import source holds more than {self.max_bytes} bytes "
                                     "(PACKYARD_IMPORT_MAX_BYTES)", path=where)


@dataclass(frozen=True)
class Identity:
    name: str = "packyard"
    email: str = "packyard@localhost"
    when: int | None = None       # seconds since epoch; None = now
    tz: str = "+0000"

    def line(self, now: int) -> bytes:
        for part in (self.name, self.email):
            if any(c in part for c in "<>\n\0"):
                raise InvalidInputError(f"identity contains a forbidden character: {part!r}")
        when = self.when if self.when is not None else now
        return f"{self.name} <{self.email}> {when} {self.tz}".encode()


@dataclass(frozen=True)
class ImportResult:
    commit: bytes
    tree: bytes
    parent: bytes | None
    ref: str
    files: int
    trees: int
    counters: dict


@dataclass(slots=True)
class _File:
    mode: bytes
    read: Callable[[], bytes] | None   # None: a directory's regular file, read from ``where``
    where: str
    size: int = 0                # a directory's regular file: its size (it may be streamed by path)


@dataclass(slots=True)
class _Dir:
    entries: dict[bytes, "_Dir | _File"] = field(default_factory=dict)


def check_entry_name(name: bytes, where: str) -> None:
    """Reject names git cannot store in a tree (or that git fsck flags)."""
    if not name:
        raise InvalidInputError("empty file name", path=where)
    if b"\0" in name or b"/" in name:
        raise InvalidInputError(f"file name {name!r} contains NUL or '/'", path=where)
    if name in (b".", b".."):
        raise InvalidInputError(f"file name {name!r} is not storable", path=where)
    if name.lower() == b".git":
        raise InvalidInputError("a '.git' entry cannot be stored in a git tree", path=where)


def _check_link_target(target: bytes, link_rel: str, where: str) -> None:
    """A symlink must stay inside the import root (judged lexically from its own directory)."""
    if not target:
        raise InvalidInputError("symlink with an empty target", path=where)
    if target.startswith(b"/"):
        raise InvalidInputError(f"symlink points outside the import root (absolute target {target!r})",
                                path=where)
    base = posixpath.dirname(link_rel.encode("utf-8", "surrogateescape"))
    resolved = posixpath.normpath(posixpath.join(base, target)) if base else posixpath.normpath(target)
    if resolved == b".." or resolved.startswith(b"../"):
        raise InvalidInputError(f"symlink points outside the import root ({target!r})", path=where)


# -- sources ---------------------------------------------------------------------

def _scan_directory(root: Path, budget: _Budget | None = None) -> tuple[_Dir, int]:
    """Walk without following symlinks; the root itself may be a symlink to a directory.

    Regular files are recorded by path and size (read later, once, by ``import_tree``).
    """
    root = root.resolve()
    count = 0
    budget = budget or _Budget(None, None)

    def walk(path: Path, rel: str, depth: int = 0) -> _Dir:
        nonlocal count
        if depth > MAX_DEPTH:
            raise InvalidInputError(f"directories nested more than {MAX_DEPTH} deep", path=str(path))
        node = _Dir()
        try:
            it = os.scandir(path)
        except OSError as err:
            raise InvalidInputError(f"cannot list directory: {err.strerror}", path=str(path)) from err
        with it:
            entries = sorted(it, key=_BY_NAME)
        for e in entries:
            name = e.name.encode(_FS_ENCODING, _FS_ERRORS)     # os.fsencode, without its checks
            check_entry_name(name, e.path)
            try:
                st = e.stat(follow_symlinks=False)
            except OSError as err:
                raise InvalidInputError(f"cannot stat: {err.strerror}", path=e.path) from err
            budget.take(st.st_size if stat.S_ISREG(st.st_mode) else 0, e.path)
            if stat.S_ISDIR(st.st_mode):
                sub = walk(Path(e.path), f"{rel}/{e.name}" if rel else e.name, depth + 1)
                if sub.entries:
                    node.entries[name] = sub
            elif stat.S_ISLNK(st.st_mode):
                target = os.fsencode(os.readlink(e.path))
                _check_link_target(target, f"{rel}/{e.name}" if rel else e.name, e.path)
                node.entries[name] = _File(MODE_LINK, _constant(target), e.path)
                count += 1
            elif stat.S_ISREG(st.st_mode):
                mode = MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
                node.entries[name] = _File(mode, None, e.path, st.st_size)
                count += 1
            else:
                raise InvalidInputError("not a regular file, directory or symlink; git cannot store it",
                                        path=e.path)
        return node

    return walk(root, ""), count


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


_BY_NAME = operator.attrgetter("name")


def _read_for_fsck(path: str, size: int, name: bytes) -> bytes:
    """A large file at a name fsck reads (.gitmodules, .gitattributes), for the check. A .gitattributes
    over git's ATTR_MAX_FILE_SIZE is judged by its size alone (gitattributesLarge): only one byte past
    the limit is read, so a huge file at that name cannot make the import hold all of it in memory."""
    from .fsck import rules

    if (is_hfs_dotgitattributes(name) or is_ntfs_dotgitattributes(name)) and size > rules.ATTR_MAX_FILE_SIZE:
        fd = open_source(path)
        try:
            return os.read(fd, rules.ATTR_MAX_FILE_SIZE + 1)
        finally:
            os.close(fd)
    return _read_file(path, size)


def _read_file(path: str, size: int, limit: int | None = None) -> bytes:
    """open + read + close (3 syscalls; the size is known from the directory scan).

    A file that grew since the scan is read to its end, unless that passes ``limit``
    bytes: then it is refused (reading it whole is what the streamed path avoids).
    """
    try:
        fd = open_source(path)
        try:
            data = os.read(fd, size + 1)       # a regular file returns short only at EOF
            if len(data) > size:               # it grew since the scan: read the rest
                chunks = [data]
                got = len(data)
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                    got += len(chunk)
                    if limit is not None and got > limit:
                        raise InvalidInputError(f"file grew from {size} to more than {limit} bytes since the "
                                                "directory scan; it changed while being imported", path=path)
                data = b"".join(chunks)
            return data
        finally:
            os.close(fd)
    except OSError as err:
        raise InvalidInputError(f"cannot read file: {err.strerror}", path=path) from err


def _scan_tar(path: Path, max_member_bytes: int, budget: _Budget | None = None) -> tuple[_Dir, int, tarfile.TarFile]:
    budget = budget or _Budget(None, None)
    try:
        tar = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as err:
        raise InvalidInputError(f"cannot open tar archive: {err}", path=str(path)) from err
    members: list[tarfile.TarInfo] = []
    try:
        for m in tar:   # member by member, so the budget cuts a tar bomb's header list short
            budget.take(m.size if m.isfile() else 0, f"{path}:{m.name}")
            members.append(m)
    except (tarfile.TarError, OSError, EOFError) as err:
        tar.close()
        raise InvalidInputError(f"corrupt tar archive: {err}", path=str(path)) from err
    except BaseException:
        tar.close()
        raise
    try:
        return _scan_members(tar, members, path, max_member_bytes)
    except BaseException:
        tar.close()
        raise


def _scan_members(tar: tarfile.TarFile, members: list[tarfile.TarInfo], path: Path,
                  max_member_bytes: int) -> tuple[_Dir, int, tarfile.TarFile]:
    root = _Dir()
    files: dict[str, _File] = {}
    count = 0

    def parent_of(parts: list[bytes], where: str) -> _Dir:
        node = root
        for part in parts:
            child = node.entries.get(part)
            if child is None:
                child = node.entries[part] = _Dir()
            elif isinstance(child, _File):
                raise InvalidInputError("tar member is both a file and a directory", path=where)
            node = child
        return node

    for m in members:
        where = f"{path}:{m.name}"
        raw = m.name.encode("utf-8", "surrogateescape")
        if raw.startswith(b"/"):
            raise InvalidInputError("tar member has an absolute path", path=where)
        parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
        if not parts:
            if m.isdir():
                continue
            raise InvalidInputError("tar member has an empty name", path=where)
        for p in parts:
            if p == b"..":
                raise InvalidInputError("tar member path escapes the archive root ('..')", path=where)
            check_entry_name(p, where)
        rel = "/".join(p.decode("utf-8", "surrogateescape") for p in parts)
        if m.isdir():
            parent_of(parts, where)  # creates the directory node (and checks it is not a file)
            continue
        parent = parent_of(parts[:-1], where)
        if isinstance(parent.entries.get(parts[-1]), _Dir):
            raise InvalidInputError("tar member is both a file and a directory", path=where)
        if m.issym():
            target = m.linkname.encode("utf-8", "surrogateescape")
            _check_link_target(target, rel, where)
            f = _File(MODE_LINK, _constant(target), where)
        elif m.isfile() or m.islnk():
            if m.islnk():
                linked = posixpath.normpath(m.linkname)
                if linked not in files:
                    raise InvalidInputError(f"tar hard link to {m.linkname!r}, which is not an earlier file",
                                            path=where)
                f = _File(files[linked].mode, files[linked].read, where)
            else:
                if m.size > max_member_bytes:
                    raise LimitExceededError(
                        f"tar member is {m.size} bytes, over max_tar_member_bytes={max_member_bytes}: tar "
                        "members are read into memory, not streamed; extract the archive and import the "
                        "directory (big files are streamed from there), or raise the limit", path=where)
                mode = MODE_EXEC if m.mode & stat.S_IXUSR else MODE_FILE
                f = _File(mode, functools.partial(_read_member, tar, m, where), where)
        else:
            raise InvalidInputError("tar member is not a file, directory or symlink; git cannot store it",
                                    path=where)
        if parts[-1] not in parent.entries:
            count += 1
        parent.entries[parts[-1]] = f   # a later member replaces an earlier one, as tar -x does
        files[rel] = f
    _prune_empty(root)
    return root, count, tar


def _constant(data: bytes) -> Callable[[], bytes]:
    """A symlink's content (its target) as a _File's reader."""
    return lambda: data


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, where: str) -> bytes:
    try:
        fobj = tar.extractfile(member)
        if fobj is None:
            raise InvalidInputError("tar member has no data", path=where)
        return fobj.read()
    except (tarfile.TarError, OSError, EOFError) as err:
        raise InvalidInputError(f"cannot read tar member: {err}", path=where) from err


def _count_dirs(node: _Dir) -> int:
    """Directories under ``node``, itself included: one tree object each."""
    return 1 + sum(_count_dirs(child) for child in node.entries.values() if isinstance(child, _Dir))


def _prune_empty(node: _Dir) -> bool:
    for name in list(node.entries):
        child = node.entries[name]
        if isinstance(child, _Dir) and not _prune_empty(child):
            del node.entries[name]
    return bool(node.entries)


# -- trees and commit -----------------------------------------------------------

def tree_sort_key(name: bytes, is_tree: bool) -> bytes:
    """git's tree order: byte order, with directory names compared as if followed by '/'."""
    return name + b"/" if is_tree else name


def encode_tree(entries: list[tuple[bytes, bytes, bytes]]) -> bytes:
    """entries: (mode, name, oid); sorted here in git's order."""
    ordered = sorted(entries, key=lambda e: tree_sort_key(e[1], e[0] == MODE_TREE))
    return b"".join(mode + b" " + name + b"\0" + oid for mode, name, oid in ordered)


def encode_commit(tree: bytes, parents: list[bytes], author: bytes, committer: bytes, message: str) -> bytes:
    msg = message.encode()
    if not msg.endswith(b"\n"):
        msg += b"\n"
    lines = [b"tree " + tree.hex().encode()]
    lines += [b"parent " + p.hex().encode() for p in parents]
    lines += [b"author " + author, b"committer " + committer]
    return b"\n".join(lines) + b"\n\n" + msg


@gc_paused()   # many long-lived acyclic objects: see store/tuning.py
def import_tree(repo, ref: str, source: str | os.PathLike[str], *, message: str = "Import",
                author: Identity = Identity(), committer: Identity | None = None,
                counters: BatchCounters | None = None, progress: Progress | None = None,
                large_file_threshold: int = LARGE_FILE_THRESHOLD,
                max_tar_member_bytes: int = MAX_TAR_MEMBER_BYTES, max_files: int | None = None,
                max_bytes: int | None = None, pack_threshold: int | None = PACK_THRESHOLD,
                fsck: FsckOptions | None = None, **batch_options) -> ImportResult:
    """Write ``source`` (directory or tar) as blobs + trees + a commit whose parent is ``ref``'s
    current value, then move ``ref`` by compare-and-swap. Raises InvalidInputError for bad input
    (nothing written), RefUpdateError if the ref moved meanwhile (objects stay unreferenced).

    Memory (see the module docstring): directory files over ``large_file_threshold`` bytes are
    streamed in two passes, reported as phases ``hash`` and ``compress`` with byte counts
    between the ``import`` phase's file counts; a file changed between the passes is an
    InvalidInputError. Tar members over ``max_tar_member_bytes`` are a LimitExceededError, and so is a
    source of more than ``max_files`` entries or ``max_bytes`` of content (found by the scan).

    An import of at least ``pack_threshold`` objects (files, directories and the commit; None: never)
    is written as one pack with computed deltas (store/batch/pack.py) instead of loose files; the
    counters' ``write_path`` says which ("pack" or "loose").

    What it builds is checked by git's fsck (store/fsck; ``fsck`` or git's strict defaults) before
    anything is published: every tree and the commit, the .gitmodules files (FsckError: nothing written)."""
    check_ref_name(ref)
    src = Path(source)
    if not src.exists():
        raise InvalidInputError("import source does not exist", path=str(src))
    t0 = time.monotonic()
    read_limit = max(large_file_threshold, 0)   # a small file that grew past this since the scan is refused
    tar = None
    budget = _Budget(max_files, max_bytes)
    if src.is_dir():
        root, nfiles = _scan_directory(src, budget)
    else:
        root, nfiles, tar = _scan_tar(src, max_tar_member_bytes, budget)
    counters = counters if counters is not None else BatchCounters()
    counters.add_time("scan", time.monotonic() - t0)
    parent = repo.refs.read(ref)
    ntrees = 0
    done = 0
    step = max(1, nfiles // 100)
    # A tar's members cannot be read again cheaply: a pack batch would hold them all, so a tar holding
    # more than PACK_MEMORY is written loose (one member in memory at a time). A directory's files past
    # PACK_MEMORY go into the pack streamed and whole (add_file) instead.
    can_hold = tar is None or budget.bytes <= PACK_MEMORY
    count_hint = nfiles + _count_dirs(root) + 1 if can_hold else None   # None: begin picks loose
    built: list[tuple[ObjectType, bytes]] = []      # trees, the commit, blobs fsck reads (.gitmodules, ...)
    checks = fsck or STRICT
    large: dict[bytes, int] = {}                     # blobs at those names over checks.big_file_threshold
    built_ids: list[bytes] = []
    blob_ids: dict[bytes, int] = {}

    def keep(obj_type: ObjectType, data: bytes, oid: bytes) -> bytes:
        built.append((obj_type, data))
        built_ids.append(oid)
        return oid

    try:
        with begin(repo, count_hint=count_hint, pack_threshold=pack_threshold, counters=counters, progress=progress,
                   **batch_options) as batch:
            pack_batch = batch if isinstance(batch, PackBatch) else None   # which one begin picked, narrowed once
            if pack_batch is None:
                batch.progress = None   # the import reports its own "import" phase; a loose batch's "write" repeats it
            def write(node: _Dir, path: bytes) -> bytes:
                nonlocal ntrees, done
                entries = []
                for name, child in node.entries.items():
                    full = path + name
                    if isinstance(child, _Dir):
                        entries.append((MODE_TREE, name, write(child, full + b"/")))
                    else:
                        gitmodules = (is_hfs_dotgitmodules(name) or is_ntfs_dotgitmodules(name)   # fsck reads it
                                      or is_hfs_dotgitattributes(name) or is_ntfs_dotgitattributes(name))
                        if child.read is not None:          # symlink target, tar member
                            data = child.read()
                            oid, _ = batch.add(ObjectType.BLOB, data, full)
                            if gitmodules:
                                keep(ObjectType.BLOB, data, oid)
                        elif child.size > large_file_threshold or \
                                (pack_batch is not None and pack_batch.held_bytes + child.size > PACK_MEMORY):
                            oid, _ = batch.add_file(child.where, child.size, ObjectType.BLOB, progress=progress,
                                                    name=full)
                            if gitmodules and child.size > checks.big_file_threshold:
                                large[oid] = child.size   # judged by its size, never read (gitmodulesLarge)
                            elif gitmodules:
                                keep(ObjectType.BLOB, _read_for_fsck(child.where, child.size, name), oid)
                        else:
                            data = _read_file(child.where, child.size, read_limit)
                            oid, _ = batch.add(ObjectType.BLOB, data, full)
                            if gitmodules:
                                keep(ObjectType.BLOB, data, oid)
                        blob_ids[oid] = int(ObjectType.BLOB)
                        entries.append((child.mode, name, oid))
                        done += 1
                        if progress is not None and (done % step == 0 or done == nfiles):
                            progress("import", done, nfiles)
                ntrees += 1
                data = encode_tree(entries)
                return keep(ObjectType.TREE, data, batch.add(ObjectType.TREE, data, path.rstrip(b"/"))[0])

            tree = write(root, b"")
            now = int(time.time())
            commit_data = encode_commit(tree, [parent] if parent else [], author.line(now),
                                        (committer or author).line(now), message)
            commit, _ = batch.add(ObjectType.COMMIT, commit_data)
            keep(ObjectType.COMMIT, commit_data, commit)
            fsck_objects(repo, built, checks, known=blob_ids, oids=built_ids, large=large)
            if progress is not None:
                progress("commit", 0, None)
            result = batch.commit([RefUpdate(ref, parent, commit)])
    finally:
        if tar is not None:
            tar.close()
    if progress is not None:
        progress("done", nfiles, nfiles)
    return ImportResult(commit=commit, tree=tree, parent=parent, ref=ref, files=nfiles, trees=ntrees,
                        counters=result.counters)


__all__ = ["Identity", "ImportResult", "import_tree", "LARGE_FILE_THRESHOLD", "MAX_TAR_MEMBER_BYTES", "encode_tree",
           "encode_commit", "check_entry_name", "StoreError"]
