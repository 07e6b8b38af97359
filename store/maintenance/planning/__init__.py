"""Should we? Cheap and pure.

* :mod:`.stats` -- what a repository looks like, gathered without walking its objects (pack headers, a sample of
  loose fan-out directories, a few directory listings), with :mod:`.servingstats` for its serving files;
* :mod:`.strategy` -- ``plan_maintenance(stats, policy, now)``: "should we repack, how, and why", a pure
  function with its reasons in words.
"""
