"""Test helpers for smart HTTP: git's own ``git http-backend`` behind a tiny WSGI-to-CGI bridge (the oracle),
and ``packyard http`` as a real server process on a free loopback port."""
from __future__ import annotations

import os
import select
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterator


def cgi_bridge(project_root: Path, extra_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """A WSGI application running ``git http-backend`` as CGI for each request (what Apache's mod_cgi does)."""
    from packyard.workers.receive.smarthttp import request_body

    def app(environ: dict[str, Any], start_response):  # type: ignore[no-untyped-def]
        body = b""
        if environ["REQUEST_METHOD"] == "POST":
            raw = request_body({**environ, "HTTP_CONTENT_ENCODING": ""})   # de-chunked only: git gunzips
            body = raw.read()
        env = {**os.environ, **extra_env, "GIT_PROJECT_ROOT": str(project_root), "GIT_HTTP_EXPORT_ALL": "1",
               "REMOTE_USER": "tester", "REQUEST_METHOD": environ["REQUEST_METHOD"],
               "PATH_INFO": environ["PATH_INFO"], "QUERY_STRING": environ.get("QUERY_STRING", ""),
               "CONTENT_TYPE": environ.get("CONTENT_TYPE", ""), "CONTENT_LENGTH": str(len(body)),
               "GATEWAY_INTERFACE": "CGI/1.1"}
        for key in ("HTTP_CONTENT_ENCODING", "HTTP_GIT_PROTOCOL"):
            if environ.get(key):
                env[key] = environ[key]
        proc = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=120)
        head, _, payload = proc.stdout.partition(b"\r\n\r\n")
        status, headers = "200 OK", []
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = value.strip()
            elif name:
                headers.append((name, value.strip()))
        start_response(status, headers)
        return [payload]
    return app


class Served:
    """A WSGI app on a free loopback port in a thread of this process (``close`` stops it)."""

    def __init__(self, app: Any) -> None:
        from packyard.workers.receive.smarthttp import make_server

        self.server = make_server("127.0.0.1", 0, app)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="cgi-bridge")
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(30)


class PackyardHttp:
    """``packyard http --listen 127.0.0.1:0`` as a child process; ``url`` once it prints its address."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(["packyard", "http", "--listen", "127.0.0.1:0"], env=env,
                                     stdout=subprocess.PIPE, stderr=self.log)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("listening on "):
            self.close()
            raise AssertionError(f"packyard http did not start: {line!r}, {log.read_text()[-2000:]}")
        self.url = line.split()[-1].rstrip("/")
        self.socket: str | None = None
        if env.get("PACKYARD_RECEIVE_SOCKET", "off") != "off":   # its second line: where it takes stdio pushes
            line = self.proc.stdout.readline().decode()   # printed right after the first (maybe read with it)
            if not line.startswith("taking stdio pushes on unix:"):
                self.close()
                raise AssertionError(f"packyard http takes no stdio pushes: {line!r}, {log.read_text()[-2000:]}")
            self.socket = line.strip().split("unix:", 1)[1]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:   # pragma: no cover
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def served(env: dict[str, str], log: Path) -> Iterator[PackyardHttp]:
    server = PackyardHttp(env, log)
    try:
        yield server
    finally:
        server.close()
