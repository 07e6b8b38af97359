"""Maintenance of a repository's object store: repacking, cruft packs, preserved packs.

* :mod:`.tips` — the starting points of reachability (refs, HEAD, reflogs);
* :mod:`.walk` — what the tips reach, in git's pack order (the older history's trees in a forked helper);
* :mod:`.sources` — where each object of the start snapshot lives (pack entry or loose file);
* :mod:`.writeplan` — a plan written into a pack: verbatim copies, the rest whole (the delta search's seam);
* :mod:`.repack` — the ``full``, ``geometric`` and ``loose`` repacks, and what a repack may delete;
* :mod:`.preserved` — replaced packs kept in ``objects/pack/preserved/`` for a while, then expired;
* :mod:`.leftovers` — what dead repacks left behind (temp files, half-moved packs).
"""
