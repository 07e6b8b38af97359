"""The repository checksum Gitaly computes (``CalculateChecksum``; Praefect compares it between replicas).

Gitaly's rule (``internal/git/checksum.go`` and ``service/repository/calculate_checksum.go``): run
``git show-ref --head``; for each output line ``<hex oid> <refname>`` that the regular expression
``HEAD|(refs/(heads|tags|keep-around|merge-requests|environments|notes)/)`` matches *anywhere* (it is not
anchored: ``refs/remotes/origin/HEAD`` counts, ``refs/remotes/origin/main`` does not), take the SHA-1 of
the line (no newline) and XOR it into a big integer. The checksum is that integer's minimal big-endian
bytes in hex (Go's ``big.Int.Bytes``: leading zero bytes dropped), or forty zeros when no line counted.

Here the lines come from packyard's own ``RefStore`` (loose refs over packed-refs, symbolic refs resolved,
HEAD first when it resolves), the lines ``git show-ref --head`` prints; no git process is run.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from packyard.store.refs import RefStore

#: Gitaly's ``refsAllowed`` (searched, not anchored, in the whole line)
ALLOWED = re.compile(rb"HEAD|(refs/(heads|tags|keep-around|merge-requests|environments|notes)/)")
#: the checksum of a repository with no counted ref (Gitaly's ``ZeroChecksum``)
ZERO_CHECKSUM = "0" * 40


@dataclass(frozen=True)
class Checksum:
    """A repository's checksum and how many show-ref lines went into it."""

    hex: str
    counted: int
    refs: int   # show-ref lines in all (HEAD included)

    def __str__(self) -> str:
        return self.hex


def show_ref_lines(refs: Mapping[str, bytes], head: bytes | None) -> list[bytes]:
    """The lines ``git show-ref --head`` prints for ``refs`` (name -> oid) and HEAD's value (None: unborn)."""
    lines = [] if head is None else [head.hex().encode() + b" HEAD"]
    lines += [oid.hex().encode() + b" " + name.encode() for name, oid in sorted(refs.items())]
    return lines


def checksum_of_lines(lines: Iterable[bytes]) -> Checksum:
    """Gitaly's checksum of ``git show-ref``-style lines (trailing newlines ignored)."""
    total = 0
    counted = seen = 0
    for raw in lines:
        line = raw.rstrip(b"\n")
        seen += 1
        if not ALLOWED.search(line):
            continue
        counted += 1
        total ^= int.from_bytes(hashlib.sha1(line).digest(), "big")
    if total == 0:
        return Checksum(ZERO_CHECKSUM, counted, seen)
    return Checksum(total.to_bytes((total.bit_length() + 7) // 8, "big").hex(), counted, seen)


def repository_checksum(git_dir: str | os.PathLike[str]) -> Checksum:
    """The checksum of the repository at ``git_dir`` (a bare repository's directory), from its refs as they
    are now: one read of packed-refs and the loose refs (``RefStore.as_dict``)."""
    store = RefStore(Path(git_dir))
    refs = store.as_dict()
    return checksum_of_lines(show_ref_lines(refs, store.resolve("HEAD")))


def differing_refs(ours: Mapping[str, bytes], theirs: Mapping[str, bytes]) -> list[tuple[str, str, str]]:
    """``(name, our hex or "-", their hex or "-")`` for each counted ref the two maps disagree on, sorted."""
    out = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        if a != b and ALLOWED.search(name.encode()):
            out.append((name, a.hex() if a else "-", b.hex() if b else "-"))
    return out
