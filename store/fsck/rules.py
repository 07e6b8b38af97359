"""git's fsck.c rules for one object: ``fsck_tree``, ``fsck_commit``, ``fsck_tag`` and the
``.gitmodules`` blob check, with git's message ids, order and return values.

Each ``check_*`` takes the object's bytes and an :class:`ObjectReport` (which knows the object's
id and the severities) and returns git's result: non-zero means git refuses the object. They
also return what the object links to, by the type the link claims (git's ``fsck_walk``:
a tree entry by its canonical mode, a commit's tree and parents, a tag's object by its
``type`` line), and, for trees, the entries found at a ``.gitmodules`` name.
"""
from __future__ import annotations

import functools
import re

from .. import native
from ..objects import ObjectType
from .gitmodules import gitmodules_findings
from .msgs import FsckOptions, Severity
from .paths import (
    is_hfs_dotgit,
    is_hfs_dotgitattributes,
    is_hfs_dotgitignore,
    is_hfs_dotgitmodules,
    is_hfs_dotmailmap,
    is_ntfs_dotgit,
    is_ntfs_dotgitattributes,
    is_ntfs_dotgitignore,
    is_ntfs_dotgitmodules,
    is_ntfs_dotmailmap,
)

BLOB, TREE, COMMIT, TAG = int(ObjectType.BLOB), int(ObjectType.TREE), int(ObjectType.COMMIT), int(ObjectType.TAG)
_S_IFMT, _S_IFREG, _S_IFDIR, _S_IFLNK, _S_IFGITLINK = 0o170000, 0o100000, 0o040000, 0o120000, 0o160000
_NULL = b"\0" * 20
_HEX = re.compile(rb"[0-9a-fA-F]{40}")
_TYPES = {b"commit": COMMIT, b"tree": TREE, b"blob": BLOB, b"tag": TAG}
MAX_WARNINGS = 100

_C = native.fsck()
#: which tree scan runs: "C" (store/fsck/_fsck.c) or "Python" (PACKYARD_PURE_PYTHON=1, or not built)
IMPLEMENTATION = "C" if _C is not None else "Python"


class ObjectReport:
    """git's ``report()`` for one object: severity lookup, skip list, the findings in order."""

    __slots__ = ("opts", "oid", "findings", "warnings")

    def __init__(self, opts: FsckOptions, oid: bytes) -> None:
        self.opts = opts
        self.oid = oid
        self.findings: list[tuple[str, str, str | None]] = []   # error-level: (msg id, text, tree path)
        self.warnings: list[tuple[str, str, str | None]] = []

    def __call__(self, msg_id: str, text: str, path: str | None = None) -> int:
        sev = self.opts.severity(msg_id)
        if sev is Severity.IGNORE or self.oid in self.opts.skiplist:
            return 0
        if sev in (Severity.ERROR, Severity.FATAL):
            self.findings.append((msg_id, text, path))
            return 1
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append((msg_id, text, path))
        return 0


def _name(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


# ------------------------------------------------------------------------------------------
# trees

def _is_less_than_slash(c: int) -> bool:
    return 0 < c < 0x2F


def _verify_ordered(mode1: int, name1: bytes, mode2: int, name2: bytes, candidates: list[bytes]) -> int:
    """0 ordered, -1 unordered, -2 duplicates (fsck.c verify_ordered, with its D/F candidate stack)."""
    n = min(len(name1), len(name2))
    if name1[:n] < name2[:n]:
        return 0
    if name1[:n] > name2[:n]:
        return -1
    c1 = name1[n] if n < len(name1) else 0
    c2 = name2[n] if n < len(name2) else 0
    if not c1 and not c2:
        return -2
    if not c1 and mode1 & _S_IFMT == _S_IFDIR:
        c1 = 0x2F
    if not c2 and mode2 & _S_IFMT == _S_IFDIR:
        c2 = 0x2F
    if not c1 and _is_less_than_slash(c2):
        candidates.append(name1)
    elif c2 == 0x2F and _is_less_than_slash(c1):
        while candidates:
            f_name = candidates.pop()
            if not name2.startswith(f_name):
                continue
            rest = name2[len(f_name):]
            if not rest:
                return -2
            if _is_less_than_slash(rest[0]):
                candidates.append(f_name)
                break
    return 0 if c1 < c2 else -1


def _decode_entry(data: bytes, pos: int) -> tuple[int, int, int] | None:
    """tree-walk.c decode_tree_entry on data[pos:]: (raw mode, name start, name end) or None."""
    size = len(data) - pos
    if size < 23 or data[len(data) - 21] != 0:
        return None
    if data[pos] == 0x20:
        return None
    mode = 0
    i = pos
    for _ in range(size):
        c = data[i]
        i += 1
        if c == 0x20:
            break
        if not 0x30 <= c <= 0x37:
            return None
        mode = ((mode << 3) + (c - 0x30)) & 0xFFFFFFFF
    else:
        return None
    nul = data.find(b"\0", i)
    if nul == i:
        return None
    return mode, i, nul


def _link_type(mode: int) -> int:
    """fsck_walk_tree's view (canon_mode): regular files and symlinks are blobs, dirs trees, the rest gitlinks (0)."""
    fmt = mode & _S_IFMT
    if fmt in (_S_IFREG, _S_IFLNK):
        return BLOB
    if fmt == _S_IFDIR:
        return TREE
    return 0


TreeResult = tuple[int, list[bytes], list[bytes], list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]


def check_tree(data: bytes, rep: ObjectReport) -> TreeResult:
    """(git's retval, blob links, tree links, [(oid, name) at a .gitmodules name],
    [(oid, name) at a .gitattributes name] (later git's ``gitattributes_found``))."""
    blobs: list[bytes] = []
    trees: list[bytes] = []
    gitmodules: list[tuple[bytes, bytes]] = []
    gitattributes: list[tuple[bytes, bytes]] = []
    retval = 0
    if not data:
        return 0, blobs, trees, gitmodules, gitattributes
    first = _decode_entry(data, 0)
    if first is None:
        rep("badTree", "cannot be parsed as a tree")
        # fsck_walk cannot start on this tree either: index-pack/unpack-objects die whatever the severity.
        raise Refused("badTree", "cannot be parsed as a tree")
    has_null = has_full = has_empty = has_dot = has_dotdot = has_dotgit = has_zero = has_bad = False
    has_dups = unsorted = False
    dotgit_name: bytes | None = None
    o_mode = 0
    o_name: bytes | None = None
    candidates: list[bytes] = []
    entry: tuple[int, int, int] | None = first
    pos = 0
    while entry is not None:
        raw_mode, ns, ne = entry
        name = data[ns:ne]
        oid = data[ne + 1:ne + 21]
        mode = raw_mode & 0xFFFF          # fsck_tree holds it in an unsigned short
        has_null |= oid == _NULL
        has_full |= b"/" in name
        has_empty |= not name
        has_dot |= name == b"."
        has_dotdot |= name == b".."
        if is_hfs_dotgit(name) or is_ntfs_dotgit(name):
            has_dotgit = True
            dotgit_name = dotgit_name or name
        has_zero |= data[pos] == 0x30
        is_link = mode & _S_IFMT == _S_IFLNK
        if is_hfs_dotgitmodules(name) or is_ntfs_dotgitmodules(name):
            if not is_link:
                gitmodules.append((oid, name))
            else:
                retval += rep("gitmodulesSymlink", ".gitmodules is a symbolic link", _name(name))
        if not is_link and (is_hfs_dotgitattributes(name) or is_ntfs_dotgitattributes(name)):
            gitattributes.append((oid, name))      # later git's fsck_tree (the symlink case is below)
        if is_link:
            if is_hfs_dotgitignore(name) or is_ntfs_dotgitignore(name):
                retval += rep("gitignoreSymlink", ".gitignore is a symlink", _name(name))
            if is_hfs_dotgitattributes(name) or is_ntfs_dotgitattributes(name):
                retval += rep("gitattributesSymlink", ".gitattributes is a symlink", _name(name))
            if is_hfs_dotmailmap(name) or is_ntfs_dotmailmap(name):
                retval += rep("mailmapSymlink", ".mailmap is a symlink", _name(name))
        bs = name.find(b"\\")
        while bs >= 0:
            after = name[bs + 1:]
            if is_ntfs_dotgit(after):
                has_dotgit = True
                dotgit_name = dotgit_name or name
            if is_ntfs_dotgitmodules(after):
                if not is_link:
                    gitmodules.append((oid, name))
                else:
                    retval += rep("gitmodulesSymlink", ".gitmodules is a symbolic link", _name(name))
            bs = name.find(b"\\", bs + 1)
        lt = _link_type(raw_mode)
        if lt == BLOB:
            blobs.append(oid)
        elif lt == TREE:
            trees.append(oid)
        pos = ne + 21
        nxt = _decode_entry(data, pos) if pos < len(data) else None
        if pos < len(data) and nxt is None:
            # update_tree_entry_gently failed: git reports and stops before this entry's mode/order checks
            retval += rep("badTree", "cannot be parsed as a tree")
            break
        if mode not in (0o100755, 0o100644, _S_IFLNK, _S_IFDIR, _S_IFGITLINK) and not (
                mode == 0o100664 and not rep.opts.strict):
            has_bad = True
        if o_name is not None:
            v = _verify_ordered(o_mode, o_name, mode, name, candidates)
            if v == -1:
                unsorted = True
            elif v == -2:
                has_dups = True
        o_mode, o_name = mode, name
        entry = nxt
    # git's fsck_tree reports in this order, each at most once
    for found, msg_id, text in ((has_null, "nullSha1", "contains entries pointing to null sha1"),
                                (has_full, "fullPathname", "contains full pathnames"),
                                (has_empty, "emptyName", "contains empty pathname"),
                                (has_dot, "hasDot", "contains '.'"),
                                (has_dotdot, "hasDotdot", "contains '..'"),
                                (has_dotgit, "hasDotgit", "contains '.git'"),
                                (has_zero, "zeroPaddedFilemode", "contains zero-padded file modes"),
                                (has_bad, "badFilemode", "contains bad file modes"),
                                (has_dups, "duplicateEntries", "contains duplicate file entries"),
                                (unsorted, "treeNotSorted", "not properly sorted")):
        if found:
            retval += rep(msg_id, text, _name(dotgit_name or b"")) if msg_id == "hasDotgit" else rep(msg_id, text)
    return retval, blobs, trees, gitmodules, gitattributes


# Fast path for the common tree: standard modes, sorted, no duplicates, no null id, and no name that is
# special on any filesystem. A special name starts with '.' or a byte >= 0x80 (HFS+ ignorables) or holds
# '~' or '\\'; the few such names in a tree (.gitignore, ...) are judged one by one with git's rules, and
# anything that could be a finding goes to check_tree, which decides (and reports) exactly as git.
_TREE_OK = re.compile(rb"(?:(?:100644|100755|120000|40000|160000) [^\0/]+\0.{20})*", re.S)
_TREE_OK_664 = re.compile(rb"(?:(?:100644|100755|100664|120000|40000|160000) [^\0/]+\0.{20})*", re.S)
_TREE_ENTRY = re.compile(rb"(\d+) ([^\0]+)\0(.{20})", re.S)


_HIGH_START = re.compile(rb"(?:^|\0)[\x80-\xff]")
_NULL_ENTRY_ID = b"\0" * 21     # a name's terminator followed by a null id (may also hit inside ids: slow path)


#: _special_kind's verdicts
_NEVER_CLEAN, _CLEAN_UNLESS_LINK, _CLEAN, _ATTRS_UNLESS_LINK = 0, 1, 2, 3


@functools.lru_cache(maxsize=4096)
def _special_kind(name: bytes) -> int:
    """What git's fsck_tree could say of a special-looking name, whatever its entry. Cached: a few names
    (.gitignore, .mailmap, .gitattributes) recur in every root tree, and the HFS+/NTFS rules walk them
    code point by code point (3.3 s of the 13 s of index-pack --strict on git-v2.0.0 before the cache)."""
    if name in (b".", b"..") or b"\\" in name or name[0] >= 0x80:
        return _NEVER_CLEAN
    if is_ntfs_dotgit(name) or is_hfs_dotgit(name) or is_ntfs_dotgitmodules(name) or is_hfs_dotgitmodules(name):
        return _NEVER_CLEAN
    if is_hfs_dotgitattributes(name) or is_ntfs_dotgitattributes(name):
        return _ATTRS_UNLESS_LINK
    if is_hfs_dotgitignore(name) or is_ntfs_dotgitignore(name) or is_hfs_dotmailmap(name) or is_ntfs_dotmailmap(name):
        return _CLEAN_UNLESS_LINK   # a finding only as a symlink (INFO by default, but reported by check_tree)
    return _CLEAN


FastTree = tuple[list[bytes], list[bytes], list[tuple[bytes, bytes]]]


def _judge_specials(specials: list[tuple[bytes, bytes, bool]], attrs: bool) -> list[tuple[bytes, bytes]] | None:
    """None when a special name needs check_tree, else the [(oid, name)] at a .gitattributes name to record
    (only with ``attrs``: later git's ``gitattributes_found``, as check_tree records them)."""
    found: list[tuple[bytes, bytes]] = []
    for name, oid, is_link in specials:
        kind = _special_kind(name)
        if kind == _NEVER_CLEAN or (is_link and kind != _CLEAN):
            return None
        if attrs and kind == _ATTRS_UNLESS_LINK:
            found.append((oid, name))
    return found


def check_tree_fast(data: bytes, allow_664: bool = False, attrs: bool = False) -> FastTree | None:
    """(blob links, tree links, [(oid, name) at a .gitattributes name]) when the tree is certainly clean,
    else None (use check_tree).
    ``allow_664``: mode 100664 counts as clean (its badFilemode is INFO, reported by nothing here).
    ``attrs``: the .gitattributes blob checks are on, so a .gitattributes entry's id is returned to record
    (a tree of git.git holds one at its root: it stays on the fast path).
    The scan runs in C (store/fsck/_fsck.c) when built; :func:`check_tree_fast_py` is its specification."""
    if _C is None:
        return check_tree_fast_py(data, allow_664, attrs)
    got = _C.tree_scan(data, allow_664)
    if got is None:
        return None
    blobs, trees, specials = got
    found = _judge_specials(specials, attrs) if specials else []
    return None if found is None else (blobs, trees, found)


def check_tree_fast_py(data: bytes, allow_664: bool = False, attrs: bool = False) -> FastTree | None:
    """check_tree_fast in Python: the specification of the C scan, and the fallback without it."""
    if not (_TREE_OK_664 if allow_664 else _TREE_OK).fullmatch(data) or _NULL_ENTRY_ID in data:
        return None
    entries = _TREE_ENTRY.findall(data)
    names = [e[1] for e in entries]
    joined = b"\0".join(names)
    found: list[tuple[bytes, bytes]] = []
    if (joined[:1] == b"." or b"\0." in joined or b"~" in joined or b"\\" in joined
            or (not joined.isascii() and _HIGH_START.search(joined))):
        judged = _judge_specials([(n, o, m == b"120000") for m, n, o in entries
                                  if n[0] == 0x2E or n[0] >= 0x80 or b"~" in n or b"\\" in n], attrs)
        if judged is None:
            return None
        found = judged
    if len(set(names)) != len(names):
        return None
    if b"40000 " in data:
        keys = [name + b"/" if mode == b"40000" else name for mode, name, _o in entries]
        if keys != sorted(keys):
            return None
        trees = [o for m, _n, o in entries if m == b"40000"]
        blobs = [o for m, _n, o in entries if m != b"40000" and m != b"160000"]
    else:
        if names != sorted(names):
            return None
        trees = []
        blobs = [o for m, _n, o in entries if m != b"160000"] if b"160000 " in data else [e[2] for e in entries]
    return blobs, trees, found


# ------------------------------------------------------------------------------------------
# commits and tags

def _verify_headers(data: bytes, rep: ObjectReport) -> int:
    i = 0
    n = len(data)
    while i < n:
        nul = data.find(b"\0", i)
        lf = data.find(b"\n\n", i)
        if nul >= 0 and (lf < 0 or nul < lf):
            return rep("nulInHeader", f"unterminated header: NUL at offset {nul}")
        if lf >= 0:
            return 0
        break
    if n and data[-1] == 0x0A:
        return 0
    return rep("unterminatedHeader", "unterminated header")


def _strtoumax(data: bytes, p: int) -> tuple[int, int]:
    """parse_timestamp (strtoumax base 10): (value, end); leading whitespace and a sign allowed."""
    q = p
    while q < len(data) and data[q] in b" \t\n\v\f\r":
        q += 1
    neg = False
    if q < len(data) and data[q] in b"+-":
        neg = data[q] == 0x2D
        q += 1
    s = q
    while q < len(data) and 0x30 <= data[q] <= 0x39:
        q += 1
    if q == s:
        return 0, p
    v = int(data[s:q])
    if v > 0xFFFFFFFFFFFFFFFF:
        v = 0xFFFFFFFFFFFFFFFF
    elif neg:
        v = (-v) & 0xFFFFFFFFFFFFFFFF
    return v, q


def _at(data: bytes, i: int) -> int:
    return data[i] if i < len(data) else 0


# A well-formed ident line (the common case): name, " <email>", a date without leading zero that
# fits in 19 digits, a time zone, LF. Anything else takes the exact path below.
_IDENT_OK = re.compile(rb"[^<>\n\0]+ <[^<>\n\0]*> (?:0|[1-9][0-9]{0,17}) [+-][0-9]{4}\n")


def fsck_ident(data: bytes, pos: int, rep: ObjectReport) -> tuple[int, int]:
    """(git's result, position of the next line)."""
    m = _IDENT_OK.match(data, pos)
    if m is not None:
        return 0, m.end()
    return fsck_ident_exact(data, pos, rep)


def fsck_ident_exact(data: bytes, pos: int, rep: ObjectReport) -> tuple[int, int]:
    """fsck.c fsck_ident, step by step (the specification of the fast match above)."""
    eol = data.find(b"\n", pos)
    nul = data.find(b"\0", pos)
    if nul >= 0 and (eol < 0 or nul < eol):
        nxt = nul                       # strchrnul stops at a NUL
    else:
        nxt = len(data) if eol < 0 else eol + 1
    p = pos
    if _at(data, p) == 0x3C:
        return rep("missingNameBeforeEmail", "invalid author/committer line - missing space before email"), nxt
    while _at(data, p) not in (0, 0x3C, 0x3E, 0x0A):
        p += 1
    if _at(data, p) == 0x3E:
        return rep("badName", "invalid author/committer line - bad name"), nxt
    if _at(data, p) != 0x3C:
        return rep("missingEmail", "invalid author/committer line - missing email"), nxt
    if data[p - 1] != 0x20:
        return rep("missingSpaceBeforeEmail", "invalid author/committer line - missing space before email"), nxt
    p += 1
    while _at(data, p) not in (0, 0x3C, 0x3E, 0x0A):
        p += 1
    if _at(data, p) != 0x3E:
        return rep("badEmail", "invalid author/committer line - bad email"), nxt
    p += 1
    if _at(data, p) != 0x20:
        return rep("missingSpaceBeforeDate", "invalid author/committer line - missing space before date"), nxt
    p += 1
    if _at(data, p) == 0x30 and _at(data, p + 1) != 0x20:
        return rep("zeroPaddedDate", "invalid author/committer line - zero-padded date"), nxt
    value, end = _strtoumax(data, p)
    if value > (1 << 63) - 1:           # date_overflows: beyond time_t (strtoumax saturates)
        return rep("badDateOverflow", "invalid author/committer line - date causes integer overflow"), nxt
    if end == p or _at(data, end) != 0x20:
        return rep("badDate", "invalid author/committer line - bad date"), nxt
    p = end + 1
    if (_at(data, p) not in (0x2B, 0x2D) or not all(0x30 <= _at(data, p + k) <= 0x39 for k in (1, 2, 3, 4))
            or _at(data, p + 5) != 0x0A):
        return rep("badTimezone", "invalid author/committer line - bad time zone"), nxt
    return 0, nxt


def _oid_line(data: bytes, pos: int) -> bytes | None:
    hexid = data[pos:pos + 40]
    if _HEX.fullmatch(hexid) and _at(data, pos + 40) == 0x0A:
        return bytes.fromhex(hexid.decode())
    return None


class Refused(Exception):
    """git's object parser (not fsck) refuses this object whatever the severities say."""

    def __init__(self, msg_id: str, text: str) -> None:
        super().__init__(text)
        self.msg_id = msg_id
        self.text = text


def check_commit(data: bytes, rep: ObjectReport) -> tuple[int, bytes | None, list[bytes]]:
    """(git's result, tree link, parent links)."""
    parents: list[bytes] = []
    tree = _oid_line(data, 5) if data.startswith(b"tree ") else None
    # parse_commit_buffer (index-pack parses every commit) refuses these before fsck runs.
    if tree is None or len(data) <= 46:
        raise Refused("badTreeSha1" if data.startswith(b"tree ") else "missingTree", "bogus commit object")
    pos = 46
    while data.startswith(b"parent ", pos):
        parent = _oid_line(data, pos + 7)
        if parent is None:
            raise Refused("badParentSha1", "bad parents in commit")
        parents.append(parent)
        pos += 48
    if _verify_headers(data, rep):
        return -1, tree, parents
    authors = 0
    err = 0
    while data.startswith(b"author ", pos):
        authors += 1
        err, pos = fsck_ident(data, pos + 7, rep)
        if err:
            return err, tree, parents
    if authors < 1:
        err = rep("missingAuthor", "invalid format - expected 'author' line")
    elif authors > 1:
        err = rep("multipleAuthors", "invalid format - multiple 'author' lines")
    if err:
        return err, tree, parents
    if not data.startswith(b"committer ", pos):
        return rep("missingCommitter", "invalid format - expected 'committer' line"), tree, parents
    err, pos = fsck_ident(data, pos + 10, rep)
    if err:
        return err, tree, parents
    if b"\0" in data:
        err = rep("nulInCommit", "NUL byte in the commit object body")
        if err:
            return err, tree, parents
    return 0, tree, parents


_REFNAME_BAD = re.compile(rb"[\x00-\x20\x7f~^:?*\[\\]")


def check_refname_format(name: bytes) -> bool:
    """refs.c check_refname_format(name, 0): True if valid."""
    if name == b"@" or b"@{" in name or _REFNAME_BAD.search(name) or b".." in name:
        return False
    for comp in name.split(b"/"):
        if not comp or comp.startswith(b".") or comp.endswith(b".lock"):
            return False
    return not name.endswith(b".")


def check_tag(data: bytes, rep: ObjectReport) -> tuple[int, bytes | None, int]:
    """(git's result, tagged object, the type its ``type`` line claims)."""
    # parse_tag_buffer (index-pack parses every tag) refuses these whatever fsck says.
    if len(data) < 64:
        raise Refused("missingTag", "bogus tag object (too short)")
    if not data.startswith(b"object "):
        raise Refused("missingObject", "bogus tag object")
    target = _oid_line(data, 7)
    if target is None:
        raise Refused("badObjectSha1", "bad tag pointer")
    pos = 48
    if not data.startswith(b"type ", pos):
        raise Refused("missingTypeEntry", "bogus tag object")
    eol = data.find(b"\n", pos)
    if eol < 0:
        raise Refused("missingType", "bogus tag object")
    ttype = _TYPES.get(data[pos + 5:eol])
    if ttype is None:
        raise Refused("badType", "invalid 'type' value")
    tag_line = eol + 1
    if not (tag_line + 4 < len(data) and data.startswith(b"tag ", tag_line)):
        raise Refused("missingTagEntry", "invalid format - expected 'tag' line")
    if data.find(b"\n", tag_line + 4) < 0:
        raise Refused("missingTag", "invalid format - unexpected end after 'tag' line")
    ret = _verify_headers(data, rep)
    if ret:
        return ret, target, ttype
    pos = eol + 1
    if not data.startswith(b"tag ", pos):
        return rep("missingTagEntry", "invalid format - expected 'tag' line"), target, ttype
    eol = data.find(b"\n", pos)
    if eol < 0:
        return rep("missingTag", "invalid format - unexpected end after 'type' line"), target, ttype
    tagname = data[pos + 4:eol]
    k = tagname.find(b"\0")
    if not check_refname_format(b"refs/tags/" + (tagname if k < 0 else tagname[:k])):
        ret = rep("badTagName", "invalid 'tag' name: " + _name(tagname))
        if ret:
            return ret, target, ttype
    pos = eol + 1
    if not data.startswith(b"tagger ", pos):
        ret = rep("missingTaggerEntry", "invalid format - expected 'tagger' line")
        if ret:
            return ret, target, ttype
    else:
        ret, pos = fsck_ident(data, pos + 7, rep)
    if pos >= len(data) or data[pos] == 0:
        return ret, target, ttype
    if data[pos] != 0x0A:
        ret = rep("extraHeaderEntry", "invalid format - extra header(s) after 'tagger'")
    return ret, target, ttype


#: attr.h: the longest line and the largest file later git's attribute parser reads.
ATTR_MAX_LINE_LENGTH = 2048
ATTR_MAX_FILE_SIZE = 100 * 1024 * 1024
#: The ids of the .gitattributes checks (git 2.39.1 and later; ERROR by default).
GITATTRIBUTES_IDS = ("gitattributesMissing", "gitattributesLarge", "gitattributesLineLength", "gitattributesBlob")


def gitattributes_findings(buf: bytes) -> list[tuple[str, str]]:
    """git's fsck_blob (2.39.1+) for a blob found at a .gitattributes name: too large to parse, or a line
    (up to a newline; git's scan also stops at a NUL byte) of ATTR_MAX_LINE_LENGTH bytes or more."""
    if len(buf) > ATTR_MAX_FILE_SIZE:
        return [("gitattributesLarge", ".gitattributes too large to parse")]
    nul = buf.find(b"\0")
    text = buf if nul < 0 else buf[:nul]
    if len(text) >= ATTR_MAX_LINE_LENGTH and any(len(line) >= ATTR_MAX_LINE_LENGTH for line in text.split(b"\n")):
        return [("gitattributesLineLength", ".gitattributes has too long lines to parse")]
    return []


def check_gitattributes_blob(data: bytes, rep: ObjectReport, path: str | None) -> int:
    """git's fsck_blob (2.39.1+) for a blob found at a .gitattributes name."""
    ret = 0
    for msg_id, text in gitattributes_findings(data):
        ret |= rep(msg_id, text, path)
    return ret


def check_gitmodules_blob(data: bytes, rep: ObjectReport, path: str | None) -> int:
    """fsck_blob for a blob found at a .gitmodules name (skip-listed blobs were dropped by the caller)."""
    ret = 0
    for msg_id, text in gitmodules_findings(data):
        ret |= rep(msg_id, text, path)
    return ret
