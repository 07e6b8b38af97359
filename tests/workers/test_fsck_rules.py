"""store/fsck beyond index-pack/unpack-objects: write_objects and import_tree check what they receive or
build (verdicts compared with git index-pack --strict on the same objects), the fast tree path agrees with
the exact one, severities parse like git's, and the settings carry them."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsckcases import CASES, Source, git_verdict
from gitutil import git, snapshot_tree
from packyard.store.batch.api import write_objects
from packyard.store.errors import FsckError, StoreError
from packyard.store.fsck import FsckConfigError, FsckOptions, Severity, parse_severities
from packyard.store.fsck.rules import ObjectReport, Refused, check_tree, check_tree_fast
from packyard.store.importtree import import_tree
from packyard.store.objects import ObjectType
from packyard.store.repo import Repository
from packyard.workers.settings import Settings, SettingsError

WRITE_CASES = ["ok-history", "ok-gitmodules", "hasDotgit-trailing-dot", "hasDotgit-hfs-zwnj", "gitmodulesUrl-option",
               "gitmodulesName", "gitmodulesSymlink", "gitmodulesBlob", "zeroPaddedFilemode", "link-file-names-tree",
               "link-commit-tree-is-blob", "ok-mode-100600-badFilemode-info", "badTimezone", "gitmodules-in-repo"]


@pytest.mark.parametrize("name", WRITE_CASES)
def test_write_objects_same_verdict_as_git(tmp_path, name):
    src = Source(tmp_path / "src.git")
    case = CASES[name](src)
    (tmp_path / "oracle").mkdir()
    g = git_verdict(src, case, "index-pack", tmp_path / "oracle")
    repo = Repository.init(tmp_path / "r.git")
    if case.have:
        write_objects(repo, [_read(src, oid) for oid in case.have])
    before = snapshot_tree(repo.path)
    try:
        write_objects(repo, [_read(src, oid) for oid in case.push])
    except StoreError as err:
        assert not g.accepted, (g.text, str(err))
        assert snapshot_tree(repo.path) == before
        if g.msg_id is not None:
            assert getattr(err, "msg_id", None) == g.msg_id, str(err)
    else:
        assert g.accepted, g.text


def _read(src: Source, oid: str) -> tuple[str, bytes]:
    t = git("cat-file", "-t", oid, git_dir=src.path).decode().strip()
    return t, git("cat-file", t, oid, git_dir=src.path)


def test_import_tree_refuses_what_git_refuses(tmp_path):
    repo = Repository.init(tmp_path / "r.git")
    good = tmp_path / "good"
    (good / "lib").mkdir(parents=True)
    (good / ".gitmodules").write_text('[submodule "lib"]\n\tpath = lib\n\turl = https://example.com/lib.git\n')
    (good / "README").write_text("hi\n")
    import_tree(repo, "refs/heads/main", good)
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=repo.path)
    for k, (name, content, msg_id) in enumerate((
            (".gitmodules", '[submodule "../../hooks"]\n\tpath = x\n\turl = ./x\n', "gitmodulesName"),
            (".gitmodules", '[submodule "x"]\n\tpath = x\n\turl = --upload-pack=touch /tmp/x\n', "gitmodulesUrl"),
            ("GITMOD~1", '[submodule "x"]\n\tupdate = !sh\n', "gitmodulesUpdate"),
            ("git~1", "not a repository\n", "hasDotgit"),
            (".git.", "trailing dot\n", "hasDotgit"))):
        bad = tmp_path / f"bad-{k}"
        bad.mkdir()
        (bad / name).write_text(content)
        before = snapshot_tree(repo.path)
        with pytest.raises(FsckError) as info:
            import_tree(repo, "refs/heads/main", bad)
        assert info.value.msg_id == msg_id and info.value.tree_path == name
        assert snapshot_tree(repo.path) == before
    link = tmp_path / "link"
    link.mkdir()
    (link / "target").write_text("x\n")
    (link / ".gitmodules").symlink_to("target")
    with pytest.raises(FsckError) as info:
        import_tree(repo, "refs/heads/main", link)
    assert info.value.msg_id == "gitmodulesSymlink"


# ---- the fast tree path never accepts what the exact check refuses, and gives the same links

def _tree(entries):
    return b"".join(m + b" " + n + b"\0" + o for m, n, o in entries)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"100644", b"100755", b"100664", b"120000", b"40000", b"160000",
                                            b"040000", b"100600", b"644"]),
                          st.sampled_from([b"a", b"b", b"a.c", b"a-", b".", b"..", b".git", b"git~1", b"x/y",
                                           b"zz", b"\xc3\xa9", b".gitmodules", b"GI7EBA~1", b"a\\b",
                                           b"\xe2\x80\x8c.git",
                                           b"g", b"m", b".gitignore", b".mailmap", b".gitattributes", b"~1",
                                           b"x~y", b".git.", b".gitx", b"gitmod~1", b"\xef\xbb\xbf.git"]),
                          st.sampled_from([b"\x11" * 20, b"\0" * 20, b" .git\0" + b"\1" * 14])),
                max_size=6))
def test_fast_tree_path_agrees_with_exact_check(entries):
    data = _tree(entries)
    for allow_664, attrs in ((False, False), (True, False), (False, True), (True, True)):
        fast = check_tree_fast(data, allow_664, attrs)
        if fast is None:
            continue
        # without allow_664 nothing at all may be found, even with badFilemode raised to an error
        opts = FsckOptions() if allow_664 else FsckOptions(severities={"badFilemode": Severity.ERROR})
        rep = ObjectReport(opts, b"\0" * 20)
        try:
            ret, blobs, trees, gitmodules, gitattributes = check_tree(data, rep)
        except Refused:
            pytest.fail("fast path accepted a tree git cannot parse")
        assert ret == 0 and not rep.findings and not gitmodules
        assert allow_664 or not rep.warnings
        assert (sorted(blobs), sorted(trees)) == (sorted(fast[0]), sorted(fast[1]))
        # the .gitattributes blobs to check later: the same ones the exact walk records (none without attrs)
        assert sorted(fast[2]) == (sorted(gitattributes) if attrs else [])


def test_root_tree_with_gitattributes_stays_on_the_fast_path():
    """git.git's root tree holds .gitattributes: with its checks on (git's default) the fast path records the
    blob instead of sending the whole tree to the entry-by-entry rules (35,180 trees of git-v2.0.0 did: the
    strict index-pack took 5.6x git's time); a symlink there is still the exact walk's (gitattributesSymlink)."""
    oid = b"\x07" * 20
    clean = _tree([(b"100644", b".gitattributes", oid), (b"100644", b".gitignore", b"\x08" * 20),
                   (b"40000", b"t", b"\x09" * 20)])
    assert check_tree_fast(clean, attrs=True) == ([oid, b"\x08" * 20], [b"\x09" * 20], [(oid, b".gitattributes")])
    assert check_tree_fast(clean, attrs=False)[2] == []
    link = _tree([(b"120000", b".gitattributes", oid), (b"100644", b"a", b"\x08" * 20)])
    assert check_tree_fast(link, attrs=True) is None and check_tree_fast(link, attrs=False) is None


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([b"A", b" ", b"<", b">", b"a@b", b"0", b"1", b"123", b"9" * 19, b"+", b"-",
                                 b"0000", b"0100", b"\n", b"\0", b"x"]), max_size=12))
def test_fast_ident_agrees_with_exact(parts):
    from packyard.store.fsck.rules import fsck_ident, fsck_ident_exact

    data = b"author " + b"".join(parts) + b"\ncommitter x\n"
    r1, r2 = (ObjectReport(FsckOptions(), b"\1" * 20) for _ in range(2))
    assert fsck_ident(data, 7, r1) == fsck_ident_exact(data, 7, r2)
    assert r1.findings == r2.findings


_tree_bytes = st.lists(st.tuples(st.sampled_from([b"100644", b"100755", b"100664", b"120000", b"40000", b"160000",
                                                   b"040000", b"1006440", b"", b"10064"]),
                                  st.one_of(st.sampled_from([b"a", b"a.c", b"a-", b"b", b".gitignore", b"x~1",
                                                             b"a\\b", b"\xc3\xa9", b"a/b", b"", b".", b"A"]),
                                            st.binary(max_size=4)),
                                  st.one_of(st.just(b"\x11" * 20), st.just(b"\0" * 20), st.binary(min_size=19,
                                                                                                 max_size=21))),
                        max_size=7).map(lambda es: b"".join(m + b" " + n + b"\0" + o for m, n, o in es))


def _sorted_tree(entries):
    uniq = {n: m for m, n in entries}
    es = sorted(((m, n) for n, m in uniq.items()), key=lambda e: e[1] + (b"/" if e[0] == b"40000" else b""))
    return b"".join(m + b" " + n + b"\0" + bytes([len(n)]) * 20 for m, n in es)


_sorted_trees = st.lists(st.tuples(st.sampled_from([b"100644", b"40000", b"160000", b"120000", b"100664"]),
                                   st.one_of(st.sampled_from([b"a", b"a.c", b"a-b", b"ab", b".gitignore", b".mailmap",
                                                              b"x~1", b"git~1", b".git", b"\xe2\x80\x8c.git",
                                                              b".gitattributes", b"gitatt~1", b".GitAttributes"]),
                                             st.binary(min_size=1, max_size=3).filter(
                                                 lambda b: b"\0" not in b and b"/" not in b))),
                         max_size=8).map(_sorted_tree)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(_tree_bytes, _sorted_trees, st.binary(max_size=80)), st.booleans(), st.booleans())
def test_tree_scan_c_same_as_python(data, allow_664, attrs):
    from packyard.store.fsck import rules

    if rules._C is None:
        pytest.skip("C tree scan not built (or PACKYARD_PURE_PYTHON=1)")
    got = rules.check_tree_fast(data, allow_664, attrs)
    assert got == rules.check_tree_fast_py(data, allow_664, attrs)
    # the file and directory named alike, apart: a duplicate both must see
    if got is not None:
        dup = _sorted_tree([(b"100644", b"n"), (b"100644", b"n.c")]) + b"40000 n\0" + b"\2" * 20
        assert rules.check_tree_fast(dup) is None and rules.check_tree_fast_py(dup) is None


def test_severity_syntax_like_git():
    sev, skip = parse_severities("zeroPaddedFilemode=ignore,badTimezone:warn missingemail=error|skiplist=/x")
    assert sev == {"zeroPaddedFilemode": Severity.IGNORE, "badTimezone": Severity.WARN,
                   "missingEmail": Severity.ERROR} and skip == "/x"
    for bad, text in (("nulInHeader=warn", "Cannot demote"), ("noSuchThing=error", "Unhandled message id"),
                      ("badDate=fatal", "Unknown fsck message type"), ("badDate", "Missing '='")):
        with pytest.raises(FsckConfigError, match=text):
            parse_severities(bad)
    opts = FsckOptions()
    assert opts.refuses("hasDotgit") and not opts.refuses("badFilemode")          # strict: WARN -> ERROR
    assert not FsckOptions(strict=False).refuses("hasDotgit")
    assert not FsckOptions.from_config("hasDotgit=warn").refuses("hasDotgit")


def test_settings_carry_fsck(tmp_path):
    s = Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path)})
    assert s.receive_fsck and s.fsck_options == FsckOptions()
    skip = tmp_path / "skip"
    skip.write_text("# legacy\n" + "ab" * 20 + "\n")
    env = {"PACKYARD_STATE_DIR": str(tmp_path), "PACKYARD_RECEIVE_FSCK": "0",
           "PACKYARD_FSCK": "zeroPaddedFilemode=ignore,badTimezone=ignore", "PACKYARD_FSCK_SKIPLIST": str(skip)}
    s = Settings.from_env(env)
    assert not s.receive_fsck and s.fsck_options.skiplist == {bytes.fromhex("ab" * 20)}
    assert not s.fsck_options.refuses("zeroPaddedFilemode") and s.fsck_options.refuses("hasDotgit")
    back = Settings.from_env(s.as_env())
    assert (back.receive_fsck, back.fsck, back.fsck_skiplist) == (s.receive_fsck, s.fsck, s.fsck_skiplist)
    for bad in ({"PACKYARD_FSCK": "hasDotgit=maybe"}, {"PACKYARD_FSCK_SKIPLIST": str(tmp_path / "none")},
                {"PACKYARD_RECEIVE_FSCK": "perhaps"}):
        with pytest.raises(SettingsError):
            Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path), **bad})
    skip.write_text("not-an-id\n")
    with pytest.raises(SettingsError, match="line 1"):
        Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path), "PACKYARD_FSCK_SKIPLIST": str(skip)})


def test_typed_error_fields_survive_a_resolver_process():
    from packyard.store.forked import error_from_tuple, error_tuple
    from packyard.store.fsck import fsck_error

    err = fsck_error(b"\x01" * 20, "hasDotgit", "contains '.git'", "git~1", path="push.pack", offset=12)
    assert str(err).startswith("01" * 20 + ": hasDotgit: contains '.git' [path git~1]")
    back = error_from_tuple(error_tuple(err))     # what a forked resolver sends its parent
    assert isinstance(back, FsckError) and str(back) == str(err)
    assert (back.msg_id, back.tree_path, back.oid, back.offset) == ("hasDotgit", "git~1", "01" * 20, 12)
    assert ObjectType.TREE == 2
