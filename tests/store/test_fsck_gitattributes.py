"""The .gitattributes checks git added in 2.39.1 (gitattributesLineLength, gitattributesLarge,
gitattributesBlob, gitattributesMissing; fsck.c's fsck_blob / fsck_finish, attr.h's ATTR_MAX_LINE_LENGTH
2048 and ATTR_MAX_FILE_SIZE 100 MiB): the same verdict as git (2.39.5 here) by default and lowered, on
index-pack and unpack-objects, with the C and the Python tree scans; the cases git cannot be made to
show (a missing blob beside a missing link, a 100 MiB blob) through the batch check. The one-per-id
parity cases are in tests/fsckcases.py (test_fsck_parity.py runs them)."""
from __future__ import annotations

import pytest

from fsckcases import Case, Source, git_verdict, packyard_refusal
from gitutil import snapshot_tree
from packyard.store.errors import FsckError
from packyard.store.fsck import FsckOptions, checker, rules
from packyard.store.objects import ObjectType
from packyard.store.repo import Repository

LOWERED = ("gitattributesLineLength=ignore,gitattributesLarge=ignore,gitattributesBlob=ignore,"
           "gitattributesMissing=ignore")
LONG = b"*.c " + b"x" * 2044 + b"\n"          # a line of 2,048 bytes: too long for later git
SHORT = b"*.c " + b"x" * 2043 + b"\n"         # 2,047: the longest it parses


def _case(src: Source, name: str, data: bytes | None, *, mode: str = "100644") -> Case:
    """A commit over a tree whose entry ``name`` holds ``data`` (a blob), or an empty tree (None)."""
    obj = src.blob(data) if data is not None else src.tree()
    entries = [(mode, "README", src.blob(b"readme\n")), (mode if data is not None else "40000", name, obj)]
    entries.sort(key=lambda e: e[1] + ("/" if e[0] == "40000" else ""))     # git's tree order
    root = src.tree(*entries)
    commit = src.commit(root)
    return Case([obj, src.blob(b"readme\n"), root, commit])


def _ours(tmp_path, src: Source, case: Case, tool: str, config: str | None):
    err = packyard_refusal(src, case, tool, tmp_path / f"py-{tool}-{config is not None}.git", config)
    assert err is None or isinstance(err, FsckError), err
    return err


@pytest.fixture(params=["c", "python"])
def scan(request, monkeypatch):
    """Both tree scans: the C fast path and its Python specification."""
    if request.param == "python":
        monkeypatch.setattr(rules, "_C", None)
    elif rules._C is None:
        pytest.skip("the _fsck extension is not built (or PACKYARD_PURE_PYTHON=1)")
    return request.param


@pytest.mark.parametrize("name", [".gitattributes", ".GitAttributes", "GITATT~1", "gi7d29~1"])
@pytest.mark.parametrize("tool", ["index-pack", "unpack-objects"])
def test_long_line_refused_as_git_does_and_accepted_when_lowered(tmp_path, scan, tool, name):
    src = Source(tmp_path / "src.git")
    case = _case(src, name, LONG)
    for config in (None, LOWERED):
        where = tmp_path / f"git-{config is None}"
        where.mkdir()
        g = git_verdict(src, case, tool, where, config)
        err = _ours(tmp_path / f"ours-{config is None}", src, case, tool, config)
        assert (err is None) == g.accepted, (config, g.text, err)
        if config is None:
            assert g.msg_id == "gitattributesLineLength", g.text
            assert err.msg_id == "gitattributesLineLength"
            assert str(err).startswith(f"{case.push[0]}: gitattributesLineLength: .gitattributes has too long lines")
            assert f"[path {name}]" in str(err)


@pytest.mark.parametrize("tool", ["index-pack", "unpack-objects"])
def test_lines_git_parses_are_accepted(tmp_path, scan, tool):
    src = Source(tmp_path / "src.git")
    for i, data in enumerate((SHORT * 3, b"*.c text\n" + b"\0" + b"y" * 3000,   # git's scan stops at a NUL
                              b"", b"x" * 2047)):
        case = _case(src, ".gitattributes", data)
        (tmp_path / f"{i}").mkdir()
        assert git_verdict(src, case, tool, tmp_path / f"{i}").accepted, data[:20]
        assert _ours(tmp_path / f"{i}", src, case, tool, None) is None, data[:20]


@pytest.mark.parametrize("tool", ["index-pack", "unpack-objects"])
def test_a_tree_at_gitattributes_is_refused_as_git_does(tmp_path, scan, tool):
    src = Source(tmp_path / "src.git")
    case = _case(src, ".gitattributes", None)
    (tmp_path / "git").mkdir()
    g = git_verdict(src, case, tool, tmp_path / "git")
    err = _ours(tmp_path, src, case, tool, None)
    assert not g.accepted and g.msg_id == "gitattributesBlob", g.text
    assert err is not None and err.msg_id == "gitattributesBlob" and "non-blob found at .gitattributes" in str(err)
    assert _ours(tmp_path / "lowered", src, case, tool, LOWERED) is None


def test_a_symlink_at_gitattributes_is_not_a_blob_check(tmp_path, scan):
    """git: a symlink is reported as gitattributesSymlink (INFO), its target never parsed as attributes."""
    src = Source(tmp_path / "src.git")
    case = _case(src, ".gitattributes", LONG, mode="120000")
    (tmp_path / "git").mkdir()
    assert git_verdict(src, case, "index-pack", tmp_path / "git").accepted
    assert _ours(tmp_path, src, case, "index-pack", None) is None


def test_missing_and_large_blobs_in_a_written_batch(monkeypatch):
    """write_objects / import_tree's check (check_batch): a .gitattributes blob nowhere is
    gitattributesMissing (when links may point outside the batch); a blob over ATTR_MAX_FILE_SIZE is
    gitattributesLarge (the size lowered here: 100 MiB objects do not belong in a unit test)."""
    opts = FsckOptions()
    blob = b"*.c text\n"
    blob_id = bytes.fromhex("a" * 40)
    tree = b"100644 .gitattributes\0" + blob_id

    def nothing(oid):
        return None

    with pytest.raises(FsckError) as got:
        checker.check_batch([(int(ObjectType.TREE), tree, b"t" * 20)], opts, nothing, nothing, require_links=False)
    assert got.value.msg_id == "gitattributesMissing"
    # all four lowered: nothing recorded, nothing to say
    checker.check_batch([(int(ObjectType.TREE), tree, b"t" * 20)], FsckOptions.from_config(LOWERED), nothing,
                        nothing, require_links=False)
    monkeypatch.setattr(rules, "ATTR_MAX_FILE_SIZE", len(blob) - 1)
    with pytest.raises(FsckError) as got:
        checker.check_batch([(int(ObjectType.TREE), tree, b"t" * 20), (int(ObjectType.BLOB), blob, blob_id)],
                            opts, nothing, nothing, require_links=True)
    assert got.value.msg_id == "gitattributesLarge"


def test_findings_table():
    f = rules.gitattributes_findings
    assert f(b"") == [] and f(SHORT) == [] and f(b"a\n" * 5000) == []
    assert f(LONG) == [("gitattributesLineLength", ".gitattributes has too long lines to parse")]
    assert f(b"ok\n" + b"z" * 2048) == f(LONG)                 # the last line, without a newline
    assert f(b"ok\0" + b"z" * 5000) == []                        # after a NUL git reads no further


@pytest.mark.parametrize("size_over", [1, 50_000])
def test_import_of_a_huge_gitattributes_reads_one_byte_past_the_limit(tmp_path, monkeypatch, size_over):
    """import_tree checks a .gitattributes it streams into the batch (a file over large_file_threshold):
    over ATTR_MAX_FILE_SIZE it is gitattributesLarge, decided on limit + 1 bytes read, never the whole
    file (the limit lowered here, as above); the repository stays as it was; under it, it imports."""
    from packyard.store import importtree
    from packyard.store.importtree import Identity, import_tree

    limit = 4096
    monkeypatch.setattr(rules, "ATTR_MAX_FILE_SIZE", limit)
    reads: list[int] = []
    real_read = importtree.os.read

    def counting_read(fd, n):
        reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(importtree.os, "read", counting_read)
    src = tmp_path / "src"
    src.mkdir()
    (src / ".gitattributes").write_bytes(b"*.c text\n" * ((limit + size_over) // 9 + 1))
    repo = Repository.init(tmp_path / "r.git")
    before = snapshot_tree(repo.path)
    who = Identity(name="A", email="a@example.com", when=1700000000)
    with pytest.raises(FsckError) as got:
        import_tree(repo, "refs/heads/main", src, author=who, large_file_threshold=1024)
    assert got.value.msg_id == "gitattributesLarge"
    size = (src / ".gitattributes").stat().st_size
    assert limit + 1 in reads and size + 1 not in reads, reads   # the check's read stops past the limit
    assert snapshot_tree(repo.path) == before
    (src / ".gitattributes").write_bytes(b"*.c text\n" * (limit // 9))          # under the limit
    import_tree(repo, "refs/heads/main", src, author=who, large_file_threshold=100)
