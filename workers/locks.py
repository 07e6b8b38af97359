"""Redis lease lock per repository, with fencing tokens.

A lease is the Redis key ``packyard:lock:<repo>`` holding ``<token>:<owner>``,
with a TTL. Acquisition is one Lua script: if the key is free, raise the per-repo
counter ``packyard:fence:<repo>`` to the repository's own fence (the floor, see below),
INCR it (so tokens only ever grow, across holders and across expiries) and SET the key
with that token and the TTL.

The repository's fence file (``packyard/fence``, ``packyard/maintenance-fence``;
:mod:`packyard.store.fence`) is the source of truth for tokens, not Redis: it holds the
highest token that has changed the repository. A Redis that lost its data (a restart
without persistence, a flush, a new server) starts its counters at 0; without the floor
it would hand out tokens the storage then refuses as stale ("stale fencing token 6:
refs here were already moved under token 11") until the counter caught up. The floor is
read from the file before each attempt and applied inside the script, atomically with
the INCR, so a token is never at or below the fence. Renewal is a Lua
compare-and-extend and release a Lua compare-and-delete, so a holder whose lease
expired can never extend or delete its successor's lease.

The value names its holder process (an owner record, :mod:`packyard.store.owner`: pid,
host, boot id, start time) after a ``|``. A waiter that finds the lease held by a process
that is provably dead (same host; pid gone or reused, or the host rebooted) deletes it at
once (compare-and-delete on the exact value) instead of waiting out the TTL: a worker
SIGKILLed mid-job no longer blocks its repository -- and its own redelivered job -- for
up to ``PACKYARD_LOCK_TTL``. A holder on another host is never judged; its lease expires.

A lease can be lost (the process stalled past the TTL, Redis restarted):
:meth:`Lease.check` raises :class:`packyard.store.errors.LockLostError` when the key no
longer holds our value, and every write that must be fenced carries ``lease.token``:
a later holder has a larger token, and the ref store refuses an older one than it has
already seen (``RefStore.update(fence_token=...)``), which closes the window between a
holder's last check and its write.

    with repo_lock(redis_client(settings), repo_path, ttl=60, job_id=task_id) as lease:
        ...  # lease.check() before each publishing step; lease.renew() on long work

Every lease operation is an event (``on_event``; :func:`db_event_recorder` writes ``lock_events``):
acquired (with how long the acquirer waited, ``waited_ms``), renewed, released, lost/expired
(a failed check or renewal), broken (a dead holder's lease deleted), taken over (acquired
after the previous holder's lease ran out or was broken without a release: each lease kind
keeps ``packyard:lease-last:<kind>:<repo>``, the last holder's value, set at acquisition and
cleared by its release), skipped (a scheduled maintenance job found the lease taken),
wait_timeout (gave up waiting) and aborted (a holder stopped before a destructive step).
"""
from __future__ import annotations

import enum
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import redis

from packyard.store import fence as store_fence
from packyard.store import owner as store_owner
from packyard.store.errors import LockLostError
from packyard.store.lease import Lease as StoreLease
from packyard.workers.records.models import LockEventKind
from packyard.workers.redisconn import redis_client
from packyard.workers.settings import Settings

KEY_PREFIX = "packyard:lock:"
FENCE_PREFIX = "packyard:fence:"


class LeaseKind(enum.Enum):
    """Two leases per repository, each with its own fencing-token sequence (store.fence.FenceKind).

    ``REPO``: ingestion and bulk writes (moves refs); ``MAINTENANCE``: repack, prune, gc
    (deletes packs and loose objects). Ingestion never takes the maintenance lease.
    """

    REPO = ("packyard:lock:", "packyard:fence:")
    MAINTENANCE = ("packyard:lock:maint:", "packyard:fence:maint:")

    @property
    def key_prefix(self) -> str:
        return self.value[0]

    @property
    def fence_prefix(self) -> str:
        return self.value[1]

    @property
    def fence_kind(self) -> store_fence.FenceKind:
        """The repository fence file whose tokens this lease's token sequence must stay above."""
        return store_fence.FenceKind.REFS if self is LeaseKind.REPO else store_fence.FenceKind.MAINTENANCE


# KEYS[1] lease key, KEYS[2] token counter; ARGV[1] owner, ARGV[2] TTL (ms), ARGV[3] floor (the fence).
_ACQUIRE = """
if redis.call('exists', KEYS[1]) == 1 then return false end
local floor = tonumber(ARGV[3])
local current = tonumber(redis.call('get', KEYS[2]) or '0')
if current < floor then redis.call('set', KEYS[2], floor) end
local token = redis.call('incr', KEYS[2])
redis.call('set', KEYS[1], token .. ':' .. ARGV[1], 'PX', ARGV[2])
return token
"""
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
# A holder's own release: the lease, and the "last holder" record that says it was released (not expired).
_RELEASE_OWN = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  if redis.call('get', KEYS[2]) == ARGV[1] then redis.call('del', KEYS[2]) end
  return redis.call('del', KEYS[1])
end
return 0
"""
# KEYS[1] the "last holder" record; ARGV[1] the new holder's value, ARGV[2] its lifetime (s): the previous value.
_RECORD_HOLDER = """
local previous = redis.call('get', KEYS[1])
redis.call('set', KEYS[1], ARGV[1], 'EX', ARGV[2])
return previous
"""
#: How long the last holder's record outlives it: a takeover is reported if the next holder comes within a week.
LAST_HOLDER_SECONDS = 7 * 24 * 3600
OWNER_SEPARATOR = "|"


class LockTimeout(TimeoutError):
    """The lease stayed taken for longer than the caller was willing to wait."""


@dataclass(frozen=True)
class LockEvent:
    repo: str
    lock_name: str
    job_id: str | None
    event: LockEventKind
    token: int | None
    waited_ms: int | None = None
    detail: dict[str, Any] | None = None


OnEvent = Callable[[LockEvent], None]


def lock_name_for(repo: str | Path) -> str:
    return str(Path(repo).expanduser().resolve())


def last_key(kind: "LeaseKind", name: str) -> str:
    """The key holding the value of the last holder of this lease that has not released it."""
    return f"packyard:lease-last:{kind.name.lower()}:{name}"


def describe_value(value: bytes | str | None) -> dict[str, Any] | None:
    """A lease value as event detail: the holder's token, job and process (None: no value)."""
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    token_text, _, rest = text.partition(":")
    job = rest.split(":", 1)[0] if rest else None
    holder = lease_holder(text)
    return {"holder_token": int(token_text) if token_text.isdigit() else None,
            "holder_job": None if job in (None, "", "-") else job,
            "holder": holder.describe() if holder is not None else None}


def holder_detail(client: redis.Redis, repo: str | Path, kind: "LeaseKind | None" = None) -> dict[str, Any] | None:
    """Who holds the lease now (token, job, process), or None if nobody."""
    kind = kind or LeaseKind.REPO
    return describe_value(client.get(kind.key_prefix + lock_name_for(repo)))


def fence_floor(repo: str | Path, kind: LeaseKind = LeaseKind.REPO) -> int:
    """The highest token of ``kind`` recorded in the repository's fence file (0: none, or no repository yet).

    ``repo`` is a bare repository or a work tree with ``.git``. A fence file that is not a
    number raises CorruptObjectError (naming it): no token can be trusted against it.
    """
    path = Path(repo).expanduser()
    git_dir = path / ".git" if (path / ".git").is_dir() else path
    try:
        return store_fence.recorded_token(git_dir, kind.fence_kind)
    except (NotADirectoryError, PermissionError):
        return 0


def db_event_recorder(settings: Settings | str) -> OnEvent:
    """An ``on_event`` that writes lock_events rows, best effort.

    A lock event is an audit row: if the records database is unreachable it is logged
    (``lock.event_record_failed``) and dropped, never raised into the lease operation --
    a release that raised would fail a finished job and leave the lease to expire.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from packyard.workers import logs as plog
    from packyard.workers.records.recorder import record_lock_event

    def record(ev: LockEvent) -> None:
        try:
            record_lock_event(settings, repo=ev.repo, job_id=ev.job_id, lock_name=ev.lock_name, event=ev.event,
                              token=ev.token, waited_ms=ev.waited_ms, detail=ev.detail)
        except SQLAlchemyError as err:
            plog.get_logger("packyard.locks").warning(
                "lock.event_record_failed", lock_event=getattr(ev.event, "value", ev.event), lock=ev.lock_name,
                token=ev.token, error=str(err))

    return record


class Lease:
    """A held repository lease. ``token`` is the fencing token (strictly increasing per repository).

    It is the storage's lease seam as it is (:class:`packyard.store.lease.Lease`: ``token``, ``check()``
    raising LockLostError), so tasks and commands hand it to the store as ``lease=`` unchanged;
    :func:`_as_store_lease` below is where mypy checks that it stays one."""

    def __init__(self, client: redis.Redis, repo: str, token: int, owner: str, ttl: float,
                 job_id: str | None, on_event: OnEvent | None, kind: LeaseKind = LeaseKind.REPO) -> None:
        self.client, self.repo, self.token, self.owner = client, repo, token, owner
        self.ttl, self.job_id, self.on_event, self.kind = ttl, job_id, on_event, kind
        self.key = kind.key_prefix + repo
        self.value = f"{token}:{owner}"
        self.released = False
        self.lost = False
        self.waited_ms = 0                          # how long the acquirer waited for it
        self.took_over: dict[str, Any] | None = None  # the previous holder, when it never released

    def _emit(self, kind: LockEventKind, waited_ms: int | None = None, detail: dict[str, Any] | None = None) -> None:
        if self.on_event is not None:
            self.on_event(LockEvent(self.repo, self.key, self.job_id, kind, self.token, waited_ms, detail))

    def abort(self, step: str, reason: str) -> None:
        """Record that the holder stopped before ``step`` (a destructive one) because of ``reason``."""
        self._emit(LockEventKind.ABORTED, detail={"step": step, "reason": reason[:500]})

    def _why_lost(self) -> LockEventKind:
        return LockEventKind.EXPIRED if self.client.get(self.key) is None else LockEventKind.LOST

    def _lost(self, doing: str) -> LockLostError:
        kind = self._why_lost()
        if not self.lost:
            self.lost = True
            self._emit(kind, detail={"while": doing})
        holder = "nobody holds it" if kind is LockEventKind.EXPIRED else "another holder has it"
        return LockLostError(f"repository lease {kind.value} while {doing} (token {self.token}; {holder})",
                             path=self.repo)

    def is_held(self) -> bool:
        """Whether Redis still holds our value (a pure question; records nothing)."""
        return self.client.get(self.key) == self.value.encode()

    def check(self) -> None:
        """Raise LockLostError unless the lease is still ours. Call before every step that publishes."""
        if self.lost or not self.is_held():
            raise self._lost("checking")

    def renew(self, ttl: float | None = None) -> None:
        """Extend the lease by ``ttl`` (default: the original TTL) if it is still ours, else LockLostError."""
        ms = int((ttl or self.ttl) * 1000)
        if self.lost or not self.client.eval(_RENEW, 1, self.key, self.value, ms):
            raise self._lost("renewing")
        self._emit(LockEventKind.RENEWED)

    def release(self) -> bool:
        """Delete the lease if it is still ours. False (and a lost/expired event) if it was not."""
        if self.released:
            return True
        self.released = True
        if self.client.eval(_RELEASE_OWN, 2, self.key, last_key(self.kind, self.repo), self.value):
            self._emit(LockEventKind.RELEASED)
            return True
        if not self.lost:
            self.lost = True
            self._emit(self._why_lost(), detail={"while": "releasing"})
        return False


def _as_store_lease(lease: Lease) -> StoreLease:
    """The one place the Redis lease meets the storage's seam (type-checked: a Lease is a StoreLease)."""
    return lease


def try_acquire(client: redis.Redis, repo: str | Path, ttl: float, job_id: str | None = None,
                on_event: OnEvent | None = None, kind: LeaseKind = LeaseKind.REPO, waited_ms: int = 0) -> Lease | None:
    """One attempt: a Lease, or None if someone else holds it. Its token is above the repository's fence.

    A lease held by a process that is provably dead is broken first (see the module doc). The
    acquired event carries ``waited_ms`` (how long the caller has been trying); a lease whose
    previous holder never released it (it expired, or was broken) also records a takeover.
    """
    name = lock_name_for(repo)
    record = store_owner.current_owner().encode().decode().strip()
    owner = f"{job_id or '-'}:{uuid.uuid4().hex}{OWNER_SEPARATOR}{record}"
    floor = fence_floor(repo, kind)
    keys = (kind.key_prefix + name, kind.fence_prefix + name)
    token = client.eval(_ACQUIRE, 2, *keys, owner, int(ttl * 1000), floor)
    broken = False
    if token is None and break_if_holder_dead(client, keys[0], name, on_event):
        broken = True
        token = client.eval(_ACQUIRE, 2, *keys, owner, int(ttl * 1000), fence_floor(repo, kind))
    if token is None:
        return None
    lease = Lease(client, name, int(token), owner, ttl, job_id, on_event, kind)
    lease.waited_ms = int(waited_ms)
    previous = client.eval(_RECORD_HOLDER, 1, last_key(kind, name), lease.value, LAST_HOLDER_SECONDS)
    lease._emit(LockEventKind.ACQUIRED, waited_ms=lease.waited_ms)
    if previous is not None:
        # The last holder never released: its lease ran out (a stall, a lost host) or its process died.
        lease.took_over = {**(describe_value(previous) or {}), "how": "broken" if broken else "expired"}
        lease._emit(LockEventKind.TAKEN_OVER, detail=lease.took_over)
    return lease


def lease_holder(value: bytes | str | None) -> store_owner.Owner | None:
    """The owner record in a lease value (None: free, or written by a version without one)."""
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    _, sep, record = text.partition(OWNER_SEPARATOR)
    return store_owner.Owner.decode(record.encode()) if sep else None


def break_if_holder_dead(client: redis.Redis, key: str, repo: str, on_event: OnEvent | None = None) -> bool:
    """Delete the lease ``key`` if its holder is provably dead (compare-and-delete); True if it was deleted."""
    value = client.get(key)
    holder = lease_holder(value)
    if value is None or holder is None or store_owner.liveness(holder) is not store_owner.Liveness.DEAD:
        return False
    if not client.eval(_RELEASE, 1, key, value):
        return False              # released, expired or taken meanwhile: try again normally
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    token_text = text.split(":", 1)[0]
    job = text.split(":", 2)[1] if text.count(":") >= 2 else None
    if on_event is not None:
        on_event(LockEvent(repo, key, None if job in (None, "-") else job, LockEventKind.BROKEN,
                           int(token_text) if token_text.isdigit() else None))
    return True


def acquire(client: redis.Redis, repo: str | Path, ttl: float, job_id: str | None = None,
            on_event: OnEvent | None = None, wait: float = 30.0, poll: float = 0.05,
            kind: LeaseKind = LeaseKind.REPO) -> Lease:
    """Wait up to ``wait`` seconds for the lease (``lease.waited_ms`` says how long it took); LockTimeout
    (and a wait_timeout event naming the holder) if it stays taken."""
    start = time.monotonic()
    deadline = start + wait
    waited = 0
    while True:
        lease = try_acquire(client, repo, ttl, job_id, on_event, kind, waited_ms=waited)
        if lease is not None:
            return lease
        now = time.monotonic()
        if now >= deadline:
            waited = int((now - start) * 1000)
            holder = holder_detail(client, repo, kind)
            if on_event is not None:
                on_event(LockEvent(lock_name_for(repo), kind.key_prefix + lock_name_for(repo), job_id,
                                   LockEventKind.WAIT_TIMEOUT, None, waited, holder))
            by = f" by job {holder['holder_job']}" if holder and holder.get("holder_job") else ""
            raise LockTimeout(f"repository {lock_name_for(repo)} stayed locked{by} for {wait}s")
        time.sleep(poll)
        waited = int((time.monotonic() - start) * 1000)


class _Heartbeat(threading.Thread):
    """Renews a lease every ttl/3 until stopped; a failed renewal marks the lease lost (check() then raises)."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(name=f"lease-heartbeat-{lease.token}", daemon=True)
        self.lease = lease
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.lease.ttl / 3):
            try:
                self.lease.renew()
            except LockLostError:
                return
            except redis.RedisError:
                continue  # a later renewal (or check()) decides


@contextmanager
def repo_lock(client: redis.Redis, repo: str | Path, ttl: float, job_id: str | None = None,
              on_event: OnEvent | None = None, wait: float = 30.0, auto_renew: bool = False,
              kind: LeaseKind = LeaseKind.REPO) -> Iterator[Lease]:
    """Hold the repository lease for the block; released (compare-and-delete) on exit.

    ``auto_renew`` renews in a background thread every ttl/3; the block must still call
    ``lease.check()`` before publishing, because renewal can fail (stalls, Redis restarts).
    """
    lease = acquire(client, repo, ttl, job_id, on_event, wait, kind=kind)
    with hold(lease, auto_renew):
        yield lease


@contextmanager
def hold(lease: Lease, auto_renew: bool = False) -> Iterator[Lease]:
    """Keep an acquired lease for the block (renewing it if asked) and release it on exit."""
    beat = _Heartbeat(lease) if auto_renew else None
    if beat is not None:
        beat.start()
    try:
        yield lease
    finally:
        if beat is not None:
            beat.stopped.set()
            beat.join()
        try:
            lease.release()
        except redis.RedisError as err:
            # The lease service is unreachable (restarting): the lease runs out after its TTL. Raising
            # here would turn the block's outcome (often finished work) into a failure.
            from packyard.workers import logs as plog

            plog.get_logger("packyard.locks").warning("lease.release_failed", lock=lease.key, token=lease.token,
                                                      error=str(err))


def claim_fence(repo: str | Path, lease: Lease) -> None:
    """Record a maintenance lease's token in the repository's maintenance fence as the job starts.

    Why: a holder that stalls past its lease must be refused by the store even if its successor
    has not deleted anything yet; once a later token is recorded, every deletion carrying an
    older one is refused (LockLostError, nothing deleted). A fence at or above our token means a
    later holder already started: LockLostError.
    """
    from packyard.store.repo import find_git_dir

    git_dir = find_git_dir(Path(repo).expanduser())   # NotARepositoryError: nothing is written outside a repository
    kind = store_fence.FenceKind.MAINTENANCE if lease.kind is LeaseKind.MAINTENANCE else store_fence.FenceKind.REFS
    with store_fence.fenced(git_dir, lease.token, "begin maintenance", kind=kind):
        pass


class MaintenanceBusy(LockTimeout):
    """``skip_if_busy``: the maintenance lease is held by another job (one attempt, no wait)."""


@contextmanager
def maintenance_lease(settings: Settings, repo: str | Path, wait: float | None = None,
                      job_id: str | None = None, *, ttl: float | None = None, skip_if_busy: bool = False,
                      client: redis.Redis | None = None, on_event: OnEvent | None = None,
                      on_held: Callable[[Lease], None] | None = None,
                      on_lost: Callable[[LockLostError], None] | None = None) -> Iterator[Lease]:
    """THE maintenance-lease policy: ``packyard repack --lock`` / ``gc --lock`` use it as it is, and
    ``PackyardTask.maintenance_lock`` wraps it (its retries, job-row notes and skipped runs around it).

    Acquire the repository's maintenance lease (``ttl``, default PACKYARD_LOCK_TTL): wait up to ``wait``
    seconds (default PACKYARD_MAINTENANCE_WAIT; LockTimeout after it), or with ``skip_if_busy`` one attempt
    (MaintenanceBusy if another job holds it). Renew it in the background; ``on_held(lease)`` runs first
    once it is held; then record its token in the maintenance fence (:func:`claim_fence`: a stalled previous
    holder is refused before any deletion) and run the block. A LockLostError out of the block (a failed
    check, a refused fence; also as the cause of a task's Retry) is recorded as an ``aborted`` event, then
    ``on_lost(error)``. Events go to ``lock_events`` (dropped if the database is down)."""
    from celery.exceptions import Retry

    on_event = on_event if on_event is not None else db_event_recorder(settings)
    client = client if client is not None else redis_client(settings)
    ttl = ttl or settings.lock_ttl
    if skip_if_busy:
        found = try_acquire(client, repo, ttl, job_id, on_event, LeaseKind.MAINTENANCE)
        if found is None:
            raise MaintenanceBusy(f"the maintenance lease of {lock_name_for(repo)} is held by another job")
        lease = found
    else:
        lease = acquire(client, repo, ttl, job_id, on_event, wait=settings.maintenance_wait if wait is None
                        else float(wait), poll=0.1, kind=LeaseKind.MAINTENANCE)
    with hold(lease, auto_renew=True):
        if on_held is not None:
            on_held(lease)
        try:
            claim_fence(repo, lease)
            yield lease
        except BaseException as err:
            cause = err.exc if isinstance(err, Retry) else err
            if isinstance(cause, LockLostError):
                lease.abort("delete", str(cause))
                if on_lost is not None:
                    on_lost(cause)
            raise


# -- pools and their members: one lease order ------------------------------------------------------------

def pool_lease_order(pool: str | Path, member: str | Path | None = None, *, refs: bool = False,
                     ingest: bool = False) -> tuple[tuple[str, LeaseKind], ...]:
    """THE order in which a job takes the leases of a pool and of one of its members, so that no two jobs
    deadlock: the pool's maintenance lease first, then (``refs``: a fetch moving the pool's refs) the pool's
    repository lease, then the member's maintenance lease, then (``ingest``: a disconnect, which must not
    let a push land between its copy and the removal of the alternates) the member's repository lease.

    Every job holds a prefix of this order and nothing else: a pool repack the pool's maintenance lease, a
    member's repack or push the member's own, link pool + member maintenance, disconnect all of the member's.
    So no job holding a member's lease ever waits for its pool's."""
    order = [(str(pool), LeaseKind.MAINTENANCE)]
    if refs:
        order.append((str(pool), LeaseKind.REPO))
    if member is not None:
        order.append((str(member), LeaseKind.MAINTENANCE))
        if ingest:
            order.append((str(member), LeaseKind.REPO))
    return tuple(order)


@contextmanager
def pool_leases(settings: Settings, pool: str | Path, member: str | Path | None = None, *, refs: bool = False,
                ingest: bool = False, wait: float | None = None, job_id: str | None = None,
                client: redis.Redis | None = None, on_event: OnEvent | None = None,
                on_held: Callable[[Lease], None] | None = None) -> Iterator[StoreLease]:
    """Hold the leases :func:`pool_lease_order` names, in that order, for the block; yields one
    :class:`~packyard.store.lease.Joint` (``check()`` checks them all; ``token`` is the last one's, the lease of
    the repository the step writes into). Maintenance leases as :func:`maintenance_lease` takes them (fence
    claimed, renewed); repository leases renewed too. LockTimeout if one stays taken past ``wait``."""
    from contextlib import ExitStack

    from packyard.store.lease import Joint

    client = client if client is not None else redis_client(settings)
    on_event = on_event if on_event is not None else db_event_recorder(settings)
    held: list[Lease] = []
    with ExitStack() as stack:
        for path, kind in pool_lease_order(pool, member, refs=refs, ingest=ingest):
            if kind is LeaseKind.MAINTENANCE:
                lease = stack.enter_context(maintenance_lease(settings, path, wait, job_id, client=client,
                                                              on_event=on_event, on_held=on_held))
            else:
                lease = acquire(client, path, settings.lock_ttl, job_id, on_event,
                                wait=settings.maintenance_wait if wait is None else float(wait), kind=kind)
                stack.enter_context(hold(lease, auto_renew=True))
                if on_held is not None:
                    on_held(lease)
            held.append(lease)
        yield Joint(*held)


_RELEASE_HELD_BY = """
local value = redis.call('get', KEYS[1])
if value and string.find(value, ':' .. ARGV[1] .. ':', 1, true) then return redis.call('del', KEYS[1]) end
return 0
"""


def release_held_by(client: redis.Redis, repo: str | Path, job_id: str) -> bool:
    """Delete the repository's leases (either kind) that job ``job_id`` holds (its process was killed,
    e.g. at the hard time limit, and cannot release them itself). True if a lease was deleted.

    A lease value is ``<token>:<job id>:<uuid>|<owner>``: the job id is matched between colons."""
    name = lock_name_for(repo)
    deleted = [client.eval(_RELEASE_HELD_BY, 1, kind.key_prefix + name, job_id) for kind in LeaseKind]
    return any(deleted)
