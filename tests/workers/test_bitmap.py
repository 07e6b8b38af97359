"""Reachability bitmaps (store/maintenance/serving/bitmap.py, ewah.py) with git 2.39 as the oracle.

* the encoder gives git's own bytes for git's own pack (same object order, commits and names), with and
  without the lookup table, with pack.preferBitmapTips;
* a full repack writes a bitmap git uses: ``rev-list --test-bitmap``, ``--use-bitmap-index`` equal to the
  plain walk, pack-objects' trace shows the bitmap, fsck; ``bitmap=False`` writes none; the replaced pack's
  bitmap moves to preserved/ with it; a SIGKILL at the bitmap's rename leaves a repository git serves.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitutil import ROOT, git, repo_from_corpus
from packyard.store.maintenance.planning.stats import gather_stats
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.maintenance.serving import ewah
from packyard.store.maintenance.serving.bitmap import BitmapOptions, bitmap_for, name_hash, read_header
from packyard.store.repo import Repository

_TYPES = {b"commit": 1, b"tree": 2, b"blob": 3, b"tag": 4}


def _history(base: Path, commits: int = 160) -> Path:
    """A bare repository git built (fast-import): ``commits`` commits on main with a side branch merged every
    20, distinct and repeated dates, annotated tags, paths shorter and longer than 16 bytes, a gitlink."""
    lines = []
    mark = 0
    side_mark = None
    main_mark = 0
    date = 1_600_000_000
    for i in range(commits):
        mark += 1
        date += 3600 if i % 7 else 0   # (some commits share a date: selection sorts stably)
        branch = "refs/heads/side" if i % 10 == 5 else "refs/heads/main"
        lines.append(f"commit {branch}\nmark :{mark}\ncommitter C <c@example.com> {date} +0000\n"
                     f"data {len(f'c{i}')}\nc{i}\n")
        if branch == "refs/heads/side":
            if side_mark is None:
                lines.append(f"from :{main_mark}\n")
            side_mark = mark
        elif side_mark is not None and i % 20 == 0:
            lines.append(f"merge :{side_mark}\n")
            side_mark = None
        if branch == "refs/heads/main":
            main_mark = mark
        body = f"content {i}\n"
        lines.append(f"M 100644 inline dir{i % 3}/f{i % 5}.txt\ndata {len(body)}\n{body}\n")
        long = f"a long file name {i % 4}\n"
        lines.append(f"M 100644 inline some/deeper/directory/a_rather_long_file_name_{i % 4}.c\n"
                     f"data {len(long)}\n{long}\n")
        if i == 3:
            lines.append("M 160000 1111111111111111111111111111111111111111 sub\n")
        if i % 40 == 39:
            lines.append(f"tag v{i}\nfrom :{mark}\ntagger T <t@example.com> {date} +0000\n"
                         f"data {len(str(i)) + 1}\nv{i}\n")
    bare = base / "repo.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("fast-import", "--quiet", git_dir=bare, input="".join(lines).encode())
    return bare


def _git_pack(bare: Path):
    """git's pack of ``bare``: (order by offset, types, checksum, the pack's .bitmap path)."""
    [idx] = (bare / "objects" / "pack").glob("pack-*.idx")
    ents = []
    for line in git("show-index", input=idx.read_bytes()).decode().splitlines():
        off, oid, _crc = line.split()
        ents.append((int(off), bytes.fromhex(oid)))
    order = [o for _off, o in sorted(ents)]
    out = git("cat-file", "--batch", git_dir=bare, input=b"".join(o.hex().encode() + b"\n" for o in order))
    objs = {}
    p = 0
    while p < len(out):
        nl = out.index(b"\n", p)
        oid, typ, size = out[p:nl].split()
        n = int(size)
        objs[bytes.fromhex(oid.decode())] = (_TYPES[typ], out[nl + 1:nl + 1 + n])
        p = nl + 1 + n + 1
    checksum = bytes.fromhex(idx.stem[5:])
    return order, [objs[o][0] for o in order], checksum, objs, idx.with_suffix(".bitmap")


def _names(bare: Path) -> dict[bytes, bytes]:
    names: dict[bytes, bytes] = {}
    for line in git("rev-list", "--objects", "--all", git_dir=bare).splitlines():
        oid, _sp, path = line.partition(b" ")
        names.setdefault(bytes.fromhex(oid.decode()), path)
    return names


def _refs(bare: Path) -> dict[str, bytes]:
    out = git("for-each-ref", "--format=%(refname) %(objectname)", git_dir=bare).decode()
    return {name: bytes.fromhex(oid) for name, oid in (line.split() for line in out.splitlines())}


def _ours_beside_gits(bare: Path, options: BitmapOptions, config: Sequence[str] = (),
                      tips: dict[str, bytes] | None = None) -> tuple[bytes, bytes, list[bytes]]:
    """``git repack -adb`` (with ``config``), then ``bitmap_for`` over git's own pack and every commit: (our
    bitmap's bytes, git's, the commits)."""
    git(*config, "repack", "-adbq", git_dir=bare)
    order, types, checksum, objs, theirs = _git_pack(bare)
    commits = [bytes.fromhex(h) for h in git("rev-list", "--all", git_dir=bare).decode().split()]
    mine = bitmap_for(order, types, checksum, commits, objs.__getitem__, names=_names(bare), tips=tips,
                      options=options)
    return mine, theirs.read_bytes(), commits


@pytest.mark.parametrize("config,options", [
    ([], BitmapOptions(lookup_table=False)),
    (["-c", "pack.writeBitmapLookupTable=true"], BitmapOptions(lookup_table=True)),
    (["-c", "pack.writeBitmapLookupTable=true", "-c", "pack.preferBitmapTips=refs/prefer/"],
     BitmapOptions(lookup_table=True, prefer_tips=("refs/prefer/",))),
    (["-c", "pack.writeBitmapHashCache=false"], BitmapOptions(lookup_table=False, hash_cache=False)),
])
def test_same_bytes_as_gits_bitmap_for_gits_pack(tmp_path, config, options):
    bare = _history(tmp_path)
    for n in (57, 131):   # (commits no window would choose on its own)
        git("update-ref", f"refs/prefer/p{n}", f"main~{n}", git_dir=bare)
    mine, theirs, commits = _ours_beside_gits(bare, options, config, tips=_refs(bare))
    assert len(commits) > 100   # (past the "every commit" case: the windows and merges choose)
    assert mine == theirs


def test_same_bytes_for_a_few_commits(tmp_path):
    bare = _history(tmp_path, commits=30)
    mine, theirs, commits = _ours_beside_gits(bare, BitmapOptions(lookup_table=False))
    assert mine == theirs
    assert read_header(mine).entries == len(commits)


@pytest.mark.slow
def test_same_bytes_for_git_v1(tmp_path):
    bare = repo_from_corpus(tmp_path)
    mine, theirs, commits = _ours_beside_gits(bare, BitmapOptions(lookup_table=False))
    assert mine == theirs


def test_ewah_bits_survive_every_construction():
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randrange(1, 3000)
        density = rng.choice([0.0, 0.01, 0.5, 0.99, 1.0])
        a = sum(1 << i for i in range(n) if rng.random() < density)
        b = sum(1 << i for i in range(n) if rng.random() < rng.choice([0.0, 0.3, 1.0]))
        ea, eb = ewah.from_int(a), ewah.from_int(b)
        assert ea.to_int() == a and eb.to_int() == b
        assert ewah.xor(ea, eb).to_int() == a ^ b
        back, end = ewah.parse(ea.serialize())
        assert back.to_int() == a and end == len(ea.serialize())
        s = ewah.Ewah()
        for i in range(n):
            if a >> i & 1:
                s.set(i)
        assert s.to_int() == a
        # the type rows' word-at-a-time construction: the same words, run-length words and bit_size as set's
        fast = ewah.from_int_as_set(a)
        assert (fast.buffer, fast.rlw, fast.bit_size) == (s.buffer, s.rlw, s.bit_size)
        assert fast.serialize() == s.serialize()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(1, 200)), max_size=40))
def test_type_rows_word_at_a_time_equal_set_bit_by_bit(runs):
    """Runs of set and clear bits (a type row: long runs of one type, all-ones words, gaps of many words)."""
    bits, at = 0, 0
    for v, length in runs:
        if v:
            bits |= ((1 << length) - 1) << at
        at += length
    s = ewah.Ewah()
    for i in range(bits.bit_length()):
        if bits >> i & 1:
            s.set(i)
    fast = ewah.from_int_as_set(bits)
    assert (fast.buffer, fast.rlw, fast.bit_size) == (s.buffer, s.rlw, s.bit_size)


def test_name_hash_is_gits():
    # git's pack_name_hash: spaces skipped, the last characters weigh most.
    assert name_hash(None) == 0 and name_hash(b"") == 0
    assert name_hash(b"a") == ord("a") << 24
    assert name_hash(b"a b") == name_hash(b"ab") == ((ord("a") << 24 >> 2) + (ord("b") << 24))
    long = b"x" * 40 + b"_sixteen_or_more.c"
    assert name_hash(b"dir/" + long) == name_hash(long)


# -- a full repack's bitmap, read by git ----------------------------------------------------------------------

def _bitmaps(bare: Path) -> list[Path]:
    return sorted((bare / "objects" / "pack").glob("pack-*.bitmap"))


def _pack_reused(bare: Path, *config: str) -> tuple[int, int, bytes]:
    """A full clone's pack-objects (what upload-pack runs): (objects, objects reused whole from the pack through
    the bitmap: git's "pack-reused", only counted when the bitmap found them), its GIT_TRACE2_PERF."""
    perf = bare.parent / "trace.perf"
    perf.unlink(missing_ok=True)
    env = {**os.environ, "GIT_TRACE2_PERF": str(perf)}
    proc = subprocess.run(["git", "--git-dir", str(bare), *config, "pack-objects", "--progress", "--revs", "--all",
                           "--stdout"], input=b"", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True,
                          env=env)
    total = proc.stderr.rsplit(b"Total ", 1)[1].split(b" ", 1)[0]
    reused = proc.stderr.rsplit(b"pack-reused ", 1)[1].split()[0]
    return int(total), int(reused), perf.read_bytes()


def _check_git_uses(bare: Path) -> None:
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    for ref in ("refs/heads/main", "refs/heads/side"):
        proc = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--test-bitmap", ref],
                              capture_output=True)
        assert proc.returncode == 0 and proc.stderr.rstrip().endswith(b"OK!"), proc.stderr[-300:]
    plain = git("rev-list", "--objects", "--all", git_dir=bare)
    fast = git("rev-list", "--objects", "--all", "--use-bitmap-index", git_dir=bare)
    assert sorted(x.split(b" ")[0] for x in fast.splitlines()) == sorted(x.split(b" ")[0]
                                                                          for x in plain.splitlines())
    total, reused, perf = _pack_reused(bare)
    assert reused == total > 0                      # every object found through the bitmap, sent verbatim
    assert b"label:enumerate-objects" in perf       # (the trace: pack-objects' counting phase ran, and ended)
    total_off, reused_off, _perf = _pack_reused(bare, "-c", "pack.useBitmaps=false")
    assert (total_off, reused_off) == (total, 0)    # the control: without the bitmap nothing is pack-reused


def test_full_repack_writes_a_bitmap_git_uses(tmp_path):
    bare = _history(tmp_path)
    git("repack", "-dq", git_dir=bare)
    result = repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL))
    [bm] = _bitmaps(bare)
    assert bm.stem == result.packs_written[0]
    header = read_header(bm.read_bytes())
    assert header.checksum.hex() == bm.stem[5:]
    assert result.counters.bitmap_commits == header.entries > 0
    _check_git_uses(bare)
    assert [p.bitmap for p in gather_stats(bare).packs] == ["ok"]


def test_stats_tell_a_missing_or_foreign_bitmap(tmp_path):
    bare = _history(tmp_path, commits=20)
    git("-c", "repack.writeBitmaps=false", "repack", "-adq", git_dir=bare)
    [info] = gather_stats(bare).packs
    assert info.bitmap == "missing"
    git("repack", "-adbq", git_dir=bare)   # git's own bitmap: ok
    [info] = gather_stats(bare).packs
    assert info.bitmap == "ok"
    bm = bare / "objects" / "pack" / f"{info.name}.bitmap"
    data = bytearray(bm.read_bytes())
    data[12:32] = bytes(20)   # (names another pack)
    bm.chmod(0o644)
    bm.write_bytes(bytes(data))
    [info] = gather_stats(bare).packs
    assert info.bitmap == f"bitmap names pack {'00' * 20}"


def test_no_bitmap_option_writes_none(tmp_path):
    bare = _history(tmp_path, commits=20)
    repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL, bitmap=False))
    assert _bitmaps(bare) == []
    assert list((bare / "objects" / "pack").glob("pack-*.idx"))


def test_replaced_pack_takes_its_bitmap_to_preserved(tmp_path):
    bare = _history(tmp_path, commits=20)
    first = repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL)).packs_written[0]
    tip = git("commit-tree", "-m", "one more", "-p", "main", "main^{tree}", git_dir=bare).decode().strip()
    git("update-ref", "refs/heads/main", tip, git_dir=bare)
    second = repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL)).packs_written[0]
    assert first != second
    assert [p.stem for p in _bitmaps(bare)] == [second]
    assert (bare / "objects" / "pack" / "preserved" / f"{first}.bitmap").is_file()
    repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL, preserve_for=0))
    assert not (bare / "objects" / "pack" / "preserved" / f"{first}.bitmap").exists()
    _check_git_uses(bare)


_CHILD = """
import sys
import time
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.repo import Repository
repack(Repository.open(sys.argv[1]), RepackOptions(mode=RepackMode.FULL))
"""


def test_sigkill_at_the_bitmap_rename_leaves_a_repository_git_serves(tmp_path):
    bare = _history(tmp_path, commits=40)
    git("repack", "-dq", git_dir=bare)
    env = {**os.environ, "PACKYARD_FAULT": "repack.after_bitmap_rename"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(bare)], env=env, cwd=ROOT, capture_output=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    names = {p.name for p in (bare / "objects" / "pack").iterdir()}
    assert any(n.endswith(".bitmap") for n in names)   # (killed with the bitmap in, its idx not yet)
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    git("clone", "-q", "--bare", "--no-local", str(bare), str(tmp_path / "clone.git"))
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=tmp_path / "clone.git")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(bare)], cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in (bare / "objects" / "pack").iterdir()}
    assert [n for n in names if n.startswith("tmp_")] == []
    bitmaps = [n for n in names if n.endswith(".bitmap")]
    assert len(bitmaps) == 1 and bitmaps[0].replace(".bitmap", ".idx") in names
    _check_git_uses(bare)


_REPACK_BYTES = """
import sys
import time
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.maintenance.serving import bitmap
from packyard.store.repo import Repository
r = repack(Repository.open(sys.argv[1]), RepackOptions(mode=RepackMode.FULL))
print(bitmap.IMPLEMENTATION, r.packs_written[0])
"""


@pytest.mark.parametrize("source", ["history", pytest.param("git-v1.0.0", marks=pytest.mark.slow)])
def test_c_and_python_give_the_same_bytes(tmp_path, source):
    from packyard.store.maintenance.serving import bitmap

    if bitmap.IMPLEMENTATION != "c" and not os.environ.get("PACKYARD_REQUIRE_C"):
        pytest.skip("the C extension is not built here (or PACKYARD_PURE_PYTHON=1)")
    if source == "history":
        base = _history(tmp_path / "h")
        git("repack", "-dq", git_dir=base)   # (in a pack: the C loop reads through the packs)
    else:
        base = repo_from_corpus(tmp_path / "c")
    got = {}
    for impl, env in (("c", {}), ("python", {"PACKYARD_PURE_PYTHON": "1"})):
        bare = tmp_path / f"{impl}.git"
        subprocess.run(["cp", "-a", str(base), str(bare)], check=True)
        proc = subprocess.run([sys.executable, "-c", _REPACK_BYTES, str(bare)], cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, **env}, timeout=300)
        assert proc.returncode == 0, proc.stderr
        used, name = proc.stdout.split()
        assert used == impl
        got[impl] = (name, (bare / "objects" / "pack" / f"{name}.bitmap").read_bytes())
    assert got["c"] == got["python"]


def test_leftovers_know_the_bitmap_temp_file(tmp_path):
    from packyard.store.leftovers import RULES, Kind
    from packyard.store.leftovers.passes import remove_stale_temp_files
    from packyard.store.owner import this_host_tag
    from packyard.store.pack.write import tmp_owner_tag

    pack_dir = tmp_path / "objects" / "pack"
    pack_dir.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    old = time.time() - RULES[Kind.ORPHAN_PACK].unjudged_after - 1
    mine = pack_dir / f"tmp_bitmap_{os.getpid()}_{this_host_tag()}-0000abcd"
    theirs = pack_dir / f"tmp_bitmap_{dead.pid}_{this_host_tag()}-0000abcd"
    orphan = pack_dir / f"pack-{'3' * 40}.bitmap"   # (a bitmap renamed in, its idx never: a killed install)
    for p in (mine, theirs, orphan):
        p.write_bytes(b"BITM")
        os.utime(p, (old, old))
    assert tmp_owner_tag(theirs.name) == (dead.pid, this_host_tag())
    assert remove_stale_temp_files(pack_dir) == 2
    assert mine.exists() and not theirs.exists() and not orphan.exists()


@pytest.mark.parametrize("source", ["history", pytest.param("git-v1.0.0", marks=pytest.mark.slow)])
def test_same_bytes_from_packyards_own_walk(tmp_path, source):
    """No input from git but its pack: packyard's walk gives the commits (in git's traversal order) and each
    object's path hash (git's full path, first reached), and the file is git's, name-hash cache included."""
    from packyard.store.maintenance.walk.reach import walk
    from packyard.store.maintenance.walk.tips import read_tips

    bare = _history(tmp_path) if source == "history" else repo_from_corpus(tmp_path)
    git("-c", "pack.writeBitmapLookupTable=true", "repack", "-adbq", git_dir=bare)
    order, types, checksum, objs, theirs = _git_pack(bare)
    repo = Repository.open(bare)

    def read(oid):
        t, data = repo.objects.read(oid)
        return int(t), data

    reach = walk(sorted(read_tips(repo).items()), read)
    mine = bitmap_for(order, types, checksum, reach.commits, read, path_hashes=reach.path_hashes,
                      tips=read_tips(repo), options=BitmapOptions(lookup_table=True))
    assert mine == theirs.read_bytes()
    # the idx order handed in (as a repack's writer hands its own) instead of sorted here: the same file
    position = {oid: k for k, oid in enumerate(order)}
    by_idx = [position[oid] for oid in sorted(order)]
    assert bitmap_for(order, types, checksum, reach.commits, read, path_hashes=reach.path_hashes,
                      tips=read_tips(repo), options=BitmapOptions(lookup_table=True), index=by_idx) == mine
    with pytest.raises(ValueError, match="not among the objects"):   # an order that is not by id is caught
        bitmap_for(order, types, checksum, reach.commits, read, path_hashes=reach.path_hashes,
                   tips=read_tips(repo), options=BitmapOptions(lookup_table=True), index=by_idx[::-1])


def test_settings_choose_the_lookup_table_and_preferred_tips(tmp_path):
    from packyard.workers.settings import Settings

    s = Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path)})
    assert s.bitmap_lookup_table is True and s.bitmap_prefer_tips == ()
    s = Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path), "PACKYARD_BITMAP_LOOKUP_TABLE": "0",
                           "PACKYARD_BITMAP_PREFER_TIPS": "refs/heads/, refs/tags/"})
    assert s.bitmap_lookup_table is False and s.bitmap_prefer_tips == ("refs/heads/", "refs/tags/")
    again = Settings.from_env(s.as_env())
    assert (again.bitmap_lookup_table, again.bitmap_prefer_tips) == (False, ("refs/heads/", "refs/tags/"))


def test_the_queued_command_takes_the_bitmap_options_from_the_settings(tmp_path, monkeypatch):
    from packyard.store.maintenance.serving.bitmap import OPT_LOOKUP_TABLE
    from packyard.workers.commands.repack import repack as command

    bare = _history(tmp_path, commits=160)

    def has_bitmap(commit: str) -> bool:   # (git 2.39's --test-bitmap refuses a commit without its own bitmap)
        proc = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--test-bitmap", commit],
                              capture_output=True)
        assert proc.returncode == 0 or b"doesn't have an indexed bitmap" in proc.stderr, proc.stderr[-300:]
        return proc.returncode == 0

    git("repack", "-adbq", git_dir=bare)   # git's selection, no preferred tips: find a commit it skips
    tip = next(c for c in (git("rev-parse", f"main~{n}", git_dir=bare).decode().strip() for n in range(101, 150))
               if not has_bitmap(c))
    monkeypatch.setenv("PACKYARD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PACKYARD_BITMAP_LOOKUP_TABLE", "0")
    monkeypatch.setenv("PACKYARD_BITMAP_PREFER_TIPS", "refs/prefer/")
    git("update-ref", "refs/prefer/old", tip, git_dir=bare)
    result = command(bare, mode="full")
    [bm] = _bitmaps(bare)
    assert bm.stem == result["packs_written"][0]
    assert not read_header(bm.read_bytes()).flags & OPT_LOOKUP_TABLE
    assert has_bitmap(tip)   # the preferred tip got one (checked by git against a walk from it)


def test_a_pack_the_repack_keeps_gives_up_its_bitmap(tmp_path):
    """A writer freshened a pack holding expired objects during the repack: the pack stays (it is relied on),
    but git reads one bitmap per repository: the new pack's; the kept pack's goes (git would warn about it)."""
    from packyard.store.maintenance.repack.options import RepackHooks

    bare = _history(tmp_path, commits=20)
    git("update-ref", "refs/heads/doomed", "side", git_dir=bare)
    git("repack", "-adbq", git_dir=bare)   # git's pack, with git's bitmap; then 'side' becomes unreachable
    [old] = (bare / "objects" / "pack").glob("pack-*.pack")
    git("update-ref", "-d", "refs/heads/doomed", git_dir=bare)
    git("update-ref", "-d", "refs/heads/side", git_dir=bare)
    git("reflog", "expire", "--expire=now", "--all", git_dir=bare)

    def freshen():
        t = time.time() + 5
        os.utime(old, (t, t))

    result = repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL, expire=0),
                    hooks=RepackHooks(before_delete=freshen))
    assert result.counters.kept_freshened == 1 and old.exists()
    assert result.counters.bitmaps_removed == 1
    assert [p.stem for p in _bitmaps(bare)] == result.packs_written
    proc = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--test-bitmap", "main"], capture_output=True)
    assert proc.returncode == 0 and b"ignoring extra bitmap" not in proc.stderr, proc.stderr[-300:]
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
