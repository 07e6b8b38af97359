"""A stdio push handed to a running server: ``packyard receive-pack`` gives its stdin, stdout and stderr to
``packyard http`` over a unix socket (PACKYARD_RECEIVE_SOCKET), and the push runs there.

Why: a fresh Python process pays for its imports and connections (the records, the Redis client: about half a
second) before a 10-commit push that git's receive-pack finishes in tens of milliseconds. A server that is
already running has them; Gitaly's stdio pushes work the same way (gitlab-shell is a thin client of a resident
server). The protocol is unchanged: the server speaks it on the client's own descriptors
(:func:`~.session.serve`), so its bytes are exactly those of an in-process push, and git's client cannot tell.

One connection per push, a ``SOCK_SEQPACKET`` socket (each message arrives whole, the header with its
descriptors):

1. the client connects; each side checks the other's credentials (``SO_PEERCRED``): the same user (or root
   for the server), so no other account can take a push's streams or hand in streams of its own;
2. the client sends one message: a JSON header (``repo``, ``advertise_refs``, ``stateless``, ``git_protocol``)
   with its descriptors 0, 1 and 2 (``SCM_RIGHTS``);
3. the server answers ``taken`` (it will run the push) or ``busy`` (``MAX_PUSHES`` already running; the client
   runs the push itself, as it does when no server listens), before it touches any of the streams;
4. the server runs the push with ITS settings (confinement, mode, hooks, limits: the message names only the
   repository, checked there as in process), closes its copies of the descriptors, then sends ``exit <status>``.

The client imports nothing of packyard's but this module and :mod:`~packyard.workers.envpaths`, so a push handed
over costs a bare interpreter's start. A client whose server goes away mid-push exits 128 with git's ``fatal:``
(the streams are half used: it cannot start again).

The same client in C, ``packyard-receive-pack`` (_handoff_client.c, installed beside the ``packyard`` script
when a compiler was there: :func:`native_client`), starts in ~1 ms instead of a Python's ~20 ms, which is what a
frontend should run (docs/receive.md). :func:`hand_over` is its specification: the same header bytes, the same
socket path, the same checks and answers (tests/receive/test_handoff_client.py); whatever it does not handle
itself it hands to ``packyard receive-pack`` before touching a stream.
"""
from __future__ import annotations

import json
import os
import socket
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

#: pushes a server runs at once from its socket; one more is told ``busy`` and runs in its own process
MAX_PUSHES = 64
#: bytes of one header at most (a repository path is at most PATH_MAX)
MAX_HEADER = 16384
#: seconds a connected client may take to send its header, and a server to answer taken/busy
HANDSHAKE_TIMEOUT = 10.0
_CRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


#: the C client's program name (setup.py's PROGRAMS)
NATIVE_CLIENT = "packyard-receive-pack"


def native_client() -> str | None:
    """The path of this install's ``packyard-receive-pack`` (beside its ``packyard`` script), or None when it was
    not built (no C compiler at install time: ``packyard receive-pack`` does the same, slower to start)."""
    import sysconfig

    path = os.path.join(sysconfig.get_path("scripts"), NATIVE_CLIENT)
    return path if os.access(path, os.X_OK) else None


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected unix socket."""
    _pid, uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return uid


def _read_line(sock: socket.socket, limit: int = 64) -> bytes:
    """One ``\\n``-ended line from ``sock`` (without it); b"" when the other end closed first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(limit - len(data))
        if not chunk:
            return b""
        data += chunk
        if len(data) >= limit and not data.endswith(b"\n"):
            return b""
    return data[:-1]


# -- the client: packyard receive-pack ---------------------------------------------------------------------

def hand_over(path: str | Path | None, repo: str, *, advertise_refs: bool, stateless: bool) -> int | None:
    """Run this push in the server listening at ``path``; its exit status, or None when no server of this user
    listens there or it is busy (the caller runs the push itself; nothing has been read or written)."""
    if path is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with sock:
        sock.settimeout(HANDSHAKE_TIMEOUT)
        try:
            sock.connect(os.fspath(path))
            if peer_uid(sock) not in (os.getuid(), 0):
                return None    # not our server: our streams are not handed to another account
            header = json.dumps({"repo": repo, "advertise_refs": advertise_refs, "stateless": stateless,
                                 "git_protocol": os.environ.get("GIT_PROTOCOL", "")}).encode()
            socket.send_fds(sock, [header], [0, 1, 2])
            if _read_line(sock) != b"taken":
                return None
        except OSError:   # no socket, a stale one, a timeout: the push runs here
            return None
        sock.settimeout(None)   # the push's own bounds are the server's (idle time, hooks, the job's limits)
        try:
            line = _read_line(sock)
        except OSError:
            line = b""
    if not line.startswith(b"exit ") or not line[5:].isdigit() or int(line[5:]) > 255:   # (not an exit status)
        os.write(2, b"fatal: the receiving server went away during the push\n")
        return 128
    return int(line[5:])


# -- the server: packyard http ------------------------------------------------------------------------------

class HandoffServer:
    """Takes pushes on a unix socket at ``path`` and runs each in a thread of its own (``serve_in_thread``)."""

    def __init__(self, path: Path, log: Any) -> None:
        import threading

        self.path = path
        self.log = log
        self.slots = threading.BoundedSemaphore(MAX_PUSHES)
        self.sock: socket.socket | None = None
        self.refused = ""     # why bind() did not listen

    def bind(self) -> bool:
        """Listen at ``path``: a socket file no server answers on (one killed) is replaced; one a live server
        answers on is left to it (False, as when the directory refuses the socket; ``refused`` says why)."""
        self.refused = ""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with probe:
            try:
                probe.connect(os.fspath(self.path))
                self.refused = "another process serves it"
                self.log.warning("receive socket %s is served by another process; stdio pushes go there", self.path)
                return False
            except FileNotFoundError:
                pass
            except OSError:
                if self.path.is_socket():
                    self.path.unlink()   # a killed server's: nothing listens on it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        old = os.umask(0o177)           # the socket file is 0600: only this user connects
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            sock.bind(os.fspath(self.path))
        except OSError as err:
            sock.close()
            self.refused = err.strerror or str(err)
            self.log.warning("cannot listen for stdio pushes at %s: %s", self.path, err)
            return False
        finally:
            os.umask(old)
        sock.listen(MAX_PUSHES)
        self.sock = sock
        return True

    def serve_in_thread(self) -> None:
        import threading

        threading.Thread(target=self._accept_loop, name="receive-socket", daemon=True).start()

    def close(self, drain: float = 0.0) -> int:
        """Stop taking pushes (the socket file goes), then wait up to ``drain`` seconds for those running to end;
        returns how many were still running."""
        import time

        if self.sock is not None:
            self.sock.close()
            self.sock = None
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        deadline = time.monotonic() + drain
        taken = 0
        while taken < MAX_PUSHES and self.slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            taken += 1
        for _ in range(taken):
            self.slots.release()
        return MAX_PUSHES - taken

    def _accept_loop(self) -> None:
        import threading

        while self.sock is not None:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return       # closed
            threading.Thread(target=self.handle, args=(conn,), name="receive-push", daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        """One client: the checks and the header, then the push on its descriptors, then its exit status."""
        fds: list[int] = []
        with conn:
            try:
                conn.settimeout(HANDSHAKE_TIMEOUT)
                uid = peer_uid(conn)
                if uid != os.getuid():
                    self.log.warning("receive socket: refused a client of uid %d", uid)
                    return
                data, fds, _flags, _addr = socket.recv_fds(conn, MAX_HEADER, 3)
                header = _header(data, fds)
            except (OSError, ValueError) as err:
                self.log.warning("receive socket: refused a client: %s", err)
                for fd in fds:
                    os.close(fd)
                return
            if not self.slots.acquire(blocking=False):
                for fd in fds:
                    os.close(fd)
                _send(conn, b"busy\n")
                return
            try:
                if not _send(conn, b"taken\n"):
                    for fd in fds:
                        os.close(fd)
                    return
                conn.settimeout(None)
                status = self._run(header, fds)
                _send(conn, b"exit %d\n" % status)
            finally:
                self.slots.release()

    def _run(self, header: dict[str, Any], fds: list[int]) -> int:
        """The push on the client's descriptors, closed afterwards (before the client is told: once it exits,
        nothing of the push holds its streams)."""
        from packyard.workers.receive.session import serve

        in_fd, out_fd, err_fd = fds
        stdout = os.fdopen(out_fd, "wb", buffering=0)
        stderr = os.fdopen(err_fd, "wb", buffering=0)
        try:
            return serve(header["repo"], in_fd, stdout, stderr, advertise_only=header["advertise_refs"],
                         stateless=header["stateless"], git_protocol=header["git_protocol"])
        except OSError as err:   # the client's end went away (EPIPE): what git's receive-pack dies of too
            self.log.warning("receive socket: push to %s ended: %s", header["repo"], err)
            return 128
        except Exception:
            self.log.exception("receive socket: push to %s failed", header["repo"])
            return 128
        finally:
            os.close(in_fd)
            for stream in (stdout, stderr):
                try:
                    stream.close()
                except OSError:
                    pass


def _header(data: bytes, fds: list[int]) -> dict[str, Any]:
    """The client's header, checked: three descriptors, the four fields with their types (ValueError if not)."""
    if len(fds) != 3:
        raise ValueError(f"{len(fds)} descriptors instead of stdin, stdout and stderr")
    header = json.loads(data.decode("utf-8", "surrogateescape"))
    if not isinstance(header, dict) or not isinstance(header.get("repo"), str) \
            or not isinstance(header.get("git_protocol"), str) \
            or not all(isinstance(header.get(k), bool) for k in ("advertise_refs", "stateless")):
        raise ValueError("a malformed header")
    return header


def _send(conn: socket.socket, data: bytes) -> bool:
    try:
        conn.sendall(data)
        return True
    except OSError:
        return False
