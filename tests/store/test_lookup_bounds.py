"""Every lookup ends: dead packs (idx without pack, pack without idx, truncated, vanished preserved packs)
give an answer or a typed error within a bound, never a loop (issue 16)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitutil import git, make_worktree_repo
from packyard.store import ObjectMissingError, PackFormatError, Repository, StoreError
from packyard.store.leftovers import RULES, Kind
from packyard.store.leftovers.passes import remove_stale_temp_files
from packyard.store.objdir import MAX_VANISHED_RELISTINGS, PRESERVED_DIR


def _pack_of(bare: Path, oids: list[str], into: Path) -> str:
    """git pack-objects of ``oids`` into ``into`` (pack-<sha>.pack/.idx); returns the pack's name."""
    into.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["git", "--git-dir", str(bare), "pack-objects", "-q", str(into / "pack")],
                         input=("\n".join(oids) + "\n").encode(), capture_output=True, check=True).stdout
    return "pack-" + out.decode().strip()


@pytest.fixture
def one_blob_repo(tmp_path: Path) -> tuple[Path, str]:
    """A bare repository whose history is packed, plus one extra blob id to play with."""
    bare = make_worktree_repo(tmp_path, commits=1, files_per_commit=2)
    git("repack", "-a", "-d", "-q", git_dir=bare)
    blob = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"the object under test\n").decode().strip()
    return bare, blob


def _copies(bare: Path, blob: str, n: int) -> list[str]:
    """``n`` distinct packs in objects/pack that each hold ``blob`` (plus one filler blob to tell them apart)."""
    names = []
    for i in range(n):
        filler = git("hash-object", "-w", "--stdin", git_dir=bare, input=f"filler {i}\n".encode()).decode().strip()
        names.append(_pack_of(bare, [blob, filler], bare / "objects" / "pack"))
    loose = bare / "objects" / blob[:2] / blob[2:]
    if loose.exists():   # only the packs hold it from here on
        os.unlink(loose)
    return names


def test_idx_without_pack_is_absent_as_in_git(one_blob_repo):
    """The issue's reproduction: the object in two packs whose .idx remain but whose .pack files are gone.
    It used to alternate between the two dead packs forever (58,284 listings in 5 s); git answers at once."""
    bare, blob = one_blob_repo
    pack_dir = bare / "objects" / "pack"
    for name in _copies(bare, blob, 2):
        os.unlink(pack_dir / f"{name}.pack")
    # git's verdict: the object does not exist
    assert subprocess.run(["git", "--git-dir", str(bare), "cat-file", "-e", blob]).returncode != 0
    repo = Repository.open(bare)
    with pytest.raises(ObjectMissingError):
        repo.objects.read(bytes.fromhex(blob))
    assert repo.objects.packs.rescans <= 2, "one listing, one re-listing: dead idx files are not listed"
    assert not repo.objects.has(bytes.fromhex(blob))


def test_packs_that_vanish_after_listing_end_the_lookup(one_blob_repo):
    """Listed while whole, then the .pack files go (an open idx, a pack never opened): dropped, re-listed a
    bounded number of times, and the answer is 'missing', with every vanished pack counted."""
    bare, blob = one_blob_repo
    pack_dir = bare / "objects" / "pack"
    names = _copies(bare, blob, 3)
    repo = Repository.open(bare)
    oid = bytes.fromhex(blob)
    assert repo.objects.has(oid)                 # lists the directory and opens the idx files
    for name in names:
        os.unlink(pack_dir / f"{name}.pack")
    before = repo.objects.packs.rescans
    with pytest.raises(ObjectMissingError):
        repo.objects.read(oid)
    assert repo.objects.counters.packs_vanished >= 1
    assert repo.objects.packs.rescans - before <= MAX_VANISHED_RELISTINGS + 1


def test_a_vanished_pack_falls_through_to_a_live_copy(one_blob_repo):
    bare, blob = one_blob_repo
    pack_dir = bare / "objects" / "pack"
    dead, live = _copies(bare, blob, 2)
    spare = _pack_of(bare, [blob], bare.parent / "spare")
    repo = Repository.open(bare)
    oid = bytes.fromhex(blob)
    assert repo.objects.has(oid)
    os.unlink(pack_dir / f"{dead}.pack")
    os.unlink(pack_dir / f"{live}.pack")
    for ext in ("pack", "idx"):                  # a repack installed a new home meanwhile (idx last)
        shutil.move(str(bare.parent / "spare" / f"{spare}.{ext}"), pack_dir / f"{spare}.{ext}")
    obj_type, data = repo.objects.read(oid)
    assert data == b"the object under test\n"


def test_truncated_pack_is_a_typed_error_naming_it_or_skipped_for_a_good_copy(one_blob_repo):
    bare, blob = one_blob_repo
    pack_dir = bare / "objects" / "pack"
    (bad,) = _copies(bare, blob, 1)
    spare = _pack_of(bare, [blob], bare.parent / "spare")
    with open(pack_dir / f"{bad}.pack", "r+b") as f:
        f.truncate(20)
    oid = bytes.fromhex(blob)
    with pytest.raises(PackFormatError) as err:
        Repository.open(bare).objects.read(oid)
    assert bad in str(err.value)
    for ext in ("pack", "idx"):                  # another copy: the read answers from it
        shutil.move(str(bare.parent / "spare" / f"{spare}.{ext}"), pack_dir / f"{spare}.{ext}")
    assert Repository.open(bare).objects.read(oid)[1] == b"the object under test\n"


def test_janitor_removes_an_orphaned_idx_by_its_age_rule(one_blob_repo):
    bare, blob = one_blob_repo
    pack_dir = bare / "objects" / "pack"
    (name,) = _copies(bare, blob, 1)
    os.unlink(pack_dir / f"{name}.pack")
    idx = pack_dir / f"{name}.idx"
    assert remove_stale_temp_files(pack_dir) == 0 and idx.exists(), "young: kept (a git repack may be mid-unlink)"
    old = idx.stat().st_mtime - RULES[Kind.ORPHAN_IDX].unjudged_after - 60
    os.utime(idx, (old, old))
    assert remove_stale_temp_files(pack_dir) >= 1
    assert not idx.exists()
    assert remove_stale_temp_files(pack_dir, orphans=False) == 0   # an ingesting job never judges installed names


# -- property: any mix of dead packs -----------------------------------------------------------

DAMAGE = st.sampled_from(["whole", "no-pack", "no-idx", "truncated", "vanish-after-listing"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damages=st.lists(DAMAGE, min_size=1, max_size=5), preserved=st.lists(DAMAGE, max_size=2))
def test_any_mix_of_dead_packs_answers_or_raises_within_a_bound(tmp_path_factory, damages, preserved):
    base = tmp_path_factory.mktemp("mix")
    bare = make_worktree_repo(base, commits=1, files_per_commit=1)
    blob = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"the object under test\n").decode().strip()
    pack_dir = bare / "objects" / "pack"
    made = [(d, pack_dir, n) for d, n in zip(damages, _copies(bare, blob, len(damages)))]
    pdir = pack_dir / PRESERVED_DIR
    for d in preserved:
        n = _pack_of(bare, [blob, git("hash-object", "-w", "--stdin", git_dir=bare,
                                      input=f"p{len(made)}\n".encode()).decode().strip()], base / "p")
        pdir.mkdir(exist_ok=True)
        for ext in ("pack", "idx"):
            shutil.move(str(base / "p" / f"{n}.{ext}"), pdir / f"{n}.{ext}")
        made.append((d, pdir, n))
    repo = Repository.open(bare)
    oid = bytes.fromhex(blob)
    repo.objects.has(oid)
    for d, where, n in made:
        if d == "no-pack" or d == "vanish-after-listing":
            os.unlink(where / f"{n}.pack")
        elif d == "no-idx":
            os.unlink(where / f"{n}.idx")
        elif d == "truncated":
            with open(where / f"{n}.pack", "r+b") as f:
                f.truncate(30)
    whole = any(d == "whole" for d, _w, _n in made)
    try:
        _t, data = repo.objects.read(oid)
    except StoreError as err:
        assert not whole, f"a whole copy exists, yet: {err!r}"
        assert isinstance(err, (ObjectMissingError, PackFormatError))
    else:
        assert data == b"the object under test\n"
    bound = 2 * (MAX_VANISHED_RELISTINGS + 2)
    assert repo.objects.packs.rescans <= bound and repo.objects.preserved.rescans <= bound


def test_verify_names_the_missing_pack_file(one_blob_repo):
    from packyard.store.verify import verify_repository

    bare, blob = one_blob_repo
    pack_dir = bare / "objects" / "pack"
    (name,) = _copies(bare, blob, 1)
    verify_repository(bare)                       # whole: passes
    os.unlink(pack_dir / f"{name}.pack")
    with pytest.raises(PackFormatError) as err:
        verify_repository(bare)
    assert f"{name}.pack" in str(err.value) and "OSError" not in str(err.value)
    assert err.value.path == str(pack_dir / f"{name}.pack")
