"""Maintenance of a repository's object store: deciding what is due, and doing it.

Should we? (pure, cheap)

* :mod:`.stats` — what a repository looks like, gathered without walking its objects
  (pack headers, a sample of loose fan-out directories, a few directory listings);
* :mod:`.strategy` — ``plan_maintenance(stats, policy, now)``: "should we repack, how, and why",
  a pure function with its reasons in words.

Do it:

* :mod:`.tips` — the starting points of reachability (refs, HEAD, reflogs);
* :mod:`.walk` — what the tips reach, in git's pack order (the older history's trees in a forked helper);
* :mod:`.sources` — where each object of the start snapshot lives (pack entry or loose file);
* :mod:`.writeplan` — a plan written into a pack: reused deltas copied verbatim, new ones from the delta search
  (:mod:`..pack.search`), the rest whole;
* :mod:`.repack` — the ``full``, ``geometric`` and ``loose`` repacks, and what a repack may delete;
* :mod:`.preserved` — replaced packs kept in ``objects/pack/preserved/`` for a while, then expired;
* :mod:`.leftovers` — what dead writers and repacks left behind (temp files, half-moved packs).

The jobs (repack, gc) live in the worker layer; nothing here imports Celery, Redis or SQL.
"""
