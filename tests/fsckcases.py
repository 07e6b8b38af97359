"""fsck parity cases: hand-written objects made by real git (``hash-object --literally``), packed by
``git pack-objects``, and the verdicts of ``git index-pack --strict`` / ``git unpack-objects --strict``
next to packyard's. Shared by tests/store/test_fsck_parity.py and tests/workers/test_fsck_rules.py."""
from __future__ import annotations

import io
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gitutil import GIT_ENV, git
from packyard.store.errors import StoreError

ZERO = "0" * 40
AUTHOR = b"author A U Thor <a@example.com> 1700000000 +0000\n"
COMMITTER = b"committer C O Mitter <c@example.com> 1700000000 +0000\n"
_ERR = re.compile(rb"error: object [0-9a-f]{40}: ([A-Za-z0-9]+): ")


class Source:
    """A scratch bare repository where objects are written literally and packed by git."""

    def __init__(self, path: Path) -> None:
        self.path = path
        git("init", "-q", "--bare", str(path))

    def put(self, typ: str, data: bytes) -> str:
        return git("hash-object", "--literally", "-t", typ, "-w", "--stdin", git_dir=self.path,
                   input=data).decode().strip()

    def blob(self, data: bytes = b"hello\n") -> str:
        return self.put("blob", data)

    def tree(self, *entries: tuple[str | bytes, str | bytes, str]) -> str:
        return self.put("tree", tree_bytes(*entries))

    def commit(self, tree: str, *, parents: tuple[str, ...] = (), extra: bytes = b"", body: bytes = b"msg\n") -> str:
        head = b"tree " + tree.encode() + b"\n" + b"".join(b"parent " + p.encode() + b"\n" for p in parents)
        return self.put("commit", head + AUTHOR + COMMITTER + extra + b"\n" + body)

    def pack(self, oids: list[str]) -> bytes:
        return git("pack-objects", "-q", "--stdout", git_dir=self.path, input="".join(o + "\n" for o in oids).encode())


def tree_bytes(*entries: tuple[str | bytes, str | bytes, str]) -> bytes:
    out = b""
    for mode, name, oid in entries:
        m = mode.encode() if isinstance(mode, str) else mode
        n = name.encode() if isinstance(name, str) else name
        out += m + b" " + n + b"\0" + bytes.fromhex(oid)
    return out


@dataclass
class Case:
    """``push``: ids packed and pushed; ``have``: ids already in the receiving repository."""
    push: list[str]
    have: list[str] = field(default_factory=list)
    msg_id: str | None = None          # the id git reports (None: git refuses without an fsck id, or accepts)
    accepted: bool = False


@dataclass
class Verdict:
    accepted: bool
    msg_id: str | None
    text: str = ""


def git_verdict(src: Source, case: Case, tool: str, where: Path, config: str | None = None) -> Verdict:
    """``git index-pack --strict[=config] --stdin`` or ``git unpack-objects --strict[=config]`` in a fresh
    bare repository holding ``case.have``."""
    dest = where / f"git-{tool}.git"
    git("init", "-q", "--bare", str(dest))
    if case.have:
        git("unpack-objects", "-q", git_dir=dest, input=src.pack(case.have))
    flag = "--strict" if config is None else f"--strict={config}"
    cmd = ["git", "--git-dir", str(dest), tool, flag] + (["--stdin"] if tool == "index-pack" else ["-q"])
    proc = subprocess.run(cmd, input=src.pack(case.push), capture_output=True, env={**os.environ, **GIT_ENV})
    m = _ERR.search(proc.stderr)
    return Verdict(proc.returncode == 0, m.group(1).decode() if m else None, proc.stderr.decode("utf-8", "replace"))


def packyard_refusal(src: Source, case: Case, tool: str, dest: Path, config: str | None = None) -> StoreError | None:
    """packyard's ``index_pack`` / ``unpack_objects`` with ``strict=True`` (and the severities of ``config``) of
    ``case.push`` into a new repository at ``dest`` holding ``case.have``: the error it refused the push with (a
    refusal must leave the repository byte-for-byte unchanged: asserted), or None when it took the push."""
    from gitutil import snapshot_tree
    from packyard.store.fsck import FsckOptions
    from packyard.store.pack.indexpack import index_pack
    from packyard.store.pack.unpack import unpack_objects
    from packyard.store.repo import Repository

    dest.parent.mkdir(parents=True, exist_ok=True)
    repo = Repository.init(dest)
    if case.have:
        index_pack(repo, io.BytesIO(src.pack(case.have)))
    opts = FsckOptions.from_config(config) if config else None
    pack = src.pack(case.push)
    before = snapshot_tree(repo.path)
    try:
        if tool == "index-pack":
            index_pack(repo, io.BytesIO(pack), strict=True, fsck=opts)
        else:
            unpack_objects(repo, pack, strict=True, fsck=opts)
    except StoreError as err:
        assert snapshot_tree(repo.path) == before, "a refused push left something behind"
        return err
    return None


def packyard_verdict(src: Source, case: Case, tool: str, where: Path, config: str | None = None) -> Verdict:
    """``packyard_refusal`` in ``where/py-<tool>.git`` as a Verdict beside ``git_verdict``'s."""
    err = packyard_refusal(src, case, tool, where / f"py-{tool}.git", config)
    return Verdict(True, None) if err is None else Verdict(False, getattr(err, "msg_id", None), str(err))


CaseFn = Callable[[Source], Case]


def _tree_case(*entries, msg_id=None, accepted=False, extra_push=()) -> CaseFn:
    """A tree of ``entries`` (``"B"`` stands for a pushed blob, ``"T"`` for a pushed empty tree)."""
    def make(src: Source) -> Case:
        b, t = src.blob(), src.tree()
        ents = [(m, n, {"B": b, "T": t}.get(o, o)) for m, n, o in entries]
        return Case([b, t, src.tree(*ents), *extra_push], msg_id=msg_id, accepted=accepted)
    return make


def _commit_case(raw: Callable[[str], bytes], msg_id=None, accepted=False) -> CaseFn:
    def make(src: Source) -> Case:
        t = src.tree()
        return Case([t, src.put("commit", raw(t))], msg_id=msg_id, accepted=accepted)
    return make


def _head(t: str) -> bytes:
    return b"tree " + t.encode() + b"\n"


def _tag_case(raw: Callable[[str], bytes], msg_id=None, accepted=False) -> CaseFn:
    def make(src: Source) -> Case:
        b = src.blob()
        return Case([b, src.put("tag", raw(b))], msg_id=msg_id, accepted=accepted)
    return make


TAGGER = b"tagger T A Gger <t@example.com> 1700000000 +0000\n"


def _obj(b: str) -> bytes:
    return b"object " + b.encode() + b"\n"


def _gitmodules_case(content: bytes, msg_id=None, accepted=False, name=".gitmodules", mode="100644",
                     in_repo=False) -> CaseFn:
    def make(src: Source) -> Case:
        gm = src.blob(content)
        t = src.tree((mode, name, gm))
        if in_repo:
            return Case([t], have=[gm], msg_id=msg_id, accepted=accepted)
        return Case([gm, t], msg_id=msg_id, accepted=accepted)
    return make


#: a .gitattributes line of 2,048 bytes: git 2.39.1+ refuses it (attr.h ATTR_MAX_LINE_LENGTH)
LONG_ATTRIBUTES = b"*.c " + b"x" * 2044 + b"\n"

GOOD_GITMODULES = b'[submodule "lib"]\n\tpath = lib\n\turl = https://example.com/lib.git\n\tupdate = rebase\n'


def _gm(key: str, value: str, name: str = "x") -> bytes:
    return f'[submodule "{name}"]\n\tpath = x\n\t{key} = {value}\n'.encode()


def _symlink_to_gitmodules_blob(src: Source) -> Case:
    gm = src.blob(b"target")
    return Case([gm, src.tree(("120000", ".gitmodules", gm))], msg_id="gitmodulesSymlink")


def _gitmodules_tree(src: Source) -> Case:
    inner = src.tree(("100644", "a", src.blob()))
    return Case([src.blob(), inner, src.tree(("40000", ".gitmodules", inner))], msg_id="gitmodulesBlob")


def _gitmodules_gitlink(src: Source) -> Case:
    # a gitlink named .gitmodules to a commit nobody has: index-pack prints it, unpack-objects refuses
    return Case([src.tree(("160000", ".gitmodules", "1" * 40))], msg_id=None)


def _entry_names_tree(src: Source) -> Case:
    """a 100644 entry that names a tree (the link's type is wrong)."""
    inner = src.tree(("100644", "a", src.blob()))
    return Case([src.blob(), inner, src.tree(("100644", "f", inner))])


def _entry_names_tree_in_repo(src: Source) -> Case:
    inner = src.tree(("100644", "a", src.blob()))
    return Case([src.tree(("100644", "f", inner))], have=[src.blob(), inner])


def _dir_names_blob(src: Source) -> Case:
    b = src.blob()
    return Case([b, src.tree(("40000", "d", b))])


def _commit_tree_is_blob(src: Source) -> Case:
    b = src.blob()
    return Case([b, src.put("commit", _head(b) + AUTHOR + COMMITTER + b"\nmsg\n")])


def _commit_tree_is_blob_in_repo(src: Source) -> Case:
    b = src.blob(b"in the repository\n")
    return Case([src.put("commit", _head(b) + AUTHOR + COMMITTER + b"\nmsg\n")], have=[b])


def _parent_is_tree(src: Source) -> Case:
    t = src.tree()
    return Case([t, src.put("commit", _head(t) + b"parent " + t.encode() + b"\n" + AUTHOR + COMMITTER + b"\nm\n")])


def _tag_type_lies(src: Source) -> Case:
    b = src.blob()
    return Case([b, src.put("tag", _obj(b) + b"type commit\ntag v1\n" + TAGGER + b"\nm\n")])


def _history(src: Source) -> Case:
    """An ordinary history: two commits, nested trees, an annotated tag, a well-formed .gitmodules."""
    b1, b2 = src.blob(b"one\n"), src.blob(b"two\n")
    gm = src.blob(GOOD_GITMODULES)
    sub = src.tree(("100644", "a.c", b1), ("120000", "link", b1), ("100755", "run", b2))
    root = src.tree(("100644", ".gitmodules", gm), ("100644", "README", b1), ("40000", "dir", sub),
                    ("160000", "lib", "2" * 40))
    c1 = src.commit(root)
    root2 = src.tree(("100644", ".gitmodules", gm), ("100644", "README", b2), ("40000", "dir", sub),
                     ("160000", "lib", "2" * 40))
    c2 = src.commit(root2, parents=(c1,))
    tag = src.put("tag", _obj(c2) + b"type commit\ntag v1.0\n" + TAGGER + b"\nrelease\n")
    return Case([b1, b2, gm, sub, root, c1, root2, c2, tag], accepted=True)


def _bad_gitmodules_in_repo(src: Source) -> Case:
    """The .gitmodules blob is already in the repository; only the tree naming it is pushed."""
    return _gitmodules_case(_gm("url", "--upload-pack=touch /tmp/pwned"), "gitmodulesUrl", in_repo=True)(src)


CASES: dict[str, CaseFn] = {
    # ---- controls: both accept
    "ok-history": _history,
    "ok-gitmodules": _gitmodules_case(GOOD_GITMODULES, accepted=True),
    "ok-gitmodules-relative-url": _gitmodules_case(_gm("url", "../sibling.git"), accepted=True),
    "ok-mode-100664": _tree_case(("100664", "old", "B"), msg_id=None, accepted=True),
    "ok-mode-100600-badFilemode-info": _tree_case(("100600", "old", "B"), accepted=True),
    "ok-mode-100000-badFilemode-info": _tree_case(("100000", "weird", "B"), accepted=True),
    "ok-gitignore-symlink-info": _tree_case(("120000", ".gitignore", "B"), accepted=True),
    "ok-gitattributes-symlink-info": _tree_case(("120000", ".gitattributes", "B"), accepted=True),
    "ok-mailmap-symlink-info": _tree_case(("120000", ".mailmap", "B"), accepted=True),
    "ok-gitmodules-parse-info": _gitmodules_case(b"[submodule\n", accepted=True),
    "ok-tag-no-tagger-info": _tag_case(lambda b: _obj(b) + b"type blob\ntag v1\n\nold style tag\n", accepted=True),
    "ok-bad-tag-name-info": _tag_case(lambda b: _obj(b) + b"type blob\ntag a..b\n" + TAGGER + b"\nm\n",
                                      accepted=True),
    "ok-extra-header-ignored": _tag_case(lambda b: _obj(b) + b"type blob\ntag v1\n" + TAGGER + b"x y\n\nm\n",
                                         accepted=True),
    "ok-gitmodules-dotted-name": _gitmodules_case(_gm("url", "./a", name="a..b"), accepted=True),
    "ok-dotgit-prefix": _tree_case(("100644", ".gitx", "B"), ("100644", "git~2", "B"), ("100644", "xgit~1", "B"),
                                   accepted=True),
    # ---- tree names: hasDotgit in every spelling git knows
    "hasDotgit": _tree_case(("100644", ".git", "B"), msg_id="hasDotgit"),
    "hasDotgit-upper": _tree_case(("40000", ".GIT", "T"), msg_id="hasDotgit"),
    "hasDotgit-ntfs-short": _tree_case(("40000", "git~1", "T"), msg_id="hasDotgit"),
    "hasDotgit-ntfs-short-upper": _tree_case(("100644", "GIT~1", "B"), msg_id="hasDotgit"),
    "hasDotgit-trailing-dot": _tree_case(("100644", ".git.", "B"), msg_id="hasDotgit"),
    "hasDotgit-trailing-space": _tree_case(("100644", ".git ", "B"), msg_id="hasDotgit"),
    "hasDotgit-trailing-dots-spaces": _tree_case(("100644", ".git . .", "B"), msg_id="hasDotgit"),
    "hasDotgit-ntfs-stream": _tree_case(("100644", ".git::$INDEX_ALLOCATION", "B"), msg_id="hasDotgit"),
    "hasDotgit-hfs-zwnj": _tree_case(("100644", ".g\u200cit".encode(), "B"), msg_id="hasDotgit"),
    "hasDotgit-hfs-leading-ignorable": _tree_case(("100644", "\u200e.git".encode(), "B"), msg_id="hasDotgit"),
    "hasDotgit-hfs-bom": _tree_case(("100644", ".gi\ufefft".encode(), "B"), msg_id="hasDotgit"),
    "hasDotgit-backslash": _tree_case(("100644", b"a\\.git", "B"), msg_id="hasDotgit"),
    "hasDotgit-backslash-short": _tree_case(("100644", b"x\\git~1\\y", "B"), msg_id="hasDotgit"),
    "hasDot": _tree_case(("100644", ".", "B"), msg_id="hasDot"),
    "hasDotdot": _tree_case(("40000", "..", "T"), msg_id="hasDotdot"),
    "fullPathname": _tree_case(("100644", "a/b", "B"), msg_id="fullPathname"),
    "nullSha1": _tree_case(("100644", "a", ZERO), msg_id="nullSha1"),
    "zeroPaddedFilemode": _tree_case(("040000", "d", "T"), msg_id="zeroPaddedFilemode"),
    "zeroPaddedFilemode-file": _tree_case(("0100644", "f", "B"), msg_id="zeroPaddedFilemode"),
    "duplicateEntries": _tree_case(("100644", "a", "B"), ("100644", "a", "B"), msg_id="duplicateEntries"),
    "duplicateEntries-file-dir": _tree_case(("100644", "a", "B"), ("100644", "a.c", "B"), ("40000", "a", "T"),
                                            msg_id="duplicateEntries"),
    "treeNotSorted": _tree_case(("100644", "b", "B"), ("100644", "a", "B"), msg_id="treeNotSorted"),
    "treeNotSorted-dir-slash": _tree_case(("40000", "a", "T"), ("100644", "a.c", "B"), msg_id="treeNotSorted"),
    "badFilemode-raised": _tree_case(("100600", "f", "B"), msg_id="badFilemode"),   # run with badFilemode=error
    # ---- .gitmodules under every name git treats as it
    "gitmodulesSymlink": _symlink_to_gitmodules_blob,
    "gitmodulesSymlink-ntfs-short": _tree_case(("120000", "GITMOD~1", "B"), msg_id="gitmodulesSymlink"),
    "gitmodulesSymlink-ntfs-fallback": _tree_case(("120000", "gi7eba~9", "B"), msg_id="gitmodulesSymlink"),
    "gitmodulesSymlink-hfs": _tree_case(("120000", ".gitmodules\u200d".encode(), "B"), msg_id="gitmodulesSymlink"),
    "gitmodulesBlob": _gitmodules_tree,
    "gitmodulesMissing-gitlink": _gitmodules_gitlink,
    "gitmodulesName": _gitmodules_case(_gm("url", "./x", name="../../hooks"), "gitmodulesName"),
    "gitmodulesName-backslash": _gitmodules_case(_gm("url", "./x", name="a\\\\..\\\\b"), "gitmodulesName"),
    "gitmodulesUrl-option": _gitmodules_case(_gm("url", "--upload-pack=touch /tmp/pwned"), "gitmodulesUrl"),
    "gitmodulesUrl-encoded-newline": _gitmodules_case(_gm("url", "./%0ahost=example.com"), "gitmodulesUrl"),
    "gitmodulesUrl-git-newline": _gitmodules_case(_gm("url", "git://example.com/%0a"), "gitmodulesUrl"),
    "gitmodulesUrl-dotdot-colon": _gitmodules_case(_gm("url", "../../:example.com/x"), "gitmodulesUrl"),
    "gitmodulesUrl-http-newline": _gitmodules_case(_gm("url", "https://example.com/%0apath"), "gitmodulesUrl"),
    "gitmodulesUrl-http-no-host": _gitmodules_case(_gm("url", "https:///example.com/x"), "gitmodulesUrl"),
    "gitmodulesUrl-curl-scheme": _gitmodules_case(_gm("url", "http::https:///x"), "gitmodulesUrl"),
    "gitmodulesPath": _gitmodules_case(b'[submodule "x"]\n\tpath = --output=foo\n\turl = ./x\n', "gitmodulesPath"),
    "gitmodulesUpdate": _gitmodules_case(_gm("update", "!rm -rf /"), "gitmodulesUpdate"),
    "gitmodules-ntfs-short-name": _gitmodules_case(_gm("url", "--upload-pack=x"), "gitmodulesUrl",
                                                   name="GITMOD~1"),
    "gitmodules-ntfs-fallback-name": _gitmodules_case(_gm("url", "--upload-pack=x"), "gitmodulesUrl",
                                                      name="gi7eba~1"),
    "gitmodules-ntfs-trailing": _gitmodules_case(_gm("url", "--upload-pack=x"), "gitmodulesUrl",
                                                 name=".gitmodules . "),
    "gitmodules-hfs-name": _gitmodules_case(_gm("url", "--upload-pack=x"), "gitmodulesUrl",
                                            name=".giTmodu\u200cles"),
    "gitmodules-old-style-section": _gitmodules_case(b"[submodule.x]\n\turl = --upload-pack=x\n", "gitmodulesUrl"),
    "gitmodules-in-repo": _bad_gitmodules_in_repo,
    # ---- .gitattributes (git 2.39.1+): a blob found at the name is checked like .gitmodules
    "gitattributesLineLength": _gitmodules_case(LONG_ATTRIBUTES, "gitattributesLineLength", name=".gitattributes"),
    "gitattributesLineLength-last-line": _gitmodules_case(b"*.c text\n" + b"y" * 2048, "gitattributesLineLength",
                                                          name=".gitattributes"),
    "gitattributesLineLength-ntfs-short": _gitmodules_case(LONG_ATTRIBUTES, "gitattributesLineLength",
                                                           name="GITATT~1"),
    "gitattributesLineLength-ntfs-fallback": _gitmodules_case(LONG_ATTRIBUTES, "gitattributesLineLength",
                                                              name="gi7d29~3"),
    "gitattributesLineLength-hfs": _gitmodules_case(LONG_ATTRIBUTES, "gitattributesLineLength",
                                                    name=".gitAttributes\u200c"),
    "gitattributesLineLength-in-repo": _gitmodules_case(LONG_ATTRIBUTES, "gitattributesLineLength",
                                                        name=".gitattributes", in_repo=True),
    "gitattributesBlob": lambda src: Case(
        [src.blob(), src.tree(("100644", "a", src.blob())),
         src.tree(("40000", ".gitattributes", src.tree(("100644", "a", src.blob()))))], msg_id="gitattributesBlob"),
    "ok-gitattributes-longest-line": _gitmodules_case(b"*.c " + b"x" * 2043 + b"\n", accepted=True,
                                                      name=".gitattributes"),
    "ok-gitattributes-long-after-nul": _gitmodules_case(b"*.c text\n\0" + b"y" * 3000, accepted=True,
                                                        name=".gitattributes"),
    "ok-gitattributes-long-line-elsewhere": _gitmodules_case(LONG_ATTRIBUTES, accepted=True, name="gitattributes"),
    # ---- link types
    "link-file-names-tree": _entry_names_tree,
    "link-file-names-tree-in-repo": _entry_names_tree_in_repo,
    "link-dir-names-blob": _dir_names_blob,
    "link-commit-tree-is-blob": _commit_tree_is_blob,
    "link-commit-tree-is-blob-in-repo": _commit_tree_is_blob_in_repo,
    "link-parent-is-tree": _parent_is_tree,
    "link-tag-type-lies": _tag_type_lies,
    # ---- commits
    "missingAuthor": _commit_case(lambda t: _head(t) + COMMITTER + b"\nm\n", "missingAuthor"),
    "multipleAuthors": _commit_case(lambda t: _head(t) + AUTHOR + AUTHOR + COMMITTER + b"\nm\n", "multipleAuthors"),
    "missingCommitter": _commit_case(lambda t: _head(t) + AUTHOR + b"\nm\n", "missingCommitter"),
    "missingTree": _commit_case(lambda t: AUTHOR + COMMITTER + b"\nm\n"),
    "badTreeSha1": _commit_case(lambda t: b"tree " + b"z" * 40 + b"\n" + AUTHOR + COMMITTER + b"\nm\n"),
    "badParentSha1": _commit_case(lambda t: _head(t) + b"parent 123\n" + AUTHOR + COMMITTER + b"\nm\n"),
    "badDate": _commit_case(lambda t: _head(t) + b"author A <a@b> notadate +0000\n" + COMMITTER + b"\nm\n",
                            "badDate"),
    "badDateOverflow": _commit_case(lambda t: _head(t) + b"author A <a@b> 99999999999999999999 +0000\n"
                                    + COMMITTER + b"\nm\n", "badDateOverflow"),
    "badEmail": _commit_case(lambda t: _head(t) + b"author A <a<b> 1 +0000\n" + COMMITTER + b"\nm\n", "badEmail"),
    "badName": _commit_case(lambda t: _head(t) + b"author A>b <a@b> 1 +0000\n" + COMMITTER + b"\nm\n", "badName"),
    "badTimezone": _commit_case(lambda t: _head(t) + b"author A <a@b> 1 +00000\n" + COMMITTER + b"\nm\n",
                                "badTimezone"),
    "badTimezone-letters": _commit_case(lambda t: _head(t) + AUTHOR + b"committer C <c@d> 1 +0a00\n\nm\n",
                                        "badTimezone"),
    "missingEmail": _commit_case(lambda t: _head(t) + b"author A 1 +0000\n" + COMMITTER + b"\nm\n",
                                 "missingEmail"),
    "missingNameBeforeEmail": _commit_case(lambda t: _head(t) + b"author <a@b> 1 +0000\n" + COMMITTER + b"\nm\n",
                                           "missingNameBeforeEmail"),
    "missingSpaceBeforeDate": _commit_case(lambda t: _head(t) + b"author A <a@b>1 +0000\n" + COMMITTER + b"\nm\n",
                                           "missingSpaceBeforeDate"),
    "missingSpaceBeforeEmail": _commit_case(lambda t: _head(t) + b"author A<a@b> 1 +0000\n" + COMMITTER + b"\nm\n",
                                            "missingSpaceBeforeEmail"),
    "zeroPaddedDate": _commit_case(lambda t: _head(t) + b"author A <a@b> 0123 +0000\n" + COMMITTER + b"\nm\n",
                                   "zeroPaddedDate"),
    "nulInHeader": _commit_case(lambda t: _head(t) + AUTHOR + b"committer C <c@d> 1 +0000\0\n\nm\n",
                                "nulInHeader"),
    "unterminatedHeader": _commit_case(lambda t: _head(t) + AUTHOR + b"committer C <c@d> 1 +0000",
                                       "unterminatedHeader"),
    "nulInCommit": _commit_case(lambda t: _head(t) + AUTHOR + COMMITTER + b"\nm\0sg\n", "nulInCommit"),
    "ok-commit-double-space-date": _commit_case(lambda t: _head(t) + b"author A <a@b>  1 +0000\n" + COMMITTER
                                                + b"\nm\n", accepted=True),
    # ---- tags
    "missingObject": _tag_case(lambda b: b"type blob\ntag v1\n" + TAGGER + b"\nmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm\n"),
    "badObjectSha1": _tag_case(lambda b: b"object " + b"g" * 40 + b"\ntype blob\ntag v1\n" + TAGGER + b"\nm\n"),
    "missingTypeEntry": _tag_case(lambda b: _obj(b) + b"tag v1\n" + TAGGER + b"\nm\n"),
    "missingType": _tag_case(lambda b: _obj(b) + b"type blobblobblobblobblob"),
    "badType": _tag_case(lambda b: _obj(b) + b"type bogus\ntag v1\n" + TAGGER + b"\nm\n"),
    "missingTagEntry": _tag_case(lambda b: _obj(b) + b"type blob\n" + TAGGER + b"\nm\n"),
    "missingTag": _tag_case(lambda b: _obj(b) + b"type blob\ntag v1-without-a-newline-at-the-end"),
    "badTagName-raised": _tag_case(lambda b: _obj(b) + b"type blob\ntag a..b\n" + TAGGER + b"\nm\n",
                                   "badTagName"),
    "tag-bad-tagger": _tag_case(lambda b: _obj(b) + b"type blob\ntag v1\ntagger T <t> x +0000\n\nm\n", "badDate"),
    "tag-bad-tagger-then-extra-header": _tag_case(lambda b: _obj(b) + b"type blob\ntag v1\n"
                                                  b"tagger T <t> x +0000\nextra header\n\nm\n", accepted=True),
    # (git 2.39 prints badDate there but accepts: the ignored extraHeaderEntry report overwrites the result)
    "extraHeaderEntry-raised": _tag_case(lambda b: _obj(b) + b"type blob\ntag v1\n" + TAGGER + b"x y\n\nm\n",
                                         "extraHeaderEntry"),
    "missingTaggerEntry-raised": _tag_case(lambda b: _obj(b) + b"type blob\ntag v1\n\nold\n", "missingTaggerEntry"),
    "badTree": _tree_case(("100644", "a", "B"), ("10064x", "b", "B"), msg_id="badTree"),
    "badTree-first-entry": lambda src: Case([src.put("tree", b"100644 a\0" + b"\1" * 10)], msg_id="badTree"),
}

#: severity configurations some cases run under (as `--strict=<config>` for git, FsckOptions for packyard)
CONFIGS: dict[str, str] = {
    "badFilemode-raised": "badFilemode=error",
    "badTagName-raised": "badTagName=error",
    "extraHeaderEntry-raised": "extraHeaderEntry=error",
    "missingTaggerEntry-raised": "missingTaggerEntry=error",
}

#: the same cases again under a configuration that lowers the finding (both must then accept or both refuse)
LOWERED: dict[str, str] = {
    "zeroPaddedFilemode": "zeroPaddedFilemode=ignore",
    "badTimezone": "badTimezone=ignore",
    "hasDotgit-ntfs-short": "hasDotgit=warn",
    "gitmodulesUrl-option": "gitmodulesUrl=ignore",
    "nullSha1": "nullSha1=ignore",
    "treeNotSorted": "treeNotSorted=warn",
    "ok-gitignore-symlink-info": "gitignoreSymlink=error",
    "ok-gitattributes-symlink-info": "gitattributesSymlink=error",
    "gitattributesLineLength": "gitattributesLineLength=ignore",
    "gitattributesBlob": "gitattributesBlob=ignore",
    "ok-mailmap-symlink-info": "mailmapSymlink=error",
    "ok-gitmodules-parse-info": "gitmodulesParse=error",
    "missingEmail": "missingEmail=ignore",
    "badTree": "badTree=ignore",
    "badTree-first-entry": "badTree=ignore",
    "nulInCommit": "nulInCommit=ignore",
    "tag-bad-tagger-then-extra-header": "extraHeaderEntry=ignore",
}
