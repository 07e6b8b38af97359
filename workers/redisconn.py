"""The one way a packyard process opens a Redis client (the leases, a queued push's hook output).

Its own module so that a receiving process can open one without :mod:`~packyard.workers.locks`, which loads
the records (SQLAlchemy) for its lock events.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from packyard.workers.settings import Settings


def redis_client(settings: "Settings | Any") -> redis.Redis:
    return redis.Redis.from_url(settings.redis_py_url, socket_timeout=10, socket_connect_timeout=10)
