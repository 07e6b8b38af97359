"""unpack_objects vs `git unpack-objects`: same objects from thin packs (OFS_DELTA and REF_DELTA), bad packs."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gitutil import batch_check_all, git, repo_from_corpus, snapshot_tree
from packyard.store import RefUpdate, Repository
from packyard.store.errors import LimitExceededError, PackFormatError
from packyard.store.pack.unpack import parse_pack, unpack_objects

N_BACK = 15


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A corpus repo, a base repo holding only tip~N, and thin packs base..tip."""
    base_dir = tmp_path_factory.mktemp("unpack")
    corpus = repo_from_corpus(base_dir, "git-v1.0.0")
    tip = git("rev-parse", "main", git_dir=corpus).strip().decode()
    old = git("rev-parse", f"main~{N_BACK}", git_dir=corpus).strip().decode()
    git("update-ref", "refs/heads/base", old, git_dir=corpus)
    template = base_dir / "base.git"
    git("clone", "-q", "--bare", "--no-local", "--single-branch", "--branch", "base", str(corpus), str(template))
    revs = f"{tip}\n^{old}\n".encode()
    packs = {
        "ofs": git("pack-objects", "-q", "--revs", "--thin", "--stdout", "--delta-base-offset", git_dir=corpus,
                   input=revs),
        "ref": git("pack-objects", "-q", "--revs", "--thin", "--stdout", git_dir=corpus, input=revs),
    }
    return {"corpus": corpus, "template": template, "tip": tip, "old": old, "packs": packs, "dir": base_dir}


def copy_of(setup, name: str) -> Path:
    dest = setup["dir"] / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(setup["template"], dest, symlinks=True)
    return dest


@pytest.mark.parametrize("kind", ["ofs", "ref"])
def test_thin_pack_exploded_like_git_unpack_objects(setup, kind):
    pack = setup["packs"][kind]
    entries = parse_pack(pack)
    types = {e.type for e in entries}
    assert (6 if kind == "ofs" else 7) in types, "the pack really carries deltas of that kind"
    ours = copy_of(setup, f"ours-{kind}.git")
    theirs = copy_of(setup, f"theirs-{kind}.git")
    git("unpack-objects", "-q", git_dir=theirs, input=pack)
    repo = Repository.open(ours)
    seen = []
    res = unpack_objects(repo, pack, progress=lambda *a: seen.append(a),
                         ref_updates=[RefUpdate("refs/heads/base", bytes.fromhex(setup["old"]),
                                                bytes.fromhex(setup["tip"]))])
    assert batch_check_all(ours) == batch_check_all(theirs)
    assert res.objects == len(entries) and res.deltas > 0
    assert res.written + res.skipped <= res.objects
    assert seen and seen[-1] == ("unpack", res.objects, res.objects)
    assert git("rev-parse", "base", git_dir=ours).strip().decode() == setup["tip"]
    git("fsck", "--full", "--no-dangling", git_dir=ours)


def test_ref_delta_base_missing_from_repo(setup, tmp_path):
    """A thin pack sent to a repository lacking the delta bases: typed error naming the base, nothing written."""
    empty = tmp_path / "empty.git"
    git("init", "-q", "--bare", str(empty))
    before = snapshot_tree(empty)
    with pytest.raises(PackFormatError, match="ref-delta base") as info:
        unpack_objects(Repository.open(empty), setup["packs"]["ref"])
    assert info.value.oid is not None and info.value.offset is not None
    assert {k: v for k, v in snapshot_tree(empty).items() if not k.startswith("packyard/")} == before
    assert not list((empty / "objects").glob("??/*"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "signature", "trailing"])
def test_damaged_pack_rejected_before_writing(setup, damage):
    pack = bytearray(setup["packs"]["ofs"])
    if damage == "truncate":
        pack = pack[: len(pack) // 2]
    elif damage == "flip":
        pack[len(pack) // 3] ^= 0xFF
    elif damage == "signature":
        pack[0:4] = b"KCAP"
    else:
        pack = pack[:-20] + b"junk" + pack[-20:]
    dest = copy_of(setup, f"bad-{damage}.git")
    before = snapshot_tree(dest)
    with pytest.raises(PackFormatError):
        unpack_objects(Repository.open(dest), bytes(pack))
    assert snapshot_tree(dest) == before


def test_pack_too_big_to_explode(setup):
    dest = copy_of(setup, "limit.git")
    with pytest.raises(LimitExceededError):
        unpack_objects(Repository.open(dest), setup["packs"]["ofs"], max_objects=3)
