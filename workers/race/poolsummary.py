"""The pool race's vocabulary (``packyard race --pool``, :mod:`.pool`): its options and its summary.

The summary is the race summary (:class:`~.summary.RaceSummary`: readers' lookups and misses, clones, lost
reads) with what a fork network adds: the jobs of each kind (pool repacks, member repacks, pushes per member,
fetches into the pool, disconnects), and git's verdicts after the run -- ``git fsck --full`` of the pool and of
every member, and each member's ``git rev-list --objects --all`` against its frontend's work repository (the
objects the member held before the run, minus what its own force pushes dropped, plus what its pushes
carried). An object a member's refs reach that git cannot find in it is LOST (``final_missing``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packyard.workers.race.summary import RaceSummary

POOL_JOBS = ("pool_repack", "member_repack", "push", "fetch", "disconnect")


@dataclass(frozen=True)
class PoolRaceOptions:
    repo: Path                        # the network's directory (new): source.git, fork-N.git, pool.git in it
    forks: int = 2                    # forks of the source; the last one is disconnected during the run
    duration: float = 20.0
    pool_repack_every: float = 3.0    # seconds between the pool's full repacks (islands, members' reach kept)
    member_repack_every: float = 2.0  # seconds between member repacks (members in turn: git repack -a -d -l)
    push_every: float = 0.7           # seconds between pushes (members in turn; thin packs, bases in the pool)
    fetch_every: float = 3.0          # seconds between fetches of the source into the pool
    disconnect_at: float = 0.4        # the last fork is disconnected at this fraction of the duration (<0: never)
    readers: int = 1                  # reader processes per member, and one on the pool
    reader_rate: float = 600.0        # lookups per second per reader, at most
    cloners: int = 1                  # clone readers, each cloning the members in turn (git clone --no-local, fsck)
    clone_pause: float = 0.2
    expire: float = 3.0               # seconds: unreachable objects older than this go in full repacks
    seed: int | None = None
    job_timeout: float = 300.0
    unsafe_pool_prune: bool = False   # NEGATIVE CONTROL: the pool's repacks ignore the members' refs

    @property
    def mode(self) -> str:
        return "unsafe-pool-prune" if self.unsafe_pool_prune else "safe"


@dataclass
class PoolRaceSummary(RaceSummary):
    forks: int = 0
    members: list[str] = field(default_factory=list)           # every member's git dir (the source first)
    pool: str = ""
    jobs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOL_JOBS, 0))
    pushes_per_member: dict[str, int] = field(default_factory=dict)
    thin_bases_in_pool: int = 0        # thin pushes whose bases only the pool held when they were sent
    disconnected: list[str] = field(default_factory=list)
    pool_repacks_ignoring_members: int = 0
    fsck_failed: list[str] = field(default_factory=list)        # "<repo>: <git's words>"
    missing_per_member: dict[str, int] = field(default_factory=dict)
    objects_before: dict[str, int] = field(default_factory=dict)
    objects_after: dict[str, int] = field(default_factory=dict)
    rev_list_differs: list[str] = field(default_factory=list)   # members whose rev-list --objects is not the oracle's

    @property
    def ok(self) -> bool:
        return super().ok and not self.fsck_failed and not self.rev_list_differs and self.final_missing == 0

    def counters(self) -> dict[str, Any]:
        out = super().counters()
        out.update({f"jobs_{k}": v for k, v in self.jobs.items()})
        out.update(forks=self.forks, members=len(self.members), fsck_failed=len(self.fsck_failed),
                   rev_list_differs=len(self.rev_list_differs), thin_bases_in_pool=self.thin_bases_in_pool,
                   pool_repacks_ignoring_members=self.pool_repacks_ignoring_members)
        return out

    def render(self) -> str:
        j = self.jobs
        lines = [
            f"packyard race --pool {self.run_id[:8]}: {self.duration:.0f} s, {len(self.members)} members "
            f"(the source and {self.forks} forks) of {self.pool}, {self.readers} readers ({self.mode}), "
            f"seed {self.seed}",
            f"  lookups   {self.lookups:,} (reads {self.reads:,}, quick checks {self.quick:,}, "
            f"absent-id probes {self.probes:,})",
            f"  jobs      pool repacks {j['pool_repack']}"
            + (f" ({self.pool_repacks_ignoring_members} ignoring the members' refs)"
               if self.pool_repacks_ignoring_members else "")
            + f", member repacks {j['member_repack']}, pushes {j['push']} ({self.thin_bases_in_pool} thin with "
            f"their bases in the pool), fetches {j['fetch']}, disconnects {j['disconnect']}",
            "  misses    " + ", ".join(f"{k} {v:,}" for k, v in self.events.items()),
            f"  clones    {self.clones['clones']:,} by git through upload-pack (members in turn), each fscked: "
            f"{self.clones_failed:,} failed",
        ]
        for m in self.members:
            name = Path(m).name
            lines.append(f"  {name:<10} {self.objects_before.get(m, 0):,} objects before, "
                         f"{self.objects_after.get(m, 0):,} after ({self.pushes_per_member.get(m, 0)} pushes); "
                         f"missing {self.missing_per_member.get(m, 0)}"
                         + (" (disconnected)" if m in self.disconnected else ""))
        for ex in self.lost_examples[:3]:
            lines.append(f"      e.g. {ex.get('oid')} ({ex.get('op')}, {ex.get('reader')}): "
                         f"{str(ex.get('error'))[:140]}")
        for ex in self.clone_examples[:3]:
            lines.append(f"      clone failed ({ex.get('op')}, {ex.get('step')}): {str(ex.get('error', ''))[:200]}")
        for f in self.fsck_failed[:4]:
            lines.append(f"  fsck failed: {f[:300]}")
        for f in self.rev_list_differs[:4]:
            lines.append(f"  rev-list differs: {f[:300]}")
        for f in self.failures[:5]:
            lines.append(f"  job failed: {f[:300]}")
        for e in self.reader_errors[:5]:
            lines.append(f"  reader error: {e}")
        if self.ok:
            verdict = (f"PASS: no lost reads, no failed clone of {self.clones['clones']}, git fsck --full clean in "
                       f"the pool and {len(self.members)} members, every member's rev-list --objects as expected")
        else:
            verdict = "FAIL: " + ", ".join(filter(None, (
                f"{self.lost} lost reads ({self.final_missing} objects missing after the run)" if self.lost else "",
                f"{self.clones_failed} failed clones" if self.clones_failed else "",
                f"{len(self.fsck_failed)} failed fscks" if self.fsck_failed else "",
                f"{len(self.rev_list_differs)} members' objects differ" if self.rev_list_differs else "",
                f"{len(self.failures)} failed jobs" if self.failures else "",
                f"{len(self.reader_errors)} reader errors" if self.reader_errors else "")))
        lines.append(f"  verdict   {verdict}")
        return "\n".join(lines)


__all__ = ["POOL_JOBS", "PoolRaceOptions", "PoolRaceSummary"]
