"""What the commit-graph and packed refs of a repository look like, gathered cheaply for the planner.

Costs: one read of ``commit-graph-chain``, the header and chunk table of each layer plus its fan-out
table's last entry (the commit count), one listing of ``refs/`` (loose refs counted, branch tips read)
and one ``stat`` of ``packed-refs``. Whether the graph covers the refs is judged for the branch tips
(``refs/heads/``, which name commits) by a binary search of each layer's id list (read with one seek
per probe, never whole); tags are not peeled here (no object is read).
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..serving.commitgraph import BDAT, BIDX, CHAIN, GDA2, GRAPHS_DIR, MONOLITHIC, OIDF, OIDL, SIGNATURE

#: Gitaly's pack-refs rule: more loose refs than max(16, ln(packed-refs bytes / 100) / ln(1.15)).
LOOSE_REFS_MIN = 16
PACKED_REFS_LOG_BASE = 1.15
#: Branch tips checked against the graph (a bound: a repository with 100,000 branches is sampled).
MAX_TIPS_CHECKED = 2048


@dataclass(frozen=True)
class GraphLayerInfo:
    commits: int
    generation_data: bool
    bloom: bool


@dataclass(frozen=True)
class ServingStats:
    """The commit-graph chain (base first), the refs, and what the planner derives from them.
    ``known=False`` (statistics built without looking, as tests of the pack rules do): no reasons."""

    known: bool = False
    graph_layers: tuple[GraphLayerInfo, ...] = ()
    graph_monolithic: bool = False            # objects/info/commit-graph (git's non-split file)
    graph_unreadable: str | None = None       # why a layer could not be read (then: rewrite it)
    tips_checked: int = 0
    tips_missing: int = 0                     # branch tips no layer holds
    loose_refs: int = 0
    packed_refs_bytes: int = 0

    @property
    def graph_commits(self) -> int:
        return sum(L.commits for L in self.graph_layers)

    def pack_refs_threshold(self) -> int:
        return loose_refs_threshold(self.packed_refs_bytes)

    def as_dict(self) -> dict[str, Any]:
        return {"graph_layers": len(self.graph_layers), "graph_commits": self.graph_commits,
                "graph_generation_data": all(L.generation_data for L in self.graph_layers) and bool(self.graph_layers),
                "graph_bloom": all(L.bloom for L in self.graph_layers) and bool(self.graph_layers),
                "graph_monolithic": self.graph_monolithic, "graph_tips_missing": self.tips_missing,
                "loose_refs": self.loose_refs, "packed_refs_bytes": self.packed_refs_bytes,
                "loose_refs_threshold": self.pack_refs_threshold()}


def loose_refs_threshold(packed_refs_bytes: int) -> int:
    """Gitaly's ``max(16, ln(packed-refs bytes / 100) / ln(1.15))`` (int, as Gitaly truncates)."""
    if packed_refs_bytes <= 100:
        return LOOSE_REFS_MIN
    return int(max(LOOSE_REFS_MIN, math.log(packed_refs_bytes / 100) / math.log(PACKED_REFS_LOG_BASE)))


def _layer_info(path: Path) -> tuple[GraphLayerInfo, tuple[int, int, int]]:
    """(info, (oid lookup offset, commits, ...)) from a layer's header and chunk table only."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8 or head[:4] != SIGNATURE:
            raise ValueError("bad signature")
        n = head[6]
        toc = f.read(12 * (n + 1))
        chunks = {}
        for i in range(n):
            cid, off = struct.unpack_from(">4sQ", toc, 12 * i)
            chunks[cid] = off
        if OIDF not in chunks or OIDL not in chunks:
            raise ValueError("no OIDF/OIDL chunk")
        f.seek(chunks[OIDF] + 255 * 4)
        (commits,) = struct.unpack(">I", f.read(4))
    return GraphLayerInfo(commits, GDA2 in chunks, BIDX in chunks and BDAT in chunks), (chunks[OIDL], commits, 0)


def _has(path: Path, oidl: int, commits: int, oid: bytes) -> bool:
    lo, hi = 0, commits
    with open(path, "rb") as f:
        while lo < hi:   # at most 32 probes
            mid = (lo + hi) // 2
            f.seek(oidl + 20 * mid)
            got = f.read(20)
            if got == oid:
                return True
            if got < oid:
                lo = mid + 1
            else:
                hi = mid
    return False


def _refs(git_dir: Path) -> tuple[list[bytes], int]:
    """(branch tips, loose ref count) from ONE walk of refs/ and one read of packed-refs."""
    tips: dict[str, bytes] = {}
    try:
        for line in (git_dir / "packed-refs").read_bytes().split(b"\n"):
            if line[:1] in (b"#", b"^", b""):
                continue
            hexid, _, name = line.partition(b" ")
            if name.startswith(b"refs/heads/") and len(hexid) == 40:
                tips[name.decode(errors="replace")] = bytes.fromhex(hexid.decode("ascii", "replace"))
    except (FileNotFoundError, ValueError):
        pass
    loose = 0
    heads = git_dir / "refs" / "heads"
    for dirpath, _dirs, files in os.walk(git_dir / "refs"):
        names = [f for f in files if not f.endswith(".lock") and not f.startswith(".")]
        loose += len(names)
        d = Path(dirpath)
        if d != heads and heads not in d.parents:
            continue
        for fname in names:
            p = d / fname
            try:
                raw = p.read_bytes().strip()
                if len(raw) == 40:
                    tips[p.relative_to(git_dir).as_posix()] = bytes.fromhex(raw.decode("ascii"))
            except (OSError, ValueError):
                continue
    return list(tips.values()), loose


def gather_serving_stats(git_dir: Path) -> ServingStats:
    objects_dir = git_dir / "objects"
    d = objects_dir / GRAPHS_DIR
    layers: list[GraphLayerInfo] = []
    where: list[tuple[Path, int, int]] = []
    unreadable = None
    try:
        names = (d / CHAIN).read_text().split()
    except FileNotFoundError:
        names = []
    for name in names:
        path = d / f"graph-{name}.graph"
        try:
            info, (oidl, commits, _) = _layer_info(path)
        except (OSError, ValueError, struct.error) as err:
            unreadable = f"graph-{name}.graph: {err}"
            break
        layers.append(info)
        where.append((path, oidl, commits))
    all_tips, loose = _refs(git_dir)
    tips = all_tips[:MAX_TIPS_CHECKED]
    missing = 0
    if where:
        for oid in tips:
            try:
                if not any(_has(p, o, c, oid) for p, o, c in where):
                    missing += 1
            except OSError:
                missing += 1
    try:
        packed_bytes = os.stat(git_dir / "packed-refs").st_size
    except FileNotFoundError:
        packed_bytes = 0
    return ServingStats(True, tuple(layers), (objects_dir / MONOLITHIC).exists(), unreadable, len(tips),
                        missing if where else len(tips), loose, packed_bytes)


def serving_reasons(s: ServingStats, *, commit_graph: bool = True, pack_refs: bool = True
                    ) -> tuple[list[str], list[str]]:
    """(commit-graph reasons, pack-refs reasons): why the next maintenance should write them (pure)."""
    graph: list[str] = []
    if not s.known:
        return [], []
    if commit_graph and (s.tips_checked or s.graph_layers):   # no branch yet: nothing to graph
        if s.graph_unreadable:
            graph.append(f"commit-graph chain unreadable ({s.graph_unreadable}): rewrite it whole")
        elif not s.graph_layers:
            graph.append("commit-graph missing" + (" (only git's non-split objects/info/commit-graph)"
                                                    if s.graph_monolithic else ""))
        else:
            if not all(L.generation_data for L in s.graph_layers):
                graph.append("commit-graph lacks generation data (GDA2)")
            if not all(L.bloom for L in s.graph_layers):
                graph.append("commit-graph lacks changed-path Bloom filters (BIDX/BDAT)")
            if s.tips_missing:
                graph.append(f"commit-graph does not cover the refs: {s.tips_missing} of {s.tips_checked} "
                             f"branch tip(s) not in it")
    refs: list[str] = []
    threshold = s.pack_refs_threshold()
    if pack_refs and s.loose_refs > threshold:
        refs.append(f"{s.loose_refs} loose refs > {threshold} (max(16, ln({s.packed_refs_bytes:,} bytes of "
                    f"packed-refs / 100) / ln 1.15)): pack them")
    return graph, refs


__all__ = ["ServingStats", "GraphLayerInfo", "gather_serving_stats", "serving_reasons", "loose_refs_threshold"]
