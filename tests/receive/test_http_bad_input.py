"""Push request bodies over smart HTTP, good and bad, sent by hand to packyard's WSGI application and to
git's own ``git http-backend`` (CGI behind a bridge) on identical repositories.

git 2.39's client sends push bodies unzipped (tests/receive/test_http.py), but a frontend or another client
may gzip or chunk them, and a broken client or proxy may cut them. For a good body both servers give the
same report and the same refs; for a bad one packyard answers with an error naming what is wrong, and on
both sides no ref moves and, on packyard's, no pack or quarantine is left behind."""
from __future__ import annotations

import gzip
import http.client
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest
from httputil import Served, cgi_bridge
from test_http import _rel
from test_push_parity import client  # noqa: F401 - the fixture

from gitutil import GIT_ENV, git

ZERO = "0" * 40


def _pkt(data: bytes) -> bytes:
    return b"%04x" % (len(data) + 4) + data


def _body(client: Path, caps: str = "report-status") -> bytes:  # noqa: F811
    new = git("rev-parse", "HEAD", cwd=client).decode().strip()
    pack = git("pack-objects", "--revs", "--stdout", "-q", cwd=client, input=b"HEAD\n")
    return _pkt(f"{ZERO} {new} refs/heads/main\0{caps} agent=git/2.39\n".encode()) + b"0000" + pack


def _post(url: str, body: bytes | Iterator[bytes], headers: dict[str, str]) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request("POST", f"{parts.path}/git-receive-pack", body=body,  # type: ignore[arg-type]
                     headers={"Content-Type": "application/x-git-receive-pack-request", **headers},
                     encode_chunked=not isinstance(body, bytes))
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Sides:
    """packyard (in this process) and git http-backend, each with one empty repository."""

    def __init__(self, store_root: Path, tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
        from packyard.workers.receive.smarthttp import GitHttp

        self.ours_repo, theirs_root = store_root / "r.git", tmp_path / "cgi"
        self.theirs_repo = theirs_root / "r.git"
        for repo in (self.ours_repo, self.theirs_repo):
            git("init", "-q", "--bare", str(repo))
        git("config", "receive.fsckObjects", "true", git_dir=self.theirs_repo)
        self.servers = {"ours": Served(GitHttp(settings)), "theirs": Served(cgi_bridge(theirs_root, GIT_ENV))}
        self.urls = {"ours": f"{self.servers['ours'].url}/{_rel(store_root, settings)}/r.git",
                     "theirs": f"{self.servers['theirs'].url}/r.git"}

    def post(self, side: str, body: bytes | Iterator[bytes], **headers: str) -> tuple[int, bytes]:
        return _post(self.urls[side], body, headers)

    def refs(self, side: str) -> bytes:
        return git("for-each-ref", git_dir=self.ours_repo if side == "ours" else self.theirs_repo)

    def nothing_left(self) -> None:
        """packyard's repository after a refused body: no ref, no pack, no quarantine or temp file."""
        assert self.refs("ours") == b""
        left = [p.name for p in (self.ours_repo / "objects").rglob("*") if p.is_file()]
        assert left == [], left

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


@pytest.fixture
def sides(store_root: Path, tmp_path: Path, settings) -> Iterator[Sides]:  # type: ignore[no-untyped-def]
    s = Sides(store_root, tmp_path, settings)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(autouse=True)
def _need_git(redis_server, migrated_db) -> None:  # type: ignore[no-untyped-def]  # the lease and the job row
    if shutil.which("git") is None:   # pragma: no cover
        pytest.skip("git is needed")
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")


def _chunks(data: bytes, size: int = 1000) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.parametrize("encoding", ["gzip", "chunked", "gzip+chunked"])
def test_a_gzipped_or_chunked_push_matches_http_backend(encoding: str, sides: Sides, client: Path) -> None:  # noqa: F811
    body = _body(client)
    sent: bytes | Iterator[bytes] = gzip.compress(body) if "gzip" in encoding else body
    headers = {"Content-Encoding": "gzip"} if "gzip" in encoding else {}
    answers = {}
    for side in ("ours", "theirs"):
        payload = _chunks(sent) if "chunked" in encoding else sent   # type: ignore[arg-type]
        answers[side] = sides.post(side, payload, **headers)
    assert answers["ours"] == answers["theirs"]
    assert answers["ours"] == (200, _pkt(b"unpack ok\n") + _pkt(b"ok refs/heads/main\n") + b"0000")
    assert sides.refs("ours") == sides.refs("theirs") != b""
    git("fsck", "--full", "--strict", git_dir=sides.ours_repo)


def test_a_body_cut_inside_the_pack(sides: Sides, client: Path) -> None:  # noqa: F811
    body = _body(client)
    cut = body[:len(body) - 200]
    answers = {side: sides.post(side, cut) for side in ("ours", "theirs")}
    for side in ("ours", "theirs"):
        status, payload = answers[side]
        # git: "unpack unpack-objects abnormal exit" (a small pack); packyard: "unpack index-pack abnormal exit"
        assert status == 200 and payload[4:11] == b"unpack " and b"unpack ok" not in payload, answers
        assert _pkt(b"ng refs/heads/main unpacker error\n") in payload, answers
        assert sides.refs(side) == b""
    sides.nothing_left()


def test_a_truncated_gzip_body_is_refused(sides: Sides, client: Path) -> None:  # noqa: F811
    zipped = gzip.compress(_body(client))
    cut = zipped[:len(zipped) // 2]
    status, payload = sides.post("ours", cut, **{"Content-Encoding": "gzip"})
    assert status in (200, 400), (status, payload)
    assert b"unpack ok" not in payload and b"gzip" in payload.lower() or b"ng refs/heads/main" in payload, payload
    theirs = sides.post("theirs", cut, **{"Content-Encoding": "gzip"})
    assert b"unpack ok" not in theirs[1]
    assert sides.refs("theirs") == b""
    sides.nothing_left()


def test_a_body_that_is_not_gzip_is_refused(sides: Sides, client: Path) -> None:  # noqa: F811
    status, payload = sides.post("ours", _body(client), **{"Content-Encoding": "gzip"})
    assert status == 400 and b"gzip" in payload.lower(), (status, payload)
    sides.nothing_left()


def test_a_bad_chunk_size_is_refused_with_its_offset(sides: Sides, client: Path) -> None:  # noqa: F811
    from packyard.workers.receive.smarthttp import MAX_CHUNK_LINE

    parts = urlsplit(sides.urls["ours"])
    for bad in (b"zz\r\n", b"1" * (MAX_CHUNK_LINE + 10) + b"\r\n"):
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        try:
            conn.putrequest("POST", f"{parts.path}/git-receive-pack")
            conn.putheader("Content-Type", "application/x-git-receive-pack-request")
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            conn.send(b"3\r\n009\r\n" + bad)   # a command's pkt-line begun, then the bad chunk-size line
            resp = conn.getresponse()
            status, payload = resp.status, resp.read()
        finally:
            conn.close()
        assert status == 400 and b"chunk" in payload and b"offset" in payload, (status, payload)
    sides.nothing_left()


def test_a_bad_pkt_line_length(sides: Sides) -> None:
    answers = {side: sides.post(side, b"zzzz" + b"x" * 100) for side in ("ours", "theirs")}
    for side in ("ours", "theirs"):
        assert b"unpack ok" not in answers[side][1] and sides.refs(side) == b""
    status, payload = answers["ours"]
    assert status in (200, 400), answers
    sides.nothing_left()


def test_a_push_outside_the_roots_is_404(sides: Sides, tmp_path: Path, client: Path) -> None:  # noqa: F811
    base = sides.servers["ours"].url
    outside = tmp_path / "outside.git"
    git("init", "-q", "--bare", str(outside))
    for path in ("/default/../../outside.git", f"/{tmp_path.name}/outside.git", "/nosuchroot/x.git"):
        status, _payload = _post(base + path, _body(client), {})
        assert status == 404, (path, status)
    assert git("for-each-ref", git_dir=outside) == b""
    assert subprocess.run(["git", "--git-dir", str(outside), "count-objects"], capture_output=True,
                          check=True).stdout.startswith(b"0 objects")
