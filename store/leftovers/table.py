"""The leftovers table: every name a dead writer may leave, its kind, its age rule and why.

The finders that apply it are :mod:`.find`; the package's docstring shows the table.
"""
from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .. import lockfile
from ..owner import Liveness, Owner

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
#: The fixed-path files git mmaps that maintenance replaces (or removes), by their path under the git dir: the old
#: inode of each is hard-linked into ``objects/pack/preserved/`` as ``<name>-<16 hex>.old`` first
#: (store/maintenance/preserved/packs.py). No pack file's name (``pack-*`` ends in its extension) and no temp file's
#: (``tmp_*``) can be one.
#: A MIDX's bitmap and reverse index (``multi-pack-index-<checksum>.bitmap``/``.rev``, mapped too) are removed, not
#: replaced, when a new MIDX is installed: kept the same way, under their own names plus the suffix.
#: The ref writers' temp files (store/refs.py) and the packed-refs writer's (store/packrefs.py), in
#: ``packyard/tmp/`` of the git dir.
REF_TMP_DIR = "packyard/tmp"
REF_TMP_PREFIX = "ref-"
PACKED_REFS_TMP_PREFIX = "packed-refs-"
#: The multi-pack-index writers' claim (packyard's and git's own lock file): store/maintenance/serving/midx.py.
MIDX_LOCK_NAME = "multi-pack-index.lock"
PRESERVED_MAPPED = {"multi-pack-index": "objects/pack/multi-pack-index",
                    "commit-graph": "objects/info/commit-graph", "packed-refs": "packed-refs"}
MIDX_SIDE_RE = re.compile(r"^multi-pack-index-[0-9a-f]{40}(?:[0-9a-f]{24})?\.(?:bitmap|rev)$")
#: A preserved pack's file that a later move of a pack of the same name replaces in preserved/ (same name, same
#: bytes, another inode: a reader on another host may map either): the older is kept the same way.
PACK_FILE_RE = re.compile(r"^pack-[0-9a-f]{40}(?:[0-9a-f]{24})?\.(?:idx|pack|rev|bitmap|mtimes)$")
#: A repack's directory of the loose files it deleted on a shared filesystem (store/maintenance/preserved/loose.py):
#: ``objects/pack/preserved/loose-<16 hex>/``; no pack file's name (``pack-*``) and no ``.old`` name can be one.
PRESERVED_LOOSE_PREFIX = "loose-"
PRESERVED_LOOSE_RE = re.compile(r"^loose-[0-9a-f]{16}$")
PRESERVED_MAPPED_RE = re.compile(r"^(multi-pack-index|commit-graph|packed-refs"
                                 r"|multi-pack-index-[0-9a-f]{40}(?:[0-9a-f]{24})?\.(?:bitmap|rev)"
                                 r"|pack-[0-9a-f]{40}(?:[0-9a-f]{24})?\.(?:idx|pack|rev|bitmap|mtimes))"
                                 r"-([0-9a-f]{16})\.old$")

HOUR = 3600.0
#: durable.write_file_durably's temp name (``.tmp-<pid>-<name>``) and where it writes (relative to the git dir).
DURABLE_TMP_PREFIX = ".tmp-"
DURABLE_TMP_DIRS = (".", "packyard", "objects/info")
#: A pool's directory renamed aside by its delete (``<pool>.deleting-<hex>``, beside the pool).
POOL_DELETING_INFIX = ".deleting-"
#: A restore's repository being built, and a replaced one being removed (store/backup/restore.py), beside the target:
#: ``.<name>.restoring-<hex>/`` and ``.<name>.replaced-<hex>/``.
RESTORE_INFIXES = (".restoring-", ".replaced-")
#: Files tested for the newest mtime of a restore's temp directory (its pack files and the last ones written).
RESTORE_SCAN_LIMIT = 10_000
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
    PRESERVED_MAPPED = "preserved_mapped"
    PRESERVED_LOOSE = "preserved_loose"
    DURABLE_TMP = "durable_tmp"
    POOL_DELETING = "pool_deleting"
    BACKUP_TMP = "backup_tmp"
    RESTORE_TMP = "restore_tmp"


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
    Rule(Kind.PACK_TMP, "objects/pack{,/preserved}/tmp_<kind>_<pid>_<tag>-<rand>", 0.0, PRUNE_EXPIRE,
         "A pack writer's temp files (pack, idx, rev, mtimes, bitmap, keep, midx, owner record), grouped by "
         "the writer's tag. A dead writer's go at once: they can be gigabytes, a repack runs this first, and "
         "nothing renames them once the writer is gone. git's tmp_pack_XXXXXX and another host's: prune expiry."),
    Rule(Kind.ORPHAN_PACK, "objects/pack/pack-*.{pack,rev,mtimes,bitmap} without .idx", None, 600.0,
         "Invisible to readers (the idx is renamed in last); an install killed between its renames leaves "
         "it. 10 minutes: longer than any install's rename sequence."),
    Rule(Kind.HALF_PRESERVED, "objects/pack/pack-* whose .idx is in preserved/", None, 0.0,
         "A repack died moving this pack to preserved/ (after its idx moved; its .pack may be a second link "
         "of the preserved one): the move is finished, never undone."),
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
    Rule(Kind.PRESERVED_MAPPED, "objects/pack/preserved/{multi-pack-index,commit-graph,packed-refs,"
         "multi-pack-index-<checksum>.{bitmap,rev},pack-<checksum>.<ext>}-<hex>.old",
         None, HOUR,
         "The old inode of a file git mmaps, linked here (its mtime set to then) just before maintenance renamed "
         "a new file over it or removed it (a preserved pack's file too, when a pack of the same name is preserved "
         "again): a reader on another NFS host that has it open or mapped keeps a "
         "valid handle only while the inode lives (else ESTALE, SIGBUS for a mapping). Nobody owns it: it goes "
         "after the preserve time (PACKYARD_MAINTENANCE_PRESERVE_FOR, one hour by default), as preserved packs."),
    Rule(Kind.PRESERVED_LOOSE, "objects/pack/preserved/loose-<hex>/", None, HOUR,
         "Second names of the loose files a repack on a shared filesystem deleted, linked here first (the "
         "directory's mtime set when its delete ended): git on another NFS host maps a loose object to read it, "
         "and dies of SIGBUS if the file's last link goes meanwhile. Nobody owns it: the whole directory goes after "
         "the preserve time (PACKYARD_MAINTENANCE_PRESERVE_FOR, one hour by default), as preserved packs."),
)
_RULES += (
    Rule(Kind.DURABLE_TMP, "{.,packyard,objects/info}/.tmp-<pid>-<name>", None, CLAIM_EXPIRE,
         "write_file_durably's temp file (the alternates, a pool's marker and members file, the fence, a new "
         "repository's HEAD and config): it lives between its write and its rename, milliseconds. Its name has "
         "a pid but no host, so nobody can judge it on shared storage: it goes after the claim's age."),
    Rule(Kind.POOL_DELETING, "<pool>.deleting-<hex>/ (beside the pool)", None, CLAIM_EXPIRE,
         "A pool's delete renames the pool aside first (one rename: no half-deleted pool is ever visible), then "
         "removes the tree; one killed in between leaves this. Nothing reads it (no alternates name it: the delete "
         "was refused while any member linked). The redelivered delete (or `packyard pool delete` run again) removes "
         "it at once, whatever its age; the age is for any other caller."),
)
_RULES += (
    Rule(Kind.BACKUP_TMP, "<backup dir>/tmp_{pack,owner}_<pid>_<tag>-<rand>, <backup dir>/.tmp-<pid>-manifest.json",
         0.0, PRUNE_EXPIRE,
         "A backup's bundle being written (the pack writer's temp file, with the bundle header before the pack, and "
         "its owner record) or its manifest being replaced, in the repository's backup directory (store/backup). "
         "Nothing names either until it is renamed: a dead writer's go at once (a bundle can be gigabytes); another "
         "host's, and the manifest's temp file (a pid, no host), after git's prune expiry, as pack temps."),
    Rule(Kind.RESTORE_TMP, "<target's dir>/.<name>.{restoring,replaced}-<hex>/", None, HOUR,
         "A restore builds the repository here and renames it onto the target only when it is complete (no "
         "half-restored repository is ever visible); a forced restore swaps the old one here and removes it. A "
         "killed restore leaves it; nothing reads it. Aged by its newest file (a live restore keeps writing "
         "packs): one hour untouched, as a quarantine."),
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
