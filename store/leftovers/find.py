"""One finder per kind of the leftovers table: ``find_<kind>(repo, now=...)`` lists what lies there, with
its owner, liveness and the table's verdict, and changes nothing (removal is :func:`..remove`)."""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from .. import durable, lockfile
from ..errors import WriteFailedError
from ..owner import Liveness, Owner, current_owner, liveness, read_owner
from .table import (
    BATCH_MARKER_DIR,
    BATCH_MARKER_RE,
    GRAPH_TMP_RE,
    LOOSE_TMP_PREFIX,
    LOOSE_TMP_RE,
    MIDX_LOCK_NAME,
    PACKED_REFS_TMP_PREFIX,
    PRESERVED_LOOSE_RE,
    PRESERVED_MAPPED_RE,
    QUARANTINE_OWNER,
    QUARANTINE_PREFIX,
    REF_TMP_DIR,
    REF_TMP_PREFIX,
    RULES,
    SERVING_LOCKS,
    Kind,
    Leftover,
    Rule,
    Verdict,
)

_PACK_SIDE = ("pack", "rev", "mtimes", "bitmap")
_HEX = frozenset("0123456789abcdef")


# -- helpers -------------------------------------------------------------------------------------

def _git_dir(repo: object) -> Path:
    """A Repository (its ``.path``) or a git dir path."""
    return Path(getattr(repo, "path", repo))  # type: ignore[arg-type]


def _now(now: float | None) -> float:
    return time.time() if now is None else now


def _scan(d: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(d) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _mtime(path: str | os.PathLike[str]) -> float | None:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return None


@functools.cache
def _host_tag() -> str:
    from ..owner import this_host_tag

    return this_host_tag()


@functools.cache
def _host() -> str:
    return current_owner().host


def _pid_liveness(pid: int) -> Liveness:
    """A pid from a name of this host's tag (host name and PID namespace): no start time in a name, so a
    reused pid reads as alive (kept, never removed wrongly)."""
    return liveness(Owner(pid=pid, host=_host()))


def _alive(record: Owner | None, pid: int | None, tag: str | None) -> Liveness | None:
    """The owner record decides; else a pid in a name of this host's tag; else nobody can judge."""
    if record is not None:
        return liveness(record)
    if pid is not None and tag == _host_tag():
        return _pid_liveness(pid)
    return None


_LOCK_VERDICTS = {lockfile.BreakVerdict.OWNER_DEAD: Verdict.REMOVE_DEAD_OWNER,
                  lockfile.BreakVerdict.AGED_OUT: Verdict.REMOVE_EXPIRED,
                  lockfile.BreakVerdict.OWNER_ALIVE: Verdict.KEEP_LIVE_OWNER,
                  lockfile.BreakVerdict.TOO_YOUNG: Verdict.KEEP_YOUNG}


def _claims(paths: Iterable[Path], kind: Kind, rule: Rule, now: float) -> list[Leftover]:
    """Claim files judged by :func:`..lockfile.judge` (the claim protocol's own rule, with this row's age)."""
    out = []
    for path in paths:
        verdict, owner = lockfile.judge(path, stale_after=rule.unjudged_after, now=now)
        mtime = _mtime(path)
        if verdict is lockfile.BreakVerdict.GONE or mtime is None:
            continue
        out.append(Leftover(path, kind, owner, now - mtime, _LOCK_VERDICTS[verdict],
                            alive=liveness(owner) if owner is not None else None))
    return out


def _aged_files(dirs: Iterable[Path], prefix: str, kind: Kind, rule: Rule, now: float, *,
                owner_re: re.Pattern[str] | None = None, pid_group: int = 1) -> list[Leftover]:
    """Files named ``prefix*`` in ``dirs``, no owner record among them: judged by the pid and host tag in the
    name where ``owner_re`` matches it (groups ``pid_group`` and the next), else by the unjudged age alone."""
    out = []
    for d in dirs:
        for e in sorted((e for e in _scan(d) if e.name.startswith(prefix)), key=lambda e: e.name):
            mtime = _mtime(e.path)
            if mtime is not None:
                alive = _named_liveness(owner_re, e.name, pid_group) if owner_re is not None else None
                out.append(Leftover(Path(e.path), kind, None, now - mtime, rule.verdict(alive, now - mtime),
                                    alive=alive))
    return out


def _named_liveness(owner_re: re.Pattern[str], name: str, pid_group: int) -> Liveness | None:
    """The liveness of the writer whose pid and host tag ``name`` carries (None: not such a name)."""
    m = owner_re.match(name)
    return _alive(None, int(m.group(pid_group)), m.group(pid_group + 1)) if m else None


# -- loose objects -------------------------------------------------------------------------------

def loose_tmp_verdict(name: str, age: float, *, rule: Rule | None = None) -> Verdict | None:
    """The table's verdict for the file ``name`` in a fan-out directory, ``age`` old (None: not a temp file)."""
    if not name.startswith(LOOSE_TMP_PREFIX):
        return None
    return (rule or RULES[Kind.LOOSE_TMP]).verdict(_named_liveness(LOOSE_TMP_RE, name, 1), age)


def _fanouts(objects: Path) -> list[str]:
    return sorted(e.path for e in _scan(objects) if len(e.name) == 2 and set(e.name) <= _HEX)


def find_loose_tmp(repo: object, *, now: float | None = None, rule: Rule | None = None,
                   fanouts: Sequence[str] | None = None) -> list[Leftover]:
    """``objects/xx/tmp_obj_*`` (every fan-out dir, or the names in ``fanouts``)."""
    now, rule = _now(now), rule or RULES[Kind.LOOSE_TMP]
    objects = _git_dir(repo) / "objects"
    dirs = _fanouts(objects) if fanouts is None else [str(objects / f) for f in fanouts]
    return _aged_files([Path(d) for d in dirs], LOOSE_TMP_PREFIX, Kind.LOOSE_TMP, rule, now,
                       owner_re=LOOSE_TMP_RE, pid_group=1)


def create_batch_marker(repo: object, pid: int, batch_id: str) -> Path:
    """``packyard/batches/<pid>_<batch id>`` holding this process's owner record: a live batch's name, so the
    next batch learns with one listing whether one died (:func:`find_batch_markers`)."""
    d = _git_dir(repo) / BATCH_MARKER_DIR
    path = d / f"{pid}_{batch_id}"
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            d.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            from ..durable import write_all

            write_all(fd, current_owner().encode())
        finally:
            os.close(fd)
    except OSError as err:
        durable.unlink_if_present(path)
        raise WriteFailedError(f"cannot create batch marker: {err.strerror}", errno=err.errno, path=path) from err
    return path


def remove_batch_marker(path: Path | None) -> None:
    """The batch is over (committed or aborted): its marker goes."""
    if path is not None:
        durable.unlink_if_present(path)


def find_batch_markers(repo: object, *, now: float | None = None, rule: Rule | None = None,
                       files_of_kept: bool = False) -> list[Leftover]:
    """``packyard/batches/*`` markers; a removable one's ``files`` are its batch's tmp objects (the fan-out dirs
    are read only when one is removable, or every marker's when ``files_of_kept``: the janitor's)."""
    now, rule = _now(now), rule or RULES[Kind.BATCH_MARKER]
    git_dir = _git_dir(repo)
    found: list[tuple[Leftover, str]] = []
    for e in sorted(_scan(git_dir / BATCH_MARKER_DIR), key=lambda e: e.name):
        m = BATCH_MARKER_RE.match(e.name)
        mtime = _mtime(e.path)
        if m is None or mtime is None:
            continue
        record = read_owner(e.path)
        alive = _alive(record, int(m.group(1)), m.group(2))
        item = Leftover(Path(e.path), Kind.BATCH_MARKER, record, now - mtime, rule.verdict(alive, now - mtime),
                        alive=alive)
        found.append((item, f"{m.group(2)}-{m.group(3)}"))
    wanted = {batch for item, batch in found if files_of_kept or item.verdict.removes}
    if not wanted:
        return [item for item, _ in found]
    files: dict[str, list[Path]] = {b: [] for b in wanted}
    for d in _fanouts(git_dir / "objects"):
        for e in _scan(Path(d)):
            m = LOOSE_TMP_RE.match(e.name)
            if m is not None and f"{m.group(2)}-{m.group(3)}" in files:
                files[f"{m.group(2)}-{m.group(3)}"].append(Path(e.path))
    return [dataclasses.replace(item, files=tuple(sorted(files[b]))) if b in files else item for item, b in found]


# -- the pack directory --------------------------------------------------------------------------

def find_pack_temps(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``objects/pack/tmp_*`` (and ``objects/pack/preserved/tmp_*``: the listing nudge of a repack's move,
    install.advance_listing): packyard's grouped by writer tag (``path`` = the owner record ``tmp_owner_<tag>``
    when there is one, judged by it; else by the name's pid), git's and unknown names one by one."""
    from ..objdir import PRESERVED_DIR

    now, rule = _now(now), rule or RULES[Kind.PACK_TMP]
    pack_dir = _git_dir(repo) / "objects" / "pack"
    return _writer_temps(pack_dir, [*_scan(pack_dir), *_scan(pack_dir / PRESERVED_DIR)], Kind.PACK_TMP, rule, now)


def _writer_temps(record_dir: Path, entries: "list[os.DirEntry[str]]", kind: Kind, rule: Rule,
                  now: float) -> list[Leftover]:
    """The pack writer's ``tmp_*`` files among ``entries``, grouped by writer tag (judged by the owner record
    ``record_dir/tmp_owner_<tag>`` when there is one, else by the name's pid); other ``tmp_*`` names one by one."""
    from ..pack.write import OWNER_PREFIX, TMP_RE

    groups: dict[str, list[Path]] = {}
    out = []
    for e in sorted(entries, key=lambda e: e.name):
        if not e.name.startswith("tmp_") or not e.is_file(follow_symlinks=False):
            continue
        m = TMP_RE.match(e.name)
        if m is not None:
            groups.setdefault(e.name.split("_", 2)[2], []).append(Path(e.path))
            continue
        mtime = _mtime(e.path)
        if mtime is not None:
            out.append(Leftover(Path(e.path), kind, None, now - mtime, rule.verdict(None, now - mtime)))
    for tag, paths in groups.items():
        record_path = record_dir / f"{OWNER_PREFIX}{tag}"
        record = read_owner(record_path) if record_path in paths else None
        mtimes = [t for t in map(_mtime, paths) if t is not None]
        if not mtimes:
            continue
        pid, host_tag = tag.split("_", 1)[0], tag.split("_", 1)[1].split("-", 1)[0]
        alive = _alive(record, int(pid), host_tag)
        head = record_path if record_path in paths else paths[0]
        age = now - max(mtimes)
        out.append(Leftover(head, kind, record, age, rule.verdict(alive, age),
                            files=tuple(p for p in paths if p != head), alive=alive))
    return out


def _pack_names(pack_dir: Path) -> dict[str, os.DirEntry[str]]:
    return {e.name: e for e in _scan(pack_dir)}


def _sides_without_idx(pack_dir: Path, names: dict[str, os.DirEntry[str]]
                       ) -> Iterator[tuple[str, os.DirEntry[str], bool]]:
    """``pack-*.{pack,rev,mtimes,bitmap}`` whose ``.idx`` is not beside them, in name order: (stem, entry,
    whether that ``.idx`` is in preserved/)."""
    from ..objdir import PRESERVED_DIR

    for name, e in sorted(names.items()):
        stem, _, ext = name.rpartition(".")
        if name.startswith("pack-") and ext in _PACK_SIDE and f"{stem}.idx" not in names:
            yield stem, e, (pack_dir / PRESERVED_DIR / f"{stem}.idx").exists()


def find_orphan_packs(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``pack-*.{pack,rev,mtimes,bitmap}`` without their ``.idx`` (none in preserved/ either)."""
    now, rule = _now(now), rule or RULES[Kind.ORPHAN_PACK]
    pack_dir = _git_dir(repo) / "objects" / "pack"
    out = []
    for _stem, e, preserved in _sides_without_idx(pack_dir, _pack_names(pack_dir)):
        if preserved:
            continue                 # a half-finished move to preserved/: find_half_preserved's
        mtime = _mtime(e.path)
        if mtime is not None:
            out.append(Leftover(Path(e.path), Kind.ORPHAN_PACK, None, now - mtime, rule.verdict(None, now - mtime)))
    return out


def find_half_preserved(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """Packs whose ``.idx`` is already in preserved/ but whose other files are not: one per pack."""
    now, rule = _now(now), rule or RULES[Kind.HALF_PRESERVED]
    pack_dir = _git_dir(repo) / "objects" / "pack"
    stems: dict[str, Path] = {}
    for stem, e, preserved in _sides_without_idx(pack_dir, _pack_names(pack_dir)):
        if preserved:
            stems.setdefault(stem, Path(e.path))
    out = []
    for path in stems.values():
        mtime = _mtime(path)
        if mtime is not None:
            out.append(Leftover(path, Kind.HALF_PRESERVED, None, now - mtime, Verdict.FINISH_MOVE
                                if rule.verdict(None, now - mtime).removes else Verdict.KEEP_YOUNG))
    return out


def find_orphan_idx(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``pack-*.idx`` whose ``.pack`` is gone."""
    now, rule = _now(now), rule or RULES[Kind.ORPHAN_IDX]
    pack_dir = _git_dir(repo) / "objects" / "pack"
    names = _pack_names(pack_dir)
    out = []
    for name, e in sorted(names.items()):
        if name.startswith("pack-") and name.endswith(".idx") and f"{name[:-4]}.pack" not in names:
            mtime = _mtime(e.path)
            if mtime is not None:
                out.append(Leftover(Path(e.path), Kind.ORPHAN_IDX, None, now - mtime, rule.verdict(None, now - mtime)))
    return out


def find_midx_lock(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``objects/pack/multi-pack-index.lock`` (packyard's claim, or git's own lock file)."""
    path = _git_dir(repo) / "objects" / "pack" / MIDX_LOCK_NAME
    return _claims([path] if path.exists() else [], Kind.MIDX_LOCK, rule or RULES[Kind.MIDX_LOCK], _now(now))


def _preserved_entries(repo: object, kind: Kind, wanted: Callable[[os.DirEntry[str]], bool], now: float | None,
                       rule: Rule | None) -> list[Leftover]:
    """The entries of ``objects/pack/preserved/`` that ``wanted`` picks, as ``kind`` leftovers aged by their mtime
    (nobody owns them)."""
    from ..objdir import PRESERVED_DIR

    now, rule = _now(now), rule or RULES[kind]
    out = []
    for e in sorted(_scan(_git_dir(repo) / "objects" / "pack" / PRESERVED_DIR), key=lambda e: e.name):
        if not wanted(e):
            continue
        mtime = _mtime(e.path)
        if mtime is not None:
            out.append(Leftover(Path(e.path), kind, None, now - mtime, rule.verdict(None, now - mtime)))
    return out


def find_preserved_mapped(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``objects/pack/preserved/{multi-pack-index,commit-graph,packed-refs,multi-pack-index-<checksum>.{bitmap,rev},
    pack-<checksum>.<ext>}-<hex>.old``: old inodes of the files git mmaps, kept for readers on other hosts, aged by
    their mtime (set when they were linked there)."""
    return _preserved_entries(repo, Kind.PRESERVED_MAPPED, lambda e: PRESERVED_MAPPED_RE.match(e.name) is not None,
                              now, rule)


def find_preserved_loose(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``objects/pack/preserved/loose-<hex>/``: a repack's second names of the loose files it deleted on a shared
    filesystem (store/maintenance/preserved/loose.py), aged by the directory's mtime (set when the delete ended)."""
    return _preserved_entries(repo, Kind.PRESERVED_LOOSE, lambda e: PRESERVED_LOOSE_RE.match(e.name) is not None
                              and e.is_dir(follow_symlinks=False), now, rule)


def find_keeps(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``pack-*.keep`` files carrying packyard's owner record (an operator's ``.keep`` is not listed)."""
    now, rule = _now(now), rule or RULES[Kind.KEEP]
    out = []
    for e in sorted(_scan(_git_dir(repo) / "objects" / "pack"), key=lambda e: e.name):
        if e.name.startswith("pack-") and e.name.endswith(".keep"):
            record, mtime = read_owner(e.path), _mtime(e.path)
            if record is not None and mtime is not None:
                alive = liveness(record)
                out.append(Leftover(Path(e.path), Kind.KEEP, record, now - mtime, rule.verdict(alive, now - mtime),
                                    alive=alive))
    return out


# -- quarantines ---------------------------------------------------------------------------------

def find_quarantines(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``objects/incoming-*/``, aged by their newest entry, judged by the ``packyard-owner`` record inside."""
    now, rule = _now(now), rule or RULES[Kind.QUARANTINE]
    out = []
    for e in sorted(_scan(_git_dir(repo) / "objects"), key=lambda e: e.name):
        if not e.name.startswith(QUARANTINE_PREFIX) or not e.is_dir(follow_symlinks=False):
            continue
        mtimes = [_mtime(e.path)] + [_mtime(f.path) for f in _scan(Path(e.path))]
        if mtimes[0] is None:
            continue
        age = now - max(t for t in mtimes if t is not None)
        record = read_owner(Path(e.path) / QUARANTINE_OWNER)
        alive = liveness(record) if record is not None else None
        out.append(Leftover(Path(e.path), Kind.QUARANTINE, record, age, rule.verdict(alive, age), alive=alive))
    return out


# -- the commit-graph's and pack-refs' leftovers -------------------------------------------------

def _serving_claim_paths(git_dir: Path) -> list[Path]:
    out: list[Path] = []
    for rel in SERVING_LOCKS:
        path = git_dir / rel
        out += [Path(e.path) for e in sorted(_scan(path.parent), key=lambda e: e.name)
                if e.name == path.name or (e.name.startswith(path.name + ".") and e.name.endswith(".lock"))]
    return out


def find_serving_locks(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``packed-refs.lock``, ``commit-graph-chain.lock`` and their side files."""
    return _claims(_serving_claim_paths(_git_dir(repo)), Kind.SERVING_LOCK, rule or RULES[Kind.SERVING_LOCK],
                   _now(now))


def find_graph_temps(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``objects/info/commit-graphs/tmp_*`` (ours by the pid in the name, git's by age)."""
    return _aged_files([_git_dir(repo) / "objects" / "info" / "commit-graphs"], "tmp_", Kind.GRAPH_TMP,
                       rule or RULES[Kind.GRAPH_TMP], _now(now), owner_re=GRAPH_TMP_RE, pid_group=2)


def find_packed_refs_temps(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``packyard/tmp/packed-refs-*``."""
    return _aged_files([_git_dir(repo) / REF_TMP_DIR], PACKED_REFS_TMP_PREFIX, Kind.PACKED_REFS_TMP,
                       rule or RULES[Kind.PACKED_REFS_TMP], _now(now))


def find_packed_refs_new(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``packed-refs.new`` (git's)."""
    return _aged_files([_git_dir(repo)], "packed-refs.new", Kind.PACKED_REFS_NEW, rule or RULES[Kind.PACKED_REFS_NEW],
                       _now(now))


# -- refs ----------------------------------------------------------------------------------------

def find_ref_claims(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """Every ``*.lock`` under ``refs/`` and ``packyard/`` (ref claims, the fence claim, their side files)."""
    git_dir = _git_dir(repo)
    paths: list[Path] = []
    for top in (git_dir / "refs", git_dir / "packyard"):
        for dirpath, _dirs, names in os.walk(top):
            paths += [Path(dirpath) / n for n in names if n.endswith(".lock")]
    return _claims(sorted(paths), Kind.REF_CLAIM, rule or RULES[Kind.REF_CLAIM], _now(now))


def find_ref_temps(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``packyard/tmp/ref-*``."""
    return _aged_files([_git_dir(repo) / REF_TMP_DIR], REF_TMP_PREFIX, Kind.REF_TMP, rule or RULES[Kind.REF_TMP],
                       _now(now))


# -- durable single-file writes and pool deletions ---------------------------------------------------

def find_durable_temps(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``.tmp-<pid>-<name>`` in the git dir, ``packyard/`` and ``objects/info/`` (durable.write_file_durably)."""
    from .table import DURABLE_TMP_DIRS, DURABLE_TMP_PREFIX

    git_dir = _git_dir(repo)
    return _aged_files([git_dir / d for d in DURABLE_TMP_DIRS], DURABLE_TMP_PREFIX, Kind.DURABLE_TMP,
                       rule or RULES[Kind.DURABLE_TMP], _now(now))


def find_pool_deletions(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``<pool>.deleting-*`` directories beside ``repo`` (a path: the pool itself is gone once renamed)."""
    from .table import POOL_DELETING_INFIX

    where = getattr(repo, "path", repo)   # a Repository, or the (vanished) pool's path
    path = Path(os.path.realpath(where if isinstance(where, (str, os.PathLike)) else str(where)))
    now, rule = _now(now), rule or RULES[Kind.POOL_DELETING]
    out = []
    for e in sorted((e for e in _scan(path.parent) if e.name.startswith(path.name + POOL_DELETING_INFIX)
                     and e.is_dir(follow_symlinks=False)), key=lambda e: e.name):
        mtime = _mtime(e.path)
        if mtime is not None:
            out.append(Leftover(Path(e.path), Kind.POOL_DELETING, None, now - mtime, rule.verdict(None, now - mtime)))
    return out


def find_backup_temps(backup_dir: str | os.PathLike[str], *, now: float | None = None,
                      rule: Rule | None = None) -> list[Leftover]:
    """In a repository's backup directory (store/backup; ``backup_dir`` a path): the bundle writer's temp files,
    grouped by writer tag as pack temps are, and the manifest's ``.tmp-<pid>-manifest.json``."""
    from .table import DURABLE_TMP_PREFIX

    d = Path(os.fspath(backup_dir))
    now, rule = _now(now), rule or RULES[Kind.BACKUP_TMP]
    return [*_writer_temps(d, list(_scan(d)), Kind.BACKUP_TMP, rule, now),
            *_aged_files([d], DURABLE_TMP_PREFIX, Kind.BACKUP_TMP, rule, now)]


def find_restore_temps(target: str | os.PathLike[str], *, now: float | None = None,
                       rule: Rule | None = None) -> list[Leftover]:
    """``.<name>.restoring-*`` and ``.<name>.replaced-*`` directories beside a restore's ``target`` (a path),
    aged by their newest file (at most :data:`~.table.RESTORE_SCAN_LIMIT` looked at)."""
    from .table import RESTORE_INFIXES, RESTORE_SCAN_LIMIT

    path = Path(os.path.realpath(os.fspath(target)))
    now, rule = _now(now), rule or RULES[Kind.RESTORE_TMP]
    prefixes = tuple(f".{path.name}{infix}" for infix in RESTORE_INFIXES)
    out = []
    for e in sorted((e for e in _scan(path.parent) if e.name.startswith(prefixes) and e.is_dir(follow_symlinks=False)),
                    key=lambda e: e.name):
        newest = _mtime(e.path)
        if newest is None:
            continue
        for n, (dirpath, _dirs, files) in enumerate(os.walk(e.path)):
            for f in [dirpath, *(os.path.join(dirpath, name) for name in files)]:
                t = _mtime(f)
                newest = max(newest, t if t is not None else newest)
            if n >= RESTORE_SCAN_LIMIT:
                break
        out.append(Leftover(Path(e.path), Kind.RESTORE_TMP, None, now - newest, rule.verdict(None, now - newest)))
    return out


#: Every finder by kind (the table test walks it; ``find_half_preserved`` and ``find_orphan_packs`` share a listing).
FINDERS: dict[Kind, Callable[..., list[Leftover]]] = {
    Kind.LOOSE_TMP: find_loose_tmp, Kind.BATCH_MARKER: find_batch_markers, Kind.PACK_TMP: find_pack_temps,
    Kind.ORPHAN_PACK: find_orphan_packs, Kind.HALF_PRESERVED: find_half_preserved, Kind.ORPHAN_IDX: find_orphan_idx,
    Kind.MIDX_LOCK: find_midx_lock, Kind.QUARANTINE: find_quarantines, Kind.KEEP: find_keeps,
    Kind.SERVING_LOCK: find_serving_locks, Kind.GRAPH_TMP: find_graph_temps,
    Kind.PACKED_REFS_TMP: find_packed_refs_temps, Kind.PACKED_REFS_NEW: find_packed_refs_new,
    Kind.REF_CLAIM: find_ref_claims, Kind.REF_TMP: find_ref_temps, Kind.PRESERVED_MAPPED: find_preserved_mapped,
    Kind.PRESERVED_LOOSE: find_preserved_loose, Kind.DURABLE_TMP: find_durable_temps,
    Kind.POOL_DELETING: find_pool_deletions, Kind.BACKUP_TMP: find_backup_temps,
    Kind.RESTORE_TMP: find_restore_temps,
}


