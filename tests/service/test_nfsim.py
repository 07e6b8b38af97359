"""nfsim (issue 22): two simulated NFS client hosts over one backing directory, and packyard's lookup
rules across them.

* nfsim itself: each mount caches attributes and listings on its own; a listing is revalidated on
  opendir (close-to-open) unless the mount trusts it; a file removed or replaced through one mount is
  ESTALE to a reader on the other (not on the mount that removed it: silly-rename); RENAME_NOREPLACE
  passes through; counters count the round trips. Each of these runs on both filesystems (the C one,
  _nfsimd.c, where it is built; fs.py, its specification), and one scripted workload through both must
  give the same answers and the same counters.
* packyard: a pack installed through host A is found by a long-lived reader on host B whose listing
  of objects/pack is older than the pack (the miss re-lists with a fresh opendir, which revalidates);
  the negative control -- the same reader on a mount that trusts its cached listing -- loses the read.
* packyard: objects a loose repack on host A moves into a pack while a reader on host B has their
  loose files open answer ESTALE to B; B's read still succeeds (ESTALE is "gone": re-list, read the pack).

* a file host B maps, replaced through host A: the C filesystem gives B's new open the new file and B's old
  mapping the old file while it has a link (ESTALE, so SIGBUS, once it has none), as an NFS client's file
  handles do; end to end, git on host B keeps reading through a MIDX packyard replaced on host A because the
  old one is linked in preserved/, and dies of SIGBUS without that link.
* another host's pids: a claim held by host B's process in its own PID namespace (with its own host
  name, and with A's) is never judged by host A's process table.
* the syscall budget: index-pack and a full repack make as many metadata round trips for 2,000 objects
  as for 100.
* ``packyard race --hosts 2``: workers on both hosts (B's in its own PID/UTS/mount namespaces), readers
  on both mounts, no lost read and no lease taken across hosts; the control trusting cached listings
  loses reads.

git is the oracle of what exists (``git cat-file -e``, ``git fsck`` on the backing directory). Tests skip
only where /dev/fuse (or fuse3, or unshare for the namespace tests) is missing.
"""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packyard.workers.nfsim.fs  # noqa: F401  (METADATA_KINDS)
from gitutil import commit_blobs, git, make_worktree_repo, write_blobs
from packyard.workers import nfsim

REASON = nfsim.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"nfsim cannot mount here: {REASON}")

LONG = 600.0   # cache lifetimes far beyond a test's run: what a test sees never depends on expiry
#: The filesystems the tests of nfsim itself run on: fs.py always, the C one where it is built (the other tests
#: take the default: the C one when built).
IMPLS = ["python", *(["c"] if nfsim.implementation() == "c" else [])]


@pytest.fixture
def hosts(nfsim_hosts):
    """mount(name, **options) -> nfsim.Mount of the shared backing dir (tests/service/conftest.py)."""
    return nfsim_hosts


def _renameat2(old: Path, new: Path, flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(old), -100, os.fsencode(new), ctypes.c_uint(flags)) != 0:
        return ctypes.get_errno()
    return 0


@pytest.mark.parametrize("impl", IMPLS)
def test_each_mount_is_one_nfs_client(hosts, impl):
    a = hosts("a", ac_attr=LONG, ac_dir=LONG, impl=impl)
    b = hosts("b", ac_attr=LONG, ac_dir=LONG, impl=impl)
    c = hosts("c", ac_attr=LONG, ac_dir=LONG, dir_revalidate="trust", impl=impl)
    A, B, C = a.mountpoint, b.mountpoint, c.mountpoint
    (A / "d").mkdir()
    (A / "d" / "one").write_bytes(b"1" * 100)
    assert sorted(os.listdir(B / "d")) == sorted(os.listdir(C / "d")) == ["one"]

    # listings: B revalidates on opendir and sees a new name at once; C trusts its cached listing
    before = b.counters()
    (A / "d" / "two").write_bytes(b"2")
    assert sorted(os.listdir(B / "d")) == ["one", "two"]
    assert os.listdir(C / "d") == ["one"]
    assert (C / "d" / "two").read_bytes() == b"2"       # a lookup by name is not the listing: found
    after = b.counters()
    assert after["readdir"] - before["readdir"] == 1
    os.listdir(B / "d")                                   # unchanged directory: no listing re-read
    assert b.counters()["readdir"] == after["readdir"]

    # attributes: B's cached size is stale until B opens the file (close-to-open)
    assert os.stat(B / "d" / "one").st_size == 100
    with open(A / "d" / "one", "ab") as f:
        f.write(b"1" * 50)
    assert os.stat(B / "d" / "one").st_size == 100
    with open(B / "d" / "one", "rb") as f:
        assert os.fstat(f.fileno()).st_size == 150
        assert f.read() == b"1" * 150

    # ESTALE: a handle on B whose file A removed, or replaced by a rename
    (A / "d" / "gone").write_bytes(b"g" * 10)
    (A / "d" / "old").write_bytes(b"o" * 10)
    (A / "d" / "new").write_bytes(b"n" * 10)
    fg = os.open(B / "d" / "gone", os.O_RDONLY)
    fo = os.open(B / "d" / "old", os.O_RDONLY)
    try:
        os.unlink(A / "d" / "gone")
        os.rename(A / "d" / "new", A / "d" / "old")
        for fd in (fg, fo):
            with pytest.raises(OSError) as exc:
                os.pread(fd, 10, 0)
            assert exc.value.errno == errno.ESTALE
    finally:
        os.close(fg)
        os.close(fo)
    assert b.counters()["estale"] >= 2   # the kernel may retry a failed read
    assert (B / "d" / "old").read_bytes() == b"n" * 10    # a new open finds the new file

    # silly-rename: the mount that removed an open file still reads it
    (A / "d" / "mine").write_bytes(b"m" * 10)
    with open(A / "d" / "mine", "rb") as f:
        os.unlink(A / "d" / "mine")
        assert f.read() == b"m" * 10

    # RENAME_NOREPLACE reaches the server (packyard's loose publish relies on it)
    assert _renameat2(A / "d" / "two", A / "d" / "one", 1) == errno.EEXIST
    assert (hosts.backing / "d" / "one").read_bytes() == b"1" * 150


#: A reader on host B: maps the file argv[1] with no read-ahead, touches its first page, says "mapped", waits
#: for a line, then touches every page and says whether each still holds the old file's bytes ("a").
_MAPPER = r"""
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
m.madvise(mmap.MADV_RANDOM)
assert m[0] == ord("a")
print("mapped", flush=True)
sys.stdin.readline()
print("old" if all(m[i] == ord("a") for i in range(0, size, 4096)) else "mixed", flush=True)
"""


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kept", [True, False], ids=["old-file-kept", "old-file-gone"])
def test_a_file_mapped_on_host_b_and_replaced_through_host_a(hosts, impl, kept):
    """Host B maps a file (the MIDX, a commit-graph); host A renames a smaller file over it; host B then opens
    the name again (a new clone) and touches the old mapping's pages it had not read yet. An NFS client's
    inode is the server's file handle: the new open is a new inode with the new bytes, and the old mapping
    reads the old file while the old file has a link somewhere (``kept``: what packyard's preserve step
    leaves), or dies of SIGBUS (ESTALE on a page it had not cached) once the file is gone.

    The C filesystem keys its nodes by the file a name held, as that client does. fs.py runs on libfuse's
    high-level API (mfusepy), which keys them by name: the new file takes over the old node, and the old
    mapping's unread pages come from the new file (its documented limit, docs/nfs.md; in a race, a clone
    reading such a mapping fails, which an NFS client would not have caused while the old file had a link)."""
    a = hosts("a", ac_attr=0.2, ac_dir=0.2, impl=impl)
    b = hosts("b", ac_attr=0.2, ac_dir=0.2, impl=impl)
    A, B = a.mountpoint, b.mountpoint
    size = 64 * 4096
    (A / "f").write_bytes(b"a" * size)
    child = subprocess.Popen([sys.executable, "-c", _MAPPER, str(B / "f")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        if kept:
            os.link(A / "f", A / "f.kept")
        (A / "f.new").write_bytes(b"b" * 4096)
        os.rename(A / "f.new", A / "f")
        time.sleep(1.0)     # B's cached attributes (0.2 s) and the kernel's name (0.2 s) of f expire
        assert (B / "f").read_bytes() == b"b" * 4096      # a new open on B: the new file
        out, _ = child.communicate("\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if impl == "python":
        assert (child.returncode, out.strip()) == (0, "mixed")
    elif kept:
        assert (child.returncode, out.strip()) == (0, "old")
    else:
        assert child.returncode == -signal.SIGBUS, (child.returncode, out)


def _blob_packs(bare: Path, packs: int, per_pack: int) -> list[str]:
    """``packs`` packs of ``per_pack`` distinct small blobs each, written by git fast-import; the blob ids."""
    for p in range(packs):
        stream = b"".join(b"blob\ndata %d\n%s\n" % (len(d), d)
                          for d in (b"blob %d of pack %d" % (i, p) for i in range(per_pack)))
        git("fast-import", "--quiet", git_dir=bare, input=stream)
    out = git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", git_dir=bare)
    return out.decode().split()


@pytest.mark.skipif("c" not in IMPLS, reason="nfsim's C filesystem is not built here (libfuse3's headers): fs.py "
                    "keys the kernel's inodes by name (test_a_file_mapped_on_host_b_and_replaced_through_host_a)")
@pytest.mark.parametrize("preserve", [True, False], ids=["preserved", "not-preserved"])
def test_git_on_host_b_reads_through_a_midx_host_a_replaced(hosts, tmp_path, preserve):
    """End to end, what the preserved MIDX is for: ``git cat-file --batch-check`` on host B maps the MIDX (40,000
    objects: 1.1 MB, larger than the kernel's read-ahead, so most of its pages are not read yet) and finds one
    object; packyard's MIDX write on host A renames a new MIDX over it; then B's git looks up objects whose
    entries lie in pages it never read. With the old MIDX linked into preserved/ (packyard's default) git
    reads them through its old mapping; without, the old file is gone from the server, its pages are ESTALE
    and git dies of SIGBUS, as on NFS."""
    from packyard.store.maintenance.serving.midx import MIDX_NAME, installed_stems, write_midx

    a = hosts("a", ac_attr=LONG, ac_dir=LONG)
    b = hosts("b", ac_attr=LONG, ac_dir=LONG)
    bare = hosts.backing / "r.git"
    git("init", "-q", "--bare", str(bare))
    ids = sorted(_blob_packs(bare, 2, 20_000))
    git("multi-pack-index", "write", "--no-progress", git_dir=bare)
    assert (bare / "objects" / "pack" / MIDX_NAME).stat().st_size > 1_000_000
    first = [i for i in ids if i.startswith("00")][0]
    later = [i for i in ids if i.startswith(("6", "7", "8", "9", "a"))][::97]    # far from what B read first
    proc = subprocess.Popen(["git", "--git-dir", str(b.mountpoint / "r.git"), "cat-file", "--batch-check"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(first + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split()[0] == first
        pack_dir = a.mountpoint / "r.git" / "objects" / "pack"
        stems = installed_stems(pack_dir)
        assert len(stems) == 2
        write_midx(pack_dir, stems[:1], preserve=preserve)      # through host A: the old MIDX replaced
        out, _ = proc.communicate("".join(f"{i}\n" for i in later), timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    kept = list((hosts.backing / "r.git" / "objects" / "pack" / "preserved").glob(f"{MIDX_NAME}-*.old"))
    if preserve:
        assert len(kept) == 1
        assert proc.returncode == 0, out
        assert [line.split()[0] for line in out.splitlines()] == later
        assert all(line.split()[1] == "blob" for line in out.splitlines())
    else:
        assert kept == []
        assert proc.returncode == -signal.SIGBUS, (proc.returncode, out[-500:])
    estale = b.counters()["estale"]      # nfsim's ESTALE answers to host B: the old MIDX's pages, and only them
    assert estale == 0 if preserve else estale >= 1, estale


def _mapped(pid: int, needle: str) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif("c" not in IMPLS, reason="nfsim's C filesystem is not built here (libfuse3's headers): fs.py "
                    "keys the kernel's inodes by name (test_a_file_mapped_on_host_b_and_replaced_through_host_a)")
@pytest.mark.parametrize("preserve", [True, False], ids=["preserved", "not-preserved"])
def test_git_on_host_b_reads_a_loose_object_a_repack_on_host_a_deletes(hosts, tmp_path, preserve):
    """git reads a loose object through a map (open, mmap, close, inflate from the map). A repack on host A
    that packs it deletes the loose file: on NFS the file's last link goes, and git on host B, part way
    through its map, meets ESTALE at its next page -- SIGBUS. Here B's ``git cat-file --batch`` maps a 24 MiB
    loose blob and streams it into a pipe read only after packyard's loose repack through host A has ended. With
    ``preserve`` (packyard's default) the repack linked the loose file into
    ``objects/pack/preserved/loose-<hex>/`` before unlinking it, and B reads the whole blob; without, B dies of
    SIGBUS."""
    import random

    from packyard.store.maintenance.repack.options import RepackHooks, RepackMode, RepackOptions
    from packyard.store.maintenance.repack.run import repack
    from packyard.store.repo import Repository

    a = hosts("a", ac_attr=LONG, ac_dir=LONG)
    b = hosts("b", ac_attr=LONG, ac_dir=LONG)
    bare = hosts.backing / "r.git"
    git("init", "-q", "--bare", str(bare))
    data = random.Random(7).randbytes(24 << 20)
    (tmp_path / "big").write_bytes(data)
    oid = git("hash-object", "-w", str(tmp_path / "big"), git_dir=bare).decode().strip()
    tree = git("mktree", git_dir=bare, input=f"100644 blob {oid}\tbig\n".encode()).decode().strip()
    git("update-ref", "refs/heads/main", git("commit-tree", tree, "-m", "big", git_dir=bare).decode().strip(),
        git_dir=bare)
    commit = git("rev-parse", "main", git_dir=bare).decode().strip()
    # B's git lists objects/pack (empty) for its first object, before the repack; it finds the blob loose later.
    proc = subprocess.Popen(["git", "--git-dir", str(b.mountpoint / "r.git"), "cat-file", "--batch"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    procs = [proc]
    proc.stdin.write(f"{commit}\n".encode())
    proc.stdin.flush()
    header = proc.stdout.readline().split()
    assert header[:2] == [commit.encode(), b"commit"]
    proc.stdout.read(int(header[2]) + 1)

    def start_reader() -> None:
        # Just before the delete, B maps the loose file and streams the blob into a pipe nobody reads yet: git
        # blocks once the pipe is full, its map made and nearly all of it unread.
        proc.stdin.write(f"{oid}\n".encode())
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not _mapped(proc.pid, f"{oid[:2]}/{oid[2:]}"):
            assert proc.poll() is None and time.monotonic() < deadline, "git on B never mapped the loose object"
            time.sleep(0.001)

    try:
        res = repack(Repository(a.mountpoint / "r.git"),
                     RepackOptions(mode=RepackMode.LOOSE, preserve=preserve, midx=False, bitmap=False),
                     hooks=RepackHooks(before_delete=start_reader))
        assert res.counters.loose_deleted == 3
        assert not (bare / "objects" / oid[:2] / oid[2:]).exists()
        got, _ = proc.communicate(timeout=120)     # B reads on, through its map
        rc = proc.returncode
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    kept = list((bare / "objects" / "pack" / "preserved").glob(f"loose-*/*/{oid}"))
    if preserve:
        assert len(kept) == 1 and res.counters.loose_preserved == 3
        assert rc == 0 and got == f"{oid} blob {len(data)}\n".encode() + data + b"\n"
        assert b.counters()["estale"] == 0
    else:
        assert kept == [] and res.counters.loose_preserved == 0
        assert rc == -signal.SIGBUS, rc
        assert b.counters()["estale"] >= 1
    git("fsck", "--full", "--strict", git_dir=bare)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_benchmarks_probe_counts_the_daemons_own_cpu_apart_from_the_calls(hosts, impl, capsys):
    """``packyard bench --nfsim-latency`` prints the simulator's own CPU per run beside the round trips: reading
    a file through the mount costs the daemon CPU time (FUSE requests, copies) that is no metadata call."""
    from packyard.workers.cli.bench import nfsim_side

    a = hosts("a", ac_attr=LONG, ac_dir=LONG, latency=0.0, impl=impl)
    chunk = os.urandom(1 << 20)
    before = nfsim_side.probe(a)
    deadline = time.monotonic() + 60
    for i in range(10_000):   # (/proc counts in clock ticks: write through the mount until the daemon used some)
        with open(a.mountpoint / f"f{i % 4}", "wb", buffering=0) as f:
            for _ in range(16):
                f.write(chunk)
        calls = nfsim_side.calls_between(nfsim_side.probe(a), before)
        if calls[nfsim_side.CPU_KEY] > 0 or time.monotonic() > deadline:
            break
    assert calls[nfsim_side.CPU_KEY] > 0
    assert calls["create"] >= 1
    nfsim_side.report("0s", {"packyard": [1.0]}, {"packyard": [1.0]}, {"packyard": [calls]})
    out = capsys.readouterr().out
    total = sum(v for k, v in calls.items() if k != nfsim_side.CPU_KEY)
    assert f"{total:19.0f}" in out                        # the CPU milliseconds are not counted as calls
    assert "nfsim daemon CPU per run" in out and nfsim_side.CPU_KEY not in out


@pytest.mark.parametrize("impl", IMPLS)
def test_times_set_to_now_through_a_mount_are_now(hosts, tmp_path, impl):
    """``os.utime(path)`` (packyard's freshen, ``touch``) reaches nfsim as utimensat's UTIME_NOW marker, and
    ``touch -m`` leaves the access time with UTIME_OMIT: "now" is the server's clock, "omit" keeps the time.
    Taken as nanoseconds, they set 1970-01-01 00:00:01 -- a freshened pack looked 56 years old to expiry."""
    a = hosts("a", ac_attr=LONG, ac_dir=LONG, impl=impl)
    f = a.mountpoint / "f"
    f.write_bytes(b"x")
    os.utime(f, ns=(1_000_000_000_000_000_000, 1_100_000_000_000_000_000))   # explicit times: as given
    assert os.stat(hosts.backing / "f").st_mtime_ns == 1_100_000_000_000_000_000
    before = time.time()
    os.utime(f)                                                          # UTIME_NOW for both
    st = os.stat(hosts.backing / "f")
    assert before - 5 <= st.st_mtime <= time.time() + 5 and before - 5 <= st.st_atime <= time.time() + 5
    os.utime(hosts.backing / "f", ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    subprocess.run(["touch", "-m", str(f)], check=True)                  # mtime now, atime omitted
    st = os.stat(hosts.backing / "f")
    assert st.st_atime_ns == 1_000_000_000_000_000_000 and st.st_mtime >= before - 5


def _errno(fn, *args):
    """fn(*args), or the name of the errno it failed with."""
    try:
        return fn(*args)
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))


def _script(A: Path, B: Path) -> list:
    """One workload through host A and host B; what each step answered."""
    out: list = []
    (A / "d").mkdir()
    (A / "d" / "f").write_bytes(b"f" * 100)
    out += [os.stat(B / "d" / "f").st_size, sorted(os.listdir(B / "d"))]
    (A / "d" / "g").write_bytes(b"g" * 10)
    out.append(sorted(os.listdir(B / "d")))
    os.link(A / "d" / "f", A / "d" / "h")
    out.append(os.stat(A / "d" / "h").st_nlink)
    os.utime(A / "d" / "h", ns=(1_000_000_000, 2_000_000_000))
    os.chmod(A / "d" / "h", 0o600)
    out += [os.stat(B / "d" / "h").st_mtime_ns, oct(os.stat(B / "d" / "h").st_mode)]
    os.symlink("f", A / "d" / "s")
    out.append(os.readlink(B / "d" / "s"))
    os.truncate(A / "d" / "f", 3)
    out.append((B / "d" / "f").read_bytes())
    fd = os.open(B / "d" / "g", os.O_RDONLY)
    os.unlink(A / "d" / "g")
    out.append(_errno(os.pread, fd, 10, 0))
    os.close(fd)
    (A / "d" / "m").write_bytes(b"m" * 10)
    fd = os.open(B / "d" / "m", os.O_RDONLY)
    os.link(A / "d" / "m", A / "d" / "n")      # another link keeps the file: B's read is served (kept_reads)
    os.unlink(A / "d" / "m")
    out.append(_errno(os.pread, fd, 10, 0))
    os.close(fd)
    with open(A / "d" / "f", "rb") as f:
        os.unlink(A / "d" / "f")
        out.append(f.read())
    out.append(_renameat2(A / "d" / "h", A / "d" / "s", 1))
    os.rename(A / "d" / "h", A / "d" / "k")
    out.append(sorted(os.listdir(B / "d")))
    out.append(_errno(os.rmdir, A / "d"))
    out.append(_errno(os.stat, B / "d" / "missing"))
    with open(A / "d" / "k", "r+b") as f:
        f.write(b"k")
        os.fsync(f.fileno())
    out.append(os.statvfs(A).f_bsize > 0)
    return out


@pytest.mark.skipif("c" not in IMPLS, reason="nfsim's C filesystem is not built here (libfuse3's headers)")
def test_the_c_filesystem_answers_and_counts_as_its_python_specification(tmp_path):
    """_nfsimd.c against fs.py: one workload through two hosts of each gives the same answers and, on both
    hosts, the same counters (every round trip of every kind, cache hit, ESTALE, kept read, refused rename,
    byte)."""
    seen = {}
    for impl in IMPLS:
        backing = tmp_path / impl / "server"
        backing.mkdir(parents=True)
        with nfsim.Mount(backing, tmp_path / impl / "a", latency=0.0, ac_attr=LONG, ac_dir=LONG, impl=impl) as a, \
                nfsim.Mount(backing, tmp_path / impl / "b", latency=0.0, ac_attr=LONG, ac_dir=LONG, impl=impl) as b:
            answers = _script(a.mountpoint, b.mountpoint)
            counts = [{k: v for k, v in m.counters().items() if k not in ("max_in_flight", "latency_s")}
                      for m in (a, b)]
        seen[impl] = (answers, counts)
    assert seen["c"][0] == seen["python"][0]
    # (an NFS client's answers: B's stale handle is ESTALE, A's own removed file still reads, NOREPLACE refused)
    assert seen["python"][0] == [100, ["f"], ["f", "g"], 2, 2_000_000_000, "0o100600", "f", b"fff", "ESTALE",
                                 b"m" * 10, b"fff", errno.EEXIST, ["k", "n", "s"], "ENOTEMPTY", "ENOENT", True]
    assert seen["c"][1] == seen["python"][1]
    # kept reads: B's read of m (kept by n); A's read of f after its own unlink (kept by h)
    assert [c["kept_reads"] for c in seen["python"][1]] == [1, 1], seen["python"][1]


def _packed_repo(base: Path) -> Path:
    """A bare repository made by git, every object in one pack."""
    bare = make_worktree_repo(base, commits=4, files_per_commit=4)
    git("repack", "-a", "-d", "-q", git_dir=bare)
    return bare


def _new_pack(scratch: Path, tag: str) -> tuple[Path, list[str]]:
    """A pack of new blobs made by git in a scratch repository; the pack file and the ids."""
    s = scratch / f"scratch-{tag}.git"
    git("init", "-q", "--bare", str(s))
    ids = write_blobs(s, scratch, 20, tag)
    data = git("pack-objects", "--stdout", "-q", git_dir=s, input=("\n".join(ids) + "\n").encode())
    path = scratch / f"{tag}.pack"
    path.write_bytes(data)
    return path, ids


def _index_pack(repo: Path, pack: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(["packyard", "index-pack", "--repo", str(repo), "--no-progress", str(pack)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_pack_installed_through_host_a_is_found_by_a_reader_on_host_b(hosts, tmp_path, pk):
    from packyard.store.errors import ObjectMissingError
    from packyard.store.repo import Repository

    bare = _packed_repo(hosts.backing)
    a = hosts("a", ac_attr=LONG, ac_dir=LONG)
    b = hosts("b", ac_attr=LONG, ac_dir=LONG)
    c = hosts("c", ac_attr=LONG, ac_dir=LONG, dir_revalidate="trust")
    old = git("rev-parse", "main", git_dir=bare).decode().strip()
    reader_b = Repository(b.mountpoint / bare.name)
    reader_c = Repository(c.mountpoint / bare.name)
    for reader in (reader_b, reader_c):     # both list objects/pack now, and keep that listing
        assert reader.objects.read(bytes.fromhex(old))[0].name.lower() == "commit"

    pack, ids = _new_pack(tmp_path, "pushed")
    _index_pack(a.mountpoint / bare.name, pack, pk.cli_env())
    for oid in ids:                         # git, on the server, has them
        git("cat-file", "-e", oid, git_dir=bare)

    before = b.counters()
    for oid in ids:
        kind, data = reader_b.objects.read(bytes.fromhex(oid), verify=True)
        assert data == git("cat-file", "blob", oid, git_dir=bare)
    assert reader_b.objects.counters.relisted_hits == 1            # one miss, one re-listing, then found
    assert b.counters()["readdir"] - before["readdir"] >= 1          # the re-listing really read the directory

    # Negative control: the same reader on a mount that trusts its cached listing never sees the pack.
    lost = 0
    for oid in ids:
        try:
            reader_c.objects.read(bytes.fromhex(oid))
        except ObjectMissingError:
            lost += 1
    assert lost == len(ids)
    assert c.counters()["readdir_hits"] >= 1


UNPRESERVED_LOOSE_REPACK = ("import sys; from packyard.workers.commands.repack import repack; "
                            "repack(sys.argv[1], mode='loose', preserve=False)")


def test_loose_objects_repacked_on_host_a_while_open_on_host_b_are_read_despite_estale(hosts, tmp_path, pk):
    """A loose repack on A (a new pack, then the loose files go) deletes a loose file a reader on B has open: B's
    read answers ESTALE; packyard treats that as gone (as ENOENT), re-lists objects/pack and reads the new pack.
    Before that rule, the ESTALE escaped the read. The repack runs with ``preserve=False``: by default a repack on
    a shared filesystem keeps the loose files it deletes linked in preserved/ (for git's readers, which map
    them: the next test), and no read meets ESTALE; the rule still serves a file deleted otherwise (an expired
    object, git's own ``repack -d`` or ``prune`` on another host).

    The repack runs at the fault point between B's open and its read, so the test does not depend on luck: as
    a race (a reader thread against the repack's process) it met no ESTALE in 30 rounds of a loaded CI run."""
    from packyard.store import faults
    from packyard.store.repo import Repository

    bare = _packed_repo(hosts.backing)
    a = hosts("a", ac_attr=LONG, ac_dir=LONG)
    b = hosts("b", ac_attr=LONG, ac_dir=LONG)
    ra, rb = a.mountpoint / bare.name, b.mountpoint / bare.name
    ids = write_blobs(ra, tmp_path, 40, "loose")
    expected = {oid: git("cat-file", "blob", oid, git_dir=bare) for oid in ids}
    reader = Repository(rb)
    reader.objects.packs.prepare()          # B lists objects/pack now, and keeps that listing (LONG)
    repacks: list[subprocess.CompletedProcess[str]] = []

    def repack_on_a() -> None:
        repacks.append(subprocess.run([sys.executable, "-c", UNPRESERVED_LOOSE_REPACK, str(ra)],
                                      env=pk.cli_env(), capture_output=True, text=True, timeout=120))

    faults.arm_call("loose.after_open", repack_on_a)
    try:
        first, *rest = ids
        _, data = reader.objects.read(bytes.fromhex(first), verify=True)   # open; A repacks; read: ESTALE
    finally:
        faults.disarm("loose.after_open")
    assert len(repacks) == 1 and repacks[0].returncode == 0, repacks and repacks[0].stderr
    assert data == expected[first]
    assert b.counters()["estale"] >= 1                    # the server answered B's read with ESTALE...
    assert reader.objects.loose.estale == 1               # ...the store took it as gone...
    assert reader.objects.counters.relisted_hits == 1     # ...re-listed objects/pack and found the new pack
    for oid in rest:                                      # the others: gone as loose files, found in that pack
        assert reader.objects.read(bytes.fromhex(oid), verify=True)[1] == expected[oid]
    assert not list((bare / "objects").glob("[0-9a-f][0-9a-f]/*"))   # every loose object was moved
    git("fsck", "--full", "--strict", git_dir=bare)

    # Control: the same open, delete through A, read -- without the store's rule in between, the ESTALE
    # reaches the reader as an error.
    ids = write_blobs(ra, tmp_path, 1, "control")
    path = rb / "objects" / ids[0][:2] / ids[0][2:]
    fd = os.open(path, os.O_RDONLY)
    try:
        (ra / "objects" / ids[0][:2] / ids[0][2:]).unlink()
        with pytest.raises(OSError) as err:
            os.read(fd, 1 << 16)
        assert err.value.errno == errno.ESTALE
    finally:
        os.close(fd)


def test_git_reads_a_ref_pruned_through_another_host_from_packed_refs(hosts, tmp_path):
    """The clone that failed in the two-host race (docs/nfs-log.md): host B's pack-refs (here git's own, ``git
    pack-refs --all --prune``) folds the loose refs into packed-refs and deletes them while git on host A has
    listed ``refs/heads`` and cached the refs' attributes. git's read of a loose ref is lstat, then open (three
    tries when they disagree): lstat answered "exists" from host A's attribute cache, every open said ENOENT,
    so git took the ref as broken -- and with ref paranoia (git >= 2.36) ls-refs advertised it with the null id;
    the clone asked for 0000... and upload-pack died ("not our ref"). A Linux NFS client drops a name whose open
    found it gone (the stale dentry, and the directory is marked for revalidation), so git's second lstat says
    ENOENT and git reads packed-refs; nfsim now does the same."""
    bare = hosts.backing / "r.git"
    git("init", "-q", "--bare", str(bare))
    tree = git("mktree", git_dir=bare, input=b"").decode().strip()
    commit = git("commit-tree", tree, "-m", "one", git_dir=bare).decode().strip()
    for ref in ("refs/heads/x", "refs/heads/y"):
        git("update-ref", ref, commit, git_dir=bare)
    # A keeps its listing of refs/heads (as in the race: it listed just before B pruned) and its attributes
    a = hosts("a", ac_attr=LONG, ac_dir=LONG, dir_revalidate="trust")
    b = hosts("b", ac_attr=LONG, ac_dir=LONG)
    ra, rb = a.mountpoint / "r.git", b.mountpoint / "r.git"
    assert git("for-each-ref", "--format=%(refname)", git_dir=ra).decode().split() == ["refs/heads/x", "refs/heads/y"]
    git("pack-refs", "--all", "--prune", git_dir=rb)
    assert not (hosts.backing / "r.git" / "refs" / "heads" / "x").exists()
    # git through A: each ref with its id (from packed-refs), never the null id; the clone works
    listed = git("ls-remote", str(ra)).decode().split()
    assert listed == [commit, "refs/heads/x", commit, "refs/heads/y"], listed
    clone = subprocess.run(["git", "clone", "-q", "--bare", "--no-local", str(ra), str(tmp_path / "c.git")],
                           capture_output=True, text=True, env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"})
    assert clone.returncode == 0, clone.stderr
    # The client's rule itself, on a plain file: A's cached "exists" lasts until an open finds the file gone.
    (ra / "f").write_bytes(b"f")
    assert (ra / "f").exists()
    (rb / "f").unlink()
    assert (ra / "f").exists()                                # A's attribute cache: still there...
    with pytest.raises(FileNotFoundError):
        (ra / "f").read_bytes()                               # ...until an open asks the server
    assert not (ra / "f").exists()                            # and then A knows it is gone


HOST_B_HOLDER = r"""
import os, sys
from packyard.store import lockfile
claim = lockfile.acquire(sys.argv[1], "host B's claim")
print(os.getpid(), flush=True)
sys.stdin.read()            # hold the claim until host A closes our stdin
"""


def _unshare_works() -> bool:
    return subprocess.run(["unshare", "--pid", "--uts", "--fork", "--mount-proc", "true"],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("uts", [True, False], ids=["own-hostname", "same-hostname"])
def test_a_claim_of_host_b_in_its_own_pid_namespace_is_never_judged_by_host_a_s_process_table(hosts, uts):
    """Host B's process runs in its own PID namespace (``unshare --pid --fork --mount-proc``; with its own
    hostname, or -- a container on the same machine -- with A's), on its own mount, and holds a claim
    file in the shared directory. Its pid means nothing on host A: A must not break the claim (neither
    "dead" because A has no such pid or a later one, nor "alive" by A's process table)."""
    from packyard.store import lockfile
    from packyard.store.errors import LockContendedError
    from packyard.store.owner import Liveness, liveness, read_owner

    if not _unshare_works():
        pytest.skip("unshare --pid --uts --mount-proc is not permitted here")
    a = hosts("a")
    b = hosts("b")
    (a.mountpoint / "locks").mkdir()
    claim_b = b.mountpoint / "locks" / "main.lock"
    prefix = ["unshare", "--pid", "--fork", "--mount-proc", *(["--uts"] if uts else [])]
    # sh is pid 1 inside; python, its child, gets a small pid that names another process on host A
    inner = ("hostname nfsim-host-b; " if uts else "") + f'"{os.sys.executable}" -c "$0" "$1"; :'
    proc = subprocess.Popen([*prefix, "sh", "-c", inner, HOST_B_HOLDER, str(claim_b)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        inner_pid = int(proc.stdout.readline() or "0")
        assert 0 < inner_pid < 100, proc.stderr.read() if proc.stderr else ""
        claim_a = a.mountpoint / "locks" / "main.lock"
        owner = read_owner(claim_a)
        assert owner is not None and owner.pid == inner_pid
        assert liveness(owner) is Liveness.UNKNOWN
        assert lockfile.judge(claim_a)[0] is lockfile.BreakVerdict.TOO_YOUNG
        with pytest.raises(LockContendedError):
            lockfile.acquire(claim_a, "host A's claim", wait=0.0)
        assert claim_a.exists()
    finally:
        proc.communicate(timeout=30)
    # B's process is gone now, and still A cannot prove it: only the age rule (or job records) may break it.
    owner = read_owner(a.mountpoint / "locks" / "main.lock")
    assert owner is not None and liveness(owner) is Liveness.UNKNOWN


def _commit_packs(scratch: Path, tag: str, count: int) -> tuple[Path, Path, str]:
    """Two packs made by git: a commit of ``count`` new blobs, then one of ``count`` more on top; the tip."""
    s = scratch / f"budget-{tag}.git"
    git("init", "-q", "--bare", str(s))
    first = commit_blobs(s, scratch, "main", count)
    tip = commit_blobs(s, scratch, "main", count, parent=first)
    p1, p2 = scratch / f"{tag}-1.pack", scratch / f"{tag}-2.pack"
    p1.write_bytes(git("pack-objects", "--stdout", "-q", "--revs", git_dir=s, input=f"{first}\n".encode()))
    p2.write_bytes(git("pack-objects", "--stdout", "-q", "--revs", git_dir=s, input=f"{tip}\n^{first}\n".encode()))
    return p1, p2, tip


@pytest.mark.slow
def test_metadata_calls_per_operation_do_not_grow_with_the_object_count(hosts, tmp_path, pk):
    """The syscall budget: index-pack and a full repack make as many metadata round trips for 2,000
    objects as for 100 (the repack merges two packs; seed 000: a re-listing per missed lookup made a clone 7x
    slower on NFS)."""
    a = hosts("a", ac_attr=3.0, ac_dir=3.0)
    env = pk.cli_env()
    calls: dict[tuple[str, int], dict[str, int]] = {}
    for count in (100, 2000):
        p1, p2, tip = _commit_packs(tmp_path, f"n{count}", count)
        repo = a.mountpoint / f"r{count}.git"
        git("init", "-q", "--bare", str(repo))
        before = a.counters()
        _index_pack(repo, p1, env)
        mid = a.counters()
        _index_pack(repo, p2, env)
        git("update-ref", "refs/heads/main", tip, git_dir=hosts.backing / repo.name)   # not through a mount
        mid2 = a.counters()
        proc = subprocess.run(["packyard", "repack", "--repo", str(repo), "--mode", "full", "--no-progress"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        after = a.counters()
        calls[("index-pack", count)] = {k: mid[k] - before[k] for k in nfsim.fs.METADATA_KINDS}
        calls[("repack", count)] = {k: after[k] - mid2[k] for k in nfsim.fs.METADATA_KINDS}
        git("fsck", "--full", "--strict", git_dir=hosts.backing / repo.name)
    print({f"{op} {n}": {k: v for k, v in c.items() if v} for (op, n), c in calls.items()})
    for op in ("index-pack", "repack"):
        small, large = calls[(op, 100)], calls[(op, 2000)]
        assert sum(large.values()) <= sum(small.values()) + 4, (op, small, large)
        # A few per file the operation creates, not per object: a full repack now also leaves a .bitmap, a
        # commit-graph layer and its chain, and packed-refs (each a lock, a temp file, a rename), ~255 in all.
        assert sum(small.values()) < (200 if op == "index-pack" else 400), (op, small)


def _race_two_hosts(pk, repo: Path, *args: str, timeout: float) -> tuple[int, dict, str]:
    import json

    proc = subprocess.run(["packyard", "race", "--repo", str(repo), "--hosts", "2", "--json", *args],
                          env=pk.cli_env(), capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(lines[-1]), proc.stderr


@pytest.mark.slow
@pytest.mark.skipif("c" not in IMPLS, reason="nfsim's C filesystem is not built here (libfuse3's headers): fs.py "
                    "keys the kernel's inodes by name, so a clone mapping a MIDX the other host replaced reads the new "
                    "file's bytes, which no NFS client does (test_a_file_mapped_on_host_b_and_replaced_through_host_a)")
def test_race_across_two_hosts_loses_nothing(celery_worker, store_root, pk, settings):
    """``packyard race --hosts 2``: the session's worker (host A) and host B's worker (its own PID and UTS
    namespaces, host B's mount bound over A's path) share one Redis and one database. Phase 1: every repack on
    host A, every push, reader and clone on host B; phase 2 the reverse (1 ms per metadata call, 3 s caches).
    No lost read, no failed clone; reads of files the other host's repacks removed after the read's open (packs
    moved to preserved/, loose files deleted) were served through the files' preserved links (nfsim's
    ``kept_reads``: each would be ESTALE, SIGBUS in git's maps, without them) or met ESTALE and recovered; the
    job rows say each job ran where its phase sent it."""
    for attempt in range(2):
        repo = store_root / ("race2.git" if attempt == 0 else f"race2-{attempt}.git")
        code, out, err = _race_two_hosts(pk, repo, "--readers", "2", "--duration", "20", "--repack-every", "3",
                                         "--seed", str(7 + attempt), timeout=400)
        why = {k: out.get(k) for k in ("lost", "lost_examples", "clones_failed", "clone_examples", "failures",
                                       "reader_errors", "final_missing", "phases")}
        assert code == 0 and out["ok"], f"{why}\n{err[-3000:]}"
        assert out["events"]["lost"] == 0 and out["final_missing"] == 0
        # Whether a read was open on one host across the other host's delete is timing: a quiet run of 20 s
        # has 7-8 such reads. A run with none is inconclusive, not a pass: once more with another seed
        # (bounded), every run held to every assertion above.
        if sum(c["kept_reads"] for c in out["nfsim"].values()) > 0:
            break
    assert out["recovered"] > 0, "no miss was recovered: the readers never raced a repack"
    assert all(n >= 1 for n in out["repacks"].values()), out["repacks"]
    assert out["clones"]["clones"] >= 1 and out["clones_failed"] == 0, out["clones"]
    assert "nfsim host B" in err
    # Reads raced the other host's deletes: nfsim served reads of files whose name had gone through their other
    # links (preserved packs and loose files: kept_reads, counted by each host's mount). A read that met
    # ESTALE (a file deleted with no other link: none in this safe mode, since a repack keeps the loose files it
    # deletes; an expired object) recovered, and the store and nfsim counted it as the readers did.
    kept = {h: c["kept_reads"] for h, c in out["nfsim"].items()}
    assert len(kept) == 2 and sum(kept.values()) > 0, f"no read raced a delete: {kept} {why}"
    estale = out["events"]["estale"]
    assert out["estale"] == estale and out["estale_store"] >= estale
    assert sum(c["estale"] for c in out["nfsim"].values()) >= estale, out["nfsim"]
    assert out["aims"] > 0 and out["aimed_reads"] > 0
    git("fsck", "--full", "--strict", git_dir=store_root / f"{repo.name}.nfs" / "server" / repo.name)
    from sqlalchemy import func, select

    from packyard.workers.records import RaceEvent, session_scope
    from packyard.workers.records.models import Job

    with session_scope(settings) as s:
        rows = dict(s.execute(select(RaceEvent.kind, func.count()).where(RaceEvent.job_id == out["run_id"])
                              .group_by(RaceEvent.kind)).all())
    assert rows.get("estale", 0) == estale and not rows.get("lost")
    job = pk.job_row(out["run_id"])
    assert job.counters["estale"] == estale and job.params["hosts"] == 2 and len(job.params["phases"]) == 2
    # Routing, from the job rows' worker host (host B's worker runs with host name race-host-b): phase 1's
    # repacks on A and pushes on B, phase 2's the reverse; every repack mode ran in each phase.
    phases = out["phases"]
    assert [(p["repack_host"], p["reader_host"]) for p in phases] == [("A", "B"), ("B", "A")], phases
    with session_scope(settings) as s:
        for p in phases:
            assert all(n >= 1 for n in p["repacks"].values()), p
            for jobs, host in ((p["repack_jobs"], p["repack_host"]), (p["push_jobs"], p["reader_host"])):
                found = s.execute(select(Job.kind, Job.state, Job.worker_hostname).where(Job.task_id.in_(jobs))).all()
                assert len(found) == len(jobs) and jobs, (p, found)
                assert all(r.worker_hostname.endswith("@race-host-b") == (host == "B") for r in found), (p, found)
                assert all(r.state.name == "SUCCESS" for r in found), found
            assert p["repacks_on"] == {p["repack_host"]: len(p["repack_jobs"])}, p
            assert p["ingests_on"] == {p["reader_host"]: len(p["push_jobs"])}, p
    assert sum(p["estale"] for p in phases) == estale
    # The two hosts' repacks took turns on the maintenance lease; neither judged the other's pid (they
    # collide: host B's are single digits) dead and broke or took over its lease.
    from packyard.workers.records.models import LockEvent, LockEventKind

    with session_scope(settings) as s:
        events = [e for (e,) in s.execute(select(LockEvent.event).where(LockEvent.job_id.in_(
            select(Job.task_id).where(Job.worker_hostname.like("%@race-host-b"))))).all()]
    assert LockEventKind.ACQUIRED in events
    assert not {LockEventKind.BROKEN, LockEventKind.TAKEN_OVER, LockEventKind.LOST} & set(events), events


@pytest.mark.slow
def test_race_across_two_hosts_trusting_the_cached_listing_loses_reads(celery_worker, store_root, pk):
    """The third negative control: host B's mount reuses its cached listings (no revalidation on
    opendir) -- in phase 1 (repacks on host A, readers on host B) the readers' one re-listing then sees the old
    directory and reads are lost."""
    # A run that lost nothing is inconclusive only when the machine let it finish too few repacks to race
    # (a loaded machine: 12 s held 1-2 repacks); then once more, longer (bounded: 3 runs).
    for attempt in range(3):
        repo = store_root / f"race2-control-{attempt}.git"
        code, out, err = _race_two_hosts(pk, repo, "--readers", "2", "--duration", str(12 * (attempt + 1)),
                                         "--repack-every", "2", "--seed", str(11 + attempt), "--nfsim-trust-listing",
                                         timeout=300 + 150 * attempt)
        assert out["mode"] == "nfsim-trust-listing"
        repacks = sum(out["repacks"].values())
        if out["events"]["lost"] > 0 or repacks >= 4:
            break
    assert code == 1 and not out["ok"], (repacks, err[-3000:])
    assert out["events"]["lost"] > 0, f"{repacks} repacks and no lost read: the control did not fail"


def test_index_pack_fix_thin_finds_a_base_its_snapshot_listing_missed(hosts, tmp_path, pk):
    """index-pack answers existence from ONE snapshot (packs listed, then every loose fan-out dir). A thin
    pack's base the snapshot lacks -- a listing that missed it (here: host B's mount reusing its cached
    listing of objects/ while host A wrote the base loose; in the race: a loose repack on the other host
    moving the base into a new pack between the two listings, which over NFS take hundreds of round
    trips) -- must get one normal lookup before index-pack says "delta base missing"."""
    scratch = tmp_path / "thin-src.git"
    git("init", "-q", "--bare", str(scratch))
    text = "".join(f"line {i} of a file long enough to be deltified\n" for i in range(200))
    blob1 = git("hash-object", "-w", "--stdin", git_dir=scratch, input=text.encode()).decode().strip()
    blob2 = git("hash-object", "-w", "--stdin", git_dir=scratch, input=(text + "one more\n").encode()).decode().strip()
    t1 = git("mktree", git_dir=scratch, input=f"100644 blob {blob1}\tf\n".encode()).decode().strip()
    t2 = git("mktree", git_dir=scratch, input=f"100644 blob {blob2}\tf\n".encode()).decode().strip()
    c1 = git("commit-tree", t1, "-m", "one", git_dir=scratch).decode().strip()
    c2 = git("commit-tree", t2, "-p", c1, "-m", "two", git_dir=scratch).decode().strip()
    base_pack = git("pack-objects", "--stdout", "-q", "--revs", git_dir=scratch, input=f"{c1}\n".encode())
    thin = tmp_path / "thin.pack"
    thin.write_bytes(git("pack-objects", "--stdout", "-q", "--revs", "--thin", git_dir=scratch,
                         input=f"{c2}\n^{c1}\n".encode()))
    a = hosts("a", ac_attr=LONG, ac_dir=LONG)
    b = hosts("b", ac_attr=LONG, ac_dir=LONG, dir_revalidate="trust")
    git("init", "-q", "--bare", str(hosts.backing / "r.git"))
    from packyard.store.repo import Repository

    assert not Repository(b.mountpoint / "r.git").objects.snapshot().loose_ids   # B lists objects/ now
    git("unpack-objects", "-q", git_dir=a.mountpoint / "r.git", input=base_pack)  # A writes the base loose
    git("cat-file", "-e", blob1, git_dir=hosts.backing / "r.git")
    proc = subprocess.run(["packyard", "index-pack", "--repo", str(b.mountpoint / "r.git"), "--fix-thin",
                           "--no-progress", str(thin)], env=pk.cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    git("fsck", "--full", "--strict", git_dir=hosts.backing / "r.git")
    assert git("cat-file", "-p", f"{c2}:f", git_dir=hosts.backing / "r.git").decode() == text + "one more\n"
