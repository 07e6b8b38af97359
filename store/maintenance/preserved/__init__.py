"""What a repack replaced, kept in ``objects/pack/preserved/`` for readers that listed it before, then expired.

* :mod:`.packs` -- preserved packs: linking ahead on shared filesystems, retiring, expiry (the module doc tells
  the order of a move; the move itself is :mod:`packyard.store.preserve`, which every layer may finish);
* :mod:`.loose` -- a repack's deleted loose files kept as hard links in ``preserved/loose-<hex>/``.
"""
