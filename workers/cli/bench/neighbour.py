"""``packyard bench loose --noisy-neighbour``: durable writes while another process streams to the same filesystem.

A neighbour process writes 1 MiB blocks as fast as it can into one file in the work directory (wrapping
at ``--neighbour-mib``, so its size stays bounded and the page cache keeps dirty data for the kernel
to write back). Meanwhile:

* the 10,000-file import, packyard vs git's batch mode (loose.py's comparison, alternating rounds);
* a 10-object push (8 blobs, a tree, a commit; a ref moved from the previous push's commit) as the
  library call a worker runs (``unpack_objects`` in this warm process), ``--pushes`` times per flush
  method -- ``auto`` (store/flush.py's choice), ``fsync_each`` and ``syncfs`` forced, taking turns push
  by push -- quiet first, then under the neighbour. The commit latency is the batch's commit steps (write-out, barrier,
  renames, directory sync, ref update) from the job counters; p50 and p99 of each.
"""
from __future__ import annotations

import hashlib
import os
import statistics
import subprocess
import sys
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

COMMIT_STEPS = ("writeout", "barrier_flush", "publish_renames", "fsync_dirs", "update_refs")
METHODS = ("auto", "fsync_each", "syncfs")

NEIGHBOUR = r"""
import os, sys, time
path, wrap = sys.argv[1], int(sys.argv[2])
buf = b"\xa5" * (1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
n = 0
t0 = time.monotonic()
try:
    while True:
        os.write(fd, buf)
        n += 1
        if n % wrap == 0:
            os.lseek(fd, 0, 0)
        if n % 64 == 0:
            print(n, time.monotonic() - t0, flush=True)
except (KeyboardInterrupt, BrokenPipeError):
    pass
"""


class Neighbour:
    """The streaming writer while the ``with`` block runs; ``mib`` and ``seconds`` afterwards."""

    def __init__(self, where: Path, wrap_mib: int) -> None:
        self.path = where / "neighbour.dat"
        self.wrap = wrap_mib
        self.mib = 0
        self.seconds = 0.0

    def __enter__(self) -> "Neighbour":
        self.proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(self.path), str(self.wrap)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.proc.stdout.readline()     # it is writing
        time.sleep(2.0)                 # and has dirtied the page cache
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=60)
        # its last line may be cut short by the signal: the last complete "<MiB> <seconds>" counts
        for line in reversed(out.splitlines()):
            parts = line.split()
            try:
                self.mib, self.seconds = int(parts[0]), float(parts[1])
                break
            except (IndexError, ValueError):
                continue
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def rate(self) -> str:
        return f"{self.mib} MiB in {self.seconds:.0f} s ({self.mib / max(self.seconds, 1e-9):.0f} MiB/s)"


def _entry(type_num: int, data: bytes) -> bytes:
    size = len(data)
    head = bytearray()
    byte = (type_num << 4) | (size & 0x0F)
    size >>= 4
    while size:
        head.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    head.append(byte)
    return bytes(head) + zlib.compress(data, 1)


def _oid(label: bytes, data: bytes) -> bytes:
    return hashlib.sha1(label + b" %d\0" % len(data) + data).digest()


def ten_object_push(tag: str, parent: bytes | None) -> tuple[bytes, bytes]:
    """A self-contained pack of 8 new blobs, their tree and a commit on ``parent``; (pack, commit id)."""
    blobs = [f"push {tag} file {i}\n".encode() * (3 + i) for i in range(8)]
    tree = b"".join(b"100644 f%d\0" % i + _oid(b"blob", b) for i, b in enumerate(blobs))
    commit = (b"tree " + _oid(b"tree", tree).hex().encode() + b"\n"
              + (b"parent " + parent.hex().encode() + b"\n" if parent else b"")
              + b"author B <b@x> 1700000000 +0000\ncommitter B <b@x> 1700000000 +0000\n\npush " + tag.encode() + b"\n")
    body = b"".join([_entry(3, b) for b in blobs] + [_entry(2, tree), _entry(1, commit)])
    pack = b"PACK" + (2).to_bytes(4, "big") + (10).to_bytes(4, "big") + body
    return pack + hashlib.sha1(pack).digest(), _oid(b"commit", commit)


class Pusher:
    """10-object pushes into one repository with one flush method, each moving refs/heads/main."""

    def __init__(self, repo_path: Path, method: str, tag: str) -> None:
        from packyard.store.flush import FlushPolicy, parse_method
        from packyard.store.repo import Repository

        self.repo = Repository.open(repo_path)
        self.method, self.tag = method, tag
        self.policy = FlushPolicy(parse_method(method))
        self.parent: bytes | None = None
        self.latencies: list[float] = []
        self.chosen: dict[str, int] = {}     # the method each push's batch used

    def push(self) -> None:
        from packyard.store.pack.unpack import unpack_objects
        from packyard.store.refs import RefUpdate

        pack, commit = ten_object_push(f"{self.tag}-{self.method}-{len(self.latencies)}", self.parent)
        res = unpack_objects(self.repo, pack, ref_updates=[RefUpdate("refs/heads/main", self.parent, commit)],
                             flush_policy=self.policy)
        elapsed = res.counters["elapsed"]
        self.latencies.append(sum(elapsed.get(k, 0.0) for k in COMMIT_STEPS))
        used = [k.removeprefix("flush_") for k in res.counters if k.startswith("flush_")]
        assert len(used) == 1 and self.method in ("auto", used[0]), res.counters
        self.chosen[used[0]] = self.chosen.get(used[0], 0) + 1
        self.parent = commit


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def pushes_both_ways(base: Path, pushes: int, wrap_mib: int) -> dict[str, dict[str, list[float]]]:
    """Quiet, then under a neighbour: commit latencies per method (fresh repositories each time)."""
    from packyard.workers.cli.bench.common import git

    got: dict[str, dict[str, list[float]]] = {"quiet": {}, "noisy": {}}
    auto_chose: dict[str, dict[str, int]] = {"quiet": {}, "noisy": {}}

    def round_of(cond: str) -> None:
        # The methods take turns push by push, so a change in the machine's load hits all of them alike.
        pushers = []
        for method in METHODS:
            repo = base / f"push-{cond}-{method}.git"
            git("init", "-q", "--bare", str(repo))
            pushers.append(Pusher(repo, method, cond))
        for i in range(pushes):
            for p in (pushers if i % 2 == 0 else pushers[::-1]):
                p.push()
        for p in pushers:
            got[cond][p.method] = p.latencies
            if p.method == "auto":
                auto_chose[cond] = p.chosen

    os.sync()
    round_of("quiet")
    with Neighbour(base, wrap_mib) as nb:
        round_of("noisy")
    print(f"\n10-object pushes ({pushes} per method, library call in this process), neighbour: {nb.rate()}")
    print(f"{'commit latency (ms)':22} {'quiet p50':>10} {'quiet p99':>10} {'noisy p50':>10} {'noisy p99':>10} "
          f"{'noisy/quiet p99':>16}")
    for method in METHODS:
        q, n = got["quiet"][method], got["noisy"][method]
        print(f"{method:22} {statistics.median(q) * 1000:10.1f} {p99(q) * 1000:10.1f} "
              f"{statistics.median(n) * 1000:10.1f} {p99(n) * 1000:10.1f} {p99(n) / p99(q):15.2f}x")
    print("auto chose: " + "; ".join(f"{cond} " + ", ".join(f"{m} {k}x" for m, k in sorted(c.items()))
                                     for cond, c in auto_chose.items()))
    return got


@contextmanager
def neighbour_for(base: Path, wrap_mib: int) -> Iterator[Neighbour]:
    with Neighbour(base, wrap_mib) as nb:
        yield nb
    print(f"neighbour during the import: {nb.rate()}")
