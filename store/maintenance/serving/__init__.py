"""The files git serves a repository from, written after a repack.

* :mod:`.ewah`, :mod:`.bitmap` -- a pack's reachability bitmap (git's ``.bitmap``; C in ``_bitmap``);
* :mod:`.midx`, :mod:`.midxbitmap` -- the multi-pack-index v1 (read and written) and its bitmap;
* :mod:`.commitgraph`, :mod:`.bloom`, :mod:`.graphwrite` -- the commit-graph, its changed-path Bloom filters
  (C in ``_bloom``) and its durable install;
* :mod:`.refresh` -- the commit-graph and packed-refs refresh a repack's job runs next.
"""
