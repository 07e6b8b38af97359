"""Every file a dead writer leaves behind, the one age rule per kind, and the one way to remove them.

In the shape of Gitaly's ``housekeeping/clean_stale_data.go``: one table of what may be left
(name pattern, where, how old before it goes, and why), one ``find_<kind>(repo, now=...)`` per
kind that lists what lies there and judges it, and one :func:`remove`. Finders change nothing;
callers remove what they decide to (``removable(found)`` for the table's verdict). Who runs them:

* a loose batch, as it begins: :func:`find_batch_markers` (one listing; the fan-out dirs are read
  only when a dead batch left a marker);
* a pack batch, an index-pack and every repack, before they write: the pack directory's kinds
  (``store/maintenance/leftovers.remove_stale_temp_files``);
* ``packyard gc`` / the ``packyard.gc`` job: every kind but ``.keep`` files;
* ``packyard janitor``: the kinds with an owner record, judged by the owner's job
  (``workers/commands/janitor.py``), then gc's pass for the rest;
* the maintenance statistics count ``removable`` leftovers with the same rules.

Liveness is :func:`..owner.liveness` (pid reuse, reboots, other hosts and PID namespaces). A name
that carries only a pid (``tmp_obj_<pid>_<tag>-…``) is judged as an owner without a start time: a
reused pid reads as alive, so its file is kept, never removed wrongly.

The table (:data:`RULES`; ages in seconds; "dead" = owner provably dead, "unjudged" = no owner
record and no pid in the name, or another host's)::

    kind              where                                          dead   unjudged
    loose_tmp         objects/xx/tmp_obj_*                            600   14 days
    batch_marker      packyard/batches/<pid>_<tag>-<rand>             600   14 days
    pack_tmp          objects/pack/tmp_{pack,idx,rev,...}_*             0   14 days
    orphan_pack       objects/pack/pack-*.{pack,rev,mtimes,bitmap}      -   600      (no .idx)
    half_preserved    objects/pack/pack-*.* whose .idx is in preserved/ -   0        (finish the move)
    orphan_idx        objects/pack/pack-*.idx without its .pack          -   600
    midx_lock         objects/pack/multi-pack-index.lock                0   600
    quarantine        objects/incoming-*/                             3600  3600     (untouched since)
    keep              objects/pack/pack-*.keep with an owner record     0   never    (janitor only)
    serving_lock      packed-refs.lock, commit-graph-chain.lock (+side) 0   600
    graph_tmp         objects/info/commit-graphs/tmp_{graph,chain}_*    0   14 days
    packed_refs_tmp   packyard/tmp/packed-refs-*                        -   600
    packed_refs_new   packed-refs.new (git's packed-refs writer)        -   600
    ref_claim         refs/**.lock, packyard/**.lock                    0   600
    ref_tmp           packyard/tmp/ref-*                                -   600

A live owner's leftover is never removed by age. Each row's ``reason`` says why its ages are what
they are; ``docs/operating.md`` shows the table.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

from . import lockfile
from .errors import WriteFailedError
from .owner import Liveness, Owner, current_owner, liveness, read_owner

# -- names ---------------------------------------------------------------------------------------

#: Loose batch temp files: ``tmp_obj_<pid>_<host tag>-<batch rand>_<n>`` (git's own: ``tmp_obj_XXXXXX``).
LOOSE_TMP_PREFIX = "tmp_obj_"
LOOSE_TMP_RE = re.compile(r"^tmp_obj_(\d+)_([0-9a-f]{4})-([0-9a-f]{8})_(\d+)$")
#: A live loose batch's marker, ``packyard/batches/<pid>_<host tag>-<batch rand>``, holding its owner record.
BATCH_MARKER_DIR = "packyard/batches"
BATCH_MARKER_RE = re.compile(r"^(\d+)_([0-9a-f]{4})-([0-9a-f]{8})$")
#: index-pack's quarantine directories (``objects/incoming-<random>``) and the owner record inside each.
QUARANTINE_PREFIX = "incoming-"
QUARANTINE_OWNER = "packyard-owner"
#: Where the commit-graph and pack-refs writers claim (relative to the git dir).
SERVING_LOCKS = ("packed-refs.lock", "objects/info/commit-graphs/commit-graph-chain.lock")
GRAPH_TMP_RE = re.compile(r"^tmp_(graph|chain)_(\d+)_([0-9a-f]{4})-([0-9a-f]{8})$")
_PACK_SIDE = ("pack", "rev", "mtimes", "bitmap")
_HEX = frozenset("0123456789abcdef")

HOUR = 3600.0
#: git's default prune expiry (``gc.pruneExpire`` = 2.weeks.ago): what nobody can judge waits this long.
PRUNE_EXPIRE = 14 * 24 * HOUR
#: A dead loose batch's marker and tmp files wait this long after their owner died.
DEAD_WRITER_AFTER = 600.0
#: A lock nobody can judge (git's own, another host's) is presumed abandoned after this long.
CLAIM_EXPIRE = lockfile.DEFAULT_STALE_AFTER


class Kind(enum.Enum):
    LOOSE_TMP = "loose_tmp"
    BATCH_MARKER = "batch_marker"
    PACK_TMP = "pack_tmp"
    ORPHAN_PACK = "orphan_pack"
    HALF_PRESERVED = "half_preserved"
    ORPHAN_IDX = "orphan_idx"
    MIDX_LOCK = "midx_lock"
    QUARANTINE = "quarantine"
    KEEP = "keep"
    SERVING_LOCK = "serving_lock"
    GRAPH_TMP = "graph_tmp"
    PACKED_REFS_TMP = "packed_refs_tmp"
    PACKED_REFS_NEW = "packed_refs_new"
    REF_CLAIM = "ref_claim"
    REF_TMP = "ref_tmp"


class Verdict(enum.Enum):
    """What the table says of one leftover (a result, not a boolean)."""

    KEEP_LIVE_OWNER = "keep-live-owner"       # its owner runs: never removed by age
    KEEP_YOUNG = "keep-young"                 # not old enough for its rule yet
    KEEP_NOT_OURS = "keep-not-ours"           # no age rule applies (an operator's .keep)
    REMOVE_DEAD_OWNER = "remove-dead-owner"   # owner provably dead, and past the dead rule's age
    REMOVE_EXPIRED = "remove-expired"         # nobody can judge it, and past the unjudged rule's age
    FINISH_MOVE = "finish-move"               # a pack half moved to preserved/: the move is completed

    @property
    def removes(self) -> bool:
        return self in (Verdict.REMOVE_DEAD_OWNER, Verdict.REMOVE_EXPIRED, Verdict.FINISH_MOVE)


@dataclass(frozen=True)
class Rule:
    """One row of the table: how old a leftover of ``kind`` must be before it goes, and why."""

    kind: Kind
    where: str                     # path pattern, relative to the git dir
    dead_after: float | None       # age at which a provably dead owner's goes (None: no owner to judge)
    unjudged_after: float | None   # age at which one nobody can judge goes (None: never)
    reason: str

    def aged(self, *, dead_after: float | None = None, unjudged_after: float | None = None) -> "Rule":
        """This rule with other ages (an operator's ``--stale-after``; tests)."""
        return dataclasses.replace(
            self, dead_after=self.dead_after if dead_after is None else dead_after,
            unjudged_after=self.unjudged_after if unjudged_after is None else unjudged_after)

    def verdict(self, alive: Liveness | None, age: float) -> Verdict:
        """The table's verdict for a leftover whose owner is ``alive`` (None: no owner known) and ``age`` old."""
        if alive is Liveness.ALIVE:
            return Verdict.KEEP_LIVE_OWNER
        if alive is Liveness.DEAD and self.dead_after is not None:
            return Verdict.REMOVE_DEAD_OWNER if age >= self.dead_after else Verdict.KEEP_YOUNG
        if self.unjudged_after is None:
            return Verdict.KEEP_NOT_OURS
        return Verdict.REMOVE_EXPIRED if age >= self.unjudged_after else Verdict.KEEP_YOUNG


_RULES: tuple[Rule, ...] = (
    Rule(Kind.LOOSE_TMP, "objects/xx/tmp_obj_*", DEAD_WRITER_AFTER, PRUNE_EXPIRE,
         "A loose batch's temp object. Its batch's marker is the fast path (it removes the files at once "
         "when the batch is dead); a lone file, judged by the pid in its name alone, waits 10 minutes after "
         "that pid is gone, as the batch writer always did. git's own tmp_obj_XXXXXX and another host's: "
         "git's prune expiry, as `git prune` does."),
    Rule(Kind.BATCH_MARKER, f"{BATCH_MARKER_DIR}/<pid>_<tag>-<rand>", DEAD_WRITER_AFTER, PRUNE_EXPIRE,
         "Names a running loose batch. Dead for 10 minutes: the batch is over, and its tmp objects go with "
         "the marker whatever their own age (nothing renames them any more). Another host's: prune expiry."),
    Rule(Kind.PACK_TMP, "objects/pack/tmp_<kind>_<pid>_<tag>-<rand>", 0.0, PRUNE_EXPIRE,
         "A pack writer's temp files (pack, idx, rev, mtimes, bitmap, keep, midx, owner record), grouped by "
         "the writer's tag. A dead writer's go at once: they can be gigabytes, a repack runs this first, and "
         "nothing renames them once the writer is gone. git's tmp_pack_XXXXXX and another host's: prune expiry."),
    Rule(Kind.ORPHAN_PACK, "objects/pack/pack-*.{pack,rev,mtimes,bitmap} without .idx", None, 600.0,
         "Invisible to readers (the idx is renamed in last); an install killed between its renames leaves "
         "it. 10 minutes: longer than any install's rename sequence."),
    Rule(Kind.HALF_PRESERVED, "objects/pack/pack-* whose .idx is in preserved/", None, 0.0,
         "A repack died moving this pack to preserved/ (idx first): the move is finished, never undone."),
    Rule(Kind.ORPHAN_IDX, "objects/pack/pack-*.idx without its .pack", None, 600.0,
         "What git's unlink_pack_path leaves when interrupted (it removes the .pack first); readers treat "
         "it as absent. 10 minutes: a `git repack` may be between its unlinks."),
    Rule(Kind.MIDX_LOCK, "objects/pack/multi-pack-index.lock", 0.0, CLAIM_EXPIRE,
         "The multi-pack-index writer's claim. It blocks every later MIDX write: a dead owner's goes at "
         "once; git's own (no owner record) after 10 minutes (git holds it for one write)."),
    Rule(Kind.QUARANTINE, "objects/incoming-*/", HOUR, HOUR,
         "An index-pack's quarantine, aged by its newest file (a live ingest keeps writing into it). One "
         "hour untouched whoever owned it (gc --quarantine-after): a slow push's quarantine is not removed "
         "under it. A live owner's never. The janitor removes a dead owner's at once."),
    Rule(Kind.KEEP, "objects/pack/pack-*.keep with an owner record", 0.0, None,
         "An ingest's .keep protects its pack until the refs name it. A dead ingest's is nobody's; one without "
         "our owner record is an operator's or git's and never goes. Only the janitor removes these."),
    Rule(Kind.SERVING_LOCK, "packed-refs.lock, objects/info/commit-graphs/commit-graph-chain.lock", 0.0,
         CLAIM_EXPIRE,
         "The pack-refs and commit-graph writers' claims (and their side files): as every claim file "
         "(store/lockfile.py), a dead owner's at once, one nobody can judge after 10 minutes."),
    Rule(Kind.GRAPH_TMP, "objects/info/commit-graphs/tmp_{graph,chain}_<pid>_<tag>-<rand>", 0.0, PRUNE_EXPIRE,
         "The commit-graph writer's temp files: a dead writer's at once (as pack temps); git's "
         "tmp_graph_XXXXXX after git's prune expiry."),
    Rule(Kind.PACKED_REFS_TMP, "packyard/tmp/packed-refs-*", None, CLAIM_EXPIRE,
         "Live only while its writer holds packed-refs.lock (milliseconds): orphans after the claim's age."),
    Rule(Kind.PACKED_REFS_NEW, "packed-refs.new", None, CLAIM_EXPIRE,
         "git's packed-refs writer stages the new file here while it holds packed-refs.lock; a git killed "
         "meanwhile leaves both, and every later packed-refs write then fails (\"File exists\"). Nobody can "
         "judge it (no owner record): it goes after the claim's age, with the lock (Gitaly: 15 minutes)."),
    Rule(Kind.REF_CLAIM, "refs/**.lock, packyard/**.lock", 0.0, CLAIM_EXPIRE,
         "Ref and fence claims: a ref update holds them for milliseconds; a dead owner's at once, one "
         "nobody can judge (git's own) after 10 minutes, a live owner's never (store/lockfile.py)."),
    Rule(Kind.REF_TMP, "packyard/tmp/ref-*", None, CLAIM_EXPIRE,
         "A ref file being written, live only while its writer holds the ref's claim: orphans after the "
         "claim's age."),
)
#: The table: one rule per kind.
RULES: dict[Kind, Rule] = {r.kind: r for r in _RULES}


@dataclass(frozen=True)
class Leftover:
    """One thing a writer left, as found now: where, what, whose, how old and the table's verdict."""

    path: Path                      # the file or directory (a marker, an owner record, a claim)
    kind: Kind
    owner: Owner | None             # the owner record it carries (None: none; a name's pid is not a record)
    age: float                      # seconds since it (or its newest file) was last written
    verdict: Verdict
    files: tuple[Path, ...] = ()    # what goes with it, removed before ``path`` (a batch's tmp objects)
    alive: Liveness | None = None   # the owner's liveness as judged (from the record or the name's pid)

    @property
    def count(self) -> int:
        """Files this leftover stands for (itself and what goes with it)."""
        return 1 + len(self.files)


def removable(found: Iterable[Leftover]) -> list[Leftover]:
    """Those the table says go."""
    return [f for f in found if f.verdict.removes]


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


def _host_tag() -> str:
    from .pack.write import this_host_tag

    return this_host_tag()


def _pid_liveness(pid: int) -> Liveness:
    """A pid from a name of this host: no start time, so a reused pid reads as alive (kept)."""
    return liveness(Owner(pid=pid, host=current_owner().host))


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


def _aged_files(d: Path, prefix: str, kind: Kind, rule: Rule, now: float) -> list[Leftover]:
    """Files named ``prefix*`` in ``d`` with no owner to judge: the unjudged age alone."""
    out = []
    for e in sorted(_scan(d), key=lambda e: e.name):
        if e.name.startswith(prefix):
            mtime = _mtime(e.path)
            if mtime is not None:
                out.append(Leftover(Path(e.path), kind, None, now - mtime, rule.verdict(None, now - mtime)))
    return out


# -- loose objects -------------------------------------------------------------------------------

def loose_tmp_verdict(name: str, age: float, *, rule: Rule | None = None) -> Verdict | None:
    """The table's verdict for the file ``name`` in a fan-out directory, ``age`` old (None: not a temp file)."""
    if not name.startswith(LOOSE_TMP_PREFIX):
        return None
    rule = rule or RULES[Kind.LOOSE_TMP]
    m = LOOSE_TMP_RE.match(name)
    return rule.verdict(_alive(None, int(m.group(1)), m.group(2)) if m else None, age)


def _fanouts(objects: Path) -> list[str]:
    return sorted(e.path for e in _scan(objects) if len(e.name) == 2 and set(e.name) <= _HEX)


def find_loose_tmp(repo: object, *, now: float | None = None, rule: Rule | None = None,
                   fanouts: Sequence[str] | None = None) -> list[Leftover]:
    """``objects/xx/tmp_obj_*`` (every fan-out dir, or the names in ``fanouts``)."""
    now, rule = _now(now), rule or RULES[Kind.LOOSE_TMP]
    objects = _git_dir(repo) / "objects"
    dirs = _fanouts(objects) if fanouts is None else [str(objects / f) for f in fanouts]
    out = []
    for d in dirs:
        for e in _scan(Path(d)):
            if not e.name.startswith(LOOSE_TMP_PREFIX):
                continue
            mtime = _mtime(e.path)
            if mtime is None:
                continue
            m = LOOSE_TMP_RE.match(e.name)
            alive = _alive(None, int(m.group(1)), m.group(2)) if m else None
            out.append(Leftover(Path(e.path), Kind.LOOSE_TMP, None, now - mtime, rule.verdict(alive, now - mtime),
                                alive=alive))
    return out


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
            from .durable import write_all

            write_all(fd, current_owner().encode())
        finally:
            os.close(fd)
    except OSError as err:
        _unlink(path)
        raise WriteFailedError(f"cannot create batch marker: {err.strerror}", errno=err.errno, path=path) from err
    return path


def remove_batch_marker(path: Path | None) -> None:
    """The batch is over (committed or aborted): its marker goes."""
    if path is not None:
        _unlink(path)


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
    """``objects/pack/tmp_*``: packyard's grouped by writer tag (``path`` = the owner record ``tmp_owner_<tag>``
    when there is one, judged by it; else by the name's pid), git's and unknown names one by one."""
    from .pack.write import OWNER_PREFIX, TMP_RE

    now, rule = _now(now), rule or RULES[Kind.PACK_TMP]
    pack_dir = _git_dir(repo) / "objects" / "pack"
    groups: dict[str, list[Path]] = {}
    out = []
    for e in sorted(_scan(pack_dir), key=lambda e: e.name):
        if not e.name.startswith("tmp_") or not e.is_file(follow_symlinks=False):
            continue
        m = TMP_RE.match(e.name)
        if m is not None:
            groups.setdefault(e.name.split("_", 2)[2], []).append(Path(e.path))
            continue
        mtime = _mtime(e.path)
        if mtime is not None:
            out.append(Leftover(Path(e.path), Kind.PACK_TMP, None, now - mtime, rule.verdict(None, now - mtime)))
    for tag, paths in groups.items():
        record_path = pack_dir / f"{OWNER_PREFIX}{tag}"
        record = read_owner(record_path) if record_path in paths else None
        mtimes = [t for t in map(_mtime, paths) if t is not None]
        if not mtimes:
            continue
        pid, host_tag = tag.split("_", 1)[0], tag.split("_", 1)[1].split("-", 1)[0]
        alive = _alive(record, int(pid), host_tag)
        head = record_path if record_path in paths else paths[0]
        age = now - max(mtimes)
        out.append(Leftover(head, Kind.PACK_TMP, record, age, rule.verdict(alive, age),
                            files=tuple(p for p in paths if p != head), alive=alive))
    return out


def _pack_names(pack_dir: Path) -> dict[str, os.DirEntry[str]]:
    return {e.name: e for e in _scan(pack_dir)}


def find_orphan_packs(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``pack-*.{pack,rev,mtimes,bitmap}`` without their ``.idx`` (none in preserved/ either)."""
    from .objdir import PRESERVED_DIR

    now, rule = _now(now), rule or RULES[Kind.ORPHAN_PACK]
    pack_dir = _git_dir(repo) / "objects" / "pack"
    names = _pack_names(pack_dir)
    out = []
    for name, e in sorted(names.items()):
        stem, _, ext = name.rpartition(".")
        if not name.startswith("pack-") or ext not in _PACK_SIDE or f"{stem}.idx" in names \
                or (pack_dir / PRESERVED_DIR / f"{stem}.idx").exists():
            continue
        mtime = _mtime(e.path)
        if mtime is not None:
            out.append(Leftover(Path(e.path), Kind.ORPHAN_PACK, None, now - mtime, rule.verdict(None, now - mtime)))
    return out


def find_half_preserved(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """Packs whose ``.idx`` is already in preserved/ but whose other files are not: one per pack."""
    from .objdir import PRESERVED_DIR

    now, rule = _now(now), rule or RULES[Kind.HALF_PRESERVED]
    pack_dir = _git_dir(repo) / "objects" / "pack"
    names = _pack_names(pack_dir)
    stems: dict[str, Path] = {}
    for name, e in sorted(names.items()):
        stem, _, ext = name.rpartition(".")
        if name.startswith("pack-") and ext in _PACK_SIDE and f"{stem}.idx" not in names \
                and (pack_dir / PRESERVED_DIR / f"{stem}.idx").exists():
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
    from .pack.midx import LOCK_NAME

    path = _git_dir(repo) / "objects" / "pack" / LOCK_NAME
    return _claims([path] if path.exists() else [], Kind.MIDX_LOCK, rule or RULES[Kind.MIDX_LOCK], _now(now))


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
    now, rule = _now(now), rule or RULES[Kind.GRAPH_TMP]
    out = []
    for e in sorted(_scan(_git_dir(repo) / "objects" / "info" / "commit-graphs"), key=lambda e: e.name):
        if not e.name.startswith("tmp_"):
            continue
        mtime = _mtime(e.path)
        if mtime is None:
            continue
        m = GRAPH_TMP_RE.match(e.name)
        alive = _alive(None, int(m.group(2)), m.group(3)) if m else None
        out.append(Leftover(Path(e.path), Kind.GRAPH_TMP, None, now - mtime, rule.verdict(alive, now - mtime),
                            alive=alive))
    return out


def find_packed_refs_temps(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``packyard/tmp/packed-refs-*``."""
    from .packrefs import TMP_PREFIX
    from .refs import REF_TMP_DIR

    return _aged_files(_git_dir(repo) / REF_TMP_DIR, TMP_PREFIX, Kind.PACKED_REFS_TMP,
                       rule or RULES[Kind.PACKED_REFS_TMP], _now(now))


def find_packed_refs_new(repo: object, *, now: float | None = None, rule: Rule | None = None) -> list[Leftover]:
    """``packed-refs.new`` (git's)."""
    return _aged_files(_git_dir(repo), "packed-refs.new", Kind.PACKED_REFS_NEW, rule or RULES[Kind.PACKED_REFS_NEW],
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
    from .refs import REF_TMP_DIR, REF_TMP_PREFIX

    return _aged_files(_git_dir(repo) / REF_TMP_DIR, REF_TMP_PREFIX, Kind.REF_TMP, rule or RULES[Kind.REF_TMP],
                       _now(now))


#: Every finder by kind (the table test walks it; ``find_half_preserved`` and ``find_orphan_packs`` share a listing).
FINDERS: dict[Kind, Callable[..., list[Leftover]]] = {
    Kind.LOOSE_TMP: find_loose_tmp, Kind.BATCH_MARKER: find_batch_markers, Kind.PACK_TMP: find_pack_temps,
    Kind.ORPHAN_PACK: find_orphan_packs, Kind.HALF_PRESERVED: find_half_preserved, Kind.ORPHAN_IDX: find_orphan_idx,
    Kind.MIDX_LOCK: find_midx_lock, Kind.QUARANTINE: find_quarantines, Kind.KEEP: find_keeps,
    Kind.SERVING_LOCK: find_serving_locks, Kind.GRAPH_TMP: find_graph_temps,
    Kind.PACKED_REFS_TMP: find_packed_refs_temps, Kind.PACKED_REFS_NEW: find_packed_refs_new,
    Kind.REF_CLAIM: find_ref_claims, Kind.REF_TMP: find_ref_temps,
}


# -- removal -------------------------------------------------------------------------------------

class _Checked(Protocol):
    def check(self) -> None: ...


_CLAIM_KINDS = frozenset({Kind.MIDX_LOCK, Kind.SERVING_LOCK, Kind.REF_CLAIM})


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def remove(leftovers: Iterable[Leftover], lease: "_Checked | Callable[[], None] | None" = None) -> list[Leftover]:
    """Remove each of ``leftovers`` (as given: filter with :func:`removable` for the table's verdict); returns
    those removed. ``lease`` (a lease with ``check()``, or a fence callable) is checked before each one: a
    holder that lost its lease stops before deleting anything more.

    A claim file goes only if it still carries the owner record judged (:func:`..lockfile.remove_claim`,
    which renames it aside first: a fresh claim made meanwhile is never removed); a quarantine as a tree; a
    half-preserved pack is moved the rest of the way to preserved/; anything else file by file, the
    companions first and ``path`` (the owner record, the marker) last, so a crash midway leaves it to be
    judged again.
    """
    check = lease if lease is None or callable(lease) else lease.check
    done = []
    for item in leftovers:
        if check is not None:
            check()
        if item.kind in _CLAIM_KINDS:
            gone = lockfile.remove_claim(item.path, item.owner)
        elif item.kind is Kind.QUARANTINE:
            shutil.rmtree(item.path, ignore_errors=True)
            gone = not item.path.exists()
        elif item.kind is Kind.HALF_PRESERVED:
            from .maintenance.preserved import preserve_pack

            gone = preserve_pack(item.path.parent, item.path.name.rpartition(".")[0]) > 0
        else:
            companions = [_unlink(f) for f in item.files]
            gone = _unlink(item.path) or any(companions)
        if gone:
            done.append(item)
    return done


__all__ = ["Kind", "Verdict", "Rule", "RULES", "Leftover", "FINDERS", "removable", "remove", "loose_tmp_verdict",
           "find_loose_tmp", "find_batch_markers", "find_pack_temps", "find_orphan_packs", "find_half_preserved",
           "find_orphan_idx", "find_midx_lock", "find_keeps", "find_quarantines", "find_serving_locks",
           "find_graph_temps", "find_packed_refs_temps", "find_packed_refs_new", "find_ref_claims", "find_ref_temps",
           "create_batch_marker", "remove_batch_marker", "LOOSE_TMP_PREFIX", "QUARANTINE_PREFIX", "QUARANTINE_OWNER",
           "SERVING_LOCKS", "PRUNE_EXPIRE", "CLAIM_EXPIRE", "DEAD_WRITER_AFTER"]
