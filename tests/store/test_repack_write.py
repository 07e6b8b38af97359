"""The write plan's two implementations: the C runs (_packwrite's find_reuse / write_order / copy_entries /
check_chains / index_tables) and the pure-Python steps (what PACKYARD_PURE_PYTHON=1 runs) write
the same pack, byte for byte; a corrupt source entry fails in both with the typed error naming the pack,
the object and the entry's offset, and nothing is published. Repositories made by git here (no corpus)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gitutil import GIT_ENV, git, snapshot_tree
from packyard.store import native
from packyard.store.errors import PackFormatError
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.maintenance.walk import reach as walk_mod
from packyard.store.repo import Repository

needs_c = pytest.mark.skipif(walk_mod.IMPLEMENTATION != "c",
                             reason="the C walk is not built (or PACKYARD_PURE_PYTHON=1)")


def _commit(work: Path, files: dict[str, str], when: int) -> None:
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    env = {**GIT_ENV, "GIT_AUTHOR_DATE": f"{when} +0000", "GIT_COMMITTER_DATE": f"{when} +0000"}
    for args in (["add", "-A"], ["commit", "-q", "-m", f"at {when}"]):
        subprocess.run(["git", *args], cwd=work, env={**os.environ, **env}, check=True,
                       capture_output=True)


def build(base: Path) -> Path:
    """A bare repository: one gc'd pack (OFS_DELTA chains), two packs of later history written with
    REF_DELTA (pack-objects without --delta-base-offset), loose objects of a second branch."""
    work = base / "work"
    work.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(work))
    lines = [f"line {i}: text that a source file of some project might well carry\n" for i in range(120)]
    t = 1_700_000_000

    def version(name: str, rev: int) -> str:
        body = list(lines)
        body[rev % 120] = f"{name} revision {rev}\n"
        body.insert(rev % 50, f"inserted for {rev}\n")
        return "".join(body)

    for rev in range(25):
        _commit(work, {f"d{rev % 3}/f{k}.txt": version(f"f{k}", rev) for k in range(4)}, t + 60 * rev)
    git("gc", "-q", "--aggressive", cwd=work)
    bare = base / "bare.git"
    git("clone", "-q", "--bare", str(work), str(bare))
    prev = git("rev-parse", "HEAD", cwd=work).decode().strip()
    for batch in range(2):
        for rev in range(25 + 10 * batch, 35 + 10 * batch):
            _commit(work, {f"d{rev % 3}/f{rev % 4}.txt": version(f"f{rev % 4}", rev)}, t + 60 * rev)
        tip = git("rev-parse", "HEAD", cwd=work).decode().strip()
        pack = git("pack-objects", "-q", "--revs", "--stdout", cwd=work, input=f"{tip}\n^{prev}\n".encode())
        subprocess.run(["git", "--git-dir", str(bare), "index-pack", "--stdin"], input=pack, check=True,
                       capture_output=True)
        prev = tip
    git("checkout", "-q", "-b", "side", cwd=work)
    for rev in range(45, 52):
        _commit(work, {f"side/f{rev % 4}.txt": version(f"f{rev % 4}", rev)}, t + 60 * rev)
    side = git("rev-parse", "HEAD", cwd=work).decode().strip()
    loose = git("pack-objects", "-q", "--revs", "--stdout", cwd=work, input=f"{side}\n^{prev}\n".encode())
    subprocess.run(["git", "--git-dir", str(bare), "unpack-objects", "-q"], input=loose, check=True)
    git("update-ref", "refs/heads/main", prev, git_dir=bare)
    git("update-ref", "refs/heads/side", side, git_dir=bare)
    return bare


def _python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's next repack without the C write plan, C index or C idx tables (the Python steps)."""
    import packyard.store.maintenance.repack.reuse as reuse_mod
    import packyard.store.maintenance.repack.writeplan as writeplan_mod
    import packyard.store.maintenance.walk.sources as sources_mod
    import packyard.store.pack.idxwrite as idxwrite_mod

    monkeypatch.setattr(sources_mod, "_walk_c", None)
    monkeypatch.setattr(writeplan_mod, "_walk_c", None)
    monkeypatch.setattr(writeplan_mod, "_packwrite", None)
    monkeypatch.setattr(reuse_mod, "_packwrite", None)
    monkeypatch.setattr(idxwrite_mod, "_c_index_tables", None)


def _pack_files(bare: Path, name: str) -> dict[str, bytes]:
    d = bare / "objects" / "pack"
    return {ext: (d / f"{name}.{ext}").read_bytes() for ext in ("pack", "idx", "rev")}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("write"))


@needs_c
@pytest.mark.parametrize("options", [
    RepackOptions(mode=RepackMode.FULL, now=1_800_000_000),
    RepackOptions(mode=RepackMode.FULL, depth=3, now=1_800_000_000),    # reused chains cut (check_chains)
    RepackOptions(mode=RepackMode.FULL, window=0, now=1_800_000_000),   # no search: deltas behind written whole
    RepackOptions(mode=RepackMode.GEOMETRIC, factor=2, now=1_800_000_000),
], ids=["full", "depth3", "no-search", "geometric"])
def test_c_and_python_write_plans_give_identical_packs(template: Path, tmp_path: Path, options: RepackOptions,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    c_repo, py_repo = tmp_path / "c.git", tmp_path / "py.git"
    shutil.copytree(template, c_repo)
    shutil.copytree(template, py_repo)
    with_c = repack(Repository.open(c_repo), options)
    _python_only(monkeypatch)
    with_py = repack(Repository.open(py_repo), options)
    monkeypatch.undo()
    assert with_c.packs_written and with_c.packs_written == with_py.packs_written
    for name in with_c.packs_written:
        assert _pack_files(c_repo, name) == _pack_files(py_repo, name)
    counted = ("deltas_reused", "entries_copied", "rewritten_whole", "deltas_computed", "loose_packed",
               "deltas_dropped")
    assert {k: getattr(with_c.counters, k) for k in counted} == {k: getattr(with_py.counters, k) for k in counted}
    if options.mode is RepackMode.FULL:
        assert with_c.counters.deltas_reused > 0 and with_c.counters.entries_copied > 0
    if options.depth == 3:
        assert with_c.counters.deltas_dropped > 0
    git("fsck", "--full", "--no-dangling", git_dir=c_repo)


def test_one_source_pack_of_whole_objects_and_reused_deltas_skips_the_search(template: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """One source pack whose objects are all whole or reusable deltas: the search could try no pair (two whole
    objects of one pack are never tried against each other), so it is skipped -- and the pack is the one a
    repack without any search writes, on the C and the Python paths; with more sources the search runs."""
    one = tmp_path / "one.git"
    shutil.copytree(template, one)
    git("repack", "-q", "-a", "-d", git_dir=one)
    assert len(list((one / "objects" / "pack").glob("*.pack"))) == 1
    results, files = [], []
    for k, options in enumerate([RepackOptions(mode=RepackMode.FULL, now=1_800_000_000),
                                 RepackOptions(mode=RepackMode.FULL, window=0, now=1_800_000_000),
                                 RepackOptions(mode=RepackMode.FULL, now=1_800_000_000)]):
        repo = tmp_path / f"r{k}.git"
        shutil.copytree(one, repo)
        if k == 2:
            _python_only(monkeypatch)
        results.append(repack(Repository.open(repo), options))
        monkeypatch.undo()
        files.append(_pack_files(repo, results[-1].packs_written[0]))
        git("fsck", "--full", "--no-dangling", git_dir=repo)
    assert files[0] == files[1] == files[2]
    assert results[0].counters.deltas_reused > 0 and results[0].counters.entries_copied > 0
    for r in (results[0], results[2]):
        assert (r.counters.delta_candidates, r.counters.search_processes) == (0, 0)
    several = tmp_path / "several.git"
    shutil.copytree(template, several)
    assert repack(Repository.open(several), RepackOptions(mode=RepackMode.FULL, now=1_800_000_000)
                  ).counters.delta_candidates > 0


def test_every_planned_object_from_one_of_several_source_packs_skips_the_search(template: Path,
                                                                                tmp_path: Path) -> None:
    """Several source packs, but everything the new pack takes is whole or a reusable delta in one of them
    (the others hold only unreachable objects, expired here): no pair could be tried, the search is skipped,
    and the pack is the one a repack without any search writes."""
    base = tmp_path / "base.git"
    shutil.copytree(template, base)
    git("repack", "-q", "-a", "-d", git_dir=base)
    gone = [git("hash-object", "-w", "--stdin", git_dir=base, input=f"unreachable {k}\n".encode() * 50).strip()
            for k in range(3)]
    git("pack-objects", "-q", str(base / "objects" / "pack" / "pack"), git_dir=base, input=b"\n".join(gone) + b"\n")
    git("prune-packed", git_dir=base)
    assert len(list((base / "objects" / "pack").glob("*.pack"))) == 2
    results, files = [], []
    for k, window in enumerate((None, 0)):
        repo = tmp_path / f"s{k}.git"
        shutil.copytree(base, repo)
        opts = RepackOptions(mode=RepackMode.FULL, now=1_800_000_000, expire=0.0,
                             **({} if window is None else {"window": window}))
        results.append(repack(Repository.open(repo), opts))
        files.append(_pack_files(repo, results[-1].packs_written[0]))
        git("fsck", "--full", "--no-dangling", git_dir=repo)
    assert files[0] == files[1]
    assert results[0].counters.cruft_expired == 3 and not results[0].cruft_pack
    assert (results[0].counters.delta_candidates, results[0].counters.search_processes) == (0, 0)


def test_a_duplicate_whole_copy_in_another_pack_is_taken_from_the_main_pack(template: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A blob whole in the main pack and again, whole, in a second pack that step 1 lists first (a push's pack
    repeats what its ``^`` side had): it is taken from the main pack, so the search is skipped as with one
    source pack, on the C and the Python paths; the pack is the one a repack without search writes."""
    base = tmp_path / "base.git"
    shutil.copytree(template, base)
    git("repack", "-q", "-a", "-d", git_dir=base)
    main_idx = next((base / "objects" / "pack").glob("*.idx"))
    whole_blob = next(oid for oid, typ, _off, _size, depth in _entries(main_idx) if typ == "blob" and depth == 0)
    gone = [git("hash-object", "-w", "--stdin", git_dir=base, input=f"unreachable {k}\n".encode() * 50).strip()
            for k in range(3)]
    git("pack-objects", "-q", str(base / "objects" / "pack" / "pack"), git_dir=base,
        input=b"\n".join([whole_blob.encode(), *gone]) + b"\n")
    git("prune-packed", git_dir=base)
    # The second pack is newer: its copy of the blob is the one step 1 finds first.
    second = next(p for p in (base / "objects" / "pack").glob("*.pack") if p.with_suffix(".idx") != main_idx)
    os.utime(second, (2_000_000_000, 2_000_000_000))
    results, files = [], []
    for k, window in enumerate((None, 0, None)):
        repo = tmp_path / f"s{k}.git"
        shutil.copytree(base, repo)
        opts = RepackOptions(mode=RepackMode.FULL, now=1_800_000_000, expire=0.0,
                             **({} if window is None else {"window": window}))
        if k == 2:
            _python_only(monkeypatch)
        results.append(repack(Repository.open(repo), opts))
        monkeypatch.undo()
        files.append(_pack_files(repo, results[-1].packs_written[0]))
        git("fsck", "--full", "--no-dangling", "--strict", git_dir=repo)
    assert files[0] == files[1] == files[2]
    for r in (results[0], results[2]):
        assert (r.counters.delta_candidates, r.counters.search_processes) == (0, 0)
        assert r.counters.whole_settled == 1


def _entries(idx: Path) -> list[tuple[str, str, int, int, int]]:
    """(id, type, offset, entry size, depth or 0) of each entry of a pack, from git verify-pack -v."""
    out = []
    for line in git("verify-pack", "-v", str(idx)).decode().splitlines():
        f = line.split()
        if len(f) >= 5 and len(f[0]) == 40 and f[1] in ("commit", "tree", "blob", "tag"):
            out.append((f[0], f[1], int(f[4]), int(f[3]), int(f[5]) if len(f) > 5 else 0))
    return out


@pytest.mark.parametrize("implementation", ["c", "python"])
@pytest.mark.parametrize("shape", ["delta", "whole"])
def test_a_corrupt_copied_entry_fails_naming_pack_object_and_offset(template: Path, tmp_path: Path, shape: str,
                                                                      implementation: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if implementation == "c" and walk_mod.IMPLEMENTATION != "c":
        pytest.skip("the C walk is not built (or PACKYARD_PURE_PYTHON=1)")
    bare = tmp_path / "bare.git"
    shutil.copytree(template, bare)
    # The gc'd pack's blobs: the walk never inflates blobs and, without a search, nothing reads them: the copy
    # is the only reader of the entry, so its CRC32 check is what must catch the flipped byte.
    idx = max((bare / "objects" / "pack").glob("pack-*.idx"), key=lambda p: p.stat().st_size)
    blobs = [e for e in _entries(idx) if e[1] == "blob" and e[3] > 20 and (e[4] > 0) == (shape == "delta")]
    oid, _type, offset, size, _depth = blobs[len(blobs) // 2]
    pack = idx.with_suffix(".pack")
    raw = bytearray(pack.read_bytes())
    raw[offset + size - 3] ^= 0x40          # inside the compressed data (the header stays readable)
    pack.chmod(0o644)
    pack.write_bytes(bytes(raw))
    before = snapshot_tree(bare)
    if implementation == "python":
        _python_only(monkeypatch)
    with pytest.raises(PackFormatError) as info:
        repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL, window=0))
    err = info.value
    assert err.oid == oid and err.path == str(pack) and err.offset == offset, str(err)
    assert "CRC32" in str(err)
    assert snapshot_tree(bare) == before    # nothing published, nothing deleted, no temp file left


@needs_c
def test_c_find_reuse_equals_the_python_one_with_kept_and_duplicated_entries(template: Path, tmp_path: Path) -> None:
    """find_reuse (C) against _locate (its Python specification), id by id, on the awkward cases: every id of
    every replaceable pack (duplicates between packs: the first pack's entry is the id's), ids repeated (the
    last position counts), loose ids, and REF_DELTA bases whose ids are in a .keep pack (not in the index,
    but in ``ids``)."""
    from array import array

    from packyard.store.maintenance.repack import reuse
    from packyard.store.maintenance.walk.sources import SourceIndex

    bare = tmp_path / "r.git"
    shutil.copytree(template, bare)
    pack_dir = bare / "objects" / "pack"
    by_size = sorted(pack_dir.glob("pack-*.pack"), key=lambda p: p.stat().st_size)
    largest = [line.split()[1] for line in git("show-index", input=by_size[-1].with_suffix(".idx").read_bytes())
               .decode().splitlines()]
    smallest = git("verify-pack", "-v", str(by_size[0].with_suffix(".idx"))).decode().splitlines()
    bases = sorted({f[6] for f in (line.split() for line in smallest) if len(f) == 7 and f[1] in ("blob", "tree")})
    assert bases
    # A .keep pack with the delta bases of the smallest (REF_DELTA) pack; a pack repeating some of the largest's.
    for ids, keep in ((bases, True), (largest[:40], False)):
        name = git("pack-objects", "-q", "--delta-base-offset", str(pack_dir / "pack"),
                   input="\n".join(ids).encode() + b"\n", git_dir=bare).decode().strip()
        if keep:
            (pack_dir / f"pack-{name}.keep").write_text("")
    repo = Repository.open(bare)
    snap = repo.objects.snapshot()
    sources = SourceIndex(snap, [p for p in snap.packs if not p.is_kept()], [p for p in snap.packs if p.is_kept()])
    try:
        assert sources.c_packs is not None and sources.kept_ids
        every = [p.oids[20 * i:20 * i + 20] for p in sources.packs for i in range(p.count)]
        ids = every + sorted(sources.loose_ids) + every[:25]
        kind_b, base_b, gid_b = native.packwrite().find_reuse(sources.c_packs, ids)
        r = reuse.Reuse(len(ids))
        index_get = {oid: k for k, oid in enumerate(ids)}.get
        for k, oid in enumerate(ids):
            reuse._locate(r, k, oid, sources, index_get)
        assert bytes(r.kind) == kind_b
        assert r.base.tobytes() == base_b and r.gid.tobytes() == gid_b
        kinds = set(kind_b)
        assert {reuse.LOOSE, reuse.WHOLE, reuse.DELTA} <= kinds
        base = array("i")
        base.frombytes(base_b)
        assert any(base[k] >= 0 and ids[base[k]] in sources.kept_ids for k in range(len(ids))), \
            "a delta whose base id is only in the .keep pack's index"
    finally:
        sources.release()


@pytest.mark.skipif(native.packwrite() is None, reason="the C write plan is not built (or PACKYARD_PURE_PYTHON=1)")
def test_c_write_plan_refuses_tables_of_the_wrong_length_naming_them() -> None:
    """_walk.h's get_tables: every table of a call holds the first one's entries, else ValueError naming it."""
    from array import array

    pw = native.packwrite()
    kind, reused = bytes(3), bytes(3)
    none = array("i", [-1] * 3).tobytes()
    assert pw.write_order(kind, reused, none, none)[2] == -1
    for args, name in [((kind, bytes(2), none, none), "reused"), ((kind, reused, none[:8], none), "rbase"),
                       ((kind, reused, none, none + b"x"), "cbase")]:
        with pytest.raises(ValueError, match=f"write_order: {name} has"):
            pw.write_order(*args)
    assert pw.check_chains(bytearray(3), none, 10)[1] == 0
    with pytest.raises(ValueError, match="check_chains: base has 4 bytes, 3 entries need 12"):
        pw.check_chains(bytearray(3), none[:4], 10)
    with pytest.raises(BufferError):
        pw.check_chains(bytes(3), none, 10)      # reused is written to: a read-only buffer is refused
