"""Repack: ``full``, ``geometric`` and ``loose``, with cruft packs and preserved packs, never losing an object.

* :mod:`.options` -- what a repack is asked to do and what it reports (options, counters, result, hooks);
* :mod:`.plan` -- what goes into the new packs and why (with :mod:`.cruft` for unreachable objects' ages,
  :mod:`.names` for the delta search's order, :mod:`.looseread` for the loose objects read ahead, and
  :mod:`.islands` for delta islands);
* :mod:`.writeplan`, :mod:`.reuse` -- a plan written into a pack: reused deltas copied verbatim, new ones from
  the delta search (:mod:`packyard.store.pack.search`), the rest whole;
* :mod:`.run` -- one repack, step by step, and its delete rule (:func:`.run.delete_old_packs`).
"""
