"""Names that check out as ``.git`` / ``.gitmodules`` / ... on some filesystem (git's path.c, utf8.c).

Byte-for-byte ports of ``is_ntfs_dotgit``, ``is_ntfs_dot_generic`` (``.gitmodules``,
``.gitignore``, ``.gitattributes``, ``.mailmap`` with their NTFS 8.3 short-name prefixes),
``is_hfs_dot_generic`` with ``next_hfs_char`` (HFS+ ignores the code points in
:data:`HFS_IGNORABLE` when comparing names) and ``pick_one_utf8_char``. Names are ``bytes``
as they sit in a tree (a C string: the tree format has no NUL inside a name).
"""
from __future__ import annotations

#: utf8.c next_hfs_char: code points HFS+ ignores entirely.
HFS_IGNORABLE = frozenset({0x200c, 0x200d, 0x200e, 0x200f, 0x202a, 0x202b, 0x202c, 0x202d, 0x202e,
                           0x206a, 0x206b, 0x206c, 0x206d, 0x206e, 0x206f, 0xfeff})


def _at(s: bytes, i: int) -> int:
    """C's ``s[i]`` on a NUL-terminated string."""
    return s[i] if i < len(s) else 0


def pick_one_utf8_char(s: bytes, i: int) -> tuple[int, int | None]:
    """(code point, next index) or (0, None) for malformed UTF-8 (git's ``*start = NULL``)."""
    b0 = _at(s, i)
    if b0 < 0x80:
        return b0, i + 1
    b1, b2, b3 = _at(s, i + 1), _at(s, i + 2), _at(s, i + 3)
    if b0 & 0xE0 == 0xC0:
        if b1 & 0xC0 != 0x80 or b0 & 0xFE == 0xC0:
            return 0, None
        return ((b0 & 0x1F) << 6) | (b1 & 0x3F), i + 2
    if b0 & 0xF0 == 0xE0:
        if (b1 & 0xC0 != 0x80 or b2 & 0xC0 != 0x80 or (b0 == 0xE0 and b1 & 0xE0 == 0x80)
                or (b0 == 0xED and b1 & 0xE0 == 0xA0) or (b0 == 0xEF and b1 == 0xBF and b2 & 0xFE == 0xBE)):
            return 0, None
        return ((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F), i + 3
    if b0 & 0xF8 == 0xF0:
        if (b1 & 0xC0 != 0x80 or b2 & 0xC0 != 0x80 or b3 & 0xC0 != 0x80 or (b0 == 0xF0 and b1 & 0xF0 == 0x80)
                or (b0 == 0xF4 and b1 > 0x8F) or b0 > 0xF4):
            return 0, None
        return ((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12) | ((b2 & 0x3F) << 6) | (b3 & 0x3F), i + 4
    return 0, None


def _next_hfs_char(s: bytes, i: int | None) -> tuple[int, int | None]:
    while i is not None:
        c, i = pick_one_utf8_char(s, i)
        if i is None:
            return 0, None
        if c in HFS_IGNORABLE:
            continue
        return c, i
    return 0, None


def _is_hfs_dot_generic(name: bytes, needle: bytes) -> bool:
    c, i = _next_hfs_char(name, 0)
    if c != 0x2E:
        return False
    for want in needle:
        c, i = _next_hfs_char(name, i)
        if c > 127:
            return False
        if 0x41 <= c <= 0x5A:
            c += 32
        if c != want:
            return False
    c, i = _next_hfs_char(name, i)
    return not (c and c != 0x2F)   # is_dir_sep on POSIX: '/'


def is_hfs_dotgit(name: bytes) -> bool:
    return _is_hfs_dot_generic(name, b"git")


def is_hfs_dotgitmodules(name: bytes) -> bool:
    return _is_hfs_dot_generic(name, b"gitmodules")


def is_hfs_dotgitignore(name: bytes) -> bool:
    return _is_hfs_dot_generic(name, b"gitignore")


def is_hfs_dotgitattributes(name: bytes) -> bool:
    return _is_hfs_dot_generic(name, b"gitattributes")


def is_hfs_dotmailmap(name: bytes) -> bool:
    return _is_hfs_dot_generic(name, b"mailmap")


def is_ntfs_dotgit(name: bytes) -> bool:
    """``.git`` or ``git~1``, followed only by spaces/periods up to the end, a separator or ``:``."""
    low = name[:5].lower()
    if low[:4] == b".git":
        i = 4
    elif low == b"git~1":
        i = 5
    else:
        return False
    while True:
        c = _at(name, i)
        i += 1
        if c in (0, 0x2F, 0x5C, 0x3A):
            return True
        if c not in (0x2E, 0x20):
            return False


def _only_spaces_and_periods(name: bytes, i: int) -> bool:
    while True:
        c = _at(name, i)
        i += 1
        if c in (0, 0x3A):
            return True
        if c not in (0x20, 0x2E):
            return False


def _is_ntfs_dot_generic(name: bytes, dotgit_name: bytes, shortname_prefix: bytes) -> bool:
    n = len(dotgit_name)
    if _at(name, 0) == 0x2E and name[1:1 + n].lower() == dotgit_name:
        # strncasecmp stops at NUL: a shorter name cannot match n bytes
        return _only_spaces_and_periods(name, n + 1)
    if name[:6].lower() == dotgit_name[:6] and _at(name, 6) == 0x7E and 0x31 <= _at(name, 7) <= 0x34:
        return _only_spaces_and_periods(name, 8)
    saw_tilde = False
    i = 0
    while i < 8:
        c = _at(name, i)
        if c == 0:
            return False
        if saw_tilde:
            if not 0x30 <= c <= 0x39:
                return False
        elif c == 0x7E:
            i += 1
            c = _at(name, i)
            if not 0x31 <= c <= 0x39:
                return False
            saw_tilde = True
        elif i >= 6:
            return False
        elif c & 0x80:
            return False
        else:
            if 0x41 <= c <= 0x5A:
                c += 32
            if c != shortname_prefix[i]:
                return False
        i += 1
    return _only_spaces_and_periods(name, i)


def is_ntfs_dotgitmodules(name: bytes) -> bool:
    return _is_ntfs_dot_generic(name, b"gitmodules", b"gi7eba")


def is_ntfs_dotgitignore(name: bytes) -> bool:
    return _is_ntfs_dot_generic(name, b"gitignore", b"gi250a")


def is_ntfs_dotgitattributes(name: bytes) -> bool:
    return _is_ntfs_dot_generic(name, b"gitattributes", b"gi7d29")


def is_ntfs_dotmailmap(name: bytes) -> bool:
    return _is_ntfs_dot_generic(name, b"mailmap", b"maba30")


def is_dotgitmodules(name: bytes) -> bool:
    return is_hfs_dotgitmodules(name) or is_ntfs_dotgitmodules(name)


def is_dotgit(name: bytes) -> bool:
    return is_hfs_dotgit(name) or is_ntfs_dotgit(name)


def looks_like_command_line_option(s: bytes) -> bool:
    return s[:1] == b"-"
