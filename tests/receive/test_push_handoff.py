"""Stdio pushes handed to a running server (workers/receive/handoff.py): ``packyard receive-pack`` passes its
stdin, stdout and stderr to ``packyard http``'s receive socket and the push runs there, with the server's
settings. Real servers, real ``git push``; the parity table (test_push_parity.py) runs every scenario this way too.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from httputil import PackyardHttp

from gitutil import GIT_ENV, git
from procutil import as_nobody

RECEIVE_PACK = "packyard receive-pack"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    client = tmp_path / "client"
    git("init", "-q", "-b", "main", str(client))
    (client / "a.txt").write_text("one\n")
    git("add", "-A", cwd=client)
    git("commit", "-q", "-m", "one", cwd=client)
    return client


def _commit(client: Path, text: str) -> str:
    (client / "a.txt").write_text(text)
    git("commit", "-q", "-am", text, cwd=client)
    return git("rev-parse", "HEAD", cwd=client).decode().strip()


def _push(client: Path, repo: Path, env: dict[str, str], *refspecs: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "push", "--porcelain", "--receive-pack", RECEIVE_PACK, str(repo), *refspecs],
                          cwd=client, env=env, capture_output=True, timeout=120)


def _jobs_by(log: Path, pid: int) -> list[dict]:
    """The job.finished events of the push jobs the process ``pid`` started, from its JSON log."""
    events = []
    for line in log.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    ours = {e["job_id"] for e in events if e.get("event") == "job.started" and e.get("pid") == pid
            and e.get("task") == "packyard.receive_pack"}
    return [e for e in events if e.get("event") == "job.finished" and e.get("job_id") in ours]


def test_a_stdio_push_runs_in_the_server_with_its_settings(work: Path, store_root: Path, tmp_path: Path, pk,
                                                           short_dir: Path) -> None:  # type: ignore[no-untyped-def]
    repo = store_root / "handed.git"
    git("init", "-q", "--bare", str(repo))
    sock = short_dir / "receive.sock"
    log = tmp_path / "http.log"
    server = PackyardHttp({**pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(sock), PACKYARD_RECEIVE_DENY_DELETES="1"),
                           **GIT_ENV}, log)
    try:
        assert server.socket == str(sock)
        assert sock.is_socket() and (sock.stat().st_mode & 0o777) == 0o600
        client_env = {**pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(sock)), **GIT_ENV}   # the client allows deletes
        assert _push(work, repo, client_env, "main", "main:refs/heads/other").returncode == 0
        tip = _commit(work, "two\n")
        pushed = _push(work, repo, client_env, "main")
        assert pushed.returncode == 0, pushed.stderr
        assert git("rev-parse", "refs/heads/main", git_dir=repo).decode().strip() == tip
        refused = _push(work, repo, client_env, ":refs/heads/other")   # the server's rule, not the client's
        assert refused.returncode == 1
        assert b"deletion prohibited" in refused.stdout, refused.stdout
        git("fsck", "--full", "--strict", git_dir=repo)
        finished = _jobs_by(log, server.proc.pid)   # the server wrote every job row: the client did not
        assert [e["state"] for e in finished] == ["SUCCESS", "SUCCESS", "SUCCESS"], finished
        assert finished[-1]["counters"]["refs_refused"] == 1
    finally:
        server.close()
    assert not sock.exists(), "the server removes its socket when it stops"


def test_without_a_server_the_push_runs_in_receive_pack(work: Path, store_root: Path, pk,
                                                        short_dir: Path) -> None:  # type: ignore[no-untyped-def]
    repo = store_root / "alone.git"
    git("init", "-q", "--bare", str(repo))
    stale = short_dir / "receive.sock"      # a socket file nothing listens on (a killed server's)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.bind(str(stale))
    for sock in (str(stale), str(short_dir / "absent.sock"), "off"):
        tip = _commit(work, f"for {sock}\n")
        pushed = _push(work, repo, {**pk.cli_env(PACKYARD_RECEIVE_SOCKET=sock), **GIT_ENV}, "main")
        assert pushed.returncode == 0, pushed.stderr
        assert git("rev-parse", "refs/heads/main", git_dir=repo).decode().strip() == tip


def test_a_second_server_leaves_a_live_socket_and_takes_a_dead_ones(store_root: Path, tmp_path: Path, pk,
                                                                    short_dir: Path) -> None:  # type: ignore[no-untyped-def]
    sock = short_dir / "receive.sock"
    env = {**pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(sock)), **GIT_ENV}
    first = PackyardHttp(env, tmp_path / "first.log")
    try:
        with pytest.raises(AssertionError, match="takes no stdio pushes"):
            PackyardHttp(env, tmp_path / "second.log")
        assert "served by another process" in (tmp_path / "second.log").read_text()
        first.proc.send_signal(signal.SIGKILL)     # its socket file stays behind
        first.proc.wait(30)
        assert sock.is_socket()
        third = PackyardHttp(env, tmp_path / "third.log")
        try:
            assert third.socket == str(sock)
        finally:
            third.close()
    finally:
        first.close()


def test_a_server_killed_mid_push_fails_the_push_and_moves_nothing(work: Path, store_root: Path, tmp_path: Path,
                                                                   pk, short_dir: Path) -> None:  # type: ignore[no-untyped-def]
    repo = store_root / "killed.git"
    git("init", "-q", "--bare", str(repo))
    started = tmp_path / "hook-started"
    hook = tmp_path / "pre-receive"
    hook.write_text(f"#!/bin/sh\necho $$ > {started}.tmp && mv {started}.tmp {started}\nsleep 60\n")
    hook.chmod(0o755)
    sock = short_dir / "receive.sock"
    server = PackyardHttp({**pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(sock),
                                        PACKYARD_RECEIVE_PRE_RECEIVE_HOOK=str(hook)), **GIT_ENV},
                          tmp_path / "http.log")
    try:
        push = subprocess.Popen(["git", "push", "--receive-pack", RECEIVE_PACK, str(repo), "main"], cwd=work,
                                env={**pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(sock)), **GIT_ENV},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        pk.wait_until(started.exists, 60, what="the pre-receive hook to start in the server")
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
        os.kill(int(started.read_text()), signal.SIGKILL)   # the hook, in its own process group, outlives it
        _out, err = push.communicate(timeout=60)
        assert push.returncode != 0
        assert b"fatal: the receiving server went away during the push" in err, err
    finally:
        server.close()
    assert git("for-each-ref", git_dir=repo) == b""
    assert not list((repo / "objects" / "pack").glob("*.pack"))
    git("fsck", "--full", "--strict", git_dir=repo)


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, fmt: str, *args: object) -> None:
        self.lines.append(fmt % args)

    exception = warning


@pytest.fixture
def in_process_server(short_dir: Path) -> Iterator[tuple[object, _Log]]:
    from packyard.workers.receive.handoff import HandoffServer

    log = _Log()
    server = HandoffServer(short_dir / "receive.sock", log)
    assert server.bind()
    server.serve_in_thread()
    yield server, log
    server.close()


def test_a_busy_server_hands_the_push_back_untouched(in_process_server) -> None:  # type: ignore[no-untyped-def]
    from packyard.workers.receive.handoff import MAX_PUSHES, hand_over

    server, _log = in_process_server
    for _ in range(MAX_PUSHES):          # every slot taken: the next push is told busy
        assert server.slots.acquire(blocking=False)
    try:
        assert hand_over(server.path, "default:x.git", advertise_refs=True, stateless=False) is None
    finally:
        for _ in range(MAX_PUSHES):
            server.slots.release()


def test_a_malformed_client_is_refused_and_the_server_goes_on(in_process_server, short_dir: Path) -> None:  # type: ignore[no-untyped-def]
    server, log = in_process_server
    for message, fds in ((b"not json", [0, 1, 2]), (b'{"repo": "x"}', [0, 1, 2]), (json.dumps(
            {"repo": "x", "advertise_refs": True, "stateless": False, "git_protocol": ""}).encode(), [0])):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(30)
            s.connect(str(server.path))
            socket.send_fds(s, [message], fds)
            assert s.recv(64) == b""        # closed without an answer: nothing of it was run
    assert len(log.lines) == 3 and all("refused a client" in line for line in log.lines), log.lines
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:   # still accepting
        s.connect(str(server.path))


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_can_neither_connect_nor_be_served(in_process_server) -> None:  # type: ignore[no-untyped-def]
    from packyard.workers.receive.handoff import hand_over

    server, log = in_process_server

    def hand_over_as_another_account() -> str:
        return repr(hand_over(server.path, "default:x.git", advertise_refs=True, stateless=False))

    assert as_nobody(hand_over_as_another_account) == "None"   # the socket is 0600: it cannot connect, so it
    assert not log.lines                                       # runs its push itself
    os.chmod(server.path.parent, 0o755)
    os.chmod(server.path, 0o666)        # even if an operator opens it up, the server checks who connected
    assert as_nobody(hand_over_as_another_account) == "None"
    deadline = time.monotonic() + 30
    while not log.lines and time.monotonic() < deadline:
        threading.Event().wait(0.05)
    assert log.lines == ["receive socket: refused a client of uid 65534"]


@pytest.mark.parametrize("value, expected", [
    ("off", None), ("OFF", None), ("/run/packyard/receive.sock", "/run/packyard/receive.sock"),
    ("", "<state>/receive.sock"), ("relative.sock", "error: must be an absolute path"),
    ("/" + "x" * 120, "error: longer than a unix socket's 107 bytes"),
])
def test_the_receive_socket_setting(value: str, expected: str | None, tmp_path: Path) -> None:
    from packyard.workers import envpaths
    from packyard.workers.settings import Settings, SettingsError

    env = {"PACKYARD_STATE_DIR": str(tmp_path / "s"), "PACKYARD_RECEIVE_SOCKET": value}
    if expected is not None and expected.startswith("error: "):
        with pytest.raises(SettingsError, match=expected[7:]):
            Settings.from_env(env)
        return
    want = expected.replace("<state>", os.path.realpath(tmp_path / "s")) if expected else None
    if want is not None and len(want) > envpaths.MAX_SOCKET_PATH:   # a long temp dir: the default is then none
        want = None
    assert envpaths.receive_socket(env) == want
    got = Settings.from_env(env).receive_socket
    assert (str(got) if got is not None else None) == want


def test_a_default_socket_path_too_long_means_no_socket(tmp_path: Path) -> None:
    from packyard.workers.settings import Settings

    deep = tmp_path / ("d" * 110)
    assert Settings.from_env({"PACKYARD_STATE_DIR": str(deep)}).receive_socket is None


@pytest.fixture(autouse=True)
def _services(redis_server, migrated_db) -> None:  # type: ignore[no-untyped-def]  # the lease and the job row
    if shutil.which("git") is None:   # pragma: no cover
        pytest.skip("git is needed")
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")
