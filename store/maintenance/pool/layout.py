"""A pool on disk: its marker, its members file, its ref namespaces.

* ``packyard/pool`` (JSON: the source it was created from, its namespace key, when): written when the pool is
  created; a repository without it is not a pool, and ``link`` refuses to make anything borrow from it. The
  source's island is the pool's island core (:func:`source_key`); a marker written before the key was kept
  names the source only, whose default key is :func:`member_key` of its path;
* ``packyard/members``: the git dir of every member, one resolved absolute path a line. It is the pool's own
  record, kept beside its objects, so that the pool's repack protects what its members reach even when the
  records database is unavailable (the database mirrors it for ``pool list`` and ``status``). A member is
  added BEFORE its alternates file is written and removed only AFTER that file is gone: at no moment does a
  repository borrow from a pool that does not know it;
* ``refs/virtual/<key>/...``: a member's refs as the pool keeps them (``fetch``), ``<key>`` a short name for
  the member (a hash of its path unless the caller names one). The delta islands regex is
  :data:`ISLAND_REGEX` over the same namespace.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from ... import durable
from ...errors import InvalidInputError

MARKER = Path("packyard") / "pool"
MEMBERS = Path("packyard") / "members"
NAMESPACE = "refs/virtual/"
#: git's pack.island for a pool: one island per member namespace (Documentation/config/pack.txt's example).
ISLAND_REGEX = r"refs/virtual/([^/]+)/"
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
#: A members file is a path a line; a pool with more members than this is refused (a bound on every loop).
MAX_MEMBERS = 100_000


def member_key(git_dir: Path) -> str:
    """The default namespace key of a member: 16 hex digits of its resolved path's SHA-1."""
    return hashlib.sha1(os.fsencode(os.path.realpath(git_dir))).hexdigest()[:16]


def check_key(key: str) -> str:
    if not _KEY.match(key) or ".." in key or key.endswith((".lock", ".")):
        raise InvalidInputError(f"a pool namespace key is 1-64 letters, digits, '_', '-' or '.', not {key!r}")
    return key


def namespace(key: str) -> str:
    return f"{NAMESPACE}{check_key(key)}/"


def is_pool(git_dir: Path) -> bool:
    return (git_dir / MARKER).is_file()


def read_marker(git_dir: Path) -> dict:
    try:
        data = json.loads((git_dir / MARKER).read_text())
    except FileNotFoundError:
        raise InvalidInputError("not an object pool (no packyard/pool marker)", path=git_dir) from None
    except (OSError, ValueError) as err:
        raise InvalidInputError(f"the pool marker cannot be read: {err}", path=git_dir / MARKER) from err
    if not isinstance(data, dict):
        raise InvalidInputError("the pool marker is not a JSON object", path=git_dir / MARKER)
    return data


def write_marker(git_dir: Path, source: Path, key: str, counters: durable.DurabilityCounters | None = None) -> None:
    (git_dir / MARKER).parent.mkdir(exist_ok=True)
    data = json.dumps({"source": str(source), "key": check_key(key), "created": int(time.time())},
                      sort_keys=True).encode() + b"\n"
    durable.write_file_durably(git_dir / MARKER, data, mode=0o644, counters=counters)


def source_key(marker: dict) -> str | None:
    """The namespace key of the source the pool was made from: the marker's ``key``, else (a marker written
    before it kept one) :func:`member_key` of its ``source``; None when the marker names neither."""
    key = marker.get("key")
    if isinstance(key, str):
        return check_key(key)
    source = marker.get("source")
    return member_key(Path(source)) if isinstance(source, str) and source else None


def fetch_key(git_dir: Path, source: Path, key: str | None = None) -> str:
    """The namespace key a fetch of ``source`` into the pool ``git_dir`` writes: ``key`` when named; the
    marker's key when ``source`` is the repository the pool was made from (so a pool made with ``--key`` keeps
    its source's refs in one namespace); else :func:`member_key` of ``source``."""
    if key is not None:
        return check_key(key)
    marker = read_marker(git_dir)
    if os.path.realpath(marker.get("source") or "") == os.path.realpath(source):
        made_from = source_key(marker)
        if made_from is not None:
            return made_from
    return member_key(source)


def read_members(git_dir: Path) -> tuple[Path, ...]:
    """The pool's members, as its members file lists them (empty: none, or not a pool)."""
    try:
        with open(git_dir / MEMBERS, "rb") as f:
            data = f.read(MAX_MEMBERS * 4097 + 1)
    except FileNotFoundError:
        return ()
    lines = [line for line in data.decode("utf-8", "surrogateescape").split("\n") if line]
    if len(lines) > MAX_MEMBERS:
        raise InvalidInputError(f"pool members file lists more than {MAX_MEMBERS} members", path=git_dir / MEMBERS)
    return tuple(Path(line) for line in lines)


def write_members(git_dir: Path, members: tuple[Path, ...] | list[Path],
                  counters: durable.DurabilityCounters | None = None) -> None:
    """Replace the members file durably (temp, flush, rename, directory fsync); sorted, no duplicates."""
    unique = sorted({str(Path(os.path.realpath(m))) for m in members})
    for m in unique:
        if "\n" in m:
            raise InvalidInputError("a member path may not contain a newline", path=m)
    (git_dir / MEMBERS).parent.mkdir(exist_ok=True)
    durable.write_file_durably(git_dir / MEMBERS, "".join(f"{m}\n" for m in unique).encode("utf-8", "surrogateescape"),
                               mode=0o644, counters=counters)


__all__ = ["ISLAND_REGEX", "MARKER", "MEMBERS", "NAMESPACE", "check_key", "fetch_key", "is_pool", "member_key",
           "namespace", "read_marker", "read_members", "source_key", "write_marker", "write_members"]
