"""The ``.gitmodules`` rules: git's config parser over a blob, ``check_submodule_name``,
``check_submodule_url`` and the per-key checks of fsck.c's ``fsck_gitmodules_fn``.

:func:`parse_config` is config.c's ``git_parse_source`` for a buffer (``get_base_var``,
``get_extended_base_var``, ``get_value``, ``parse_value``): it calls back with (name, value)
for every entry until the first syntax error, then reports whether one happened (git keeps
what it already parsed, and fsck reports gitmodulesParse, INFO, on the error).
"""
from __future__ import annotations

from typing import Callable, Iterator

from .paths import looks_like_command_line_option

_EOF = -1
_SPACE = frozenset(b" \t\n\r")


def _isalpha(c: int) -> bool:
    return 0x41 <= c <= 0x5A or 0x61 <= c <= 0x7A


def _iskeychar(c: int) -> bool:
    return _isalpha(c) or 0x30 <= c <= 0x39 or c == 0x2D


def _lower(c: int) -> int:
    return c + 32 if 0x41 <= c <= 0x5A else c


class _Source:
    """config.c's buffer source and ``get_next_char`` (CRLF folded, EOF reads as a final ``\\n``).
    A 0xff byte reads as EOF, as in git (``config_buf_fgetc`` returns a signed char)."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.eof = False

    def _getc(self) -> int:
        if self.pos < len(self.buf):
            c = self.buf[self.pos]
            self.pos += 1
            return _EOF if c == 0xFF else c
        return _EOF

    def next(self) -> int:
        c = self._getc()
        if c == 0x0D:
            c = self._getc()
            if c != 0x0A:
                if c != _EOF:
                    self.pos -= 1
                c = 0x0D
        if c == _EOF:
            self.eof = True
            c = 0x0A
        return c


def _parse_value(src: _Source) -> bytes | None:
    quote = comment = False
    space = 0
    out = bytearray()
    while True:
        c = src.next()
        if c == 0x0A:
            return None if quote else bytes(out)
        if comment:
            continue
        if c in _SPACE and not quote:
            if out:
                space += 1
            continue
        if not quote and c in (0x3B, 0x23):
            comment = True
            continue
        out.extend(b" " * space)
        space = 0
        if c == 0x5C:
            c = src.next()
            if c == 0x0A:
                continue
            esc = {0x74: 0x09, 0x62: 0x08, 0x6E: 0x0A, 0x5C: 0x5C, 0x22: 0x22}.get(c)
            if esc is None:
                return None
            out.append(esc)
            continue
        if c == 0x22:
            quote = not quote
            continue
        out.append(c)


def _get_extended_base_var(src: _Source, name: bytearray, c: int) -> bool:
    while True:
        if c == 0x0A:
            return False
        c = src.next()
        if c not in _SPACE:
            break
    if c != 0x22:
        return False
    name.append(0x2E)
    while True:
        c = src.next()
        if c == 0x0A:
            return False
        if c == 0x22:
            break
        if c == 0x5C:
            c = src.next()
            if c == 0x0A:
                return False
        name.append(c)
    return src.next() == 0x5D


def _get_base_var(src: _Source, name: bytearray) -> bool:
    while True:
        c = src.next()
        if src.eof:
            return False
        if c == 0x5D:
            return True
        if c in _SPACE:
            return _get_extended_base_var(src, name, c)
        if not _iskeychar(c) and c != 0x2E:
            return False
        name.append(_lower(c))


def parse_config(buf: bytes, fn: Callable[[bytes, bytes | None], None]) -> bool:
    """Feed every (name, value) to ``fn``; True if the whole buffer parsed (False: a syntax error)."""
    src = _Source(buf)
    var = bytearray()
    baselen = 0
    comment = False
    bom = b"\xef\xbb\xbf"
    bom_i: int | None = 0
    for _ in range(len(buf) + 2):      # every step consumes at least one byte
        c = src.next()
        if bom_i is not None and bom_i < 3:
            if c == bom[bom_i]:
                bom_i += 1
                continue
            if bom_i != 0:
                return False
            bom_i = None
        if c == 0x0A:
            if src.eof:
                return True
            comment = False
            continue
        if comment:
            continue
        if c in _SPACE:
            continue
        if c in (0x23, 0x3B):
            comment = True
            continue
        if c == 0x5B:
            var.clear()
            if not _get_base_var(src, var) or not var:
                return False
            var.append(0x2E)
            baselen = len(var)
            continue
        if not _isalpha(c):
            return False
        del var[baselen:]
        var.append(_lower(c))
        # get_value
        while True:
            c = src.next()
            if src.eof or not _iskeychar(c):
                break
            var.append(_lower(c))
        while c in (0x20, 0x09):
            c = src.next()
        value: bytes | None = None
        if c != 0x0A:
            if c != 0x3D:
                return False
            value = _parse_value(src)
            if value is None:
                return False
        fn(bytes(var), value)
    return False


def _cstr(b: bytes) -> bytes:
    """What C sees of a buffer: up to its first NUL."""
    k = b.find(b"\0")
    return b if k < 0 else b[:k]


def check_submodule_name(name: bytes) -> bool:
    """False for an empty name or one with a ``..`` path component (``/`` or ``\\`` separators)."""
    if not name:
        return False
    for i in [0] + [k + 1 for k, c in enumerate(name) if c in (0x2F, 0x5C)]:
        if name[i:i + 2] == b".." and (i + 2 >= len(name) or name[i + 2] in (0x2F, 0x5C)):
            return False
    return True


def _starts_with_dot_slash(url: bytes) -> bool:
    return url[:1] == b"." and url[1:2] in (b"/", b"\\")


def _starts_with_dot_dot_slash(url: bytes) -> bool:
    return url[:2] == b".." and url[2:3] in (b"/", b"\\")


def _hex2chr(s: bytes) -> int:
    try:
        if len(s) < 2 or not all(c in b"0123456789abcdefABCDEF" for c in s[:2]):
            return -1
        return int(s[:2], 16)
    except ValueError:
        return -1


def url_decode_mem(url: bytes) -> bytes:
    """url.c ``url_decode_mem``: the scheme (up to the first ``:``) is copied, the rest %-decoded."""
    url = _cstr(url)
    out = bytearray()
    colon = url.find(b":")
    if colon > 0:
        out += url[:colon]
        url = url[colon:]
    i = 0
    while i < len(url):
        c = url[i]
        if c == 0x25 and len(url) - i >= 3:
            val = _hex2chr(url[i + 1:i + 3])
            if val > 0:
                out.append(val)
                i += 3
                continue
        out.append(c)
        i += 1
    return _cstr(bytes(out))


def _credential_from_url_ok(url: bytes) -> bool:
    """credential.c ``credential_from_url_1`` (full url, quiet): parses and no component has a newline;
    returns False where git returns -1 or the host is empty."""
    proto_end = url.find(b"://")
    if proto_end <= 0:
        return False
    cp = proto_end + 3
    at = url.find(b"@", cp)
    colon = url.find(b":", cp)
    slash = cp
    while slash < len(url) and url[slash] not in b"/?#":
        slash += 1
    comps: list[bytes] = []
    if at < 0 or slash <= at:
        host = cp
    elif colon < 0 or at <= colon:
        comps.append(url_decode_mem(url[cp:at]))
        host = at + 1
    else:
        comps.append(url_decode_mem(url[cp:colon]))
        comps.append(url_decode_mem(url[colon + 1:at]))
        host = at + 1
    comps.append(url[:proto_end])
    host_s = url_decode_mem(url[host:slash])
    comps.append(host_s)
    p = slash
    while p < len(url) and url[p] == 0x2F:
        p += 1
    if p < len(url):
        comps.append(url_decode_mem(url[p:]))
    if any(b"\n" in c for c in comps):
        return False
    return bool(host_s)


def check_submodule_url(url: bytes) -> bool:
    """fsck.c ``check_submodule_url``: False for what git disallows."""
    url = _cstr(url)
    if looks_like_command_line_option(url):
        return False
    if _starts_with_dot_slash(url) or _starts_with_dot_dot_slash(url) or url.startswith(b"git://"):
        if b"\n" in url_decode_mem(url):
            return False
        rest = url
        dotdots = 0
        for _ in range(len(url) + 1):
            if _starts_with_dot_dot_slash(rest):
                dotdots += 1
                rest = rest[3:]
            elif _starts_with_dot_slash(rest):
                rest = rest[2:]
            else:
                break
        if dotdots > 0 and rest[:1] in (b":", b"/"):
            return False
        return True
    for prefix in (b"http::", b"https::", b"ftp::", b"ftps::"):
        if url.startswith(prefix):
            return _credential_from_url_ok(url[len(prefix):])
    if url.startswith((b"http://", b"https://", b"ftp://", b"ftps://")):
        return _credential_from_url_ok(url)
    return True


def gitmodules_findings(buf: bytes) -> Iterator[tuple[str, str]]:
    """(msg id, text) for every problem in a ``.gitmodules`` blob, in git's order."""
    found: list[tuple[str, str]] = []

    def fn(var: bytes, value: bytes | None) -> None:
        var = _cstr(var)
        if not var.startswith(b"submodule."):
            return
        rest = var[len(b"submodule"):]
        dot = rest.rfind(b".")
        if dot == 0:
            return          # no subsection
        name = rest[1:dot]
        key = rest[dot + 1:]
        if not check_submodule_name(name):
            found.append(("gitmodulesName", "disallowed submodule name: " + name.decode("utf-8", "replace")))
        if value is not None:
            v = _cstr(value)
            text = v.decode("utf-8", "replace")
            if key == b"url" and not check_submodule_url(v):
                found.append(("gitmodulesUrl", "disallowed submodule url: " + text))
            if key == b"path" and looks_like_command_line_option(v):
                found.append(("gitmodulesPath", "disallowed submodule path: " + text))
            if key == b"update" and v[:1] == b"!" and v not in (b"none", b"checkout", b"rebase", b"merge"):
                found.append(("gitmodulesUpdate", "disallowed submodule update setting: " + text))

    ok = parse_config(buf, fn)
    yield from found
    if not ok:
        yield "gitmodulesParse", "could not parse gitmodules blob"
