"""Who made a file: owner records for lock files, markers, ``.keep`` files and quarantines.

Every file packyard creates to claim something (``packyard/fence.lock``, ``<ref>.lock``,
a pack's ``.keep``, a batch marker, an ``incoming-*`` quarantine) carries one owner
record: the process id, the host, the job id (when a worker job is running), the boot
id of the host and the process's start time. With it a waiter can tell a claim whose
owner is **provably dead** (same host, and the pid is gone, or belongs to a process that
started later — pid reuse —, or the host rebooted since) from one that may still be
alive (another host, or no record at all: written by git or an older version), and
break the first at once instead of waiting out an age rule.

The record is one line of JSON, so it can share a file with other content (a
``.keep`` message) and old readers ignore it::

    {"packyard_owner": 1, "pid": 4242, "host": "web-3", "job": "6f1c…", "boot": "…", "start": 81273,
     "created": 1764500000.1}

The job id is bound per job by the worker layer (:func:`bind_job`), so the pure store
code never learns about Celery: it calls :func:`current_owner` when it creates a claim.
"""
from __future__ import annotations

import contextvars
import enum
import hashlib
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Iterator

RECORD_KEY = "packyard_owner"
MAX_RECORD_BYTES = 4096   # a record is ~200 bytes; anything longer is not one of ours

_job_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("packyard_job_id", default=None)


def _read_boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _read_pid_namespace() -> int | None:
    """The inode of this process's PID namespace: pids of another namespace (a container, or host B
    under ``unshare --pid``) mean nothing in our process table, even on a host of the same name."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


_BOOT_ID = _read_boot_id()
_HOST = os.uname().nodename   # what socket.gethostname() returns (gethostname(2) is uname's nodename)
_PIDNS = _read_pid_namespace()


def host_identity() -> str:
    """Host name and PID namespace: whose pids a tmp file's name may be judged by (the tags in
    ``tmp_*`` names hash this; two PID namespaces with one host name get different tags)."""
    return _HOST if _PIDNS is None else f"{_HOST}/pidns:{_PIDNS}"


#: Four hex digits of this host's identity (host name + PID namespace) in writer temp names: the leftovers
#: table tells this host's dead writers' files from another host's by it.
_HOST_TAG = hashlib.sha1(host_identity().encode()).hexdigest()[:4]


def this_host_tag() -> str:
    return _HOST_TAG


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22).

    None when the process does not exist or /proc is unavailable. Two processes that had
    the same pid one after the other have different start times: that is how a reused
    pid is told from the original owner.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    try:
        # comm (field 2) may contain spaces and parentheses: split after the LAST ')'.
        fields = raw.rsplit(b")", 1)[1].split()
        state = fields[0]
        if state in (b"Z", b"X"):
            return None  # a zombie (killed, not yet reaped) is not a live owner
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Owner:
    """One claim's creator."""

    pid: int
    host: str
    job: str | None = None
    boot: str | None = None
    start: int | None = None
    created: float = 0.0
    pidns: int | None = None      # PID namespace inode (None: an older record, judged by host alone)

    def encode(self) -> bytes:
        """One JSON line (with its newline) for the start of a claim file."""
        d = {RECORD_KEY: 1, **asdict(self)}
        return json.dumps(d, separators=(",", ":"), sort_keys=False).encode() + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> "Owner | None":
        """The owner record on the first line of ``data``, or None if it holds none (git's files)."""
        line = data[:MAX_RECORD_BYTES].split(b"\n", 1)[0].strip()
        if not line.startswith(b"{"):
            return None
        try:
            d = json.loads(line)
        except ValueError:
            return None
        if not isinstance(d, dict) or d.get(RECORD_KEY) != 1:
            return None
        try:
            return cls(pid=int(d["pid"]), host=str(d["host"]), job=d.get("job") or None, boot=d.get("boot") or None,
                       start=int(d["start"]) if d.get("start") is not None else None,
                       created=float(d.get("created") or 0.0),
                       pidns=int(d["pidns"]) if d.get("pidns") is not None else None)
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        job = f" job {self.job}" if self.job else ""
        return f"pid {self.pid} on {self.host}{job}"


class Liveness(enum.Enum):
    """What can be proven about an owner from here: a result, not a boolean."""

    ALIVE = "alive"       # same host, same boot, the pid runs and started when the owner did
    DEAD = "dead"         # same host, and the pid is gone, reused, a zombie, or the host rebooted
    UNKNOWN = "unknown"   # another host (or no /proc): only an age rule or the job records can decide


def current_owner() -> Owner:
    """The record for a claim made now by this process (and the job bound to it, if any)."""
    pid = os.getpid()
    return Owner(pid=pid, host=_HOST, job=_job_id.get(), boot=_BOOT_ID, start=process_start_ticks(pid),
                 created=time.time(), pidns=_PIDNS)


def liveness(owner: Owner) -> Liveness:
    """Whether ``owner`` is provably alive, provably dead, or cannot be judged from this host."""
    if owner.host != _HOST:
        return Liveness.UNKNOWN
    if owner.pidns is not None and _PIDNS is not None and owner.pidns != _PIDNS:
        return Liveness.UNKNOWN   # same host name, another PID namespace: our process table cannot tell
    if owner.boot is not None and _BOOT_ID is not None and owner.boot != _BOOT_ID:
        return Liveness.DEAD  # the host rebooted: every process of the old boot is gone
    if owner.pid <= 0:
        return Liveness.DEAD
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return Liveness.DEAD
    except PermissionError:
        pass  # exists, another user's
    except OverflowError:
        return Liveness.DEAD
    if not os.path.isdir("/proc"):
        return Liveness.ALIVE  # the pid exists; reuse cannot be checked without /proc
    start = process_start_ticks(owner.pid)
    if start is None:
        return Liveness.DEAD  # vanished meanwhile, or a zombie
    if owner.start is not None and start != owner.start:
        return Liveness.DEAD  # the pid was reused by a later process
    return Liveness.ALIVE


def with_owner(message: str | bytes | None = None) -> bytes:
    """Content for a claim file that also carries a message (a ``.keep``): this process's record
    first, then the message (git ignores a ``.keep``'s content; old readers skip the JSON line)."""
    if isinstance(message, str):
        message = message.encode()
    return current_owner().encode() + ((message + b"\n") if message else b"")


def split_owner(data: bytes) -> tuple[Owner | None, bytes]:
    """(owner record, the rest) of a claim file's content; (None, data) when it has no record."""
    found = Owner.decode(data)
    if found is None:
        return None, data
    return found, data.split(b"\n", 1)[1] if b"\n" in data else b""


def read_owner(path: str | os.PathLike[str]) -> Owner | None:
    """The owner record at the start of the file ``path`` (None: absent, unreadable or no record)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        return Owner.decode(os.read(fd, MAX_RECORD_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)


def bound_job() -> str | None:
    """The job id bound to this context (None outside a worker job)."""
    return _job_id.get()


@contextmanager
def bind_job(job_id: str | None) -> Iterator[None]:
    """Claims created inside the block name ``job_id`` as their owner's job."""
    token = _job_id.set(job_id)
    try:
        yield
    finally:
        _job_id.reset(token)


def set_job(job_id: str | None) -> None:
    """Bind ``job_id`` for the rest of this context (a worker process between jobs sets None)."""
    _job_id.set(job_id)
