"""The benchmarks' nfsim side (issue 22): the same runs on a simulated NFS client mount.

``--nfsim-latency 1ms`` on a benchmark runs both sides (packyard, git) once more on an nfsim mount
(:mod:`packyard.workers.nfsim`: attribute and listing caches of 3 s, close-to-open, the given latency
on every metadata round trip) of a fresh directory beside the local ones, and prints each side's
slowdown against its own local time, packyard's time against git's on the mount, and the metadata
round trips per run by kind (the mount's counters). Several latencies, comma-separated
(``--nfsim-latency 0ms,1ms``), run on one mount each, one after the other, in the same run; with ``0ms`` among
them the last table divides each side's time at every other latency by its time at 0 -- the round trips'
own cost, apart from the simulator's (on two cores a mount with no latency at all already slowed the
geometric repack 1.2-1.4x: docs/nfs.md).
"""
from __future__ import annotations

import math
import os
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from packyard.store.errors import InvalidInputError
from packyard.workers.durations import parse_duration


def add_arg(p: Any) -> None:
    p.add_argument("--nfsim-latency", default=None, metavar="T[,T...]", type=latency_list,
                   help="also run both sides on an nfsim mount (simulated NFS client) with this latency per "
                        "metadata call (1ms, 250us): each side's slowdown and its metadata calls per kind; "
                        "several, comma-separated, run one after the other (0ms,1ms: the simulator's own cost, "
                        "then the round trips')")


def latency_list(text: str) -> list[str]:
    """``--nfsim-latency``'s value: the latencies in the order given, each one a duration (argparse reports a
    bad one)."""
    out = [t.strip() for t in text.split(",") if t.strip()]
    if not out:
        raise ValueError(text)
    for t in out:
        try:
            seconds = parse_duration(t)
        except InvalidInputError as err:
            raise ValueError(str(err)) from None
        if not math.isfinite(seconds):
            raise ValueError(t)
    return out


def slug(latency: str) -> str:
    """A directory-name form of one latency (``1ms`` -> ``1ms``, ``0.5ms`` -> ``0_5ms``)."""
    return "".join(c if c.isalnum() else "_" for c in latency)


@contextmanager
def mounted(base: Path, latency: str) -> Iterator[Any]:
    """An nfsim mount of ``base/nfsim-server-<latency>`` at ``base/nfsim-mnt-<latency>`` (SystemExit naming why
    it cannot)."""
    from packyard.workers import nfsim

    reason = nfsim.unavailable()
    if reason:
        raise SystemExit(f"packyard bench: --nfsim-latency: {reason}")
    server = base / f"nfsim-server-{slug(latency)}"
    server.mkdir(parents=True, exist_ok=True)
    m = nfsim.Mount(server, base / f"nfsim-mnt-{slug(latency)}", latency=parse_duration(latency), ac_attr=3.0,
                    ac_dir=3.0, name="bench-nfsim")
    try:
        yield m
    finally:
        m.close()


#: In a probe and in calls_between's answer: the daemon's CPU milliseconds (not a metadata call).
CPU_KEY = "nfsim_cpu_ms"


def probe(mount: Any) -> dict[str, Any]:
    """The mount's counters as of now, with the daemon's CPU time so far (``CPU_KEY``)."""
    out = dict(mount.counters())
    out[CPU_KEY] = round(mount.cpu_seconds() * 1000)
    return out


def calls_between(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    """The metadata calls by kind between two probes (kinds with 0 left out), and the daemon's CPU
    milliseconds in between (``CPU_KEY``) when both probes have it."""
    from packyard.workers.nfsim.fs import METADATA_KINDS

    out = {k: after[k] - before[k] for k in METADATA_KINDS if after[k] - before[k]}
    if CPU_KEY in after and CPU_KEY in before:
        out[CPU_KEY] = after[CPU_KEY] - before[CPU_KEY]
    return out


def _metadata(calls: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in calls.items() if k != CPU_KEY}


def report(latency: str, local: dict[str, list[float]], mounted_: dict[str, list[float]],
           calls: dict[str, list[dict[str, int]]]) -> None:
    """The nfsim table: per side, median local and mounted wall time, the slowdown, calls per run."""
    print(f"\non nfsim (latency {latency} per metadata call, attribute/listing caches 3 s, close-to-open):")
    print(f"{'':10} {'local s':>9} {'nfsim s':>9} {'slowdown':>9} {'metadata calls/run':>19}")
    med = {s: (statistics.median(local[s]), statistics.median(mounted_[s])) for s in local}
    for side, (lo, mo) in med.items():
        total = statistics.median(sum(_metadata(c).values()) for c in calls[side])
        print(f"{side:10} {lo:9.2f} {mo:9.2f} {mo / lo:8.2f}x {total:19.0f}")
    if "packyard" in med and "git" in med:
        print(f"packyard / git on the same nfsim mount: {med['packyard'][1] / med['git'][1]:.2f}x "
              f"(locally {med['packyard'][0] / med['git'][0]:.2f}x)")
    cpu = {side: [c[CPU_KEY] for c in calls[side] if CPU_KEY in c] for side in calls}
    if all(cpu.values()):
        # The simulator's own CPU (FUSE requests, data copies) on this machine's cores: part of every slowdown above
        # that no client-side change removes, and more of it where the cores are few.
        print(f"  nfsim daemon CPU per run (median; {os.cpu_count()} cores): "
              + ", ".join(f"{side} {statistics.median(v) / 1000:.2f} s" for side, v in cpu.items()))
    for side in calls:
        last = _metadata(calls[side][-1])
        print(f"  {side} calls by kind (last run): " + ", ".join(f"{k} {v}" for k, v in sorted(last.items())))
    sys.stdout.flush()


def report_over_floor(walls: dict[str, dict[str, list[float]]], title: str = "") -> None:
    """With a latency of 0 among several (``walls``: latency -> side -> wall times on that mount): each side's
    median at every other latency over its median at 0. The mount at 0 already costs the simulator's own
    work (FUSE requests, data copies through a user-space daemon, on this machine's cores); the quotient is
    what the round trips add on top of it. Nothing is printed (``title`` neither) without a 0 latency and
    another."""
    floor = next((lat for lat in walls if parse_duration(lat) == 0), None)
    if floor is None or len(walls) < 2:
        return
    print(f"\n{title}over the mount with no latency ({floor}): the round trips' own cost")
    base = {side: statistics.median(w) for side, w in walls[floor].items() if w}
    for lat, sides in walls.items():
        if lat == floor:
            continue
        print(f"  at {lat}: " + ", ".join(f"{side} {statistics.median(w) / base[side]:.2f}x"
                                          for side, w in sides.items() if w and side in base))
    sys.stdout.flush()
