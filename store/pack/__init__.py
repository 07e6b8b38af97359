"""Packs: git's pack format, reading packs, writing them, and ingesting pushed ones.

* :mod:`.format` — byte-level pieces of the pack format (header, entry header, delta header);
* :mod:`.idxwrite` — the ``.idx`` v2 / ``.rev`` writer;
* :mod:`.packdir` — installed packs (``objects/pack``) and the immutable pack list;
* :mod:`.indexpack` — index-pack: a pushed pack verified in quarantine and installed;
* :mod:`.quarantine` — index-pack's ``incoming-*`` quarantines and ``.keep`` files (stale ones by the leftovers table);
* :mod:`.unpack` — unpack-objects: a small pack exploded into loose objects;
* :mod:`.delta` — the delta encoder (C extension ``_delta``, pure-Python fallback ``_delta_py``);
* :mod:`.search` — the delta search: which object is stored as a delta of which (git's sliding window);
* :mod:`.write` — the one pack writer.
"""
