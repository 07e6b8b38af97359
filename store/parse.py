"""Structural parsing of commits, trees and tags: the links they carry.

This is the "does it parse" half of verification. It is deliberately
structural (headers present, ids well formed, tree entries well formed);
git's fsck rules for incoming data are in store/fsck/
"""
from __future__ import annotations

from .errors import CorruptObjectError
from .objects import HEX_RE, ObjectType

GITLINK_MODE = b"160000"
TREE_MODES = (b"40000", b"040000")


def _hex_field(value: bytes, what: str, oid: bytes) -> bytes:
    text = value.decode("ascii", "replace")
    if not HEX_RE.match(text):
        raise CorruptObjectError(f"{what} is not a hex object id: {value[:60]!r}", oid=oid)
    return bytes.fromhex(text)


def commit_links(data: bytes, oid: bytes) -> list[tuple[bytes, ObjectType]]:
    header, _, _msg = data.partition(b"\n\n")
    lines = header.split(b"\n")
    if not lines or not lines[0].startswith(b"tree "):
        raise CorruptObjectError("commit does not start with a tree header", oid=oid)
    links = [(_hex_field(lines[0][5:], "commit tree", oid), ObjectType.TREE)]
    seen_author = seen_committer = False
    for line in lines[1:]:
        if line.startswith(b"parent "):
            links.append((_hex_field(line[7:], "commit parent", oid), ObjectType.COMMIT))
        elif line.startswith(b"author "):
            seen_author = True
        elif line.startswith(b"committer "):
            seen_committer = True
    if not seen_author:
        raise CorruptObjectError("commit has no author header", oid=oid)
    if not seen_committer:
        raise CorruptObjectError("commit has no committer header", oid=oid)
    return links


def iter_tree(data: bytes, oid: bytes):
    """Yield (mode bytes, name bytes, entry oid) for each tree entry."""
    pos, end = 0, len(data)
    while pos < end:
        sp = data.find(b" ", pos, pos + 8)
        if sp < 0:
            raise CorruptObjectError(f"tree entry at byte {pos} has no mode", oid=oid)
        mode = data[pos:sp]
        if not mode.isdigit() or any(c > 0x37 for c in mode):
            raise CorruptObjectError(f"tree entry at byte {pos} has bad mode {mode!r}", oid=oid)
        nul = data.find(b"\0", sp + 1)
        if nul < 0 or nul + 21 > end:
            raise CorruptObjectError(f"tree entry at byte {pos} is truncated", oid=oid)
        name = data[sp + 1:nul]
        if not name or b"/" in name:
            raise CorruptObjectError(f"tree entry at byte {pos} has bad name {name!r}", oid=oid)
        yield mode, name, data[nul + 1:nul + 21]
        pos = nul + 21


def tree_links(data: bytes, oid: bytes) -> list[tuple[bytes, ObjectType]]:
    links = []
    for mode, _name, entry in iter_tree(data, oid):
        if mode == GITLINK_MODE:
            continue  # submodule commit: lives in another repository
        links.append((entry, ObjectType.TREE if mode in TREE_MODES else ObjectType.BLOB))
    return links


def tag_links(data: bytes, oid: bytes) -> list[tuple[bytes, ObjectType]]:
    header, _, _msg = data.partition(b"\n\n")
    fields = dict(line.split(b" ", 1) for line in header.split(b"\n") if b" " in line)
    if b"object" not in fields or b"type" not in fields or b"tag" not in fields:
        raise CorruptObjectError("tag lacks object, type or tag header", oid=oid)
    try:
        target_type = ObjectType.from_label(fields[b"type"])
    except Exception as err:
        raise CorruptObjectError(f"tag names unknown type {fields[b'type'][:20]!r}", oid=oid) from err
    return [(_hex_field(fields[b"object"], "tag object", oid), target_type)]


def object_links(obj_type: ObjectType | int, data: bytes, oid: bytes) -> list[tuple[bytes, ObjectType]]:
    """The objects this object refers to, with the type each must have."""
    if obj_type == ObjectType.BLOB:
        return []
    if obj_type == ObjectType.COMMIT:
        return commit_links(data, oid)
    if obj_type == ObjectType.TREE:
        return tree_links(data, oid)
    if obj_type == ObjectType.TAG:
        return tag_links(data, oid)
    raise CorruptObjectError(f"unknown object type {obj_type}", oid=oid)
