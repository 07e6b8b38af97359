"""The repack/read race harness (``packyard race``): readers, repacks and pushes racing on purpose.

* :mod:`.readers` -- a reader PROCESS: one long-lived :class:`~packyard.store.repo.Repository`, as a
  hosting frontend's read path holds one, resolving objects reachable from the refs (full reads,
  ``quick`` existence checks, and existence checks for absent ids, which re-list ``objects/pack``
  as a frontend's negotiation does). Every miss is classified: recovered by re-listing, recovered
  from ``preserved/``, answered "absent" by a quick check (expected), or LOST (an object that
  existed could not be read: a bug).
* :mod:`.pushes` -- the frontend's side: the repository the harness builds with git (history in
  one old pack, topic branches whose objects only they reach) and the pushes it makes (thin packs,
  loose-object batches, force pushes that make a topic's objects unreachable).
* :mod:`.harness` -- the run: real Celery workers repack (full, loose, geometric, alternating) and
  ingest the pushes (index_pack, unpack_objects, write_objects) through the queue while N readers
  read; every miss becomes a ``race_events`` row (written in batches), the run a ``packyard.race``
  job row; the summary; the final check that every pushed object is readable.
* :mod:`.pool` -- ``packyard race --pool``: a fork network (the source, forks, their pool) whose every job --
  the pool's repacks, member repacks, thin pushes with bases in the pool, fetches, a disconnect -- races readers
  and clones of every member; git's fsck and ``rev-list --objects`` of each judge it afterwards
  (:mod:`.poolsummary`: its options and summary; negative control ``unsafe_pool_prune``);
* :mod:`.summary` -- the run's options and its summary (the job row's counters, the printed report);
  :mod:`.hosts` -- ``--hosts 2``: which host repacks and which reads in each phase, and where the job rows
  say each job ran.

The negative controls prove the harness can fail: ``unsafe_dir_cache`` flips the readers' one
unsafe option (git's rejected stat_validity patch, ``Repository(unsafe_trust_dir_mtime=True)``),
``unsafe_delete`` makes the repacks unlink replaced packs at once (``preserve=False``).
"""
