"""packyard tasks, and the contract every task module follows.

Layers
------
* ``workers/commands/<name>.py`` — the plain work function. It takes ids, paths and
  parameters plus ``progress: Progress | None`` (``packyard.store.progress``) and returns
  a JSON-able dict with ``"counters": {name: int, ...}``. No Celery in it; tests call it
  directly. It raises ``packyard.store.errors.StoreError`` subclasses for bad input.
* ``workers/tasks/<name>.py`` — the Celery task, about 15 lines::

      from packyard.workers.app import app
      from packyard.workers.commands import unpack_objects as command
      from packyard.workers.confine import InputKind
      from packyard.workers.tasks.base import PackyardTask


      @app.task(name="packyard.unpack_objects", bind=True, base=PackyardTask,
                inputs={"pack_path": InputKind.FILE})   # read from the incoming dir, opened for the body
      def unpack_objects(self: PackyardTask, repo: str, pack_path: str) -> dict:
          \"\"\"One line: what the job does.\"\"\"
          self.bind_log(pack=pack_path.name)            # extra log context, if any
          with self.repo_lock(repo) as lease:          # storage tasks that write: the repo lease
              return self.call(command.unpack_objects, repo, pack_path, lease=lease)

  - The repository is the parameter named ``repo`` (keyword or first positional): the job
    row's repository and the ``repo`` log field come from it.
  - Every delivery passes :func:`packyard.workers.tasks.boundary.prepared` before the body runs
    (no task repeats it): arguments are checked against the function's annotations
    (InvalidInputError naming the argument), ``repo`` must lie in a storage root and arrives as
    its resolved absolute path, and each input argument declared with
    ``@app.task(..., inputs={"pack": InputKind.FILE})`` must lie in the incoming dir: a FILE
    arrives as an open binary file (closed after the job), a FILE_OR_DIRECTORY as its checked
    path (:mod:`packyard.workers.confine`). Annotate arguments with the JSON types the message
    carries (``str``, ``int``, ``bool``, ``list[dict]``, ``X | None``).
  - Time limits come from PACKYARD_TIME_LIMITS for the task's kind (the name without
    ``packyard.``): past the soft limit the body gets SoftTimeLimitExceeded and the job fails
    with a LimitExceededError naming the limit; add the kind's limits to DEFAULT_TIME_LIMITS
    in workers/settings.py when the ``default`` entry does not fit.
  - ``PackyardTask`` (``packyard.workers.tasks.base``) records the job row (STARTED, then SUCCESS with
    the returned counters or FAILURE with ``str(err)``), binds ``job_id``/``task``/``repo`` to
    every log line, logs one ``job.finished`` summary, acks late and re-queues when the worker
    process dies. The queued row is written when the task is published (any publisher).
    Every delivery is counted (``attempts``); a delivery of a job that already has its
    outcome is acknowledged without running (checked at start and under the lease). Claim
    files the store creates during the job name it (``owner.bind_job``).
  - ``self.call(fn, *args, **kw)`` passes ``progress=self.progress`` and maps errors:
    StoreError → the job fails (no retry); LockLostError, LockContendedError and Redis
    connection/timeouts (also when raised in the task body itself) → ``self.retry_later(err)``:
    retry with exponential backoff (PACKYARD_TASK_MAX_RETRIES, then the job fails), the retry
    published once the broker answers (it may be restarting).
  - ``self.progress(phase, done, total)`` → ``update_state("PROGRESS", {phase, done, total})``
    at most every 0.5 s per phase, which Flower and dashboards show.
  - ``self.repo_lock(repo)`` → the repository lease (:mod:`packyard.workers.locks`) with the configured TTL,
    renewed in the background; events go to ``lock_events``; ``lease.token`` is the fencing token
    (commands pass it to their ref updates, and the ref store refuses a token older than one it saw);
    ``lease.check()`` raises LockLostError (→ retry). A repository locked for more than 30 s
    retries the job later; a lease whose holder process is dead is broken at once. Once the
    lease is held, a job another delivery finished meanwhile stops (AlreadyFinished).
  - ``self.maintenance_lock(repo, wait=None, on_busy="wait")`` → the repository's *maintenance* lease
    (repack, prune, gc; never taken by ingestion), its own token sequence, recorded in the store's
    maintenance fence as the job starts (a stalled previous holder is refused before any deletion).
    One maintenance job per repository at a time: explicit requests wait (``wait`` seconds, default
    PACKYARD_MAINTENANCE_WAIT; then retried later), scheduled runs pass ``on_busy="skip"`` and end as
    skipped. The job row's ``lease`` says waited / skipped / took_over / lost / busy; a LockLostError
    out of the block is an ``aborted`` lock event.
  - ``self.record_race(kind, repo, **detail)`` → a ``race_events`` row (and a warning log line).
* Register the module below (one import line), add the CLI command in ``workers/cli/``
  and, for benchmarks, a module in ``workers/cli/bench/``.

Task names are ``packyard.<name>``; ``packyard submit <name>`` also accepts dashes.
"""
# Importing each task module registers its tasks (reconcile_jobs is bookkeeping, not a job: see its module).
from packyard.workers.tasks import (  # noqa: F401
    backup,
    gc,
    import_tree,
    index_pack,
    janitor,
    plan_maintenance,
    pool,
    prune_records,
    receive_pack,
    reconcile_jobs,
    repack,
    unpack_objects,
    verify_repo,
    write_objects,
)

TASK_MODULES = ("verify_repo", "import_tree", "unpack_objects", "write_objects", "index_pack", "gc",
                "plan_maintenance", "repack", "janitor", "prune_records", "pool", "backup", "receive_pack")
