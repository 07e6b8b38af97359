"""What packyard reads from (and repairs in) Celery's Redis broker: kombu's Redis transport.

kombu keeps each queue as a Redis list (``celery``, plus ``celery\\x06\\x16<n>`` per
priority step). A message delivered to a worker is popped from its list and kept, until
the worker acknowledges it, in the hash ``unacked`` (delivery tag → ``[message, exchange,
routing key]``) and the sorted set ``unacked_index`` (delivery tag → delivery time). With
``acks_late`` (every packyard task) a job's message therefore sits in a queue list while it
waits and in ``unacked`` while it runs, retries with a countdown included (a worker holds
those until their time, unacknowledged). A worker that dies, or loses its broker
connection, leaves its deliveries in ``unacked``; kombu itself restores them only after the
visibility timeout (``PACKYARD_VISIBILITY_TIMEOUT``, hours: it must exceed the longest job).

:func:`snapshot` reads the task ids of every queued and every delivered message in one Lua
script (atomic: a message moving between a list and ``unacked`` is seen on one side);
:func:`held_by_workers` asks the workers what they run or hold (``inspect`` active, reserved,
scheduled); :func:`restore_delivery` puts a delivery nobody holds back at the head of its
queue with kombu's own restore transaction. The reconciler (:mod:`packyard.workers.reconcile`)
combines them.

:func:`install_restore_guard` works around two crashes in Celery 5.7 / kombu 5.7 (both seen
when the broker restarts while a job runs; both stop the whole worker with "Unrecoverable
error", because an AttributeError is not a connection error): on the connection loss the
worker closes the broken connection and kombu tries to put the running job's message back in
its queue through the connection it has just dismantled (``'NoneType' object has no attribute
'hostname'``); when the job then finishes, its acknowledgement goes to the same dead channel
(``'NoneType' object has no attribute 'client'``). The guard lets the first fail quietly (the
message stays in ``unacked``, which the broker persists) and sends the second through a fresh
connection.
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import Any

import redis

from packyard.workers import logs as plog

log = plog.get_logger("packyard.broker")

UNACKED_KEY = "unacked"          # kombu.transport.redis.Channel.unacked_key (default)
UNACKED_INDEX_KEY = "unacked_index"
#: A message's task id: Celery puts it in the properties (``correlation_id``), which kombu
#: serialises last, so the script looks only at the tail of a large message; anything else is
#: decoded in full. KEYS: the unacked hash, then every queue list.
_SNAPSHOT = """
local function task_id(raw)
  local id = string.match(raw, '"correlation_id":%s*"([^"]+)"', -4096)
  if id then return id end
  local ok, msg = pcall(cjson.decode, raw)
  if not ok or type(msg) ~= 'table' then return false end
  if msg[1] ~= nil then msg = msg[1] end
  if type(msg) == 'table' and type(msg.headers) == 'table' and type(msg.headers.id) == 'string' then
    return msg.headers.id
  end
  return false
end
local queued, delivered = {}, {}
for i = 2, #KEYS do
  for _, raw in ipairs(redis.call('lrange', KEYS[i], 0, -1)) do
    local id = task_id(raw)
    if id then table.insert(queued, id) end
  end
end
local entries = redis.call('hgetall', KEYS[1])
for i = 1, #entries, 2 do
  local id = task_id(entries[i + 1])
  table.insert(delivered, entries[i])
  table.insert(delivered, id or '')
end
return {queued, delivered}
"""


@dataclass(frozen=True)
class BrokerSnapshot:
    """Task ids of the messages waiting in queues, and of those delivered but not acknowledged."""

    queued: frozenset[str]
    deliveries: dict[str, str]      # delivery tag -> task id ('' if the message has none)

    @property
    def task_ids(self) -> frozenset[str]:
        return self.queued | frozenset(self.deliveries.values())


def queue_keys(client: redis.Redis) -> list[str]:
    """Every list in the broker's database: the queues and their priority lists."""
    return sorted(k.decode() if isinstance(k, bytes) else k
                  for k in client.scan_iter(count=1000, _type="list"))


def snapshot(client: redis.Redis) -> BrokerSnapshot:
    """Queued and delivered task ids, read atomically."""
    keys = [UNACKED_KEY, *queue_keys(client)]
    queued, delivered = client.eval(_SNAPSHOT, len(keys), *keys)
    ids = [_text(v) for v in queued]
    pairs = [_text(v) for v in delivered]
    return BrokerSnapshot(frozenset(ids), dict(zip(pairs[::2], pairs[1::2])))


@dataclass(frozen=True)
class WorkerView:
    """What the workers that answered hold: running, prefetched, or waiting for their ETA.

    ``complete`` is False when a question could not be asked (the broker connection failed twice):
    then absence from ``task_ids`` proves nothing.
    """

    task_ids: frozenset[str]
    workers: frozenset[str]
    complete: bool = True


def held_by_workers(app: Any, timeout: float = 1.0) -> WorkerView:
    """Ask every worker (one broadcast per question, asked at once) for the jobs it holds."""
    from kombu.exceptions import OperationalError

    def ask(method: str) -> dict[str, list[dict[str, Any]]] | None:
        for _ in range(2):   # a pooled connection from before a broker restart fails once, then reconnects
            try:
                return getattr(app.control.inspect(timeout=timeout), method)() or {}
            except (OperationalError, redis.RedisError, OSError) as err:
                log.warning("broker.inspect_failed", question=method, error=str(err))
        return None

    ids: set[str] = set()
    workers: set[str] = set()
    complete = True
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        for replies in pool.map(ask, ("active", "reserved", "scheduled")):
            if replies is None:
                complete = False
                continue
            for worker, requests in replies.items():
                workers.add(worker)
                for req in requests or ():
                    req = req.get("request", req) if isinstance(req, dict) else {}
                    if req.get("id"):
                        ids.add(str(req["id"]))
    return WorkerView(frozenset(ids), frozenset(workers), complete)


def restore_delivery(app: Any, tag: str) -> None:
    """Put the delivered message ``tag`` back at the head of its queue (kombu's restore transaction:
    removed from ``unacked`` and pushed in one MULTI, or not at all)."""
    with app.connection_for_write() as conn:
        conn.default_channel.qos.restore_by_tag(tag, leftmost=True)


def install_restore_guard(redis_url: str) -> None:
    """Make kombu's Redis QoS survive a dismantled channel (see the module doc).

    * restore-at-close on a dead connection fails quietly: the deliveries stay in ``unacked``;
    * an acknowledgement that arrives after the broker connection was replaced (a job that
      ran through a broker restart) is made through a fresh connection to ``redis_url`` (the
      same two commands kombu would send), instead of stopping the worker with an
      AttributeError; if that fails too, the delivery stays in ``unacked`` for the reconciler;
    * a reject on a dead channel leaves the delivery in ``unacked`` (the reconciler puts it back).
    """
    from kombu.transport import redis as kombu_redis
    from kombu.transport import virtual

    base = kombu_redis.Channel.QoS
    if getattr(base, "packyard_guarded", False):
        return

    class GuardedQoS(base):  # type: ignore[misc, valid-type]
        packyard_guarded = True

        def restore_unacked_once(self, stderr: Any = None) -> None:
            try:
                super().restore_unacked_once(stderr)
            except Exception as err:
                log.warning("broker.restore_unacked_failed", error=f"{type(err).__name__}: {err}",
                            note="the deliveries stay unacknowledged in the broker; the reconciler restores them")

        def ack(self, delivery_tag: Any) -> None:
            try:
                super().ack(delivery_tag)
                return
            except AttributeError:   # the channel's connection was dismantled after a connection loss
                pass
            try:
                with redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=10) as client:
                    client.pipeline().zrem(self.unacked_index_key, delivery_tag) \
                        .hdel(self.unacked_key, delivery_tag).execute()
                log.info("broker.acked_on_fresh_connection", delivery_tag=_text(delivery_tag))
            except redis.RedisError as err:
                log.warning("broker.ack_failed", delivery_tag=_text(delivery_tag), error=str(err),
                            note="the delivery stays unacknowledged; the reconciler redelivers it")
            virtual.QoS.ack(self, delivery_tag)

        def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
            try:
                super().reject(delivery_tag, requeue=requeue)
            except AttributeError:
                log.warning("broker.reject_on_dead_channel", delivery_tag=_text(delivery_tag), requeue=requeue,
                            note="the delivery stays unacknowledged; the reconciler puts it back")
                virtual.QoS.ack(self, delivery_tag)

    kombu_redis.Channel.QoS = GuardedQoS


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- message size (issue 16) -------------------------------------------------------------------------
#: What kombu and Celery add around a task's body (headers, properties, delivery info), generously.
MESSAGE_OVERHEAD = 4096


def message_bytes(args: Any, kwargs: Any) -> int:
    """The size of the request a task message with these arguments makes on the broker (an upper estimate):
    Celery's JSON body ``[args, kwargs, embed]``, base64-encoded by kombu's Redis transport, plus headers."""
    import json

    body = len(json.dumps([list(args), kwargs, {"callbacks": None, "errbacks": None, "chain": None,
                                                "chord": None}]).encode())
    return 4 * ((body + 2) // 3) + MESSAGE_OVERHEAD


def check_message_size(settings: Any, task_name: str, args: Any, kwargs: Any) -> int:
    """The message's size; LimitExceededError when the broker would refuse it (PACKYARD_MAX_MESSAGE_BYTES)."""
    from packyard.store.errors import LimitExceededError

    size = message_bytes(args, kwargs)
    if size > settings.message_limit:
        hint = (" (pass big object content as objects_file=, a file in PACKYARD_INCOMING_DIR)"
                if task_name.endswith("write_objects") else "")
        raise LimitExceededError(
            f"{task_name} message of {size} bytes is over the {settings.message_limit}-byte limit of the broker "
            f"(PACKYARD_MAX_MESSAGE_BYTES); not sent{hint}")
    return size
