"""Parity with real git: for every fsck message id packyard carries, a case made by git
(``hash-object --literally``, ``pack-objects``) must get the same verdict from packyard's
index-pack --strict / unpack-objects --strict as from ``git index-pack --strict`` and
``git unpack-objects --strict`` (the same message id when git names one), under git's default
severities and under changed ones; a refusal leaves the repository byte-for-byte unchanged."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsckcases import CASES, CONFIGS, LOWERED, Case, Source, git_verdict, packyard_verdict
from gitutil import git, snapshot_tree
from packyard.store.errors import StoreError
from packyard.store.pack.indexpack import index_pack
from packyard.store.repo import Repository

TOOLS = ("index-pack", "unpack-objects")


def _compare(tmp_path: Path, name: str, config: str | None, *, check_declared: bool) -> None:
    src = Source(tmp_path / "src.git")
    case = CASES[name](src)
    for tool in TOOLS:
        where = tmp_path / f"{tool}-{config or 'default'}"
        where.mkdir()
        g = git_verdict(src, case, tool, where, config)
        p = packyard_verdict(src, case, tool, where, config)
        if check_declared and not (name == "gitmodulesMissing-gitlink"):
            # the case exercises the rule it is named after (git is the judge of that)
            assert g.accepted == case.accepted, (tool, g.text)
            if case.msg_id is not None:
                assert g.msg_id == case.msg_id, (tool, g.text)
        assert p.accepted == g.accepted, (tool, "git:", g.text, "packyard:", p.text)
        if not g.accepted and g.msg_id is not None:
            assert p.msg_id == g.msg_id, (tool, "git:", g.text, "packyard:", p.text)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_verdict_as_git(tmp_path, name):
    _compare(tmp_path, name, CONFIGS.get(name), check_declared=True)


@pytest.mark.parametrize("name", sorted(LOWERED))
def test_same_verdict_as_git_with_changed_severity(tmp_path, name):
    _compare(tmp_path, name, LOWERED[name], check_declared=False)


def test_gitlink_named_gitmodules_index_pack_accepts_unpack_refuses(tmp_path):
    """git's two tools differ here (index-pack prints a missing .gitmodules, unpack-objects refuses): so do we."""
    src = Source(tmp_path / "src.git")
    case = CASES["gitmodulesMissing-gitlink"](src)
    verdicts = {}
    for tool in TOOLS:
        where = tmp_path / tool
        where.mkdir()
        verdicts[tool] = (git_verdict(src, case, tool, where).accepted,
                          packyard_verdict(src, case, tool, where).accepted)
    assert verdicts == {"index-pack": (True, True), "unpack-objects": (False, False)}


def test_skiplist_like_git(tmp_path):
    src = Source(tmp_path / "src.git")
    case = CASES["hasDotgit-ntfs-short"](src)
    skip = tmp_path / "skip"
    skip.write_text(f"# legacy history\n{case.push[-1]}  # the bad tree\n\n")
    for tool in TOOLS:
        where = tmp_path / tool
        where.mkdir()
        g = git_verdict(src, case, tool, where, f"skiplist={skip}")
        p = packyard_verdict(src, case, tool, where, f"skiplist={skip}")
        assert g.accepted and p.accepted, (g.text, p.text)


# ---- property: random well-formed trees and commits, both accept

_names = st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b and b"/" not in b
                                                   and b not in (b".", b".."))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["100644", "100755", "120000", "40000"]), _names), min_size=1,
                max_size=8, unique_by=lambda e: e[1]),
       st.integers(min_value=0, max_value=2 ** 40), st.sampled_from([b"+0000", b"-0730", b"+1400"]))
def test_random_well_formed_history_same_verdict(tmp_path_factory, entries, date, tz):
    from packyard.store.fsck.paths import is_dotgit
    tmp = tmp_path_factory.mktemp("prop")
    src = Source(tmp / "src.git")
    blob, empty = src.blob(b"x\n"), src.tree()
    ents = sorted(((m, n, empty if m == "40000" else blob) for m, n in entries),
                  key=lambda e: e[1] + (b"/" if e[0] == "40000" else b""))
    tree = src.tree(*ents)
    ident = b"A <a@b> %d %s\n" % (date, tz)
    commit = src.put("commit", b"tree " + tree.encode() + b"\nauthor " + ident + b"committer " + ident + b"\nm\n")
    case = Case([blob, empty, tree, commit])
    expect_ok = not any(is_dotgit(n) for _m, n in entries)
    for tool in TOOLS:
        where = tmp / tool
        where.mkdir()
        g = git_verdict(src, case, tool, where)
        p = packyard_verdict(src, case, tool, where)
        assert g.accepted == p.accepted, (g.text, p.text)
        if expect_ok and g.accepted is False:
            assert p.msg_id == g.msg_id


def test_refusal_found_by_a_forked_resolver(tmp_path):
    """Enough deltas for index-pack to resolve in forked processes: the bad tree is a delta resolved by a
    child, whose FsckError (msg id, object, path) crosses the pipe; a .gitmodules blob that is a delta is
    checked late. Same verdicts as git."""
    from packyard.store.pack.indexpack import FORK_MIN_DELTAS

    src = Source(tmp_path / "src.git")
    files = tmp_path / "files"
    files.mkdir()
    body = "".join(f"line {k} of a file that changes a little\n" for k in range(60))
    paths = []
    for i in range(FORK_MIN_DELTAS + 300):
        p = files / f"{i}"
        p.write_text(body + f"version {i}\n")
        paths.append(str(p))
    blobs = git("hash-object", "-w", "--stdin-paths", git_dir=src.path,
                input="\n".join(paths).encode()).decode().split()
    big = [("100644", f"file{k:03}", blobs[k]) for k in range(200)]
    good = src.tree(*big)
    bad_tree = src.tree(*(big[:100] + [("100644", "git~1", blobs[0])] + big[102:]))   # smaller: git deltifies it
    gm_good = src.blob(b'[submodule "a"]\n\tpath = a\n\turl = https://example.com/a.git\n' + body.encode())
    gm_bad = src.blob(b'[submodule "a"]\n\tpath = a\n\turl = --upload-pack=x\n' + body.encode())
    with_gm = src.tree(("100644", ".gitmodules", gm_bad), *big[1:])
    for name, extra, msg_id in (("tree", [good, bad_tree], "hasDotgit"),
                                ("gitmodules", [gm_good, gm_bad, with_gm], "gitmodulesUrl")):
        case = Case(blobs + extra)
        where = tmp_path / name
        where.mkdir()
        (where / "p.pack").write_bytes(src.pack(case.push))
        git("index-pack", str(where / "p.pack"))
        deltas = {ln.split()[0] for ln in git("verify-pack", "-v", str(where / "p.idx")).decode().splitlines()
                  if len(ln.split()) == 7}
        assert (bad_tree if name == "tree" else gm_bad) in deltas     # the bad object is a delta
        g = git_verdict(src, case, "index-pack", where)
        assert not g.accepted and g.msg_id == msg_id, g.text
        repo = Repository.init(where / "py.git")
        before = snapshot_tree(repo.path)
        with pytest.raises(StoreError) as info:
            index_pack(repo, io.BytesIO(src.pack(case.push)), strict=True, processes=2)
        assert getattr(info.value, "msg_id", None) == msg_id, str(info.value)
        assert snapshot_tree(repo.path) == before
        result = index_pack(repo, io.BytesIO(src.pack(blobs + [good, gm_good])), strict=True, processes=2)
        assert result.workers == 2 and result.deltas >= FORK_MIN_DELTAS
