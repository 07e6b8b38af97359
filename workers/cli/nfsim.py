"""packyard nfsim mount BACKING MOUNTPOINT: one simulated NFS client host (FUSE), in the foreground.

See :mod:`packyard.workers.nfsim` and docs/nfs.md. Unmount with ``fusermount3 -u MOUNTPOINT``.
"""
from __future__ import annotations

import argparse
import sys

from packyard.workers.durations import parse_duration
from packyard.workers.nfsim import IMPLEMENTATIONS


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "nfsim", help="simulated NFS client mounts (FUSE) for tests and benchmarks",
        description="nfsim: a FUSE passthrough over one backing directory that behaves like one NFS client "
                    "(attribute and directory-listing caches, close-to-open, ESTALE, latency per metadata call, "
                    "counters). Mount the same backing directory twice for two hosts.")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    m = sub.add_parser("mount", help="mount BACKING at MOUNTPOINT and serve until unmounted (foreground)")
    m.add_argument("backing", help="the directory every simulated host shares (the 'server')")
    m.add_argument("mountpoint", help="this host's mount point")
    m.add_argument("--ac-attr", type=float, default=3.0, metavar="S",
                   help="seconds a file's cached attributes answer without a round trip (acregmin; default 3)")
    m.add_argument("--ac-dir", type=float, default=3.0, metavar="S",
                   help="seconds a directory's cached attributes (and, with --dir-revalidate trust, its "
                        "listing) are used without a round trip (acdirmin; default 3)")
    m.add_argument("--latency", default="1ms", metavar="T",
                   help="added to every metadata round trip: 1ms, 250us, 0 (default 1ms)")
    m.add_argument("--dir-revalidate", choices=("open", "trust"), default="open",
                   help="open: each opendir revalidates the directory's attributes and re-reads a changed "
                        "listing (close-to-open, default); trust: a cached listing is reused for --ac-dir "
                        "seconds (negative control)")
    m.add_argument("--counters", metavar="FILE", default=None, help="write the per-kind counters here as JSON")
    m.add_argument("--trace", metavar="FILE", default=None,
                   help="append one line per round trip (its kind and path): where a workload's round trips go")
    m.add_argument("--name", default="nfsim", help="the mount's fsname (shown in /proc/mounts)")
    m.add_argument("--impl", choices=IMPLEMENTATIONS, default="auto",
                   help="the filesystem that serves: c (_nfsimd.c), python (fs.py, its specification), auto "
                        "(c when built; default)")
    p.set_defaults(func=run, logs=False)


def run(args: argparse.Namespace) -> int:
    from packyard.workers import nfsim

    reason = nfsim.unavailable(args.impl)
    if reason:
        print(f"packyard nfsim: cannot mount: {reason}", file=sys.stderr)
        return 2
    latency = parse_duration(args.latency)
    if nfsim.implementation(args.impl) == "c":
        from packyard.store import native

        native.nfsim().serve(args.backing, args.mountpoint, args.ac_attr, args.ac_dir, latency,
                             args.dir_revalidate == "trust", args.counters, args.trace, args.name)
        return 0
    from packyard.workers.nfsim.fs import serve

    serve(args.backing, args.mountpoint, ac_attr=args.ac_attr, ac_dir=args.ac_dir, latency=latency,
          dir_revalidate=args.dir_revalidate, counters_path=args.counters, fsname=args.name, trace_path=args.trace)
    return 0
