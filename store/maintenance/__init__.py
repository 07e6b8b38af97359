"""Maintenance of a repository's object store: deciding what is due, and doing it.

Six concerns, one subpackage each, in layer order (a package may import those above it in this list and the
store's core -- objects, objdir, install, pack/, preserve, leftovers -- never those below it; the backups,
:mod:`packyard.store.backup`, sit above every one of them and nothing here imports them;
tests/store/test_layers.py checks it):

* :mod:`.walk` -- what the tips reach: the tips (refs, HEAD, reflogs), the commit and tree parsers, where each
  object of a snapshot lives (pack entry or loose file) and the reachability walk in git's pack order (C: _walk);
* :mod:`.serving` -- the formats git serves from: reachability bitmaps and EWAH, the multi-pack-index and its
  bitmap, the commit-graph with its Bloom filters, and their refresh after a repack (C: _bitmap, _bloom);
* :mod:`.preserved` -- replaced packs and loose files kept in ``objects/pack/preserved/`` for a while, then
  expired (the move itself is :mod:`packyard.store.preserve`);
* :mod:`.repack` -- the ``full``, ``geometric`` and ``loose`` repacks: their options, plans (cruft ages, names,
  delta islands), the write plan with reused deltas and the delete rule;
* :mod:`.pool` -- object pools: create, fetch, link, disconnect and delete, and what a pool's repack keeps;
* :mod:`.planning` -- "should we?": a repository's statistics gathered without walking its objects and the pure
  strategy that turns them into a plan with reasons.

The jobs (repack, gc, pools) live in the worker layer; nothing here imports Celery, Redis or SQL.
"""
