"""git's smart HTTP as a WSGI application: pushes through packyard's receive side, fetches through git's
``upload-pack`` with the serving configuration, as git 2.39's ``http-backend`` answers them.

Routes (``<repo>`` is ``<storage>/<relative path>``: ``/default/team/app.git`` is ``default:team/app.git``)::

    GET  /<repo>/info/refs?service=git-receive-pack   the advertisement (session.advertisement)
    POST /<repo>/git-receive-pack                     commands + pack in, report out (session.exchange)
    GET  /<repo>/info/refs?service=git-upload-pack    git upload-pack --stateless-rpc --advertise-refs
    POST /<repo>/git-upload-pack                      git upload-pack --stateless-rpc

Everything else is 404 (no dumb HTTP: objects are never served as files); a repository outside the
storage roots, or not a repository, is 404 before anything in it is read. Request bodies may be gzipped
(``Content-Encoding: gzip``, what git's remote-curl sends for a request over 1 KiB that fits in
``http.postBuffer``) and chunked (``Transfer-Encoding: chunked``, for larger ones, decoded here when the
server has not). Responses carry http-backend's no-cache headers. Authentication is the frontend's: this
application trusts every request it gets, so it listens on loopback (``packyard http``).
"""
from __future__ import annotations

import gzip
import io
import logging
import os
import re
import subprocess
import sys
import threading
import zlib
from typing import Any, BinaryIO, Callable, Iterable, Iterator, cast
from urllib.parse import parse_qs

from packyard.store.errors import InvalidInputError, StoreError

log = logging.getLogger("packyard.http")

NO_CACHE = [("Expires", "Fri, 01 Jan 1980 00:00:00 GMT"), ("Pragma", "no-cache"),
            ("Cache-Control", "no-cache, max-age=0, must-revalidate")]
SERVICES = ("git-receive-pack", "git-upload-pack")
_ROUTE = re.compile(r"/(?P<repo>.+?)/(?:(?P<info>info/refs)|(?P<rpc>git-receive-pack|git-upload-pack))\Z", re.S)
#: bound of a chunk-size line of a chunked body (hex digits and extensions)
MAX_CHUNK_LINE = 4096
COPY = 1 << 16


class BadRequest(InvalidInputError):
    """The HTTP request is not one git's smart HTTP makes (answered 400)."""


class ChunkedReader(io.RawIOBase):
    """``Transfer-Encoding: chunked`` decoded (RFC 9112 section 7.1), trailers skipped; ends at the last chunk."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.left = 0
        self.done = False
        self.offset = 0

    def readable(self) -> bool:
        return True

    def _line(self) -> bytes:
        line = self.raw.readline(MAX_CHUNK_LINE)
        if not line.endswith(b"\n"):
            raise BadRequest("chunked request body: a chunk-size line is cut off or too long", offset=self.offset)
        self.offset += len(line)
        return line.rstrip(b"\r\n")

    def readinto(self, b: Any) -> int:
        while not self.done and self.left == 0:
            size = self._line().partition(b";")[0].strip()
            try:
                self.left = int(size, 16)
            except ValueError:
                raise BadRequest(f"chunked request body: bad chunk size {size[:40]!r}", offset=self.offset) from None
            if self.left < 0:
                raise BadRequest("chunked request body: negative chunk size", offset=self.offset)
            if self.left == 0:
                for _ in range(1000):   # trailer fields, up to the empty line
                    if not self._line():
                        break
                else:
                    raise BadRequest("chunked request body: more than 1000 trailer lines", offset=self.offset)
                self.done = True
        if self.done:
            return 0
        data = self.raw.read(min(len(b), self.left))
        if not data:
            raise BadRequest("chunked request body: the input ended inside a chunk", offset=self.offset)
        n = len(data)
        b[:n] = data
        self.left -= n
        self.offset += n
        if self.left == 0 and self.raw.read(2) not in (b"\r\n", b"\n"):
            raise BadRequest("chunked request body: a chunk does not end with CRLF", offset=self.offset)
        return n


class LimitedReader(io.RawIOBase):
    """The first ``length`` bytes of ``raw`` (a body with Content-Length); an early end is an error."""

    def __init__(self, raw: BinaryIO, length: int) -> None:
        self.raw = raw
        self.left = length
        self.length = length

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.left <= 0:
            return 0
        data = self.raw.read(min(len(b), self.left))
        if not data:
            raise BadRequest(f"request body ended after {self.length - self.left} of {self.length} bytes "
                             "(Content-Length)")
        b[:len(data)] = data
        self.left -= len(data)
        return len(data)


class GunzipReader(io.RawIOBase):
    """A gzipped body decoded; what the gzip module raises on a body that is not gzip, or that ends inside
    its stream, is a :class:`BadRequest` naming the offset in the decoded body (never a server error)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self.offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            n = self.gz.readinto(b)
        except (OSError, EOFError, zlib.error) as err:
            if isinstance(err, BadRequest):
                raise
            raise BadRequest(f"gzip request body: {err}", offset=self.offset) from None
        self.offset += n
        return n


def request_body(environ: dict[str, Any]) -> BinaryIO:
    """The request body as git sent it: length-bounded or de-chunked, then gunzipped."""
    raw = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH") or ""
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    stream: BinaryIO
    if length.strip():
        try:
            n = int(length)
        except ValueError:
            raise BadRequest(f"bad Content-Length {length[:40]!r}") from None
        stream = io.BufferedReader(LimitedReader(raw, n), COPY)   # type: ignore[arg-type]
    elif environ.get("wsgi.input_terminated"):
        stream = raw
    elif chunked:
        stream = io.BufferedReader(ChunkedReader(raw), COPY)   # type: ignore[arg-type]
    else:
        raise BadRequest("a request body needs Content-Length or chunked transfer")
    encoding = environ.get("HTTP_CONTENT_ENCODING", "").strip().lower()
    if encoding in ("gzip", "x-gzip"):
        return io.BufferedReader(GunzipReader(stream), COPY)   # type: ignore[arg-type]
    if encoding not in ("", "identity"):
        raise BadRequest(f"Content-Encoding {encoding!r} is not gzip")
    return stream


def _protocol(environ: dict[str, Any]) -> str:
    return str(environ.get("HTTP_GIT_PROTOCOL", ""))


StartResponse = Callable[..., Any]


class GitHttp:
    """The WSGI application (``settings``: a :class:`~packyard.workers.settings.Settings`, default the
    environment's)."""

    def __init__(self, settings: Any = None) -> None:
        from packyard.workers.settings import get_settings

        self.settings = settings or get_settings()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            return self._route(environ, start_response)
        except BadRequest as err:
            return _plain(start_response, "400 Bad Request", str(err))

    def _route(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        m = _ROUTE.match(environ.get("PATH_INFO", ""))
        if m is None:
            return _plain(start_response, "404 Not Found", "not found")
        method = environ.get("REQUEST_METHOD", "GET")
        if m.group("info"):
            service = parse_qs(environ.get("QUERY_STRING", "")).get("service", [""])[0]
            if service not in SERVICES:   # dumb HTTP is not served
                return _plain(start_response, "404 Not Found", "not found (smart HTTP only)")
            want: tuple[str, ...] = ("GET", "HEAD")
        else:
            service = m.group("rpc")
            want = ("POST",)
        if method not in want:
            status = "405 Method Not Allowed"
            start_response(status, [("Allow", ", ".join(want)), ("Content-Type", "text/plain")])
            return [b"method not allowed\n"]
        git_dir = self._repository(m.group("repo"))
        if git_dir is None:
            return _plain(start_response, "404 Not Found", "repository not found")
        if service == "git-receive-pack":
            if m.group("info"):
                return self._receive_refs(git_dir, environ, start_response)
            return self._receive_rpc(git_dir, environ, start_response)
        return self._upload(git_dir, environ, start_response, advertise=bool(m.group("info")))

    def _repository(self, spelled: str) -> str | None:
        """``<storage>/<path>`` to the repository's git directory inside that storage root, or None."""
        from packyard.workers.commands.upload_pack import confined_git_dir

        storage, _, rel = spelled.partition("/")
        parts = rel.split("/")
        if not storage or not rel or any(p in ("", ".", "..") for p in parts) or "\0" in spelled:
            return None
        try:
            return confined_git_dir(f"{storage}:{rel}", self.settings)
        except StoreError as err:
            log.info("http: %s refused: %s", spelled, err)
            return None

    def _receive_refs(self, git_dir: str, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        from packyard.workers.receive.pktline import flush_pkt, pkt
        from packyard.workers.receive.session import advertisement, open_target, rules_from

        _path, repo = open_target(git_dir, self.settings)
        version1 = "version=1" in _protocol(environ).split(":")
        body = pkt(b"# service=git-receive-pack\n") + flush_pkt()
        body += advertisement(repo, rules_from(self.settings), version1=version1)
        start_response("200 OK", [*NO_CACHE, ("Content-Type", "application/x-git-receive-pack-advertisement")])
        return [body]

    def _receive_rpc(self, git_dir: str, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """The push, streamed: the exchange runs in a thread writing into a :class:`_Pipe`, and the response
        sends what it writes as it comes (the keepalives of a queued push or a silent hook, the hooks'
        side band 2, the report). Refused before any report (a bad pkt-line, chunk or gzip): 400 with the
        reason, as nothing was sent yet."""
        from packyard.workers.receive.session import exchange, rules_from

        body = request_body(environ)
        pipe = _Pipe()
        err = io.BytesIO()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["status"] = exchange(git_dir, git_dir, body, body, cast(BinaryIO, pipe), err,
                                             rules_from(self.settings), self.settings)
            except BaseException as exc:   # handed to the response, which raises it in the server's thread
                outcome["error"] = exc
            finally:
                pipe.close()

        worker = threading.Thread(target=run, daemon=True, name="receive-pack-exchange")
        worker.start()
        return _report_stream(pipe, worker, outcome, err, environ, start_response)

    def _upload(self, git_dir: str, environ: dict[str, Any], start_response: StartResponse, *,
                advertise: bool) -> Iterable[bytes]:
        from packyard.workers.commands.upload_pack import upload_pack_argv, upload_pack_env

        protocol = _protocol(environ)
        body = None if advertise else request_body(environ)
        argv = upload_pack_argv(git_dir, self.settings, stateless=True, advertise_refs=advertise)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if body is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, env=upload_pack_env(os.environ, protocol))
        feeder = None
        if body is not None:
            feeder = threading.Thread(target=_feed, args=(body, proc), daemon=True, name="upload-pack-body")
            feeder.start()
        kind = "advertisement" if advertise else "result"
        start_response("200 OK", [*NO_CACHE, ("Content-Type", f"application/x-git-upload-pack-{kind}")])
        head = b""
        if advertise and "version=2" not in protocol.split(":"):
            head = b"001e# service=git-upload-pack\n0000"
        return _stream(proc, feeder, head)


class _Pipe:
    """The exchange's stdout as a stream of chunks from its thread to the response (each ``flush`` passes on
    what was written since; ``close`` ends it)."""

    def __init__(self) -> None:
        import queue

        self.chunks: queue.Queue[bytes | None] = queue.Queue()
        self.pending = bytearray()

    def write(self, data: bytes) -> int:
        self.pending += data
        return len(data)

    def flush(self) -> None:
        if self.pending:
            self.chunks.put(bytes(self.pending))
            self.pending.clear()

    def close(self) -> None:
        self.flush()
        self.chunks.put(None)


def _report_stream(pipe: _Pipe, worker: threading.Thread, outcome: dict[str, Any], err: io.BytesIO,
                   environ: dict[str, Any], start_response: StartResponse) -> Iterator[bytes]:
    first = pipe.chunks.get()
    if first is None:
        worker.join()
        if "error" in outcome:
            raise outcome["error"]
        if outcome.get("status", 0) != 0:   # refused before any report (a bad pkt-line, chunk or gzip)
            yield from _plain(start_response, "400 Bad Request", err.getvalue().decode("utf-8", "replace").strip())
            return
    start_response("200 OK", [*NO_CACHE, ("Content-Type", "application/x-git-receive-pack-result")])
    chunk = first
    while chunk is not None:
        yield chunk
        chunk = pipe.chunks.get()
    worker.join()
    if err.getvalue():   # what git's receive-pack writes to stderr: the web server's error log
        environ["wsgi.errors"].write(err.getvalue().decode("utf-8", "replace"))
    if "error" in outcome:
        raise outcome["error"]


def _feed(body: BinaryIO, proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    try:
        while chunk := body.read(COPY):
            proc.stdin.write(chunk)
    except (BrokenPipeError, StoreError, OSError, EOFError) as err:   # git stopped reading, or a bad body
        log.info("http: upload-pack request body: %s", err)
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _stream(proc: subprocess.Popen[bytes], feeder: threading.Thread | None, head: bytes) -> Iterator[bytes]:
    assert proc.stdout is not None
    try:
        if head:
            yield head
        while chunk := proc.stdout.read1(COPY):   # type: ignore[attr-defined]
            yield chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        if feeder is not None:
            feeder.join(timeout=10)


def _plain(start_response: StartResponse, status: str, text: str) -> list[bytes]:
    start_response(status, [*NO_CACHE, ("Content-Type", "text/plain; charset=utf-8")])
    return [f"{text}\n".encode()]


def make_server(host: str, port: int, app: Any) -> Any:
    """wsgiref's server, one thread per request (the standard library's, kept with Python itself)."""
    from socketserver import ThreadingMixIn
    from wsgiref import simple_server

    class Server(ThreadingMixIn, simple_server.WSGIServer):
        daemon_threads = True
        allow_reuse_address = True

    class Handler(simple_server.WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.info("http: %s %s", self.address_string(), format % args)

        def get_stderr(self) -> Any:
            return sys.stderr

    return simple_server.make_server(host, port, app, server_class=Server, handler_class=Handler)


def serve_forever(host: str, port: int, app: Any, *, ready: Callable[[str, int], None] | None = None) -> None:
    with make_server(host, port, app) as server:
        if ready is not None:
            ready(*server.server_address[:2])
        server.serve_forever()
