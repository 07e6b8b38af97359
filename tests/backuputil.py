"""Helpers for the backup tests: Gitaly's repository checksum computed from git's own output."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from gitutil import git

GITALY_REFS = re.compile(rb"HEAD|(refs/(heads|tags|keep-around|merge-requests|environments|notes)/)")


def gitaly_checksum_by_git(git_dir: Path) -> str:
    """Gitaly's rule written out over git's output: XOR of SHA-1(line) as a big integer, hex of its minimal
    bytes, forty zeros when empty."""
    out = git("show-ref", "--head", git_dir=git_dir, check=False)
    total = 0
    for line in out.splitlines():
        if GITALY_REFS.search(line):
            total ^= int(hashlib.sha1(line).hexdigest(), 16)
    if not total:
        return "0" * 40
    raw = total.to_bytes(20, "big").lstrip(b"\0")
    return raw.hex()
