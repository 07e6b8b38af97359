"""Shared helpers for benchmarks: timing, corpus location, sample repositories, ratio table."""
from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[3]


def corpus_dir() -> Path:
    return Path(os.environ.get("PACKYARD_CORPUS") or ROOT.parent / "shared" / "corpus")


def git(*args: str, git_dir: Path | None = None, cwd: Path | None = None, input: bytes | None = None) -> bytes:
    cmd = ["git"] + (["--git-dir", str(git_dir)] if git_dir else []) + list(args)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(cmd, cwd=cwd, input=input, env=env, check=True, capture_output=True).stdout


def repo_from_pack(dest: Path, pack: Path, refs: Path | None) -> Path:
    """A bare repository holding ``pack`` indexed by git, with the tip from ``refs`` as refs/heads/main."""
    git("init", "-q", "--bare", str(dest))
    target = dest / "objects" / "pack" / "pack-sample.pack"
    shutil.copyfile(pack, target)
    git("index-pack", str(target))
    if refs is not None and refs.exists():
        sha = refs.read_text().split()[0]
        git("update-ref", "refs/heads/main", sha, git_dir=dest)
        git("symbolic-ref", "HEAD", "refs/heads/main", git_dir=dest)
    return dest


def bench_repo(bench: str, repo_arg: str | None, corpus_name: str, dest: Path, announce: bool = False
               ) -> Path | None:
    """The repository a bench reads: ``--repo`` when given, else a bare one at ``dest`` built from the corpus pack
    ``corpus_name`` (``--corpus``; with its refs file; ``announce``: say so first); None after saying on stderr
    that the pack is missing (the bench exits 2)."""
    import sys

    if repo_arg:
        return Path(repo_arg)
    corpus = corpus_dir()
    pack = corpus / f"{corpus_name}.pack"
    if not pack.exists():
        print(f"packyard bench {bench}: no corpus pack {pack}; pass --repo", file=sys.stderr)
        return None
    if announce:
        print(f"indexing {pack.name} with git ...", flush=True)
    return repo_from_pack(dest, pack, corpus / f"{corpus_name}.refs")


def packyard_entry() -> list[str]:
    """The command a user runs: the installed ``packyard`` script next to this Python, else the same entry()."""
    import sys

    script = Path(sys.executable).parent / "packyard"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from packyard.workers.cli import entry; sys.exit(entry())"]


def corpus_bench_start(bench: str, pack_arg: str | None, time_binary: str, work_arg: str | None
                       ) -> tuple[Path, Path, Path] | None:
    """The start of a bench over a corpus pack that measures peak RSS with GNU time: (the pack, its refs file,
    the work directory, made), with packyard's bytecode written; None after saying on stderr what is missing
    (no ``time_binary``, no pack or refs; the bench exits 2). ``pack_arg``: --pack (default: the corpus'
    git-v2.0.0.pack); ``work_arg``: --dir (default: a new temp directory named for the bench)."""
    import sys
    import tempfile

    if not Path(time_binary).exists():
        print(f"packyard bench {bench}: needs {time_binary} (GNU time) to measure peak RSS", file=sys.stderr)
        return None
    pack = Path(pack_arg) if pack_arg else corpus_dir() / "git-v2.0.0.pack"
    refs = pack.with_suffix(".refs")
    if not (pack.exists() and refs.exists()):
        print(f"packyard bench {bench}: no pack {pack} (with {refs.name})", file=sys.stderr)
        return None
    compile_bytecode()
    work = Path(work_arg) if work_arg else Path(tempfile.mkdtemp(prefix=f"packyard-bench-{bench}-"))
    work.mkdir(parents=True, exist_ok=True)
    return pack, refs, work


def compile_bytecode() -> None:
    """Write packyard's .pyc files before timing a freshly started packyard process.

    An installed package has its bytecode (pip compiles it); a source checkout run with
    PYTHONDONTWRITEBYTECODE=1 would otherwise recompile ~20 modules (~30 ms) in every timed
    run -- a cost of the checkout, not of the work being compared with git.
    """
    import compileall

    for pkg in ("store", "workers"):
        compileall.compile_dir(str(ROOT / pkg), quiet=2)


def describe_filesystem(path: Path) -> str:
    """e.g. 'ext4 without a journal (/dev/vda on /)': what the timed runs write to.

    Said because it changes the figures: on ext4 *without* a journal the kernel skips
    recently deleted inodes when it allocates one (ialloc.c: recently_deleted(), checked
    only when there is no journal), scanning past every inode freed in the last few
    seconds to minutes on each file creation. After another job deleted many files
    nearby, each creation costs up to ~100 us more, for git and packyard alike.
    """
    try:
        target = os.path.realpath(path)
        best = None
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            mnt = left.split()[4].replace("\\040", " ")
            inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
            if inside and (best is None or len(mnt) > len(best[0])):
                fstype, source = right.split()[:2]
                best = (mnt, fstype, source)
    except (OSError, IndexError, ValueError):
        return "unknown filesystem"
    if best is None:
        return "unknown filesystem"
    mnt, fstype, source = best
    kind = fstype
    if fstype in ("ext3", "ext4"):
        dev = os.path.basename(source)
        try:
            journaled = any(j.startswith(dev + "-") for j in os.listdir("/proc/fs/jbd2"))
        except OSError:
            journaled = False
        kind = f"{fstype} {'with a journal' if journaled else 'without a journal'}"
    return f"{kind} ({source} on {mnt})"


@contextlib.contextmanager
def fresh_ext4(parent: Path, size_gib: int = 16) -> Iterator[Path]:
    """A new ext4 with mkfs defaults (so: journaled, data=ordered) in a sparse image file under
    ``parent``, loop-mounted for the duration; needs root, mkfs.ext4 and loop devices.

    For figures that do not depend on what else the machine deleted lately (see
    describe_filesystem) and on a filesystem configured as a Git host's would be.
    """
    if os.geteuid() != 0:
        raise SystemExit("--fresh-ext4 needs root (it loop-mounts a new filesystem)")
    if shutil.which("mkfs.ext4") is None:
        raise SystemExit("--fresh-ext4 needs mkfs.ext4 (e2fsprogs)")
    image, mnt = parent / "ext4.img", parent / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size_gib << 30)
    try:
        # -i 4096: one inode per 4 KiB, as a host storing many loose objects would choose.
        subprocess.run(["mkfs.ext4", "-q", "-F", "-i", "4096", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    finally:
        image.unlink(missing_ok=True)


def best_of(fn: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def print_ratios(rows: Sequence[tuple[str, float, float]]) -> None:
    """rows: (what, packyard seconds, git seconds)."""
    print(f"{'benchmark':32} {'packyard s':>10} {'git s':>8} {'ratio':>7}")
    for what, ours, theirs in rows:
        print(f"{what:32} {ours:10.3f} {theirs:8.3f} {ours / theirs if theirs else float('inf'):7.2f}x")


def print_wall_rss(name: str, walls: tuple[Sequence[float], Sequence[float]], rss: tuple[Sequence[int], Sequence[int]],
                   *, wall_label: str = "wall time (median) s", rss_label: str = "peak RSS (max) MiB",
                   width: int = 22) -> None:
    """The head of a side-by-side row's table: the median wall time and the largest peak RSS of each side
    with packyard/git ratios. ``walls`` and ``rss`` are (packyard, git) samples; rows a bench adds after
    (pack bytes, MIDX bytes) use the same ``width``."""
    wp, wg = (statistics.median(side) for side in walls)
    rp, rg = (max(side) for side in rss)
    print(f"{name}: {'':{width}} {'packyard':>10} {'git':>10} {'ratio':>7}")
    print(f"{name}: {wall_label:{width}} {wp:10.3f} {wg:10.3f} {wp / wg:6.2f}x")
    print(f"{name}: {rss_label:{width}} {rp / 2**20:10.1f} {rg / 2**20:10.1f} {rp / rg:6.2f}x")
