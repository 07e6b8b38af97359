"""Writing the split commit-graph chain and installing it durably (the format: :mod:`.commitgraph`).

Install order (``commitgraph.after_*`` fault points between the steps): ``commit-graph-chain.lock``
claimed (git's writers and ours exclude each other); the layer written to ``tmp_graph_*`` in the
directory and flushed; renamed to ``graph-<checksum>.graph``; the new chain written to ``tmp_chain_*``,
flushed and renamed over ``commit-graph-chain``; the directory fsynced; a monolithic
``objects/info/commit-graph`` (git would prefer it over the chain) removed -- linked into
``objects/pack/preserved/`` first (``preserve``: git mmaps it, and a reader on another NFS host that has it
mapped keeps its inode for the preserve time; store/maintenance/preserved/packs.py); the claim released. Only
then are layers no chain names removed, once older than ``expire_after`` (a reader that read the old
chain a moment ago still finds its files; git's ``--expire-time``).
"""
from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Mapping

from ... import durable, leftovers, lockfile
from ...errors import ObjectMissingError
from ...faults import fault_point
from ...preserve import preserve_mapped
from . import bloom
from .commitgraph import (
    CHAIN,
    DEFAULT_EXPIRE_AFTER,
    MONOLITHIC,
    SIZE_MULTIPLE,
    Commit,
    GraphResult,
    Layer,
    LayerInput,
    chain_commits,
    compute_filters,
    corrected_dates,
    graphs_dir,
    layer_bytes,
    layer_filters,
    reachable_commits,
    read_chain,
    ref_tips,
    topo_levels,
)

_GRAPH_RE = re.compile(r"^graph-([0-9a-f]{40})\.graph$")


@dataclass(frozen=True)
class GraphOptions:
    replace: bool = False                   # one layer of every reachable commit (git --split=replace)
    size_multiple: int = SIZE_MULTIPLE
    changed_paths: bool = True
    expire_after: float = DEFAULT_EXPIRE_AFTER
    now: float | None = None
    preserve: bool = True                   # a monolithic commit-graph removed is kept in preserved/ a while

def write_commit_graph(repo, options: GraphOptions = GraphOptions(),
                       counters: durable.DurabilityCounters | None = None,
                       known: Mapping[bytes, Commit] | None = None) -> GraphResult:
    """Write (or extend) the split commit-graph chain of ``repo``; see the module docstring. ``known``:
    commits already read (the repack's walk: :func:`.commitgraph.commits_from_walk`), not read again."""
    counters = counters or durable.DurabilityCounters()
    objects_dir = Path(repo.objects.path)
    d = graphs_dir(objects_dir)
    if not d.is_dir():
        d.mkdir(parents=True, exist_ok=True)
        durable.fsync_dir(d.parent, counters)
    now = time.time() if options.now is None else options.now
    result = GraphResult()
    claim = lockfile.acquire(d / f"{CHAIN}.lock", "the commit-graph chain", wait=0.0)
    try:
        leftovers.remove(leftovers.removable(leftovers.find_graph_temps(objects_dir.parent, now=now)))
        layers = read_chain(objects_dir)
        result.layers_before = len(layers)
        replace = options.replace or any(not (L.has_generation_data and (L.has_bloom or not options.changed_paths))
                                         for L in layers)
        try:
            data = _plan_and_build(repo, layers, replace, options, result, known)
        except KeyError:
            # A merged layer names a commit whose parent is gone (deleted outside packyard): write the
            # chain whole from the objects instead.
            replace = True
            result = GraphResult(layers_before=len(layers))
            data = _plan_and_build(repo, layers, replace, options, result, known)
        if data is None:
            return result
        kept = [] if replace else layers[:result.layers_after - 1]
        checksum = data[-20:].hex()
        _install(d, data, checksum, [L.checksum.hex() for L in kept], counters)
        result.written = checksum
        result.replaced = replace
        _remove_monolithic(objects_dir, counters, preserve=options.preserve, now=now)
        leaving = [L.path for L in layers if L.checksum.hex() not in {k.checksum.hex() for k in kept}
                   and L.checksum.hex() != checksum]
        for path in leaving:   # git's mark_commit_graphs: the expiry clock starts when a layer leaves the chain
            try:
                os.utime(path, (now, now))
            except FileNotFoundError:
                pass
    finally:
        lockfile.release(claim)
    result.expired = expire_graphs(objects_dir, options.expire_after, now=now)
    return result

def _plan_and_build(repo, layers: list[Layer], replace: bool, options: GraphOptions,
                    result: GraphResult, known: Mapping[bytes, Commit] | None = None) -> bytes | None:
    # A fresh listing (None without the C extension): right after a repack the repository's snapshot still
    # names the packs it replaced (moved to preserved/, still mapped), and reading every tree from those 50
    # packs instead of the one that replaced them made the write after `packyard repack` ~3x slower.
    c_packs = bloom.open_packs(repo.objects.packs.reprepare())
    try:
        return _build(repo, layers, replace, options, result, c_packs, known)
    finally:
        bloom.close_packs(c_packs)


def _build(repo, layers: list[Layer], replace: bool, options: GraphOptions, result: GraphResult,
           c_packs: object | None, walked: Mapping[bytes, Commit] | None = None) -> bytes | None:
    read = repo.objects.read
    tips = ref_tips(repo)
    in_layers: set[bytes] = set()
    for L in layers:
        in_layers.update(L.oids)
    commits = reachable_commits(read, tips, stop=set() if replace else in_layers, c_packs=c_packs, known=walked)
    if walked:
        result.commits_from_walk = sum(1 for oid in commits if oid in walked)
    new = [oid for oid in commits if oid not in in_layers] if not replace else list(commits)
    if not new and not replace:
        result.layers_after = len(layers)
        return None
    keep = len(layers)
    if not replace:
        count = len(new)
        while keep and len(layers[keep - 1].oids) <= options.size_multiple * count:
            count += len(layers[keep - 1].oids)
            keep -= 1
        recorded = chain_commits(layers)
        for L in layers[keep:]:
            for oid in L.oids:   # merged layers' commits, if they still exist (as git's merge_commit_graph)
                if oid not in commits and repo.objects.has(oid):
                    commits[oid] = recorded[oid][0]
        new = sorted(set(new) | {oid for L in layers[keep:] for oid in L.oids if oid in commits})
        result.layers_merged = len(layers) - keep
    else:
        keep = 0
        new = sorted(new)
        result.layers_merged = len(layers)
    result.layers_after = keep + 1
    base = layers[:keep]
    base_oids = [oid for L in base for oid in L.oids]
    # The numbers of the commits below the new layer are the ones their layers recorded.
    known_levels: dict[bytes, int] = {}
    known_gens: dict[bytes, int] = {}
    if base:
        for oid in base_oids:
            _c, known_levels[oid], known_gens[oid] = recorded[oid]
        for oid in new:
            for p in commits[oid].parents:
                if p not in commits and p not in known_levels:
                    raise ObjectMissingError("a commit's parent is neither new nor in the commit-graph", oid=p)
    levels = topo_levels(commits, known_levels)
    gens = corrected_dates(commits, known_gens)
    known: dict[bytes, bytes] = {}
    if options.changed_paths:
        for L in layers[keep:]:   # the layers this write folds in (all of them when replacing)
            known.update(layer_filters(L))
    filters = compute_filters(read, commits, new, result, gens, known, c_packs) if options.changed_paths else None
    result.commits = len(new)
    return layer_bytes(LayerInput(new, commits, levels, gens, filters, base_oids,
                                  [L.checksum for L in base]))


def _tmp_name(kind: str) -> str:
    from ...owner import this_host_tag

    return f"tmp_{kind}_{os.getpid()}_{this_host_tag()}-{secrets.token_hex(4)}"


def _install(d: Path, data: bytes, checksum: str, base: list[str], counters: durable.DurabilityCounters) -> None:
    # The layer first, then the chain that names it: a chain never names a file that is not in place.
    durable.publish_file(d / _tmp_name("graph"), d / f"graph-{checksum}.graph", data, counters=counters,
                         between=partial(fault_point, "commitgraph.after_flush"), what="the commit-graph")
    fault_point("commitgraph.after_graph_rename")
    durable.fsync_dir(d, counters)   # the layer's name is durable before a chain names it
    durable.publish_file(d / _tmp_name("chain"), d / CHAIN, "".join(f"{h}\n" for h in base + [checksum]).encode(),
                         counters=counters, between=partial(fault_point, "commitgraph.after_chain_flush"),
                         what="the commit-graph")
    fault_point("commitgraph.after_chain_rename")
    durable.fsync_dir(d, counters)
    fault_point("commitgraph.after_fsync_dirs")


def _remove_monolithic(objects_dir: Path, counters: durable.DurabilityCounters, *, preserve: bool = True,
                       now: float | None = None) -> None:
    # git reads objects/info/commit-graph in preference to a chain: once the chain is in place it must go.
    # git mmaps it: a reader elsewhere that has it mapped keeps its inode through a link in preserved/.
    path = objects_dir / MONOLITHIC
    if preserve:
        preserve_mapped(path, objects_dir / "pack", now=now)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    durable.fsync_dir(path.parent, counters)


def expire_graphs(objects_dir: Path, expire_after: float, *, now: float | None = None) -> int:
    """Remove ``graph-*.graph`` files the chain does not name, once older than ``expire_after``."""
    d = graphs_dir(objects_dir)
    now = time.time() if now is None else now
    try:
        named = set((d / CHAIN).read_text().split())
    except FileNotFoundError:
        named = set()
    removed = 0
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return 0
    for e in entries:
        m = _GRAPH_RE.match(e.name)
        if not m or m.group(1) in named:
            continue
        try:
            if now - e.stat(follow_symlinks=False).st_mtime < expire_after:
                continue
            os.unlink(e.path)
            removed += 1
        except FileNotFoundError:
            continue
    return removed


__all__ = ["write_commit_graph", "GraphOptions", "expire_graphs"]
