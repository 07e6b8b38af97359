"""Packs: git's pack format, reading packs, writing them, and ingesting pushed ones.

Reading
* :mod:`.format` — byte-level pieces of the pack format (header, entry header, delta header);
* :mod:`.entries` — the one entry reader (pack bytes in memory or mapped from a file);
* :mod:`.resolve` — the one delta resolver (every check git's index-pack makes on a delta);
* :mod:`.cache` — the per-process delta-base cache (git's ``core.deltaBaseCacheLimit``);
* :mod:`.packdir` — installed packs (``objects/pack``) and the immutable pack list;
* :mod:`.idxread` — a whole ``.idx`` v2 read at once as compact arrays;
* :mod:`.mtimes` — a cruft pack's ``.mtimes``;
* :mod:`.midx` — the multi-pack-index v1 (read and written).

Writing
* :mod:`.write` — the one pack writer;
* :mod:`.search` — the delta search: which object is stored as a delta of which (git's sliding window);
* :mod:`.delta` — the delta encoder (C behind :mod:`packyard.store.native`, pure-Python fallback ``_delta_py``);
* :mod:`.idxwrite` — the ``.idx`` v2, ``.rev`` and ``.mtimes`` writers.

Ingesting
* :mod:`.indexpack` — index-pack: a pushed pack verified in quarantine and installed;
* :mod:`.receive` — index-pack's receive phase: the incoming stream parsed while it is quarantined;
* :mod:`.resolvedeltas` — index-pack's delta resolution, in process or on forked workers;
* :mod:`.quarantine` — index-pack's ``incoming-*`` quarantines and ``.keep`` files (stale ones by the leftovers table);
* :mod:`.unpack` — unpack-objects: a small pack exploded into loose objects.
"""
