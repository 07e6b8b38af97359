"""The tips reachability starts from: every ref (loose and packed-refs), HEAD (symbolic or
detached), and the objects the reflogs name (git's ``--all --reflog``)."""
from __future__ import annotations

import os
from pathlib import Path

from ...objects import HEX_RE, ZERO_OID


def read_tips(repo) -> dict[str, bytes]:
    """{name: object id} for every starting point; re-read right before a repack deletes anything."""
    tips: dict[str, bytes] = dict(repo.refs.as_dict())
    head = repo.refs.resolve("HEAD")
    if head is not None:
        tips["HEAD"] = head
    for name, oid in _reflog_ids(Path(repo.path)):
        tips.setdefault(name, oid)
    return tips


def _reflog_ids(git_dir: Path):
    """(``<log>@{n}``, id) for every old and new value in logs/ (objects a reflog can still show)."""
    logs = git_dir / "logs"
    if not logs.is_dir():
        return
    for dirpath, _dirs, files in os.walk(logs):
        for fname in files:
            path = Path(dirpath) / fname
            try:
                text = path.read_bytes()
            except OSError:
                continue
            ref = path.relative_to(logs).as_posix()
            for n, line in enumerate(text.splitlines()):
                parts = line.split(b" ", 2)
                for k, hexid in enumerate(parts[:2]):
                    h = hexid.decode("ascii", "replace")
                    if HEX_RE.match(h):
                        oid = bytes.fromhex(h)
                        if oid != ZERO_OID:
                            yield f"{ref}@{{{n}}}{'' if k else '^old'}", oid
