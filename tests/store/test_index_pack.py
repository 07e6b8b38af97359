"""index-pack against real git: byte-identical idx/rev, thin packs, bad input, strict, fs-call counts."""
from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitutil import (
    CORPUS,
    ROOT,
    batch_check_all,
    corpus_tip,
    git,
    make_worktree_repo,
    needs_corpus,
    repo_from_corpus,
    snapshot_tree,
)
from packbuild import entry_header, ofs_bytes, varint
from packyard.store.errors import (
    CollisionError,
    CorruptObjectError,
    InvalidInputError,
    LimitExceededError,
    ObjectMissingError,
    PackFormatError,
    RefUpdateError,
    StoreError,
)
from packyard.store.objects import ObjectType, encode_loose, hash_object
from packyard.store.owner import split_owner
from packyard.store.pack.indexpack import InstallOutcome, index_pack
from packyard.store.pack.quarantine import release_keep, remove_stale_quarantines
from packyard.store.refs import RefUpdate
from packyard.store.repo import Repository

V1 = CORPUS / "git-v1.0.0.pack"
V2 = CORPUS / "git-v2.0.0.pack"



# ---------------------------------------------------------------------------------------------
# helpers

def fresh_repo(base: Path, name: str = "r.git") -> Repository:
    return Repository.init(base / name)


def git_index(pack: Path | bytes, out_dir: Path, *extra: str) -> tuple[str, bytes, bytes]:
    """Run git index-pack on a copy of the same input: (checksum hex, idx bytes, rev bytes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "in.pack"
    if isinstance(pack, bytes):
        src.write_bytes(pack)
    else:
        shutil.copyfile(pack, src)
    git("index-pack", "--rev-index", *extra, "-o", str(out_dir / "g.idx"), str(src))
    idx = (out_dir / "g.idx").read_bytes()
    return idx[-40:-20].hex(), idx, (out_dir / "g.rev").read_bytes()


def quarantines(repo: Repository) -> list[str]:
    return sorted(p.name for p in Path(repo.objects.path).iterdir() if p.name.startswith("incoming-"))


def pack_of(bare: Path, *revs: str, thin: bool = False, ofs: bool = False) -> bytes:
    args = ["pack-objects", "-q", "--stdout"]
    if revs:
        args.append("--revs")
    if thin:
        args.append("--thin")
    if ofs:
        args.append("--delta-base-offset")
    if revs:
        return git(*args, git_dir=bare, input=("\n".join(revs) + "\n").encode())
    ids = b"\n".join(line.split(b" ")[0] for line in git("rev-list", "--objects", "--all", git_dir=bare).splitlines())
    return git(*args, git_dir=bare, input=ids + b"\n")


def delta_insert(src_size: int, dst: bytes, dst_size: int | None = None) -> bytes:
    """A delta that ignores its base and inserts ``dst`` (in <=127-byte ops)."""
    ops = b"".join(bytes([len(dst[i:i + 127])]) + dst[i:i + 127] for i in range(0, len(dst), 127))
    return varint(src_size) + varint(len(dst) if dst_size is None else dst_size) + ops


def build_pack(entries: list[bytes], count: int | None = None) -> bytes:
    body = b"PACK" + struct.pack(">II", 2, len(entries) if count is None else count) + b"".join(entries)
    return body + hashlib.sha1(body).digest()


def full_entry(typ: int, data: bytes) -> bytes:
    return entry_header(typ, len(data)) + zlib.compress(data)


def ingest_fails(repo: Repository, source, exc: type[StoreError], **kw) -> StoreError:
    """Ingest must raise ``exc``; the quarantine is gone and the repository is byte-for-byte unchanged."""
    before = snapshot_tree(repo.path)
    with pytest.raises(exc) as info:
        index_pack(repo, source, **kw)
    assert quarantines(repo) == []
    assert snapshot_tree(repo.path) == before
    return info.value


@pytest.fixture(scope="module")
def small_src(tmp_path_factory) -> Path:
    return make_worktree_repo(tmp_path_factory.mktemp("src"), commits=6, files_per_commit=6)


@pytest.fixture(scope="module")
def v1_repo(tmp_path_factory) -> Path:
    return repo_from_corpus(tmp_path_factory.mktemp("v1"), "git-v1.0.0")


# ---------------------------------------------------------------------------------------------
# real packs

@needs_corpus('git-v1.0.0')
@pytest.mark.parametrize("processes", [2, 1])
def test_corpus_v1_matches_git_and_fscks(tmp_path, processes):
    repo = fresh_repo(tmp_path)
    seen: dict[str, tuple[int, int | None]] = {}
    result = index_pack(repo, V1, processes=processes, progress=lambda ph, d, t: seen.__setitem__(ph, (d, t)),
                        ref_updates=[RefUpdate("refs/heads/main", None, bytes.fromhex(corpus_tip()))])
    assert result.outcome is InstallOutcome.INSTALLED
    assert result.objects == 12233 and result.deltas > 0 and result.thin_bases_added == 0
    assert result.workers == processes
    assert seen["receiving"] == (12233, 12233) and seen["resolving"] == (result.deltas, result.deltas)
    checksum, idx, rev = git_index(V1, tmp_path / "git")
    assert result.checksum == checksum and result.pack_name == f"pack-{checksum}"
    assert result.idx_path.read_bytes() == idx
    assert result.rev_path.read_bytes() == rev
    assert result.pack_path.read_bytes() == V1.read_bytes()
    assert quarantines(repo) == []
    assert repo.refs.read("refs/heads/main") == bytes.fromhex(corpus_tip())
    git("fsck", "--full", "--strict", git_dir=repo.path)
    verify = git("verify-pack", "-v", str(result.idx_path)).decode()
    assert "ok" in verify.splitlines()[-1]
    assert len(batch_check_all(repo.path)) == 12233
    assert set(result.elapsed) >= {"receive", "resolve", "thin", "check", "index", "install", "refs"}
    assert result.peak_rss > 0


@needs_corpus('git-v1.0.0')
def test_stream_source_and_64bit_offset_table(tmp_path):
    """Input from a pipe; an off32 limit forces the 64-bit offset table, compared with git's."""
    repo = fresh_repo(tmp_path)
    cat = subprocess.Popen(["cat", str(V1)], stdout=subprocess.PIPE)
    try:
        result = index_pack(repo, cat.stdout, off32_limit=0x10000, processes=1)
    finally:
        cat.stdout.close()
        cat.wait()
    assert result.large_offsets > 0
    _, idx, rev = git_index(V1, tmp_path / "git", "--index-version=2,0x10000")
    assert result.idx_path.read_bytes() == idx
    assert result.rev_path.read_bytes() == rev


def test_ofs_delta_pack_matches_git(tmp_path, small_src):
    data = pack_of(small_src, ofs=True)
    repo = fresh_repo(tmp_path)
    result = index_pack(repo, _write(tmp_path / "in.pack", data))
    checksum, idx, rev = git_index(data, tmp_path / "git")
    assert (result.checksum, result.idx_path.read_bytes(), result.rev_path.read_bytes()) == (checksum, idx, rev)
    git("fsck", "--full", git_dir=repo.path)


@needs_corpus('git-v2.0.0')
@pytest.mark.slow
def test_corpus_v2_matches_git(tmp_path):
    repo = fresh_repo(tmp_path)
    result = index_pack(repo, V2)
    assert result.objects == 164488
    checksum, idx, rev = git_index(V2, tmp_path / "git")
    assert result.checksum == checksum
    assert result.idx_path.read_bytes() == idx
    assert result.rev_path.read_bytes() == rev


def test_already_present_and_identical_existing_objects(tmp_path, small_src):
    data = pack_of(small_src)
    repo = fresh_repo(tmp_path)
    first = index_pack(repo, _write(tmp_path / "a.pack", data))
    before = snapshot_tree(repo.path)
    again = index_pack(repo, _write(tmp_path / "b.pack", data))
    assert first.outcome is InstallOutcome.INSTALLED
    assert again.outcome is InstallOutcome.ALREADY_PRESENT
    assert again.collisions_checked == again.objects  # every object existed, content compared equal
    assert snapshot_tree(repo.path) == before


def test_existing_ids_probed_through_large_pack_idx(tmp_path, small_src, monkeypatch):
    import packyard.store.pack.receive as receive  # ExistingIds and its threshold live there

    monkeypatch.setattr(receive, "SMALL_PACK_IDS", 0)  # every existing pack is "large": probed via its idx
    data = pack_of(small_src)
    repo = fresh_repo(tmp_path)
    index_pack(repo, _write(tmp_path / "a.pack", data))
    again = index_pack(repo, _write(tmp_path / "b.pack", data), processes=2)
    assert again.outcome is InstallOutcome.ALREADY_PRESENT and again.collisions_checked == again.objects


def test_missing_pack_dir_is_created(tmp_path, small_src):
    repo = fresh_repo(tmp_path)
    (Path(repo.objects.path) / "pack").rmdir()
    result = index_pack(repo, _write(tmp_path / "a.pack", pack_of(small_src)))
    assert result.idx_path.exists()
    git("fsck", "--full", git_dir=repo.path)


def test_keep_file_until_released(tmp_path, small_src):
    repo = fresh_repo(tmp_path)
    result = index_pack(repo, _write(tmp_path / "a.pack", pack_of(small_src)), keep_message="receive-pack 42")
    assert result.keep_path == result.pack_path.with_suffix(".keep")
    owner, message = split_owner(result.keep_path.read_bytes())   # packyard's owner record, then git's message
    assert owner is not None and owner.pid == os.getpid() and message == b"receive-pack 42\n"
    assert release_keep(result) is True
    assert not result.keep_path.exists()
    assert release_keep(result) is False


def test_ref_updates_are_cas_and_only_name_installed_objects(tmp_path, small_src):
    repo = fresh_repo(tmp_path)
    data = _write(tmp_path / "a.pack", pack_of(small_src))
    tip = bytes.fromhex(git("rev-parse", "main", git_dir=small_src).decode().strip())
    # A ref naming an object that is neither incoming nor present: refused before anything is installed.
    ingest_fails(repo, data, ObjectMissingError, ref_updates=[RefUpdate("refs/heads/x", None, b"\x01" * 20)])
    result = index_pack(repo, data, ref_updates=[RefUpdate("refs/heads/main", None, tip)])
    assert result.refs_updated == ("refs/heads/main",)
    git("fsck", "--full", git_dir=repo.path)
    # A stale old value: the pack is installed (already present) but the ref does not move.
    with pytest.raises(RefUpdateError):
        index_pack(repo, data, ref_updates=[RefUpdate("refs/heads/main", b"\x02" * 20, tip)])
    assert repo.refs.read("refs/heads/main") == tip and quarantines(repo) == []


# ---------------------------------------------------------------------------------------------
# thin packs

@pytest.fixture(scope="module")
def thin_case(tmp_path_factory, v1_repo):
    """A repository holding history up to main~40 and a thin pack main~40..main cut by git."""
    base = tmp_path_factory.mktemp("thin")
    old = base / "old.git"
    git("init", "-q", "--bare", str(old))
    git("index-pack", "--stdin", git_dir=old, input=pack_of(v1_repo, "main~40"))
    thin = pack_of(v1_repo, "main", "^main~40", thin=True)
    thin_ofs = pack_of(v1_repo, "main", "^main~40", thin=True, ofs=True)  # what a push sends
    return old, thin, thin_ofs


@needs_corpus('git-v1.0.0')
@pytest.mark.parametrize("kind", ["ref", "ofs"])
@pytest.mark.parametrize("parallel", [False, True])
def test_thin_pack_fix_thin_matches_git(tmp_path, thin_case, kind, parallel, monkeypatch):
    import packyard.store.pack.indexpack as ip

    if parallel:  # thin bases appended at once and resolved by forked processes (large pushes)
        monkeypatch.setattr(ip, "FORK_MIN_DELTAS", 1)
    old, thin_ref, thin_ofs = thin_case
    thin = thin_ref if kind == "ref" else thin_ofs
    ours = tmp_path / "ours.git"
    shutil.copytree(old, ours)
    theirs = tmp_path / "theirs.git"
    shutil.copytree(old, theirs)
    repo = Repository.open(ours)
    result = index_pack(repo, _write(tmp_path / "thin.pack", thin), fix_thin=True, processes=2,
                        ref_updates=[RefUpdate("refs/heads/main", None, bytes.fromhex(corpus_tip()))])
    assert result.thin_bases_added > 0
    assert result.thin_workers == (2 if parallel else 1)
    out = git("index-pack", "--stdin", "--fix-thin", "--rev-index", git_dir=theirs, input=thin).decode()
    checksum = out.split()[-1]
    assert result.checksum == checksum
    gdir = theirs / "objects" / "pack"
    assert result.pack_path.read_bytes() == (gdir / f"pack-{checksum}.pack").read_bytes()
    assert result.idx_path.read_bytes() == (gdir / f"pack-{checksum}.idx").read_bytes()
    assert result.rev_path.read_bytes() == (gdir / f"pack-{checksum}.rev").read_bytes()
    git("fsck", "--full", git_dir=ours)
    git("verify-pack", str(result.idx_path))


@pytest.mark.parametrize("d1_first", [True, False])
def test_thin_base_also_produced_by_a_thin_delta_matches_git(tmp_path, monkeypatch, d1_first):
    """d1 (base X, in the repo) yields Y; d2's base is Y, which the repository also has.

    git appends X only when d1 comes first (resolving d1 yields Y and so resolves d2); the other
    order reaches d2 twice and git refuses the pack. The parallel path must notice both and
    fall back to git's sequential order.
    """
    import packyard.store.pack.indexpack as ip

    monkeypatch.setattr(ip, "FORK_MIN_DELTAS", 1)
    x_data, y_data = b"base object X\n" * 3, b"object Y, also in the repository\n"
    base = tmp_path / "base.git"
    git("init", "-q", "--bare", str(base))
    x = bytes.fromhex(git("hash-object", "-w", "--stdin", git_dir=base, input=x_data).decode().strip())
    y = bytes.fromhex(git("hash-object", "-w", "--stdin", git_dir=base, input=y_data).decode().strip())
    d1 = delta_insert(len(x_data), y_data)
    d2 = delta_insert(len(y_data), b"the final object\n")
    e1 = entry_header(7, len(d1)) + x + zlib.compress(d1)
    e2 = entry_header(7, len(d2)) + y + zlib.compress(d2)
    pack = build_pack([e1, e2] if d1_first else [e2, e1])
    ours, theirs = tmp_path / "ours.git", tmp_path / "theirs.git"
    shutil.copytree(base, ours)
    shutil.copytree(base, theirs)
    if not d1_first:  # Y appended for d2, then d1 yields Y again and reaches d2 twice: git refuses
        proc = subprocess.run(["git", "--git-dir", str(theirs), "index-pack", "--stdin", "--fix-thin"], input=pack,
                              capture_output=True)
        assert proc.returncode != 0 and b"already resolved" in proc.stderr
        err = ingest_fails(Repository.open(ours), _write(tmp_path / "t.pack", pack), PackFormatError,
                           fix_thin=True, processes=2)
        assert "already resolved" in str(err) and err.offset == 12
        return
    result = index_pack(Repository.open(ours), _write(tmp_path / "t.pack", pack), fix_thin=True, processes=2)
    checksum = git("index-pack", "--stdin", "--fix-thin", git_dir=theirs, input=pack).decode().split()[-1]
    assert result.checksum == checksum
    assert result.thin_bases_added == 1
    assert result.pack_path.read_bytes() == (theirs / "objects" / "pack" / f"pack-{checksum}.pack").read_bytes()
    assert result.idx_path.read_bytes() == (theirs / "objects" / "pack" / f"pack-{checksum}.idx").read_bytes()


def test_thin_base_produced_in_the_pack_is_not_looked_up_in_the_repository(tmp_path):
    """d1 (base X, in the repository) yields Y; d2's base is Y, which only resolving d1 produces. git reads a
    REF_DELTA's base from the repository only when the delta is still unresolved at its turn (d2 is not: X's
    subtree resolved it), so nothing re-lists the repository's packs for Y (a miss there would)."""
    x_data = b"base object X\n" * 3
    y_data, z_data = b"object Y, made by d1\n", b"object Z, made by d2\n"
    base = tmp_path / "base.git"
    git("init", "-q", "--bare", str(base))
    x = bytes.fromhex(git("hash-object", "-w", "--stdin", git_dir=base, input=x_data).decode().strip())
    y = hash_object(ObjectType.BLOB, y_data)
    d1 = delta_insert(len(x_data), y_data)
    d2 = delta_insert(len(y_data), z_data)
    pack = build_pack([entry_header(7, len(d1)) + x + zlib.compress(d1),
                       entry_header(7, len(d2)) + y + zlib.compress(d2)])
    ours, theirs = tmp_path / "ours.git", tmp_path / "theirs.git"
    shutil.copytree(base, ours)
    shutil.copytree(base, theirs)
    repo = Repository.open(ours)
    result = index_pack(repo, _write(tmp_path / "t.pack", pack), fix_thin=True, processes=1)
    assert result.thin_bases_added == 1
    assert repo.objects.packs.rescans == 1   # the snapshot's listing; no lookup of Y re-listed objects/pack
    assert repo.objects.counters.snapshot_misses_found == 0
    checksum = git("index-pack", "--stdin", "--fix-thin", git_dir=theirs, input=pack).decode().split()[-1]
    assert result.checksum == checksum
    assert result.pack_path.read_bytes() == (theirs / "objects" / "pack" / f"pack-{checksum}.pack").read_bytes()


def test_many_deltas_against_one_missing_base_look_it_up_once(tmp_path):
    """300 REF_DELTAs against one base that is nowhere: the pack is refused naming the base, as git refuses
    it, and the repository's packs are re-listed for that base once, not once per delta (a hostile pack
    must not buy a re-listing per entry)."""
    missing = hash_object(ObjectType.BLOB, b"a base nobody has\n")
    entries = [entry_header(7, len(d)) + missing + zlib.compress(d)
               for d in (delta_insert(len(b"a base nobody has\n"), f"object {i}\n".encode()) for i in range(300))]
    pack = build_pack(entries)
    ours, theirs = tmp_path / "ours.git", tmp_path / "theirs.git"
    for repo in (ours, theirs):
        git("init", "-q", "--bare", str(repo))
    repo = Repository.open(ours)
    with pytest.raises(ObjectMissingError) as err:
        index_pack(repo, _write(tmp_path / "t.pack", pack), fix_thin=True, processes=1)
    assert err.value.oid == missing.hex()
    assert repo.objects.packs.rescans <= 2, repo.objects.packs.rescans   # the snapshot's, and one for the base
    proc = subprocess.run(["git", "index-pack", "--stdin", "--fix-thin"], cwd=theirs, input=pack,
                          capture_output=True, env={**os.environ, "GIT_DIR": str(theirs)})
    assert proc.returncode != 0 and not list((theirs / "objects" / "pack").glob("*.pack"))
    assert not list((ours / "objects" / "pack").glob("*.pack"))


def test_thin_pack_without_fix_thin_is_refused(tmp_path, thin_case):
    old, thin, _ofs = thin_case
    ours = tmp_path / "ours.git"
    shutil.copytree(old, ours)
    err = ingest_fails(Repository.open(ours), _write(tmp_path / "thin.pack", thin), ObjectMissingError)
    assert err.offset is not None and err.oid is not None and "thin" in str(err)


def test_thin_pack_into_empty_repo_misses_bases(tmp_path, thin_case):
    _old, thin, _ofs = thin_case
    err = ingest_fails(fresh_repo(tmp_path), _write(tmp_path / "thin.pack", thin), ObjectMissingError,
                       fix_thin=True)
    assert err.offset is not None


# ---------------------------------------------------------------------------------------------
# bad input: typed error with the entry offset, quarantine removed, repository unchanged

BLOB = b"hello packyard\n" * 4


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_truncated_pack(tmp_path, small_src):
    data = pack_of(small_src)
    repo = fresh_repo(tmp_path)
    for cut in (5, 12, 13, len(data) // 2, len(data) - 20, len(data) - 1):
        err = ingest_fails(repo, _write(tmp_path / "t.pack", data[:cut]), PackFormatError)
        assert err.offset is not None


def test_wrong_trailer_checksum(tmp_path, small_src):
    data = bytearray(pack_of(small_src))
    data[-1] ^= 0x01
    err = ingest_fails(fresh_repo(tmp_path), _write(tmp_path / "t.pack", bytes(data)), PackFormatError)
    assert "checksum" in str(err) and err.offset == len(data) - 20
    assert err.path == str(tmp_path / "t.pack")  # the input is named, not the removed quarantine file


def test_corrupt_zlib(tmp_path):
    good = full_entry(3, BLOB)
    bad = entry_header(3, len(BLOB)) + b"\x78\x9c" + b"\xff\xfe\xfd\xfc" * 8
    data = build_pack([good, bad])
    err = ingest_fails(fresh_repo(tmp_path), _write(tmp_path / "t.pack", data), PackFormatError)
    assert err.offset == 12 + len(good)


def test_object_count_mismatch(tmp_path):
    entries = [full_entry(3, BLOB), full_entry(3, BLOB + b"x")]
    repo = fresh_repo(tmp_path)
    more = ingest_fails(repo, _write(tmp_path / "a.pack", build_pack(entries, count=3)), PackFormatError)
    assert "count" in str(more)
    fewer = ingest_fails(repo, _write(tmp_path / "b.pack", build_pack(entries, count=1)), PackFormatError)
    assert "count" in str(fewer)


def test_delta_base_missing(tmp_path):
    missing = hashlib.sha1(b"nope").digest()
    delta = delta_insert(10, b"new content")
    entry = entry_header(7, len(delta)) + missing + zlib.compress(delta)
    data = build_pack([full_entry(3, BLOB), entry])
    err = ingest_fails(fresh_repo(tmp_path), _write(tmp_path / "t.pack", data), ObjectMissingError)
    assert err.offset == 12 + len(full_entry(3, BLOB)) and err.oid == missing.hex()


def test_delta_cycle(tmp_path):
    delta = delta_insert(len(BLOB), b"x")
    first = full_entry(3, BLOB)
    cyc = entry_header(6, len(delta)) + ofs_bytes(0) + zlib.compress(delta)  # names itself as its base
    err = ingest_fails(fresh_repo(tmp_path), _write(tmp_path / "t.pack", build_pack([first, cyc])), PackFormatError)
    assert "cycle" in str(err) and err.offset == 12 + len(first)


def test_delta_result_size_mismatch(tmp_path):
    first = full_entry(3, BLOB)
    delta = delta_insert(len(BLOB), b"abc", dst_size=4)
    bad = entry_header(6, len(delta)) + ofs_bytes(len(first)) + zlib.compress(delta)
    err = ingest_fails(fresh_repo(tmp_path), _write(tmp_path / "t.pack", build_pack([first, bad])), PackFormatError)
    assert err.offset == 12 + len(first)


@pytest.mark.parametrize("produced, forked", [(2_000, False), (30_000, True)])
def test_fork_choice_counts_the_bytes_deltas_produce(tmp_path, monkeypatch, produced, forked):
    """The same four deltas are resolved in forked processes when they produce enough bytes (resolve_work:
    each delta once, plus once per DELTA_WORK_BYTES its header declares), in-process when they do not; the
    index is git's either way."""
    import packyard.store.pack.indexpack as ip

    monkeypatch.setattr(ip, "FORK_MIN_DELTAS", 100)
    monkeypatch.setattr(ip, "DELTA_WORK_BYTES", 1000)
    entries = []
    for k in range(4):   # four bases, each with one OFS child that produces ``produced`` bytes
        base = BLOB + bytes([k])
        e_base = full_entry(3, base)
        body = b"".join(b"child %d line %d\n" % (k, n) for n in range(produced))[:produced]
        delta = delta_insert(len(base), body)
        entries += [e_base, entry_header(6, len(delta)) + ofs_bytes(len(e_base)) + zlib.compress(delta)]
    pack = _write(tmp_path / "t.pack", build_pack(entries))
    result = index_pack(fresh_repo(tmp_path), pack, processes=2)
    assert result.deltas == 4 and result.workers == (2 if forked else 1)
    _checksum, idx, _rev = git_index(pack, tmp_path / "git")
    assert result.idx_path.read_bytes() == idx


def test_bad_delta_reported_from_forked_resolver(tmp_path, monkeypatch):
    import packyard.store.pack.indexpack as ip

    monkeypatch.setattr(ip, "FORK_MIN_DELTAS", 1)  # fork resolver processes even for this tiny pack
    entries = []
    offsets = []
    pos = 12
    for k in range(6):  # six bases, each with one OFS child; the fourth child's delta does not apply
        base = BLOB + bytes([k])
        e_base = full_entry(3, base)
        good = delta_insert(len(base), b"child %d" % k)
        delta = good if k != 3 else delta_insert(len(base) + 1, b"child")  # wrong source size
        e_delta = entry_header(6, len(delta)) + ofs_bytes(len(e_base)) + zlib.compress(delta)
        entries += [e_base, e_delta]
        offsets.append(pos + len(e_base))
        pos += len(e_base) + len(e_delta)
    repo = fresh_repo(tmp_path)
    err = ingest_fails(repo, _write(tmp_path / "t.pack", build_pack(entries)), PackFormatError, processes=2)
    assert err.offset == offsets[3] and "base" in str(err)


def test_absurd_sizes_do_not_allocate(tmp_path):
    repo = fresh_repo(tmp_path)
    huge = 1 << 60
    entry = entry_header(3, huge) + zlib.compress(BLOB)
    err = ingest_fails(repo, _write(tmp_path / "a.pack", build_pack([entry])), PackFormatError)
    assert err.offset == 12
    # A delta whose header claims a 2^60-byte result.
    first = full_entry(3, BLOB)
    delta = varint(len(BLOB)) + varint(huge) + bytes([3]) + b"abc"
    bad = entry_header(6, len(delta)) + ofs_bytes(len(first)) + zlib.compress(delta)
    err = ingest_fails(repo, _write(tmp_path / "b.pack", build_pack([first, bad])), PackFormatError)
    assert err.offset == 12 + len(first)
    # An entry whose size varint overflows 64 bits.
    err = ingest_fails(repo, _write(tmp_path / "c.pack", build_pack([b"\xb0" + b"\xff" * 12 + b"\x01"])),
                       PackFormatError)
    assert err.offset == 12


def test_existing_object_with_different_content(tmp_path):
    repo = fresh_repo(tmp_path)
    oid = hash_object(ObjectType.BLOB, BLOB)
    path = Path(repo.objects.path) / oid.hex()[:2] / oid.hex()[2:]
    path.parent.mkdir()
    path.write_bytes(encode_loose(ObjectType.BLOB, b"something else entirely\n"))  # same name, other content
    err = ingest_fails(repo, _write(tmp_path / "t.pack", build_pack([full_entry(3, BLOB)])), CollisionError)
    assert err.oid == oid.hex() and err.offset == 12


def test_pack_larger_than_limit(tmp_path, small_src):
    data = pack_of(small_src)
    err = ingest_fails(fresh_repo(tmp_path), _write(tmp_path / "t.pack", data), LimitExceededError,
                       max_pack_bytes=len(data) - 1)
    assert err.offset is not None


def test_not_a_pack(tmp_path):
    repo = fresh_repo(tmp_path)
    ingest_fails(repo, _write(tmp_path / "a.pack", b"NOPE" + b"\0" * 40), PackFormatError)
    ingest_fails(repo, _write(tmp_path / "b.pack", b"PACK" + struct.pack(">II", 9, 0) + b"\0" * 20),
                 PackFormatError)
    ingest_fails(repo, tmp_path / "does-not-exist.pack", InvalidInputError)


@pytest.fixture(scope="module")
def small_pack_bytes(tmp_path_factory) -> bytes:
    src = make_worktree_repo(tmp_path_factory.mktemp("hyp"), commits=3, files_per_commit=3)
    return pack_of(src, ofs=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_packs_fail_cleanly(small_pack_bytes, data):
    pack = bytearray(small_pack_bytes)
    kind = data.draw(st.sampled_from(["truncate", "flip", "flips"]))
    if kind == "truncate":
        pack = pack[:data.draw(st.integers(0, len(pack) - 1))]
    else:
        for _ in range(1 if kind == "flip" else data.draw(st.integers(2, 5))):
            pos = data.draw(st.integers(0, len(pack) - 1))
            pack[pos] ^= 1 << data.draw(st.integers(0, 7))
    with tempfile.TemporaryDirectory() as tmp:
        repo = Repository.init(Path(tmp) / "r.git")
        src = _write(Path(tmp) / "in.pack", bytes(pack))
        before = snapshot_tree(repo.path)
        try:
            result = index_pack(repo, src, processes=1)
        except StoreError as err:
            assert isinstance(err, (PackFormatError, CorruptObjectError, ObjectMissingError)), err
            assert quarantines(repo) == []
            assert snapshot_tree(repo.path) == before
        else:  # the mutation left a valid pack: git must agree
            git("verify-pack", str(result.idx_path))


# ---------------------------------------------------------------------------------------------
# --strict, with git index-pack --strict as the oracle

def _tree(*entries: tuple[bytes, bytes, bytes]) -> bytes:
    return b"".join(mode + b" " + name + b"\0" + oid for mode, name, oid in entries)


def _ident(who: bytes) -> bytes:
    return who + b" A U Thor <a@example.com> 1700000000 +0000\n"


def _strict_pack(obj_type: int, data: bytes) -> bytes:
    """``data`` plus what it links to (one blob), so only ``data`` itself can be at fault."""
    return build_pack([full_entry(3, BLOB), full_entry(obj_type, data)])


BLOB_ID = hash_object(ObjectType.BLOB, BLOB)
EMPTY_TREE = b""
EMPTY_TREE_ID = hash_object(ObjectType.TREE, EMPTY_TREE)


def _commit(headers: bytes) -> bytes:
    return headers + b"\nmessage\n"


STRICT_BAD = {
    "tree-unsorted": (2, _tree((b"100644", b"b", BLOB_ID), (b"100644", b"a", BLOB_ID)), True),
    "tree-duplicate": (2, _tree((b"100644", b"a", BLOB_ID), (b"100644", b"a", BLOB_ID)), True),
    "commit-no-author": (1, _commit(b"tree " + EMPTY_TREE_ID.hex().encode() + b"\n" + _ident(b"committer")), True),
    "commit-no-tree": (1, _commit(_ident(b"author") + _ident(b"committer")), True),
    "commit-bad-date": (1, _commit(b"tree " + EMPTY_TREE_ID.hex().encode() + b"\n" + _ident(b"author")
                                   + b"committer C <c@x> notadate +0000\n"), True),
    "tag-no-type": (4, b"object " + BLOB_ID.hex().encode() + b"\ntag v1\n" + _ident(b"tagger") + b"\nmsg\n", True),
    "tree-dotgit": (2, _tree((b"100644", b".git", BLOB_ID)), True),
    # git only reports a bad mode (badFilemode is INFO): old histories have them. So does packyard.
    "tree-bad-mode": (2, _tree((b"100600", b"a", BLOB_ID)), False),
}


@pytest.mark.parametrize("case", sorted(STRICT_BAD))
def test_strict_rejects_malformed_objects(tmp_path, case):
    obj_type, data, git_rejects = STRICT_BAD[case]
    pack = _strict_pack(obj_type, data)
    if obj_type == 1:  # commits link to the empty tree: ship it too
        pack = build_pack([full_entry(3, BLOB), full_entry(2, EMPTY_TREE), full_entry(obj_type, data)])
    gitdir = tmp_path / "g.git"
    git("init", "-q", "--bare", str(gitdir))
    proc = subprocess.run(["git", "--git-dir", str(gitdir), "index-pack", "--strict", "--stdin"], input=pack,
                          capture_output=True)
    assert (proc.returncode != 0) == git_rejects, proc.stderr
    repo = fresh_repo(tmp_path)
    if not git_rejects:
        index_pack(repo, _write(tmp_path / "t.pack", pack), strict=True)
        return
    err = ingest_fails(repo, _write(tmp_path / "t.pack", pack), CorruptObjectError, strict=True)
    assert err.offset is not None and err.oid == hash_object(obj_type, data).hex()
    index_pack(repo, tmp_path / "t.pack")  # without --strict the pack is accepted


def test_strict_connectivity(tmp_path):
    missing_tree = hashlib.sha1(b"no such tree").digest()
    commit = _commit(b"tree " + missing_tree.hex().encode() + b"\n" + _ident(b"author") + _ident(b"committer"))
    pack = build_pack([full_entry(1, commit)])
    gitdir = tmp_path / "g.git"
    git("init", "-q", "--bare", str(gitdir))
    assert subprocess.run(["git", "--git-dir", str(gitdir), "index-pack", "--strict", "--stdin"], input=pack,
                          capture_output=True).returncode != 0
    err = ingest_fails(fresh_repo(tmp_path), _write(tmp_path / "t.pack", pack), ObjectMissingError, strict=True)
    assert err.oid == missing_tree.hex()


@needs_corpus('git-v1.0.0')
def test_strict_accepts_corpus_v1(tmp_path):
    result = index_pack(fresh_repo(tmp_path), V1, strict=True)
    assert result.objects == 12233


# ---------------------------------------------------------------------------------------------
# crash points and filesystem calls

def _run_ingest_subprocess(repo: Path, pack: Path, env_extra: dict[str, str] | None = None,
                           strace_log: Path | None = None, processes: int = 2,
                           ref: tuple[str, str] | None = None, keep: str | None = None) -> subprocess.CompletedProcess:
    refs = f"[RefUpdate({ref[0]!r}, None, bytes.fromhex({ref[1]!r}))]" if ref else "()"
    code = ("import sys; from packyard.store.repo import Repository; "
            "from packyard.store.pack.indexpack import index_pack; "
            "from packyard.store.refs import RefUpdate; "
            f"r = index_pack(Repository.open({str(repo)!r}), {str(pack)!r}, processes={processes}, "
            f"ref_updates={refs}, keep_message={keep!r}); print(r.pack_name)")
    cmd = [sys.executable, "-c", code]
    if strace_log is not None:
        cmd = ["strace", "-f", "-qq", "-y", "-o", str(strace_log), "-e",
               "trace=open,openat,stat,lstat,newfstatat,statx,access,faccessat,faccessat2,getdents64"] + cmd
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run(cmd, env=env, capture_output=True, cwd=ROOT)


def test_killed_after_pack_rename_leaves_no_visible_pack(tmp_path, small_src):
    bare = tmp_path / "r.git"
    Repository.init(bare)
    pack = _write(tmp_path / "in.pack", pack_of(small_src))
    proc = _run_ingest_subprocess(bare, pack, {"PACKYARD_FAULT": "index_pack.after_pack_rename"})
    assert proc.returncode == -9, proc.stderr
    pack_dir = bare / "objects" / "pack"
    assert [p.suffix for p in pack_dir.iterdir()] == [".pack"]  # no idx: readers cannot see it
    assert batch_check_all(bare) == {}
    git("fsck", "--full", git_dir=bare)
    proc = _run_ingest_subprocess(bare, pack)  # a retry installs it
    assert proc.returncode == 0, proc.stderr
    assert len(batch_check_all(bare)) == len(batch_check_all(small_src))


FAULT_POINTS = ("after_writeout", "after_flush", "after_keep", "after_pack_rename", "after_renames",
                "after_fsync_dirs", "after_quarantine_removed", "after_refs")


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_sigkill_at_every_install_step_leaves_a_consistent_repository(tmp_path, small_src, point):
    bare = tmp_path / "r.git"
    Repository.init(bare)
    pack = _write(tmp_path / "in.pack", pack_of(small_src))
    tip = git("rev-parse", "main", git_dir=small_src).decode().strip()
    proc = _run_ingest_subprocess(bare, pack, {"PACKYARD_FAULT": f"index_pack.{point}"},
                                  ref=("refs/heads/main", tip), keep="pushing")
    assert proc.returncode == -9, proc.stderr
    names = {p.suffix for p in (bare / "objects" / "pack").iterdir()}
    if ".idx" in names:  # visible to readers: everything the idx needs is there, and the keep came first
        assert {".pack", ".rev", ".idx", ".keep"} <= names
        git("verify-pack", str(next((bare / "objects" / "pack").glob("*.idx"))))
    ref = bare / "refs" / "heads" / "main"
    if ref.exists():  # a ref never names an object that is not installed
        assert ".idx" in names and point == "after_refs"
    git("fsck", "--full", git_dir=bare)


def test_stale_quarantine_is_removed_after_a_kill(tmp_path, small_src):
    bare = tmp_path / "r.git"
    repo = Repository.init(bare)
    pack = _write(tmp_path / "in.pack", pack_of(small_src))
    proc = _run_ingest_subprocess(bare, pack, {"PACKYARD_FAULT": "index_pack.after_flush"})
    assert proc.returncode == -9, proc.stderr
    left = quarantines(repo)
    assert len(left) == 1 and not list((bare / "objects" / "pack").iterdir())
    assert remove_stale_quarantines(repo, older_than=3600) == []          # could still be a live ingest
    assert [p.name for p in remove_stale_quarantines(repo, older_than=0)] == left
    assert quarantines(repo) == []
    git("fsck", "--full", git_dir=bare)


def _objects_calls(log: Path, objects_dir: Path) -> int:
    needle = str(objects_dir)
    return sum(1 for line in log.read_text(errors="replace").splitlines() if needle in line)


@needs_corpus('git-v1.0.0')
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_filesystem_calls_do_not_grow_with_pack_size(tmp_path, small_src):
    # A repository with 20 packs and 5,000 loose objects.
    bare = tmp_path / "busy.git"
    Repository.init(bare)
    files = tmp_path / "blobs"
    files.mkdir()
    paths = []
    for i in range(5000):
        p = files / f"{i}"
        p.write_bytes(b"loose object %d\n" % i)
        paths.append(str(p))
    ids = git("hash-object", "-w", "--stdin-paths", git_dir=bare, input="\n".join(paths).encode()).split()
    for k in range(20):
        git("pack-objects", "-q", str(bare / "objects" / "pack" / "pack"), git_dir=bare,
            input=b"\n".join(ids[k * 50:(k + 1) * 50]) + b"\n")
    assert len(list((bare / "objects" / "pack").glob("*.idx"))) == 20
    small = _write(tmp_path / "small.pack", pack_of(small_src))
    counts = {}
    for name, pack in (("small", small), ("large", V1)):
        copy = tmp_path / f"{name}.git"  # same starting state for both runs
        shutil.copytree(bare, copy)
        log = tmp_path / f"{name}.strace"
        proc = _run_ingest_subprocess(copy, pack, strace_log=log)
        assert proc.returncode == 0, proc.stderr
        counts[name] = _objects_calls(log, copy / "objects")
    print("filesystem calls touching objects/:", counts)
    n_small = len(batch_check_all(small_src))
    assert n_small < 100  # vs 12,233 objects in the large pack
    assert counts["large"] <= counts["small"], counts
