"""Work done in a forked child process, its outcome sent back to the parent over a pipe.

Three hot loops fork: the reachability walk's helper (:mod:`.maintenance.walk`), the delta search's
segments (:mod:`.pack.search`) and index-pack's delta resolvers (:mod:`.pack.resolvedeltas`). Each child
inherits the parent's state copy-on-write (pack maps, caches, the object lists so far), does its
share, reports and exits. One protocol for all of them:

* the child asks the kernel to kill it when its parent dies (:func:`die_with_parent`), so a killed
  worker leaves no orphan burning a core;
* its outcome (:class:`Outcome`) is pickled once: ``("ok", value)``, ``("error", the StoreError as a tuple)`` or
  ``("crash", text)``, with exit status 0, 1 or 2 (70 if even reporting failed);
* the parent reads the pipe to its end, reaps the child and gets the value back, or the child's
  typed error raised again (same class, message, file, object and offset: the job row names what
  the child found), or a StoreError naming the process that crashed.

:class:`ForkedCall` is the one-child case; :func:`child_main` and :func:`read_outcome` are its
halves, for a parent that multiplexes several children (index-pack's progress loop).
"""
from __future__ import annotations

import ctypes
import os
import pickle
import signal
from typing import Any, Callable, Generic, NamedTuple, NoReturn, TypeVar, cast

from . import durable, errors
from .errors import StoreError

T = TypeVar("T")

PR_SET_PDEATHSIG = 1
EXIT_OK, EXIT_ERROR, EXIT_CRASH, EXIT_UNREPORTED = 0, 1, 2, 70

#: Every StoreError class by name, so that a child's error comes back as the same class.
_ERROR_TYPES: dict[str, type[StoreError]] = {
    name: cls for name, cls in vars(errors).items() if isinstance(cls, type) and issubclass(cls, StoreError)}



class Outcome(NamedTuple):
    """What a child reported: its value, or the StoreError it raised, or how it crashed."""

    value: Any = None
    error: StoreError | None = None
    crash: str | None = None


def die_with_parent() -> None:
    """Let the kernel SIGKILL this (child) process if its parent dies (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def error_tuple(err: StoreError) -> tuple[str, str, str | None, str | None, int | None]:
    """What crosses the pipe for ``err`` (exceptions with keyword-only arguments do not unpickle)."""
    return (type(err).__name__, err.message, err.path, err.oid, err.offset)


def error_from_tuple(t: tuple[str, str, str | None, str | None, int | None]) -> StoreError:
    name, message, path, oid, offset = t
    return _ERROR_TYPES.get(name, StoreError)(message, path=path, oid=oid, offset=offset)


def child_main(wfd: int, work: Callable[[], Any], *, on_failure: Callable[[], None] | None = None) -> NoReturn:
    """In a freshly forked child: run ``work``, write its outcome to ``wfd``, exit. Never returns.

    ``on_failure`` runs (in the child) before a failure is reported, e.g. to tell siblings to stop.
    """
    code = EXIT_UNREPORTED
    try:
        die_with_parent()
        try:
            payload = pickle.dumps(("ok", work()), protocol=5)
            code = EXIT_OK
        except StoreError as err:
            if on_failure is not None:
                on_failure()
            payload = pickle.dumps(("error", error_tuple(err)), protocol=5)
            code = EXIT_ERROR
        except BaseException as err:   # reported to the parent, which raises it as a StoreError
            if on_failure is not None:
                on_failure()
            payload = pickle.dumps(("crash", f"{type(err).__name__}: {err}"), protocol=5)
            code = EXIT_CRASH
        durable.write_all(wfd, payload)
    finally:
        os._exit(code)


def read_outcome(data: bytes, status: int) -> Outcome:
    """Decode what a child wrote (``data``, all of it) given its wait status."""
    if not data:
        return Outcome(crash=f"exited with status {status} and no report")
    msg = pickle.loads(data)
    if msg[0] == "ok":
        return Outcome(value=msg[1])
    if msg[0] == "error":
        return Outcome(error=error_from_tuple(msg[1]))
    return Outcome(crash=str(msg[1]))


def read_all(fd: int) -> bytes:
    """Everything until the writer closes its end (then ``fd`` is closed here)."""
    chunks: list[bytes] = []
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


class PipeLock:
    """A lock that forked children share (made before the fork): a pipe holding one token byte; acquiring reads
    it, releasing writes it back. multiprocessing's fork-context Lock (a semaphore) does the same but costs
    ~6 ms of imports (socket, pickle's reducers) in a process that forks only once, like index-pack."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.write(self._w, b"\0")

    def __enter__(self) -> "PipeLock":
        os.read(self._r, 1)   # blocks while another process holds the token (EINTR retried by Python)
        return self

    def __exit__(self, *exc: object) -> None:
        os.write(self._w, b"\0")

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


def kill_and_reap(pid: int) -> None:
    """SIGKILL a child that is no longer wanted (an error elsewhere) and reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


class ForkedCall(Generic[T]):
    """``work()`` run in a forked child; :meth:`result` waits for it. Use as a context manager (or call
    :meth:`close`) so that a child left behind by an exception in the parent is killed."""

    def __init__(self, pid: int, fd: int, what: str) -> None:
        self.pid, self.fd, self.what = pid, fd, what

    @classmethod
    def start(cls, work: Callable[[], T], *, what: str) -> "ForkedCall[T]":
        """Fork; the child runs ``work`` (it sees the parent's memory as of now). ``what`` names the process
        in a crash report ("delta search", "reachability walk")."""
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:   # ---- child
            os.close(rfd)
            child_main(wfd, work)
        os.close(wfd)
        return cls(pid, rfd, what)

    def result(self) -> T:
        """The child's value; its StoreError raised again; a crash as a StoreError naming ``what``."""
        data = read_all(self.fd)
        self.fd = -1
        _pid, status = os.waitpid(self.pid, 0)
        self.pid = 0
        out = read_outcome(data, status)
        if out.error is not None:
            raise out.error
        if out.crash is not None:
            raise StoreError(f"{self.what} process failed: {out.crash}")
        return cast(T, out.value)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.pid:
            kill_and_reap(self.pid)
            self.pid = 0

    def __enter__(self) -> "ForkedCall[T]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ForkedCall", "child_main", "read_outcome", "read_all", "kill_and_reap", "die_with_parent",
           "error_tuple", "error_from_tuple"]
