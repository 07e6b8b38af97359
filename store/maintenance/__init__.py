"""Repository maintenance that decides for itself: cheap statistics and a pure planning strategy.

* :mod:`.stats` — what a repository looks like, gathered without walking its objects
  (pack headers, a sample of loose fan-out directories, a few directory listings);
* :mod:`.strategy` — ``plan_maintenance(stats, policy, now)``: "should we repack, how, and why",
  a pure function with its reasons in words;
* :mod:`.leftovers` — the cleanup a ``gc`` plan runs (stale temp files, expired preserved packs).

"Do it" (repack, gc) is a job in the worker layer; nothing here imports Celery, Redis or SQL.
"""
