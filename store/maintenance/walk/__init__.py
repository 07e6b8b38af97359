"""What the tips reach, read as git reads it.

* :mod:`.tips` -- the starting points of reachability (refs, HEAD, reflogs);
* :mod:`.parse` -- the commit and tree parsers the walk, the bitmaps, the names and the commit-graph share;
* :mod:`.sources` -- where each object of the start snapshot lives (pack entry or loose file);
* :mod:`.reach` -- what the tips reach, in git's pack order (the older history's trees in a forked helper; C in
  ``_walk``, whose Packs and reader the other extensions take through its capsule).
"""
