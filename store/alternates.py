"""``objects/info/alternates``: the object directories a repository borrows from (a fork's pool).

Read as git 2.39 reads it (``object-file.c``: ``read_info_alternates``, ``link_alt_odb_entries``,
``parse_alt_odb_entry``, ``link_alt_odb_entry``, ``alt_odb_usable``):

* one entry a line (``\\n``); an empty line is skipped, a line starting with ``#`` is a comment, a line
  starting with ``"`` is C-quoted (``\\n``, ``\\t``, ``\\"``, ``\\\\``, octal ``\\ooo``; broken quoting falls back
  to the line as it is); nothing else is trimmed (a trailing CR or space is part of the path, as in git);
* a relative entry is relative to the (resolved) objects directory whose file names it, not to ``info/``;
* every entry is resolved (symlinks, ``..``) and its trailing slashes dropped; an entry that does not
  resolve to a directory is skipped with a problem noted (git: "object directory ... does not exist;
  check .git/objects/info/alternates"), as are the repository's own objects directory and an entry
  listed before (so a loop A -> B -> A ends);
* each alternate's own ``info/alternates`` is read in turn, depth first (git's order: an entry's
  alternates come right after it); a file read at depth > :data:`MAX_DEPTH` is ignored (git: "ignoring
  alternate object stores, nesting too deep"), so a chain reaches six directories beyond the repository.

Confinement (packyard's, not git's): with ``roots`` given, every resolved alternate must lie strictly inside
one of them, or :class:`AlternatesRefused` (an ``InvalidInputError``) names the alternates file and the path:
the repository is refused, nothing is read through it. The server passes its storage roots
(``workers/repos.py``); a queued job cannot name an alternates file, only the pool lifecycle writes one.

Bounds: an alternates file larger than :data:`MAX_FILE_BYTES` is refused; the chain holds at most
:data:`MAX_ALTERNATES` directories (every one found past that is a problem, not followed).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import InvalidInputError

ALTERNATES = Path("info") / "alternates"
#: git's limit: a file read at a depth greater than this (the repository's own file is depth 0) is ignored.
MAX_DEPTH = 5
#: An alternates file is a few lines; a larger one is refused rather than read (bounded memory).
MAX_FILE_BYTES = 1 << 20
#: Directories in one chain; git has no such bound, a hosting service needs one (a fork has one pool).
MAX_ALTERNATES = 64

_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}


class AlternatesRefused(InvalidInputError):
    """An alternate object directory leads outside the storage roots, or the file cannot be read."""


@dataclass(frozen=True)
class Alternate:
    """One borrowed object directory: where it is (resolved), which file named it, at which depth."""

    path: Path
    listed_in: Path
    depth: int


@dataclass(frozen=True)
class AlternatesChain:
    """Every alternate of a repository, in git's lookup order, and what was skipped (git's error lines)."""

    alternates: tuple[Alternate, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(a.path for a in self.alternates)

    def __bool__(self) -> bool:
        return bool(self.alternates)


def unquote_c_style(text: str) -> str | None:
    """git's ``unquote_c_style`` on a line that starts with ``"``: the unquoted path, or None when the quoting is
    broken (no closing quote, a bad escape), in which case git takes the line as it is."""
    out: list[str] = []
    i, n = 1, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            return "".join(out) if i == n - 1 else None   # (git ignores what follows; an entry is one line)
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        i += 1
        if i >= n:
            return None
        ch = text[i]
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
            i += 1
        elif "0" <= ch <= "3" and i + 2 < n and all("0" <= c <= "7" for c in text[i:i + 3]):
            out.append(chr(int(text[i:i + 3], 8)))
            i += 3
        else:
            return None
    return None


def parse_entries(data: bytes) -> list[str]:
    """The paths one alternates file lists, in order (comments and empty lines dropped, quoted ones unquoted)."""
    text = data.decode("utf-8", "surrogateescape")
    entries: list[str] = []
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        if line.startswith('"'):
            unquoted = unquote_c_style(line)
            if unquoted is not None:
                line = unquoted
        if line:
            entries.append(line)
    return entries


def _read_file(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise AlternatesRefused(f"cannot read the alternates file: {err.strerror}", path=path) from err
    if len(data) > MAX_FILE_BYTES:
        raise AlternatesRefused(f"alternates file is larger than {MAX_FILE_BYTES} bytes", path=path)
    return data


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(root in path.parents for root in roots)


def read_chain(objects_dir: Path, *, roots: Sequence[Path] | None = None) -> AlternatesChain:
    """Every object directory ``objects_dir`` borrows from (see the module docstring). ``roots``: resolved
    storage roots every alternate must lie inside (None: no confinement, for a caller that trusts the
    filesystem)."""
    own = Path(os.path.realpath(objects_dir))
    real_roots = tuple(Path(os.path.realpath(r)) for r in roots) if roots is not None else None
    seen: set[Path] = {own}
    found: list[Alternate] = []
    problems: list[str] = []

    def read_from(base: Path, depth: int) -> None:
        listing = base / ALTERNATES
        data = _read_file(listing)
        if data is None:
            return
        if depth > MAX_DEPTH:
            if data:
                problems.append(f"{base}: ignoring alternate object stores, nesting too deep")
            return
        for entry in parse_entries(data):
            spelled = Path(entry) if os.path.isabs(entry) else base / entry
            real = Path(os.path.realpath(spelled))
            if real_roots is not None and not _inside(real, real_roots):
                raise AlternatesRefused(
                    f"alternate object directory {entry!r} resolves to {real}, outside the storage roots "
                    f"({', '.join(map(str, real_roots))}); refusing the repository", path=listing)
            if not real.is_dir():
                problems.append(f"object directory {real} does not exist; check {listing}")
                continue
            if real in seen:
                continue
            if len(found) >= MAX_ALTERNATES:
                problems.append(f"{listing}: more than {MAX_ALTERNATES} alternate object directories; "
                                f"{real} not followed")
                continue
            seen.add(real)
            found.append(Alternate(real, listing, depth))
            read_from(real, depth + 1)   # (depth first, as git links an entry's own alternates right after it)

    read_from(own, 0)
    return AlternatesChain(tuple(found), tuple(problems))


def format_entries(paths: Sequence[Path]) -> bytes:
    """An alternates file naming ``paths`` (absolute, one a line), as ``git clone --shared`` writes it; a path
    git would misread unquoted (a newline, a leading quote or ``#``) is refused."""
    lines = []
    for p in paths:
        text = str(p)
        if not os.path.isabs(text) or "\n" in text or text.startswith(('"', "#")):
            raise InvalidInputError("an alternates entry must be an absolute path git reads unquoted", path=text)
        lines.append(text + "\n")
    return "".join(lines).encode("utf-8", "surrogateescape")


__all__ = ["ALTERNATES", "MAX_DEPTH", "Alternate", "AlternatesChain", "AlternatesRefused", "format_entries",
           "parse_entries", "read_chain", "unquote_c_style"]
