"""Maintenance of a repository's object store: repacking, cruft packs, preserved packs.

* :mod:`.walk` — what the refs reach, in git's pack order;
* :mod:`.sources` — where each object of the start snapshot lives (pack entry or loose file);
* :mod:`.repack` — the ``full``, ``geometric`` and ``loose`` repacks, and what a repack may delete;
* :mod:`.preserved` — replaced packs kept in ``objects/pack/preserved/`` for a while, then expired;
* :mod:`.tips` — the starting points of reachability (refs, HEAD, reflogs).
"""
