"""packyard bench delta: the delta encoder alone, packyard (C and Python) vs dulwich, delta sizes vs git.

Input: successive versions of git.git's most often changed files, from the corpus's
git-v2.0.0 history: for each of the ``--files`` paths changed most often, the
``--pairs`` most recent (old blob, new blob) pairs that ``git log --raw`` shows as a
modification. Every encoder makes the delta old -> new for every pair, one-shot (the
index of the base is built per pair, as dulwich's ``create_delta`` does). Rounds
alternate the encoders; the best round counts. Reported: MB/s of target bytes and
the average delta size per encoder, with ratios against dulwich.

git's delta sizes for the same pairs come from ``git pack-objects --no-reuse-delta``
on each pair alone (both blobs under one name, so git tries one against the other);
git picks the direction (usually the larger blob as the base), so packyard's size is
measured again in git's direction for that comparison. Pairs git stores whole are
left out of it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Callable

from packyard.workers.cli.bench import common


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("delta", help="delta encoder: packyard C/Python vs dulwich (MB/s, sizes vs git)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", metavar="PATH", help="repository to take the versions from "
                                                  "(default: built from the corpus pack)")
    p.add_argument("--corpus", default="git-v2.0.0", help="corpus pack name (default git-v2.0.0)")
    p.add_argument("--files", type=int, default=20, help="most often changed paths to take (default 20)")
    p.add_argument("--pairs", type=int, default=25, help="most recent version pairs per path (default 25)")
    p.add_argument("--runs", type=int, default=3, help="best of N rounds (default 3)")
    p.add_argument("--no-git", action="store_true", help="skip the delta sizes of git pack-objects")
    p.set_defaults(func=run)


def version_pairs(repo: Path, files: int, per_file: int) -> list[tuple[str, str]]:
    """(old blob id, new blob id) for the most recent modifications of the most often changed paths."""
    names = common.git("log", "--format=", "--name-only", "HEAD", git_dir=repo).decode().split("\n")
    counts: dict[str, int] = {}
    for n in names:
        if n:
            counts[n] = counts.get(n, 0) + 1
    paths = sorted(counts, key=lambda p: (-counts[p], p))[:files]
    raw = common.git("log", "--raw", "--no-abbrev", "--format=", "HEAD", "--", *paths, git_dir=repo).decode()
    taken: dict[str, int] = {}
    pairs: list[tuple[str, str]] = []
    for line in raw.splitlines():
        meta, _, path = line.partition("\t")
        f = meta.split()
        # Regular files modified in place (not type changes, not merges' combined lines).
        if len(f) == 5 and f[0] in (":100644", ":100755") and f[1] == f[0][1:] and f[4] == "M":
            if taken.get(path, 0) < per_file:
                taken[path] = taken.get(path, 0) + 1
                pairs.append((f[2], f[3]))
    return pairs


def read_blobs(repo: Path, ids: list[str]) -> dict[str, bytes]:
    out = common.git("cat-file", "--batch", git_dir=repo, input="".join(i + "\n" for i in ids).encode())
    blobs: dict[str, bytes] = {}
    pos = 0
    while pos < len(out):
        nl = out.index(b"\n", pos)
        oid, _typ, size = out[pos:nl].split()
        blobs[oid.decode()] = out[nl + 1:nl + 1 + int(size)]
        pos = nl + 1 + int(size) + 1
    return blobs


def git_delta(repo: Path, old: str, new: str, tmp: Path) -> tuple[str, str, int] | None:
    """(base id, target id, delta size) of the delta git makes for this pair alone, or None."""
    out = tmp / "pair"
    name = common.git("pack-objects", "-q", "--no-reuse-delta", "--no-reuse-object", str(out), git_dir=repo,
                      input=f"{old} f\n{new} f\n".encode()).decode().strip()
    try:
        listing = common.git("verify-pack", "-v", str(tmp / f"pair-{name}.idx")).decode()
    finally:
        for suffix in (".pack", ".idx", ".rev"):
            (tmp / f"pair-{name}{suffix}").unlink(missing_ok=True)
    for line in listing.splitlines():
        f = line.split()
        # SHA-1 type size size-in-pack offset depth base: "size" of a delta entry is the delta's length.
        if len(f) == 7 and f[1] == "blob":
            return f[6], f[0], int(f[2])
    return None


def run(args: argparse.Namespace) -> int:
    from dulwich.pack import create_delta as dulwich_create_delta

    from packyard.store import native
    from packyard.store.pack import _delta_py
    c_delta = native.delta()
    if c_delta is None:
        print("packyard bench delta: the C extension is not built (pip install packyard builds it); "
              "measuring the Python encoder only", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="packyard-bench-delta-") as tmpname:
        tmp = Path(tmpname)
        repo = common.bench_repo("delta", args.repo, args.corpus, tmp / "r.git", announce=True)
        if repo is None:
            return 2
        ids = version_pairs(repo, args.files, args.pairs)
        if not ids:
            print("packyard bench delta: no modified regular files in the history", file=sys.stderr)
            return 2
        blobs = read_blobs(repo, sorted({i for pair in ids for i in pair}))
        pairs = [(blobs[a], blobs[b]) for a, b in ids]
        target_bytes = sum(len(t) for _, t in pairs)
        print(f"{len(pairs)} version pairs of {min(args.files, len({a for a, _ in ids}))} paths, "
              f"{target_bytes / 1e6:.1f} MB of targets (avg {target_bytes / len(pairs) / 1e3:.1f} KB), "
              f"{os.cpu_count()} cores, best of {args.runs}", flush=True)

        encoders: dict[str, Callable[[bytes, bytes], bytes | None]] = {}
        if c_delta is not None:
            c_module: Any = c_delta
            encoders["packyard C"] = lambda b, t: c_module.DeltaIndex(b).create_delta(t)
        encoders["packyard Python"] = lambda b, t: _delta_py.DeltaIndex(b).create_delta(t)
        encoders["dulwich"] = lambda b, t: b"".join(dulwich_create_delta(b, t))

        sizes = {name: sum(len(fn(b, t) or b"") for b, t in pairs) for name, fn in encoders.items()}
        best = {name: float("inf") for name in encoders}
        for _ in range(args.runs):
            for name, fn in encoders.items():
                best[name] = min(best[name], common.best_of(partial(_encode_all, fn, pairs), 1))

        print(f"{'encoder':18} {'MB/s':>9} {'vs dulwich':>11} {'avg delta B':>12} {'size vs dulwich':>16}")
        for name in encoders:
            rate = target_bytes / best[name] / 1e6
            print(f"{name:18} {rate:9.1f} {best['dulwich'] / best[name]:10.1f}x {sizes[name] / len(pairs):12.0f} "
                  f"{sizes[name] / sizes['dulwich']:15.2f}x")
        if c_delta is not None:
            print(f"packyard C is {best['packyard Python'] / best['packyard C']:.0f}x the Python encoder")

        if not args.no_git:
            compare_with_git(repo, ids, blobs, c_delta or _delta_py, tmp)
    return 0


def compare_with_git(repo: Path, ids: list[tuple[str, str]], blobs: dict[str, bytes], encoder, tmp: Path) -> None:
    from tqdm import tqdm

    ours = theirs = counted = 0
    for old, new in tqdm(ids, desc="git pack-objects per pair", unit="pair", leave=False, disable=None):
        found = git_delta(repo, old, new, tmp)
        if found is None:
            continue
        base_id, target_id, size = found
        d = encoder.DeltaIndex(blobs[base_id]).create_delta(blobs[target_id])
        counted += 1
        theirs += size
        ours += len(d)
    if not counted:
        print("git stored every pair whole: no delta sizes to compare")
        return
    print(f"git's own deltas ({counted} of {len(ids)} pairs, git's direction): avg {theirs / counted:.0f} B "
          f"git, {ours / counted:.0f} B packyard -> packyard/git size {ours / theirs:.2f}x")


def _encode_all(fn: Callable[[bytes, bytes], bytes | None], pairs: list[tuple[bytes, bytes]]) -> list[bytes | None]:
    return [fn(b, t) for b, t in pairs]
