"""--hosts 2: which host repacks and which reads in each phase, and where the job rows say each job ran.

:class:`Hosts` holds the run's two-host state (the reading host, the readers' aim queues, each host's queue,
nfsim's counters); :class:`Phase` one phase's record; :func:`check_routing` fails a run whose job ran on the
other phase's host (by the job rows' ``worker_hostname``). Apart from :mod:`.harness`, which schedules.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from packyard.workers.race.summary import (
    HOST_B_NAME,
    HOSTS,
    REPACK_MODES,
    NfsimCounters,
    RaceOptions,
    RaceSummary,
    Say,
    per_host,
)
from packyard.workers.settings import Settings


class Hosts:
    """--hosts 2: which host reads (a shared value the reader processes follow), the readers' aim queues,
    the queue each host's worker consumes, and the nfsim counters at phase boundaries. With one host:
    the default queue and the one path for everything."""

    def __init__(self, options: RaceOptions, served: Path, reading: Any, aims: list[Any],
                 nfsim: NfsimCounters | None) -> None:
        self.options, self.served, self.reading, self.aims, self.nfsim = options, served, reading, aims, nfsim
        self.two = options.hosts > 1 and options.reader_repo is not None

    def plan(self) -> list[tuple[str | None, str | None]]:
        """(repack host, reading host) per phase: A repacks first, then B, and so on (None: one host)."""
        if not self.two:
            return [(None, None)]
        return [(HOSTS[k % 2], HOSTS[(k + 1) % 2]) for k in range(max(1, self.options.phases))]

    def queue(self, host: str | None) -> str | None:
        """Host A's workers consume the default queue (None), host B's worker only its own."""
        return self.options.host_b_queue if host == "B" else None

    def read_through(self, host: str | None) -> None:
        if host is not None:
            self.reading.value = HOSTS.index(host)

    def reader_path(self) -> Path:
        if self.two and self.reading.value == 1:
            return Path(self.options.reader_repo)   # type: ignore[arg-type]
        return Path(self.served)

    def aim(self, n: int, ids: Iterable[str]) -> None:
        msg = ("aim", n, list(ids))
        for q in self.aims:
            q.put(msg)

    def stop_aim(self, n: int) -> None:
        for q in self.aims:
            q.put(("stop", n))

    def counters(self) -> dict[str, dict[str, Any]]:
        if self.nfsim is None:
            return {}
        try:
            return self.nfsim()
        except (OSError, ValueError):   # a counters file being replaced: this phase's figures are left out
            return {}


@dataclass
class Phase:
    n: int
    repack_host: str | None
    reader_host: str | None
    started: float
    wall_start: float
    repacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPACK_MODES, 0))
    ingests: int = 0
    repack_jobs: list[str] = field(default_factory=list)
    push_jobs: list[str] = field(default_factory=list)
    aims: int = 0
    nfsim_before: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self, t0: float, ended: float, nfsim_after: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {"phase": self.n, "repack_host": self.repack_host, "reader_host": self.reader_host,
                "started_s": round(self.started - t0, 1), "ended_s": round(ended - t0, 1),
                "wall_start": self.wall_start, "wall_end": float("inf"),
                "repacks": dict(self.repacks), "ingests": self.ingests, "aims": self.aims,
                "repack_jobs": list(self.repack_jobs), "push_jobs": list(self.push_jobs),
                "repacks_on": {}, "ingests_on": {}, "estale": 0,
                "nfsim_estale": {h: int(nfsim_after.get(h, {}).get("estale", 0)) -
                                 int(self.nfsim_before.get(h, {}).get("estale", 0)) for h in nfsim_after},
                "nfsim_kept_reads": {h: int(nfsim_after.get(h, {}).get("kept_reads", 0)) -
                                     int(self.nfsim_before.get(h, {}).get("kept_reads", 0)) for h in nfsim_after},
                "nfsim_calls": {h: int(nfsim_after.get(h, {}).get("metadata_calls", 0)) -
                                int(self.nfsim_before.get(h, {}).get("metadata_calls", 0)) for h in nfsim_after}}



def check_routing(settings: Settings, summary: RaceSummary, say: Say) -> None:
    """--hosts 2: where each phase's jobs really ran, from their job rows (``worker_hostname``: host B's worker
    runs with host name ``race-host-b``); a job on the other phase's host fails the run."""
    ids = [t for ph in summary.phases for t in ph["repack_jobs"] + ph["push_jobs"]]
    where = job_hosts(settings, ids)
    for ph in summary.phases:
        for jobs, key, should in ((ph["repack_jobs"], "repacks_on", ph["repack_host"]),
                                  (ph["push_jobs"], "ingests_on", ph["reader_host"])):
            on: dict[str, int] = {}
            for t in jobs:
                host = where.get(t) or "?"
                on[host] = on.get(host, 0) + 1
            ph[key] = on
            wrong = {h: n for h, n in on.items() if h != should}
            if wrong:
                what = "repacks" if key == "repacks_on" else "pushes"
                summary.failures.append(f"phase {ph['phase']}: {what} meant for host {should} ran on "
                                        f"{', '.join(f'{h} ({n})' for h, n in sorted(wrong.items()))} (job rows)")
    for ph in summary.phases:
        say(f"phase {ph['phase']}: repacks on {per_host(ph['repacks_on'])}, pushes on {per_host(ph['ingests_on'])} "
            "(job rows' worker host)")


def job_hosts(settings: Settings, task_ids: list[str], wait: float = 30.0) -> dict[str, str]:
    """task id -> "A" or "B" by the job row's worker host name; rows not yet written are waited for (bounded)."""
    from sqlalchemy import select

    from packyard.workers.records import session_scope
    from packyard.workers.records.models import Job

    found: dict[str, str] = {}
    deadline = time.monotonic() + wait
    while True:
        left = [t for t in task_ids if t not in found]
        if not left:
            return found
        with session_scope(settings) as s:
            for i in range(0, len(left), 500):
                for task_id, hostname in s.execute(select(Job.task_id, Job.worker_hostname)
                                                   .where(Job.task_id.in_(left[i:i + 500]))):
                    if hostname:
                        found[task_id] = "B" if hostname.endswith(f"@{HOST_B_NAME}") else "A"
        if time.monotonic() >= deadline:
            return found
        time.sleep(0.5)
