"""fsck message ids, their default severities, and the options that change them (git's fsck.h/fsck.c).

The table is git 2.39.5's ``FOREACH_FSCK_MSG_ID`` in the same order (the git the tests run,
Debian 12's), camelCased as git prints them: 2.39.1 (the security release of January 2023,
CVE-2022-23521) added the ``.gitattributes`` checks (gitattributesMissing/Large/LineLength/Blob,
ERROR), which 2.39.0 lacked. Severity rules are git's: ``strict`` turns a WARN into an ERROR;
FATAL ids can only be set to ``error``; ``ignore`` silences an id; a finding about an object on
the skip list is dropped; INFO is reported as a warning (never refuses).
"""
from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping


class Severity(enum.IntEnum):
    IGNORE = 0
    INFO = 1
    FATAL = 2
    ERROR = 3
    WARN = 4


_TABLE = """
NUL_IN_HEADER FATAL
UNTERMINATED_HEADER FATAL
BAD_DATE ERROR
BAD_DATE_OVERFLOW ERROR
BAD_EMAIL ERROR
BAD_NAME ERROR
BAD_OBJECT_SHA1 ERROR
BAD_PARENT_SHA1 ERROR
BAD_TIMEZONE ERROR
BAD_TREE ERROR
BAD_TREE_SHA1 ERROR
BAD_TYPE ERROR
DUPLICATE_ENTRIES ERROR
MISSING_AUTHOR ERROR
MISSING_COMMITTER ERROR
MISSING_EMAIL ERROR
MISSING_NAME_BEFORE_EMAIL ERROR
MISSING_OBJECT ERROR
MISSING_SPACE_BEFORE_DATE ERROR
MISSING_SPACE_BEFORE_EMAIL ERROR
MISSING_TAG ERROR
MISSING_TAG_ENTRY ERROR
MISSING_TREE ERROR
MISSING_TYPE ERROR
MISSING_TYPE_ENTRY ERROR
MULTIPLE_AUTHORS ERROR
TREE_NOT_SORTED ERROR
UNKNOWN_TYPE ERROR
ZERO_PADDED_DATE ERROR
GITMODULES_MISSING ERROR
GITMODULES_BLOB ERROR
GITMODULES_LARGE ERROR
GITMODULES_NAME ERROR
GITMODULES_SYMLINK ERROR
GITMODULES_URL ERROR
GITMODULES_PATH ERROR
GITMODULES_UPDATE ERROR
GITATTRIBUTES_MISSING ERROR
GITATTRIBUTES_LARGE ERROR
GITATTRIBUTES_LINE_LENGTH ERROR
GITATTRIBUTES_BLOB ERROR
EMPTY_NAME WARN
FULL_PATHNAME WARN
HAS_DOT WARN
HAS_DOTDOT WARN
HAS_DOTGIT WARN
NULL_SHA1 WARN
ZERO_PADDED_FILEMODE WARN
NUL_IN_COMMIT WARN
BAD_FILEMODE INFO
GITMODULES_PARSE INFO
GITIGNORE_SYMLINK INFO
GITATTRIBUTES_SYMLINK INFO
MAILMAP_SYMLINK INFO
BAD_TAG_NAME INFO
MISSING_TAGGER_ENTRY INFO
EXTRA_HEADER_ENTRY IGNORE
"""

#: packyard's own id (not in git): a link names an object of another type than it claims
#: (git dies with "object ... is a blob, not a tree" / "expected type"; no msg id there).
LINK_TYPE = "badLinkType"


def _camel(upper: str) -> str:
    parts = upper.lower().split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


DEFAULTS: dict[str, Severity] = {}
for _line in _TABLE.split("\n"):
    if _line.strip():
        _id, _sev = _line.split()
        DEFAULTS[_camel(_id)] = Severity[_sev]
DEFAULTS[LINK_TYPE] = Severity.FATAL

#: git matches ids case-insensitively without underscores ("zeropaddedfilemode").
_BY_LOWER = {k.lower(): k for k in DEFAULTS}


class FsckConfigError(ValueError):
    """A severity setting or skip list git would refuse (unknown id, FATAL demoted, bad type)."""


def canonical_id(text: str) -> str:
    key = text.replace("_", "").lower()
    try:
        return _BY_LOWER[key]
    except KeyError:
        raise FsckConfigError(f"Unhandled message id: {text}") from None


_SEV_NAMES = {"error": Severity.ERROR, "warn": Severity.WARN, "ignore": Severity.IGNORE}


def parse_severities(values: str | Iterable[str] | None) -> tuple[dict[str, Severity], str | None]:
    """git's ``fsck_set_msg_types``: ``"id=sev,id=sev"`` (separators `` ,|``, ``:`` also splits);
    ``skiplist=<path>`` names a skip list. Returns (severities, skiplist path or None)."""
    out: dict[str, Severity] = {}
    skiplist: str | None = None
    if values is None:
        return out, None
    items: list[str] = []
    for chunk in ([values] if isinstance(values, str) else list(values)):
        items.extend(s for s in re.split(r"[ ,|]", chunk) if s)
    for item in items:
        m = re.match(r"([^=:]*)[=:](.*)\Z", item, re.S)
        if m is None:
            raise FsckConfigError(f"Missing '=': '{item}'")
        key, val = m.group(1).lower(), m.group(2)
        if key == "skiplist":
            if not val:
                raise FsckConfigError("skiplist requires a path")
            skiplist = val
            continue
        msg = canonical_id(key)
        sev = _SEV_NAMES.get(val)
        if sev is None:
            raise FsckConfigError(f"Unknown fsck message type: '{val}'")
        if sev is not Severity.ERROR and DEFAULTS[msg] is Severity.FATAL:
            raise FsckConfigError(f"Cannot demote {msg} to {val}")
        out[msg] = sev
    return out, skiplist


def read_skiplist(path: str | os.PathLike[str]) -> frozenset[bytes]:
    """git's ``oidset_parse_file``: one hex id a line; ``#`` starts a comment; blank lines and
    surrounding whitespace ignored; anything else is an error naming the line."""
    ids: set[bytes] = set()
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split(b"#", 1)[0].strip()
            if not line:
                continue
            if not re.fullmatch(rb"[0-9a-fA-F]{40}", line):
                raise FsckConfigError(f"invalid object name in skip list {os.fspath(path)!s} line {lineno}: "
                                      f"{line[:60].decode('ascii', 'replace')}")
            ids.add(bytes.fromhex(line.decode()))
    return frozenset(ids)


#: git's core.bigFileThreshold default: a blob over it is not held in memory by index-pack (its fsck gets no
#: buffer: a .gitmodules or .gitattributes blob that big is gitmodulesLarge / gitattributesLarge).
BIG_FILE_THRESHOLD = 512 << 20


@dataclass(frozen=True)
class FsckOptions:
    """What a check run reports and refuses. ``strict``: WARN counts as ERROR (index-pack --strict)."""

    strict: bool = True
    severities: Mapping[str, Severity] = field(default_factory=dict)
    skiplist: frozenset[bytes] = frozenset()
    #: index-pack prints a missing .gitmodules blob instead of failing (FSCK_OPTIONS_MISSING_GITMODULES);
    #: unpack-objects fails (FSCK_OPTIONS_STRICT). Also a missing .gitattributes blob: git's index-pack
    #: fails on one, but only after its link walk already refused the missing object (ours does the same),
    #: and a write without required links (the objects API) may name blobs it writes later.
    missing_gitmodules_is_error: bool = True
    #: A blob found at .gitmodules / .gitattributes bigger than this is refused unread (git's index-pack with
    #: core.bigFileThreshold): PACKYARD_FSCK_BIG_FILE_THRESHOLD.
    big_file_threshold: int = BIG_FILE_THRESHOLD

    @classmethod
    def from_config(cls, values: str | Iterable[str] | None = None, skiplist_path: str | None = None, *,
                    strict: bool = True, missing_gitmodules_is_error: bool = True,
                    big_file_threshold: int = BIG_FILE_THRESHOLD) -> "FsckOptions":
        sev, path = parse_severities(values)
        path = path or skiplist_path
        skip = read_skiplist(path) if path else frozenset()
        return cls(strict=strict, severities=sev, skiplist=skip,
                   missing_gitmodules_is_error=missing_gitmodules_is_error, big_file_threshold=big_file_threshold)

    def severity(self, msg_id: str) -> Severity:
        got = self.severities.get(msg_id)
        if got is not None:
            return got
        sev = DEFAULTS[msg_id]
        if self.strict and sev is Severity.WARN:
            return Severity.ERROR
        return sev

    def refuses(self, msg_id: str) -> bool:
        return self.severity(msg_id) in (Severity.ERROR, Severity.FATAL)


STRICT = FsckOptions()
