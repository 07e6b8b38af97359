"""A set of object ids kept as packed 20-byte records: the links of one type an fsck batch collects.

A push of 164k objects links to about as many ids; as a Python ``set`` of ``bytes`` each costs ~100
bytes (the object, its slot, the table's spare room), 16 MiB for git-v2.0.0.pack in the receiving
process, which is what kept ``index-pack --strict``'s peak RSS above git's. Here an id costs 20 bytes
once sorted: new ids are appended to a pending buffer, which is folded into the sorted part
(sort, drop repeats) whenever it outgrows it, so the work stays O(n log n) overall and the memory
at most twice the sorted part plus one buffer.

The folding runs in C (``_fsck.sort_unique20`` / ``difference20`` / ``select20``) when built; the
``_py`` functions below are its specification and the fallback (tests/store/test_fsck_linkset.py).
"""
from __future__ import annotations

from typing import Iterable, Iterator

from .. import native

_C = native.fsck()

#: The pending buffer is folded in once it holds this many bytes and more than the sorted part.
FOLD_AT = 1 << 20


def sort_unique20_py(ids: bytes | bytearray | memoryview) -> bytes:
    """Packed ids sorted, each once (the specification of ``_fsck.sort_unique20``)."""
    mv = memoryview(ids)
    if len(mv) % 20:
        raise ValueError("sort_unique20: length is not a multiple of 20")
    return b"".join(sorted({bytes(mv[i:i + 20]) for i in range(0, len(mv), 20)}))


def difference20_py(a: bytes, b: bytes) -> bytes:
    """The ids of sorted-unique ``a`` not in sorted-unique ``b`` (specification of ``difference20``)."""
    if len(a) % 20 or len(b) % 20:
        raise ValueError("difference20: length is not a multiple of 20")
    drop = {b[i:i + 20] for i in range(0, len(b), 20)}
    return b"".join(x for x in (a[i:i + 20] for i in range(0, len(a), 20)) if x not in drop)


def select20_py(ids: bytes | bytearray | memoryview, types: bytes | bytearray, t: int) -> bytes:
    """The ids ``ids[20*i:20*i+20]`` whose ``types[i] == t`` (specification of ``select20``)."""
    n = min(len(ids) // 20, len(types))
    return b"".join(bytes(ids[20 * i:20 * i + 20]) for i in range(n) if types[i] == t)


sort_unique20 = _C.sort_unique20 if _C is not None else sort_unique20_py
difference20 = _C.difference20 if _C is not None else difference20_py
select20 = _C.select20 if _C is not None else select20_py


class LinkSet:
    """Object ids (20-byte ``bytes``), iterated in sorted order; picklable (two byte strings)."""

    __slots__ = ("_sorted", "_pending")

    def __init__(self, ids: Iterable[bytes] = ()) -> None:
        self._sorted = b""
        self._pending = bytearray()
        self.update(ids)

    # -- adding ---------------------------------------------------------------------------------
    def add(self, oid: bytes) -> None:
        self._pending += oid
        self._maybe_fold()

    def update(self, ids: Iterable[bytes]) -> None:
        self._pending += b"".join(ids)
        self._maybe_fold()

    def update_packed(self, packed: bytes | bytearray) -> None:
        """Add ids already packed 20 bytes each."""
        if len(packed) % 20:
            raise ValueError("update_packed: length is not a multiple of 20")
        self._pending += packed
        self._maybe_fold()

    def merge(self, other: "LinkSet") -> None:
        self._pending += other._sorted
        self._pending += other._pending
        self._maybe_fold()

    def _maybe_fold(self) -> None:
        if len(self._pending) >= FOLD_AT and len(self._pending) > len(self._sorted):
            self._fold()

    def _fold(self) -> bytes:
        if self._pending:
            self._pending += self._sorted
            self._sorted = b""
            self._sorted = sort_unique20(self._pending)
            self._pending = bytearray()
        return self._sorted

    # -- reading --------------------------------------------------------------------------------
    def packed(self) -> bytes:
        """Every id once, sorted, packed 20 bytes each."""
        return self._fold()

    def discard_packed(self, sorted_ids: bytes) -> None:
        """Remove every id of ``sorted_ids`` (sorted, each once, packed)."""
        self._sorted = difference20(self._fold(), sorted_ids)

    def __len__(self) -> int:
        return len(self._fold()) // 20

    def __iter__(self) -> Iterator[bytes]:
        s = self._fold()
        return (s[i:i + 20] for i in range(0, len(s), 20))

    def __contains__(self, oid: object) -> bool:
        """A merge walk (difference20), not a hash lookup: membership is for checks and tests, not hot loops."""
        if not isinstance(oid, (bytes, bytearray)) or len(oid) != 20:
            return False
        return not difference20(bytes(oid), self._fold())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LinkSet):
            return self.packed() == other.packed()
        if isinstance(other, (set, frozenset)):
            return len(self) == len(other) and all(x in other for x in self)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> bytes:
        return self._fold()

    def __setstate__(self, st: bytes) -> None:
        self._sorted = st
        self._pending = bytearray()

    def __repr__(self) -> str:
        return f"LinkSet({len(self)} ids)"


__all__ = ["LinkSet", "difference20", "select20", "sort_unique20"]
