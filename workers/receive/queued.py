"""A push handed to a worker (PACKYARD_RECEIVE_MODE=queue, the default): the receiving process's side.

1. ``spool``: the client's pack (it ends at its trailer: :class:`~.packstream.PackStream`) is copied into a
   file of its own in PACKYARD_INCOMING_DIR (``receive-<uuid>.pack``, at most PACKYARD_MAX_PACK_BYTES), the
   only place a queued job reads input from;
2. ``queue``: one ``packyard.receive_pack`` job with the push's commands, options and the file's name; the
   message expires after PACKYARD_RECEIVE_QUEUE_WAIT seconds, so a job no worker took in time is never run
   after the client was told it failed;
3. ``wait``: the job's result, polled; every PACKYARD_RECEIVE_KEEPALIVE seconds a keepalive packet goes to a
   client that reads side band 64k (git's ``0005\\1``, what receive-pack sends while its hooks and checks
   run), so a proxy or the client's own timeout does not hang up on a long ingest. Meanwhile the hooks' output
   comes as the worker's hooks write it (:class:`HookOutput`: the worker appends it to a Redis list, read here
   at each poll), so a client sees a slow pre-receive's lines as git's client would. Bounded: the queue wait,
   then the job's hard time limit (PACKYARD_TIME_LIMITS ``receive_pack``) and a minute;
4. the verdicts copied onto the request's commands (the report is written as in process mode), the spooled
   file removed.

A job that failed (its pack refused: every command ``unpacker error``; another error: ``failed to update
ref``) or never ran reports as git's receive-pack reports a failed transaction; the job row says why.
"""
from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from packyard.store.errors import LimitExceededError, StoreError
from packyard.workers.receive.session import Request

TASK = "packyard.receive_pack"
#: the prefix of the spooled packs' names in the incoming dir (store/leftovers knows it: receive_spool)
SPOOL_PREFIX = "receive-"
#: how a refused pack's job error begins (commands/receive_pack.py's unpack_failure)
UNPACK_PREFIX = "unpack index-pack abnormal exit: "


def spool(stream: Any, incoming: Path, max_bytes: int) -> Path:
    """``stream``'s bytes (the pack) into a new file in ``incoming``; LimitExceededError past ``max_bytes``.
    Not flushed to disk: the file is the job's input for minutes, never the repository's data."""
    incoming.mkdir(parents=True, exist_ok=True)
    path = incoming / f"{SPOOL_PREFIX}{uuid.uuid4().hex}.pack"
    total = 0
    try:
        with open(path, "xb") as out:
            while True:
                chunk = stream.read(1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:
                    raise LimitExceededError(f"the pushed pack is larger than PACKYARD_MAX_PACK_BYTES "
                                             f"({max_bytes} bytes)", path=path, offset=total)
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _no_keepalive() -> None:
    return None


class HookOutput:
    """A queued push's hooks' output on its way from the worker to the receiving process, as it comes: a Redis
    list per job (``packyard:receive:<job id>:output``) the worker appends each chunk to and the receiving process
    reads from its last position at each poll. Best effort both ways: the job's result carries the whole output
    too (``hook_output``), and :meth:`rest` gives what the list did not deliver (a Redis error, an expired list),
    so the client gets every byte once in the usual case, and never loses one."""

    def __init__(self, client: Any, task_id: str, ttl: float) -> None:
        self.client = client
        self.key = f"packyard:receive:{task_id}:output"
        self.ttl = max(1, int(ttl))
        self.sent = bytearray()     # (receiving side) what reached the client so far
        self._count = 0             # (receiving side) chunks read
        self.broken = False

    @classmethod
    def open(cls, s: Any, task_id: str) -> "HookOutput":
        from packyard.workers.redisconn import redis_client

        _soft, hard = s.time_limit_for(TASK)
        return cls(redis_client(s), task_id, s.receive_queue_wait + hard + 120)

    def append(self, data: bytes) -> None:
        """(worker) One chunk, as a hook wrote it."""
        if self.broken or not data:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.rpush(self.key, bytes(data))
            pipe.expire(self.key, self.ttl)
            pipe.execute()
        except Exception:   # redis.RedisError, OSError: the result still carries it
            self.broken = True

    def read_new(self, emit: Callable[[bytes], None]) -> None:
        """(receiving process) The chunks appended since the last read, to ``emit``."""
        if self.broken:
            return
        try:
            chunks = self.client.lrange(self.key, self._count, -1)
        except Exception:
            self.broken = True
            return
        for chunk in chunks:
            self._count += 1
            self.sent += chunk
            emit(chunk)

    def rest(self, whole: bytes) -> bytes:
        """(receiving process) Once the job is done: the part of its ``whole`` output the list did not deliver
        (all of it if what came is not its beginning: a redelivered job's first attempt), and the list goes."""
        try:
            self.client.delete(self.key)
        except Exception:
            pass
        if whole.startswith(self.sent):
            return whole[len(self.sent):]
        return whole


def _fail_all(req: Request, error: str) -> None:
    for cmd in req.commands:
        if cmd.error is None:
            cmd.error = error


Outcome = tuple[str | None, list[str], bytes]


def run_push_queued(path: str, req: Request, stdin: Any, s: Any, keepalive: Callable[[], None],
                    emit: Callable[[bytes], None] | None = None) -> Outcome:
    """The push as a ``packyard.receive_pack`` job; (unpack error or None, extra lines for the client, the
    hooks' output not yet given to ``emit``: pre-receive, update and post-receive, sent before the report).
    ``emit``: where the hooks' output goes as the worker's hooks write it (None: all of it comes back at the end)."""
    if req.shallow:
        _fail_all(req, "shallow update not allowed")
        return None, [], b""
    delete_only = all(c.is_delete for c in req.commands)
    spooled: Path | None = None
    try:
        if not delete_only:
            try:
                spooled = spool(stdin, s.incoming_path, s.max_pack_bytes)
            except StoreError as err:
                _fail_all(req, "unpacker error")
                return "index-pack abnormal exit", [f"fatal: {type(err).__name__}: {err}"], b""
        kwargs = {"repo": path, "commands": [c.as_param() for c in req.commands], "push_options": req.push_options,
                  "atomic": "atomic" in req.features, "pack": spooled.name if spooled is not None else None}
        return _wait(req, kwargs, s, keepalive, emit)
    finally:
        if spooled is not None:
            spooled.unlink(missing_ok=True)


def sender(s: Any) -> Any:
    """A Celery app that only publishes and reads results, with the workers' broker, backend and serializers
    (workers/app.py's celery_config). Not the service's app: importing that one loads the records (SQLAlchemy,
    ~0.5 s) to write the queued job row, which a receiving process started per push cannot afford; the worker
    writes the row when it starts the job."""
    from celery import Celery

    app = Celery("packyard", set_as_current=False)
    app.conf.update(broker_url=s.broker_url, result_backend=s.broker_url,
                    broker_transport_options={"visibility_timeout": s.visibility_timeout},
                    task_serializer="json", result_serializer="json", accept_content=["json"],
                    result_accept_content=["json"], timezone="UTC", enable_utc=True, task_send_sent_event=True)
    return app


def _wait(req: Request, kwargs: dict[str, Any], s: Any, keepalive: Callable[[], None],
          emit: Callable[[bytes], None] | None) -> Outcome:
    from packyard.workers.broker import check_message_size

    try:
        check_message_size(s, TASK, (), kwargs)
    except StoreError as err:   # 10,000 commands with long names: more than the broker takes
        _fail_all(req, "failed to update ref")
        return None, [f"error: {type(err).__name__}: {err}"], b""
    app = sender(s)
    task_id = f"receive-{uuid.uuid4()}"
    sent = time.monotonic()
    output = HookOutput.open(s, task_id) if emit is not None else None
    result = app.send_task(TASK, kwargs=kwargs, task_id=task_id, expires=max(s.receive_queue_wait, 0.001),
                           queue=s.receive_queue or None)
    _soft, hard = s.time_limit_for(TASK)
    interval = max(0.05, s.receive_keepalive) if s.receive_keepalive > 0 else 5.0   # (0: no keepalives)
    if s.receive_keepalive <= 0:
        keepalive = _no_keepalive
    next_keepalive = sent + interval
    started = False
    poll = 0.005
    # The result is polled (one GET from the result backend each time, ~0.3 ms): Celery's own get(timeout=)
    # waits at least a second on Redis, far longer than a keepalive interval or a small push.
    while not result.ready():
        if output is not None and emit is not None:
            output.read_new(emit)
        now = time.monotonic()
        if now >= next_keepalive:
            keepalive()
            next_keepalive = now + interval
            started = started or result.state not in ("PENDING", "RECEIVED")
            if not started and now - sent > s.receive_queue_wait + 5:
                result.revoke()
                _fail_all(req, "failed to update ref")
                return None, [f"error: no worker took the push (job {task_id}) within {s.receive_queue_wait:g} s "
                              "(PACKYARD_RECEIVE_QUEUE_WAIT); hosts without workers run pushes with "
                              "PACKYARD_RECEIVE_MODE=process"], b""
            if now - sent > s.receive_queue_wait + hard + 60:
                _fail_all(req, "failed to update ref")
                return None, [f"error: the push's job {task_id} did not finish within its time limit"], b""
        time.sleep(min(poll, max(0.0, next_keepalive - now)))
        poll = min(poll * 1.5, 0.01)
    value = result.get(propagate=False, timeout=30)
    if result.successful():
        for cmd, verdict in zip(req.commands, value["commands"]):
            cmd.error = verdict["error"]
            cmd.messages.extend(verdict["messages"])
        whole = base64.b64decode(value.get("hook_output") or "")
        if output is not None and emit is not None:
            output.read_new(emit)    # (the last chunks, appended before the result)
            return None, [], output.rest(whole)
        return None, [], whole
    if output is not None:
        output.rest(b"")
    text = f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else str(value)
    if type(value).__name__ == "PushUnpackFailed":
        _fail_all(req, "unpacker error")
        return "index-pack abnormal exit", [f"fatal: {str(value).split(UNPACK_PREFIX, 1)[-1]}"], b""
    _fail_all(req, "failed to update ref")
    return None, [f"error: {text} (job {task_id})"], b""


__all__ = ["SPOOL_PREFIX", "run_push_queued", "spool"]
