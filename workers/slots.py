"""The fleet's maintenance slots: at most N maintenance jobs in flight across every worker host.

A Redis sorted set ``packyard:maintenance:slots``: one member per job holding a slot (its
task id), scored with the time its claim expires. Acquisition is one Lua script — drop
expired claims, and add ours only if fewer than N remain — so planners on several hosts
never hand out slot N+1. The planner acquires a slot *before* it queues a job (under the
job's pre-chosen task id); the job's slot is released when its row is finished
(``records/task_runs.py: job_finished``), whatever the outcome. A claim also expires on its own after
``ttl`` (the broker's visibility timeout: a job redelivered after a host died runs within
it), so a lost release costs a slot for a while, never for good; the planner also drops
claims whose job rows are already finished (commands/plan_maintenance.py: ``prune_finished_slots``).
"""
from __future__ import annotations

import time

import redis

SLOTS_KEY = "packyard:maintenance:slots"

_ACQUIRE = """
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[1])
if redis.call('zscore', KEYS[1], ARGV[3]) then return redis.call('zcard', KEYS[1]) end
if redis.call('zcard', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('zadd', KEYS[1], ARGV[4], ARGV[3])
return redis.call('zcard', KEYS[1])
"""


class FleetSlots:
    """``limit`` slots shared by every planner and worker that talks to this Redis."""

    def __init__(self, client: redis.Redis, limit: int, ttl: float, key: str = SLOTS_KEY) -> None:
        self.client, self.limit, self.ttl, self.key = client, limit, ttl, key

    def try_acquire(self, task_id: str, now: float | None = None) -> int | None:
        """Claim a slot for ``task_id``: the number in flight with it, or None when all are taken."""
        now = time.time() if now is None else now
        n = int(self.client.eval(_ACQUIRE, 1, self.key, now, self.limit, task_id, now + self.ttl))
        return n or None

    def release(self, task_id: str) -> bool:
        """Give the slot back (a no-op for a job that never had one)."""
        return bool(self.client.zrem(self.key, task_id))

    def holders(self, now: float | None = None) -> list[str]:
        """Task ids holding an unexpired slot."""
        now = time.time() if now is None else now
        members = self.client.zrangebyscore(self.key, f"({now}", "+inf")
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    def in_flight(self, now: float | None = None) -> int:
        return len(self.holders(now))


def fleet_slots(settings) -> FleetSlots:  # type: ignore[no-untyped-def]
    """The slots these settings describe (PACKYARD_MAINTENANCE_CONCURRENCY, claims live a visibility timeout)."""
    from packyard.workers.locks import redis_client

    return FleetSlots(redis_client(settings), settings.maintenance_concurrency,
                      ttl=settings.visibility_timeout + settings.maintenance_jitter)
