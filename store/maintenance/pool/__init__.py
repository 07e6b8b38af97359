"""Object pools: one repository that holds a fork network's shared objects, borrowed by its members through
``objects/info/alternates`` (Gitaly's ``internal/git/objectpool``; GitHub's network repositories).

* :mod:`.layout` -- what makes a directory a pool (its marker), its members file, and the ref namespace each
  member's refs are kept under in the pool (``refs/virtual/<key>/``, git's documented island example);
* :mod:`.transfer` -- the one copy between a repository and a pool: the objects some tips reach that the
  destination lacks, written by the one pack writer (deltas reused) and installed by the one install sequence;
* :mod:`.lifecycle` -- create, fetch, link, disconnect and delete, each ordered so that a kill at any step
  leaves the pool and every member complete (``git fsck --full``), with a fault point between steps;
* :mod:`.members` -- what the pool's repack must keep for its members: everything their refs reach.

The layer rule: this package calls the repack (a member's dedupe is a full repack, ``git repack -a -d -l``)
and the walk; nothing below it imports it.
"""
