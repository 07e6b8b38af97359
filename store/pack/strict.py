"""``index-pack --strict``: git fsck's checks for incoming commits, trees and tags.

Mirrors fsck.c (git 2.39) with ``strict`` set, where warnings are errors:
tree entries must have a valid mode (100644, 100755, 120000, 40000, 160000,
plus 100664 and zero-padded modes, which early git wrote — git.git's own history
has them and ``git index-pack --strict`` only warns about them; other modes git
also only warns about, we refuse), a non-empty name
without ``/``, not ``.``, ``..`` or ``.git`` (git refuses ``.git`` and warns about
the others; we refuse all: such trees are unsafe to check out), a non-null id, be sorted in git's tree order with no
duplicate names; commits need ``tree``, ``parent``*, exactly one ``author`` and a
``committer`` with well-formed idents; tags need ``object``, ``type`` and
``tag`` headers (``tagger`` is optional, as for git's early tags).

:func:`check_object` returns the ids the object links to so the caller can
check connectivity (git's ``check_objects``: every linked object must be in
the pack or in the repository). Gitlinks (submodule commits) are not links.
"""
from __future__ import annotations

from typing import Callable

import re

from ..errors import CorruptObjectError
from ..objects import ObjectType

_HEX40 = re.compile(rb"[0-9a-fA-F]{40}")
_OK_MODES = frozenset({0o100644, 0o100755, 0o120000, 0o040000, 0o160000, 0o100664})
_DIR = 0o040000
_GITLINK = 0o160000
_NULL = b"\0" * 20
_TAG_TYPES = frozenset({b"commit", b"tree", b"blob", b"tag"})


class StrictError(ValueError):
    """One fsck finding (wrapped into CorruptObjectError by :func:`check_object`)."""


def _verify_headers(data: bytes) -> None:
    end = data.find(b"\n\n")
    head = data if end < 0 else data[:end]
    nul = head.find(b"\0")
    if nul >= 0:
        raise StrictError(f"unterminated header: NUL at offset {nul}")
    if end < 0 and data and not data.endswith(b"\n"):
        raise StrictError("unterminated header")
    if not data:
        raise StrictError("unterminated header")


def _ident(data: bytes, pos: int, what: str) -> int:
    """Check one ``Name <email> 1234567890 +0000`` line starting at ``pos``; return the next line's start."""
    eol = data.find(b"\n", pos)
    if eol < 0:
        eol = len(data)
    line = data[pos:eol]
    if line.startswith(b"<"):
        raise StrictError(f"invalid {what} line - missing space before email")
    lt = len(line)
    for i, c in enumerate(line):
        if c in (0x3C, 0x3E):  # < >
            lt = i
            break
    if lt < len(line) and line[lt] == 0x3E:
        raise StrictError(f"invalid {what} line - bad name")
    if lt >= len(line):
        raise StrictError(f"invalid {what} line - missing email")
    if lt == 0 or line[lt - 1] != 0x20:
        raise StrictError(f"invalid {what} line - missing space before email")
    gt = len(line)
    for i in range(lt + 1, len(line)):
        if line[i] in (0x3C, 0x3E):
            gt = i
            break
    if gt >= len(line) or line[gt] != 0x3E:
        raise StrictError(f"invalid {what} line - bad email")
    rest = line[gt + 1:]
    if not rest.startswith(b" "):
        raise StrictError(f"invalid {what} line - missing space before date")
    rest = rest[1:]
    if rest[:1] == b"0" and rest[1:2] != b" ":
        raise StrictError(f"invalid {what} line - zero-padded date")
    digits = 0
    while digits < len(rest) and 0x30 <= rest[digits] <= 0x39:
        digits += 1
    if digits == 0 or rest[digits:digits + 1] != b" ":
        raise StrictError(f"invalid {what} line - bad date")
    if int(rest[:digits]) >= 1 << 63:
        raise StrictError(f"invalid {what} line - date causes integer overflow")
    tz = rest[digits + 1:]
    if len(tz) != 5 or tz[0] not in (0x2B, 0x2D) or not tz[1:].isdigit() or eol >= len(data):
        raise StrictError(f"invalid {what} line - bad time zone")
    return eol + 1


def _hex_line(data: bytes, pos: int, what: str) -> tuple[bytes, int]:
    hexid = data[pos:pos + 40]
    if len(hexid) != 40 or not _HEX40.fullmatch(hexid) or data[pos + 40:pos + 41] != b"\n":
        raise StrictError(f"invalid '{what}' line format - bad sha1")
    return bytes.fromhex(hexid.decode()), pos + 41


def check_commit(data: bytes) -> list[bytes]:
    _verify_headers(data)
    if not data.startswith(b"tree "):
        raise StrictError("invalid format - expected 'tree' line")
    tree, pos = _hex_line(data, 5, "tree")
    links = [tree]
    while data.startswith(b"parent ", pos):
        parent, pos = _hex_line(data, pos + 7, "parent")
        links.append(parent)
    authors = 0
    while data.startswith(b"author ", pos):
        authors += 1
        pos = _ident(data, pos + 7, "author/committer")
    if authors < 1:
        raise StrictError("invalid format - expected 'author' line")
    if authors > 1:
        raise StrictError("invalid format - multiple 'author' lines")
    if not data.startswith(b"committer ", pos):
        raise StrictError("invalid format - expected 'committer' line")
    _ident(data, pos + 10, "author/committer")
    if b"\0" in data:
        raise StrictError("NUL byte in the commit object body")
    return links


def check_tag(data: bytes) -> list[bytes]:
    _verify_headers(data)
    if not data.startswith(b"object "):
        raise StrictError("invalid format - expected 'object' line")
    target, pos = _hex_line(data, 7, "object")
    if not data.startswith(b"type ", pos):
        raise StrictError("invalid format - expected 'type' line")
    eol = data.find(b"\n", pos)
    if eol < 0:
        raise StrictError("invalid format - unexpected end after 'type' line")
    if data[pos + 5:eol] not in _TAG_TYPES:
        raise StrictError("invalid 'type' value")
    pos = eol + 1
    if not data.startswith(b"tag ", pos):
        raise StrictError("invalid format - expected 'tag' line")
    eol = data.find(b"\n", pos)
    if eol < 0:
        raise StrictError("invalid format - unexpected end after 'tag' line")
    pos = eol + 1
    if data.startswith(b"tagger ", pos):
        _ident(data, pos + 7, "tagger")
    return [target]


def _is_dotgit(name: bytes) -> bool:
    return name.lower() == b".git"


# Fast path for the common, well-formed tree: structure and modes validated by one regex in C,
# then names/ids extracted in one pass. Anything unusual goes to the exact checker below.
_TREE_OK = re.compile(rb"(?:(?:100644|100755|100664|120000|40000|160000) [^\0/]+\0.{20})*", re.S)
_TREE_ENTRY = re.compile(rb"(\d+) ([^\0]+)\0(.{20})", re.S)
# " ." / " .." / " .git" (any case) as a whole name; may also hit inside a binary id: then the slow path decides.
_SUSPICIOUS_NAME = re.compile(rb" \.(?:\.|[gG][iI][tT])?\0")
_NULL_ENTRY_ID = b"\0" * 21   # a name's terminator followed by a null id (names hold no NUL)


def check_tree(data: bytes) -> list[bytes]:
    if _TREE_OK.fullmatch(data) and _NULL_ENTRY_ID not in data and not _SUSPICIOUS_NAME.search(data):
        entries = _TREE_ENTRY.findall(data)
        names = [name for _mode, name, _oid in entries]
        if len(set(names)) == len(names):
            keys = [name + b"/" if mode == b"40000" else name for mode, name, _oid in entries]
            if keys == sorted(keys):
                return [oid for mode, _name, oid in entries if mode != b"160000"]
    return _check_tree_exact(data)


def _check_tree_exact(data: bytes) -> list[bytes]:
    links: list[bytes] = []
    names: set[bytes] = set()
    prev_key: bytes | None = None
    pos, end = 0, len(data)
    while pos < end:
        sp = data.find(b" ", pos, pos + 8)
        if sp <= pos:
            raise StrictError(f"tree entry at byte {pos}: malformed mode")
        mode_s = data[pos:sp]
        mode = 0
        for c in mode_s:
            if not 0x30 <= c <= 0x37:
                raise StrictError(f"tree entry at byte {pos}: malformed mode {mode_s!r}")
            mode = (mode << 3) | (c - 0x30)
        nul = data.find(b"\0", sp + 1)
        if nul < 0 or nul + 21 > end:
            raise StrictError(f"tree entry at byte {pos}: truncated")
        name = data[sp + 1:nul]
        oid = data[nul + 1:nul + 21]
        if not name:
            raise StrictError(f"tree entry at byte {pos}: empty filename")
        if b"/" in name:
            raise StrictError(f"tree entry {name!r} contains a full pathname")
        if name in (b".", b".."):
            raise StrictError(f"tree entry {name!r} is . or ..")
        if _is_dotgit(name):
            raise StrictError(f"tree entry {name!r} is .git")
        if mode not in _OK_MODES:
            raise StrictError(f"tree entry {name!r} has bad file mode {mode_s.decode('ascii', 'replace')}")
        if oid == _NULL:
            raise StrictError(f"tree entry {name!r} points to the null sha1")
        if name in names:
            raise StrictError(f"tree contains duplicate file entries ({name!r})")
        names.add(name)
        key = name + b"/" if mode == _DIR else name
        if prev_key is not None and not prev_key < key:
            raise StrictError(f"tree entries not sorted ({name!r} after {prev_key.rstrip(b'/')!r})")
        prev_key = key
        if mode != _GITLINK:
            links.append(oid)
        pos = nul + 21
    return links


_CHECKS: dict[int, Callable[[bytes], list[bytes]]] = {
    ObjectType.COMMIT: check_commit, ObjectType.TREE: check_tree, ObjectType.TAG: check_tag}


def check_object(obj_type: int, data: bytes, *, oid: bytes | None = None, path: str | None = None,
                 offset: int | None = None) -> list[bytes]:
    """fsck one object; return the ids it links to. Raises CorruptObjectError naming the object."""
    check = _CHECKS.get(obj_type)
    if check is None:
        return []
    try:
        return check(data)
    except StrictError as err:
        label = ObjectType(obj_type).label.decode()
        raise CorruptObjectError(f"--strict: malformed {label}: {err}", oid=oid, path=path, offset=offset) from err
