"""The race run's vocabulary: its options, and its summary (counters for the job row, the printed report).

Apart from :mod:`.harness` (the run itself) so that the CLI, the demo and the tests read a run's options
and results without the scheduling around them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from packyard.workers.race.clones import CLONE_FAILED, CloneTotals
from packyard.workers.race.pushes import PUSH_KINDS
from packyard.workers.race.readers import ESTALE, KINDS, LOST

REPACK_MODES = ("full", "loose", "geometric")
HOSTS = ("A", "B")
HOST_B_NAME = "race-host-b"         # host B's worker's host name (its own UTS namespace; cli/race.py HOST_B)
Say = Callable[[str], None]
NfsimCounters = Callable[[], dict[str, dict[str, Any]]]   # each host's nfsim counters, as of now


@dataclass(frozen=True)
class RaceOptions:
    repo: Path
    readers: int = 4
    duration: float = 60.0
    repack_every: float = 3.0
    ingest_every: float = 1.0
    seed: int | None = None
    unsafe_dir_cache: bool = False
    unsafe_delete: bool = False
    expire: float = 5.0              # seconds: unreachable objects older than this are deleted by full repacks
    rewrite_every: int = 4           # every Nth push is a force push of a topic (while topics remain)
    reader_rate: float = 1500.0      # lookups per second per reader, at most
    job_timeout: float = 300.0       # seconds a job may take before the run gives up on it
    reader_repo: Path | None = None  # --hosts 2: the same repository through host B's mount (None: ``repo``)
    hosts: int = 1                   # 2: workers and readers on both hosts' nfsim mounts (even readers on B)
    nfsim_trust_listing: bool = False  # NEGATIVE CONTROL (--hosts 2): host B's mount trusts cached listings
    cloners: int = 1                 # clone readers (git clone --no-local + fsck, one after another); 0: none
    host_b_queue: str | None = None  # --hosts 2: host B's worker's only queue (host A's consume the default one)
    clone_pause: float = 0.2         # seconds between one clone reader's clones
    phases: int = 2                  # --hosts 2: phase 1 repacks on A (reads, pushes on B), phase 2 the reverse, ...
    aim_threads: int = 0             # --hosts 2: threads per reader of aimed cold reads (see .readers.AimedReads)
    backup_every: float = 0.0        # seconds between packyard.backup jobs (0: none); each restored after (.backups)

    @property
    def mode(self) -> str:
        unsafe = [n for n, on in (("unsafe-dir-cache", self.unsafe_dir_cache), ("unsafe-delete", self.unsafe_delete),
                                  ("nfsim-trust-listing", self.nfsim_trust_listing)) if on]
        return "+".join(unsafe) if unsafe else "safe"


@dataclass
class RaceSummary:
    run_id: str
    repo: str
    mode: str
    seed: int
    duration: float = 0.0
    readers: int = 0
    lookups: int = 0
    reads: int = 0
    quick: int = 0
    probes: int = 0
    repacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPACK_MODES, 0))
    ingests: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*PUSH_KINDS, "rewrite"), 0))
    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*KINDS, CLONE_FAILED), 0))
    events_recorded: int = 0
    clones: dict[str, int] = field(default_factory=lambda: CloneTotals().counters())
    clone_examples: list[dict[str, Any]] = field(default_factory=list)   # the first failed clones' details
    pushed_objects: int = 0
    final_missing: int = 0
    failures: list[str] = field(default_factory=list)
    reader_errors: list[str] = field(default_factory=list)
    lost_examples: list[dict[str, Any]] = field(default_factory=list)
    pushed_ids: list[str] = field(default_factory=list)   # every object a landed push carried (hex)
    hosts: int = 1
    phases: list[dict[str, Any]] = field(default_factory=list)   # --hosts 2: what ran where, phase by phase
    nfsim: dict[str, dict[str, int]] = field(default_factory=dict)   # host -> its mount's counters (the run's)
    estale_store: int = 0     # ESTALE answers the readers' store took as "gone" (LooseObjects.estale)
    aims: int = 0
    aimed_reads: int = 0
    aimed_estale: int = 0
    aimed_gone: int = 0
    backup_every: float = 0.0   # (the run's option: the backup lines are shown when it is on)
    backups: int = 0            # backup jobs that wrote an entry
    backups_unchanged: int = 0  # backup jobs that found the newest entry's refs (nothing written)
    backups_failed: int = 0     # backup jobs that ended FAILURE (also in ``failures``)
    backups_expired: int = 0    # entries a later backup's retention expired (not restorable at the end)
    restores_checked: int = 0   # manifest entries restored and compared at the end
    restores_fscked: int = 0    # of those, restored repositories git fsck --full --strict passed
    restores_from_kept: int = 0  # of those, entries retention expired, restored from the harness's kept copies
    restore_mismatches: int = 0
    restore_examples: list[str] = field(default_factory=list)   # the first mismatches, said

    @property
    def lost(self) -> int:
        return self.events[LOST]

    @property
    def estale(self) -> int:
        """Reads that met ESTALE and still returned the object (recovered)."""
        return self.events[ESTALE]

    @property
    def recovered(self) -> int:
        return self.events["relisted"] + self.events["preserved"] + self.events[ESTALE]

    @property
    def clones_failed(self) -> int:
        return self.events[CLONE_FAILED]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.clones_failed == 0 and not self.failures and not self.reader_errors and \
            self.restore_mismatches == 0 and self.backups_failed == 0

    def counters(self) -> dict[str, Any]:
        out = {"lookups": self.lookups, "repacks": sum(self.repacks.values()), "ingests": sum(self.ingests.values()),
               **self.events, "reads": self.reads, "quick": self.quick, "probes": self.probes,
               **{f"repacks_{k}": v for k, v in self.repacks.items()},
               **{f"ingests_{k}": v for k, v in self.ingests.items()},
               **self.clones, "pushed_objects": self.pushed_objects, "final_missing": self.final_missing,
               "failures": len(self.failures), "readers": self.readers, "duration_s": round(self.duration, 1),
               "estale_store": self.estale_store, "aims": self.aims, "aimed_reads": self.aimed_reads,
               "aimed_estale": self.aimed_estale, "aimed_gone": self.aimed_gone}
        if self.backup_every:
            out.update(backups=self.backups, backups_unchanged=self.backups_unchanged,
                       backups_failed=self.backups_failed, backups_expired=self.backups_expired,
                       restores_checked=self.restores_checked, restores_fscked=self.restores_fscked,
                       restores_from_kept=self.restores_from_kept,
                       restore_mismatches=self.restore_mismatches)
        for host, c in sorted(self.nfsim.items()):
            for k in ("estale", "kept_reads", "metadata_calls"):
                out[f"nfsim_{k}_host_{host.lower()}"] = int(c.get(k, 0))
        for ph in self.phases:
            n = ph["phase"]
            out[f"phase{n}_repacks_on_a"] = ph["repacks_on"].get("A", 0)
            out[f"phase{n}_repacks_on_b"] = ph["repacks_on"].get("B", 0)
            out[f"phase{n}_ingests_on_a"] = ph["ingests_on"].get("A", 0)
            out[f"phase{n}_ingests_on_b"] = ph["ingests_on"].get("B", 0)
            out[f"phase{n}_estale"] = ph["estale"]
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(lost=self.lost, recovered=self.recovered, estale=self.estale, clones_failed=self.clones_failed,
                 ok=self.ok)
        return d

    def render(self) -> str:
        r, i = self.repacks, self.ingests
        lines = [
            f"packyard race {self.run_id[:8]}: {self.duration:.0f} s, {self.readers} readers ({self.mode}), "
            f"seed {self.seed}, {self.repo}",
            f"  lookups   {self.lookups:,} (reads {self.reads:,}, quick checks {self.quick:,}, "
            f"absent-id probes {self.probes:,})",
            f"  repacks   {sum(r.values())} (full {r['full']}, loose {r['loose']}, geometric {r['geometric']})",
            f"  ingests   {sum(i.values())} (index_pack {i['index_pack']}, unpack_objects {i['unpack_objects']}, "
            f"write_objects {i['write_objects']}, force pushes {i['rewrite']}); {self.pushed_objects} objects pushed",
            "  misses (race_events rows: `packyard races`):",
            f"    relisted      {self.events['relisted']:>8,}  recovered by re-listing objects/pack",
            f"    preserved     {self.events['preserved']:>8,}  recovered from objects/pack/preserved/",
            f"    estale        {self.events[ESTALE]:>8,}  met ESTALE (deleted through another host after the open),"
            " recovered",
            f"    quick_absent  {self.events['quick_absent']:>8,}  a quick check said absent for an object that existed"
            " (expected)",
            f"    lost          {self.events['lost']:>8,}  an object that existed could not be read"
            + (f" ({self.final_missing} in the final check)" if self.final_missing else ""),
            f"  clones    {self.clones['clones']:,} by git through upload-pack, each fscked "
            f"({self.clones['clones_bitmap']:,} served through a bitmap, {self.clones['clones_during_repack']:,} "
            f"during a repack): {self.clones_failed:,} failed",
        ]
        if self.backup_every:
            lines.append(
                f"  backups   {self.backups} written every {self.backup_every:g} s "
                f"({self.backups_unchanged} unchanged, {self.backups_failed} failed, "
                f"{self.backups_expired} expired by retention); "
                f"{self.restores_checked} restored ({self.restores_from_kept} from kept copies), refs and checksum "
                f"compared ({self.restores_fscked} fscked): "
                f"{self.restore_mismatches} mismatches")
        if self.hosts > 1:
            lines.extend(self._render_hosts())
        shown: set[str] = set()
        for ex in self.lost_examples:
            oid = str(ex.get("oid"))
            if oid in shown or len(shown) >= 3:
                continue
            shown.add(oid)
            lines.append(f"      e.g. {ex.get('oid')} ({ex.get('op')}, reader {ex.get('reader')}): "
                         f"{ex.get('error', '')[:140]}")
        for ex in self.clone_examples[:3]:
            lines.append(f"      clone failed ({ex.get('op')}, {ex.get('step')}): {str(ex.get('error', ''))[:200]}")
        for m in self.restore_examples[:3]:
            lines.append(f"      restore mismatch: {m[:200]}")
        for f in self.failures[:5]:
            lines.append(f"  job failed: {f}")
        for e in self.reader_errors[:5]:
            lines.append(f"  reader error: {e}")
        if self.ok:
            verdict = "PASS: no lost reads" + ("" if self.recovered else " (but no miss was recovered: no race?)") + \
                (f", no failed clone of {self.clones['clones']}" if self.clones["clones"] else "") + \
                (f", every one of {self.restores_checked} backups restored to its recorded refs"
                 if self.backup_every else "")
        else:
            verdict = "FAIL: " + ", ".join(filter(None, (
                f"{self.lost} lost reads" if self.lost else "",
                f"{self.clones_failed} failed clones" if self.clones_failed else "",
                f"{self.restore_mismatches} restore mismatches" if self.restore_mismatches else "",
                f"{len(self.failures)} failed jobs" if self.failures
                else "", f"{len(self.reader_errors)} reader errors" if self.reader_errors else "")))
        lines.append(f"  verdict   {verdict}")
        return "\n".join(lines)

    def _render_hosts(self) -> list[str]:
        lines = []
        for ph in self.phases:
            r = ph["repacks"]
            lines.append(
                f"  phase {ph['phase']}   {ph['started_s']:.0f}-{ph['ended_s']:.0f} s: repacks on host "
                f"{ph['repack_host']} (full {r['full']}, loose {r['loose']}, geometric {r['geometric']}; job rows: "
                f"{per_host(ph['repacks_on'])}), pushes on host {ph['reader_host']} ({ph['ingests']}; job rows: "
                f"{per_host(ph['ingests_on'])}), readers on host {ph['reader_host']}; ESTALE recoveries "
                f"{ph['estale']}, nfsim ESTALE answers {per_host(ph['nfsim_estale'])}, kept reads "
                f"{per_host(ph['nfsim_kept_reads'])}")
        lines.append(f"  ESTALE    {self.estale:,} reads met ESTALE and recovered; the readers' store took "
                     f"{self.estale_store:,} ESTALE answers as gone; {self.aims} aims, {self.aimed_reads:,} aimed cold "
                     f"reads ({self.aimed_estale:,} met ESTALE, {self.aimed_gone:,} found the file gone); nfsim "
                     f"ESTALE answers {per_host({h: c.get('estale', 0) for h, c in self.nfsim.items()})}")
        kept = per_host({h: c.get('kept_reads', 0) for h, c in self.nfsim.items()})
        lines.append(f"  kept      nfsim served {kept} "
                     "reads of files another link kept after their name went (preserved packs, MIDXs, loose files): "
                     "each ESTALE (SIGBUS in a map) without that link")
        return lines


def per_host(counts: dict[str, int]) -> str:
    return ", ".join(f"{h} {counts.get(h, 0)}" for h in HOSTS)
