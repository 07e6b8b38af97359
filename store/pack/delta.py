"""Git-format deltas: the encoder the pack writer's delta search calls.

    index = DeltaIndex(base)                     # once per base: the expensive part
    delta = index.create_delta(target, max_size) # per (base, target) pair: bytes, or None

or, for one pair, ``create_delta(base, target, max_size=...)``. A delta is git's
(source size, target size, then copy/insert ops; see ``_delta_py`` for the
algorithm and the exact encoding); git, dulwich and packyard's readers apply it.

``max_size`` lets the search give up early: the encoder stops and returns None as
soon as the delta would be longer (git drops a delta larger than about half the
target minus overhead; the search computes its own limit). A returned delta is
always the same bytes as without a limit.

Objects above ``max_input`` bytes (default :data:`MAX_INPUT_SIZE`, git's
``core.bigFileThreshold``) take no part in delta compression: such a base is
refused with :class:`LimitExceededError` (ask :func:`should_delta` first), such a
target gets None, so the writer stores it whole.

Two implementations of one algorithm, chosen at import: the C extension
``_delta`` (built by ``pip install``), or the pure-Python ``_delta_py`` when the
extension is absent or ``PACKYARD_PURE_PYTHON=1``. Both return identical bytes, so
the same input gives the same pack either way. :data:`IMPLEMENTATION` says which
one runs ("c" or "python").

Inputs are contiguous bytes-like objects (bytes, or an mmap/memoryview of bytes).
The C index keeps an export of its base's buffer and encodes with the GIL released,
so one index can serve several threads; do not mutate a bytearray base meanwhile.
"""
from __future__ import annotations

from types import ModuleType

from .. import native
from ..errors import LimitExceededError

MAX_INPUT_SIZE = 512 << 20   # bytes; git's core.bigFileThreshold default: larger objects are stored whole


def _choose() -> tuple[ModuleType, str]:
    """The C encoder (``_delta``), unless PACKYARD_PURE_PYTHON=1 or it was not built (store/native.py)."""
    c = native.delta()
    if c is not None:
        return c, "c"
    from . import _delta_py
    return _delta_py, "python"


_impl, IMPLEMENTATION = _choose()


def _byte_size(buf) -> int:
    with memoryview(buf) as mv:
        return mv.nbytes


def should_delta(size: int, max_input: int = MAX_INPUT_SIZE) -> bool:
    """Whether an object of ``size`` bytes may be a delta base or target at all."""
    return size <= min(max_input, _impl.MAX_BASE)


class DeltaIndex:
    """The block index of one base, built once and tried against many targets.

    Raises :class:`LimitExceededError` when ``base`` is above ``max_input`` bytes.
    ``base_size`` is the base's length; ``memory`` the bytes the index itself takes
    (the same figure from both implementations), for a window's memory limit.
    """

    __slots__ = ("_index", "base_size", "memory", "max_input", "encode")

    def __init__(self, base, *, max_input: int = MAX_INPUT_SIZE) -> None:
        size = _byte_size(base)
        if not should_delta(size, max_input):
            raise LimitExceededError(f"delta base of {size} bytes is above the delta limit of "
                                     f"{min(max_input, _impl.MAX_BASE)} bytes")
        self._index = _impl.DeltaIndex(base)
        self.base_size = size
        self.memory: int = self._index.memory
        self.max_input = max_input
        #: ``encode(target, max_size)``: :meth:`create_delta` without its checks, for a caller that already
        #: knows ``target`` is non-empty bytes within ``max_input`` and ``max_size`` >= 0 (the delta search,
        #: which calls it a million times in a repack: the checks cost a third of each small call).
        self.encode = self._index.create_delta

    def create_delta(self, target, max_size: int | None = None) -> bytes | None:
        """The delta from the base to ``target``; None when longer than ``max_size`` (a
        negative limit admits nothing), when ``target`` is above the input limit, or
        when it is empty (git fails to apply a delta whose result is empty)."""
        size = _byte_size(target)
        if not size or size > self.max_input or (max_size is not None and max_size < 0):
            return None
        return self._index.create_delta(target, -1 if max_size is None else max_size)


def create_delta(base, target, *, max_size: int | None = None, max_input: int = MAX_INPUT_SIZE) -> bytes | None:
    """The delta from ``base`` to ``target`` (one pair; build a :class:`DeltaIndex` to
    try one base against several targets); None when it would be longer than
    ``max_size``, either input is above ``max_input`` bytes, or ``target`` is empty."""
    size = _byte_size(target)
    if (not size or size > max_input or not should_delta(_byte_size(base), max_input)
            or (max_size is not None and max_size < 0)):
        return None
    return _impl.DeltaIndex(base).create_delta(target, -1 if max_size is None else max_size)
