"""The manifest of one repository's backup directory: ``manifest.json``, every backup in the order made.

Each entry names its bundle file (relative to the directory), the bundle's SHA-256 and size, the refs and HEAD
it recorded, the repository checksum of that snapshot (store/backup/checksum.py) and where it sits in its
chain: a ``full`` entry starts a chain (``chain`` is its own id, ``parent`` None); an ``incremental`` entry's
``parent`` is the entry it builds on and ``chain`` the full entry it rests on. The file is written last, after
the bundle it names is durable, and durably itself (temp file, fsync, rename, directory fsync:
store/durable.py), so a backup killed at any step leaves either its complete entry or none.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import durable
from ..errors import BackupChainError

MANIFEST_NAME = "manifest.json"
FORMAT = 1
KINDS = ("full", "incremental")
#: The most entries a manifest is read with (a nightly backup for a century is ~36,500).
MAX_ENTRIES = 1 << 20
#: The largest manifest read (bytes).
MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class BackupEntry:
    id: str                  # sortable: 20261207T015500Z-1a2b3c4d
    kind: str                # "full" | "incremental"
    chain: str               # id of the chain's full entry
    parent: str | None
    file: str                # bundle name relative to the directory
    sha256: str
    size: int
    objects: int
    refs: dict[str, str]     # name -> hex
    head: str | None         # HEAD's symref target ("refs/heads/main"); None: detached or unborn
    checksum: str            # the repository checksum of the snapshot
    created: float
    verified: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: object, path: object) -> "BackupEntry":
        if not isinstance(raw, dict):
            raise BackupChainError(path, f"a manifest entry is not an object: {str(raw)[:80]}")
        want: dict[str, type | tuple[type, ...]] = {
            "id": str, "kind": str, "chain": str, "file": str, "sha256": str, "size": int, "objects": int,
            "refs": dict, "checksum": str, "created": (int, float), "verified": bool}
        for key, typ in want.items():
            if not isinstance(raw.get(key), typ):
                raise BackupChainError(path, f"manifest entry {raw.get('id')!r}: field {key!r} missing or mistyped")
        for key in ("parent", "head"):
            if raw.get(key) is not None and not isinstance(raw[key], str):
                raise BackupChainError(path, f"manifest entry {raw['id']!r}: field {key!r} is not a string")
        if raw["kind"] not in KINDS:
            raise BackupChainError(path, f"manifest entry {raw['id']!r}: unknown kind {raw['kind']!r}")
        refs = raw["refs"]
        if not all(isinstance(k, str) and isinstance(v, str) and len(v) == 40 for k, v in refs.items()):
            raise BackupChainError(path, f"manifest entry {raw['id']!r}: refs must map names to 40-hex ids")
        if "/" in raw["file"] or raw["file"] in ("", ".", "..") or raw["file"].startswith("."):
            raise BackupChainError(path, f"manifest entry {raw['id']!r}: file {raw['file']!r} is not a plain name")
        return cls(id=raw["id"], kind=raw["kind"], chain=raw["chain"], parent=raw.get("parent"), file=raw["file"],
                   sha256=raw["sha256"], size=raw["size"], objects=raw["objects"], refs=dict(refs),
                   head=raw.get("head"), checksum=raw["checksum"], created=float(raw["created"]),
                   verified=raw["verified"])


@dataclass(frozen=True)
class Manifest:
    entries: tuple[BackupEntry, ...] = ()    # in the order they were made

    def latest(self) -> BackupEntry | None:
        return self.entries[-1] if self.entries else None

    def get(self, entry_id: str) -> BackupEntry | None:
        for e in self.entries:
            if e.id == entry_id:
                return e
        return None

    def chains(self) -> list[list[BackupEntry]]:
        """Every chain (its full entry, then its incrementals in the order made), oldest chain first."""
        by_chain: dict[str, list[BackupEntry]] = {}
        for e in self.entries:
            by_chain.setdefault(e.chain, []).append(e)
        return list(by_chain.values())

    def chain_upto(self, entry_id: str) -> list[BackupEntry]:
        """The entries a restore of ``entry_id`` applies, oldest (the full one) first: its parents back to the
        chain's full entry. BackupChainError for an unknown id or a gap (a parent not in the manifest)."""
        entry = self.get(entry_id)
        if entry is None:
            raise BackupChainError(entry_id, "no backup with this id in the manifest")
        out = [entry]
        for _ in range(len(self.entries)):
            if entry.kind == "full":
                out.reverse()
                return out
            if entry.parent is None:
                raise BackupChainError(entry.file, f"incremental backup {entry.id} names no parent")
            parent = self.get(entry.parent)
            if parent is None:
                raise BackupChainError(entry.file, f"the chain has a gap: backup {entry.id} builds on {entry.parent}, "
                                                   f"which the manifest does not hold")
            entry = parent
            out.append(entry)
        raise BackupChainError(entry_id, "the chain's parents form a loop")

    def with_entry(self, entry: BackupEntry) -> "Manifest":
        """This manifest with ``entry`` replacing the one of its id, or appended."""
        if self.get(entry.id) is None:
            return Manifest((*self.entries, entry))
        return Manifest(tuple(entry if e.id == entry.id else e for e in self.entries))

    def without(self, ids: set[str] | frozenset[str]) -> "Manifest":
        return Manifest(tuple(e for e in self.entries if e.id not in ids))


def new_entry_id(now: float | None = None) -> str:
    """A sortable id: the UTC time to the second and 8 random hex digits."""
    t = time.time() if now is None else now
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t)) + "-" + secrets.token_hex(4)


def load_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """The manifest of ``directory`` (missing: an empty one); BackupChainError naming the file if unreadable."""
    path = Path(directory) / MANIFEST_NAME
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return Manifest()
    except OSError as err:
        raise BackupChainError(path, f"cannot read the manifest: {err.strerror}") from err
    if len(data) > MAX_BYTES:
        raise BackupChainError(path, f"the manifest is larger than {MAX_BYTES} bytes")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise BackupChainError(path, f"the manifest is not JSON: {err}") from err
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("entries"), list):
        raise BackupChainError(path, f"the manifest is not a format-{FORMAT} backup manifest")
    if len(raw["entries"]) > MAX_ENTRIES:
        raise BackupChainError(path, f"the manifest has more than {MAX_ENTRIES} entries")
    entries = tuple(BackupEntry.from_json(e, path) for e in raw["entries"])
    if len({e.id for e in entries}) != len(entries):
        raise BackupChainError(path, "the manifest names one backup id twice")
    return Manifest(entries)


def save_manifest(directory: str | os.PathLike[str], manifest: Manifest,
                  counters: durable.DurabilityCounters | None = None) -> None:
    """Write ``manifest.json`` durably: a temp file in the directory, fsync, rename, directory fsync."""
    data = json.dumps({"format": FORMAT, "entries": [e.to_json() for e in manifest.entries]}, indent=1,
                      sort_keys=True).encode() + b"\n"
    durable.write_file_durably(Path(directory) / MANIFEST_NAME, data, mode=0o644, counters=counters)


__all__ = ["MANIFEST_NAME", "BackupEntry", "Manifest", "load_manifest", "save_manifest", "new_entry_id"]
