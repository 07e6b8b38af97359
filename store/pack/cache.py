"""One delta-base cache per process, like git's ``core.deltaBaseCacheLimit`` (96 MiB).

Resolving a delta chain inflates every entry below it; the objects met on the way are kept
here, keyed by ``(pack name, offset)``, so the next chain that passes through them stops
early. A pack's name is its checksum, so an entry's content never changes under its key,
whichever :class:`~.packdir.PackFile` (or which copy of the pack, e.g. in ``preserved/``)
read it. The bound is for the whole process: a repository with 50 packs costs at most
96 MiB, not 50 times that. Least recently used entries go first; an object larger than a
quarter of the limit is not kept (it would evict everything else).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

#: git's default core.deltaBaseCacheLimit.
DELTA_BASE_CACHE_BYTES = 96 * 1024 * 1024


class DeltaBaseCache:
    """An LRU of resolved objects keyed by (pack name, offset), bounded in bytes; thread-safe."""

    def __init__(self, limit: int = DELTA_BASE_CACHE_BYTES) -> None:
        self.limit = limit
        self.used = 0
        self._items: OrderedDict[tuple[str, int], tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, pack: str, offset: int) -> tuple[int, bytes] | None:
        key = (pack, offset)
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, pack: str, offset: int, type_num: int, data: bytes) -> None:
        if len(data) > self.limit // 4:
            return
        key = (pack, offset)
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (type_num, data)
            self.used += len(data)
            while self.used > self.limit:
                _, (_, old) = self._items.popitem(last=False)
                self.used -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.used = 0

    def __len__(self) -> int:
        return len(self._items)


#: The process's cache (shared by every PackFile of every repository opened in this process).
BASE_CACHE = DeltaBaseCache()
