"""``packyard-receive-pack``, the C client of a stdio push handed to a running server (workers/receive/
_handoff_client.c), against its specification, the Python client (``packyard receive-pack``, handoff.hand_over):
the same header bytes on the same socket, the same answers to every reply of the server, and the Python's own
behaviour (it runs it) for everything it does not handle. Real pushes through it: the parity table
(test_push_parity.py, ``native``)."""
from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from gitutil import git
from procutil import as_nobody, native_client_or_skip, wait_until

PYTHON_CLIENT = ["packyard", "receive-pack"]


@pytest.fixture
def native() -> list[str]:
    return [native_client_or_skip()]


class Capture:
    """A receive socket at ``path`` that records each client (its executable, its header's bytes, how many
    descriptors came with it), closes the descriptors unused, and sends ``answers``, one message each."""

    def __init__(self, path: Path, answers: list[bytes]) -> None:
        self.path = path
        self.answers = answers
        self.got: list[tuple[str, bytes, int]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(30)
                pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
                data, fds, _flags, _addr = socket.recv_fds(conn, 16384, 8)
                for fd in fds:
                    os.close(fd)
                self.got.append((exe, data, len(fds)))
                for message in self.answers:
                    conn.sendall(message)

    def close(self) -> None:
        """Stop the thread first (shutdown wakes its accept), then close: a socket closed under a blocked or
        starting accept frees its descriptor number while the thread still uses it, and the next socket this
        process opens (another test's server) gets that number and has its connections taken."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(30)
        assert not self.thread.is_alive(), "the capturing socket's thread did not stop"
        self.sock.close()
        self.path.unlink(missing_ok=True)


def _run(cmd: list[str], args: list[str], env: dict[str, str], cwd: Path | None = None,
         ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*cmd, *args], env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=60)


HEADERS = {   # id -> (arguments, GIT_PROTOCOL or None, which executable sends the header from the C client)
    "plain": (["/srv/repos/a.git"], None, "packyard-receive-pack"),
    "advertise, v1": (["--advertise-refs", '/srv/x y/"q"\\b.git'], "version=1", "packyard-receive-pack"),
    "stateless, quiet, controls": (["--stateless-rpc", "-q", "default:a\tb\x01\x1f\x7f\r\x08\x0c.git"], None,
                                   "packyard-receive-pack"),
    "http info refs, --, a dash": (["--http-backend-info-refs", "--stateless-rpc", "--", "-dash.git"],
                                   'x"\\\nversion=2', "packyard-receive-pack"),
    "non-ASCII: the Python writes it": (["/srv/repos/\u00fc.git"], None, "python"),
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_the_same_header_bytes_and_the_servers_exit_status(case: str, native: list[str], short_dir: Path,
                                                           pk) -> None:  # type: ignore[no-untyped-def]
    args, protocol, sender = HEADERS[case]
    capture = Capture(short_dir / "r.sock", [b"taken\n", b"exit 7\n"])
    try:
        env = pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(capture.path))
        env.pop("GIT_PROTOCOL", None)
        if protocol is not None:
            env["GIT_PROTOCOL"] = protocol
        done = [_run(client, args, env) for client in (PYTHON_CLIENT, native)]
    finally:
        capture.close()
    assert [p.returncode for p in done] == [7, 7], [p.stderr for p in done]
    assert [p.stdout + p.stderr for p in done] == [b"", b""]
    (py_exe, py_header, py_fds), (c_exe, c_header, c_fds) = capture.got
    assert c_header == py_header and c_fds == py_fds == 3
    assert py_exe.startswith("python") and c_exe.startswith(sender), (py_exe, c_exe)


def test_the_socket_path_is_the_pythons(native: list[str], short_dir: Path, pk) -> None:  # type: ignore[no-untyped-def]
    """Every way of naming the socket (workers/envpaths.receive_socket) reaches the same socket from both."""
    state = short_dir / "state"
    state.mkdir()
    (short_dir / "link").symlink_to(state)
    (short_dir / ".state").symlink_to(state)
    capture = Capture(state / "receive.sock", [b"taken\n", b"exit 3\n"])
    base = {k: v for k, v in pk.cli_env().items() if k not in ("PACKYARD_RECEIVE_SOCKET", "PACKYARD_STATE_DIR")}
    cases = {   # name -> (environment on top of base, which executable the C client's header comes from)
        "the state dir": ({"PACKYARD_STATE_DIR": str(state)}, "packyard-receive-pack"),
        "an empty setting: the default": ({"PACKYARD_STATE_DIR": str(state), "PACKYARD_RECEIVE_SOCKET": ""},
                                          "packyard-receive-pack"),
        "through a symlink": ({"PACKYARD_STATE_DIR": str(short_dir / "link")}, "packyard-receive-pack"),
        "relative to the cwd": ({"PACKYARD_STATE_DIR": "link"}, "packyard-receive-pack"),
        "no state dir: ./.state": ({}, "packyard-receive-pack"),
        "the path itself": ({"PACKYARD_RECEIVE_SOCKET": str(capture.path)}, "packyard-receive-pack"),
        "blanks around it: the Python strips": ({"PACKYARD_RECEIVE_SOCKET": f"  {capture.path}\t"}, "python"),
    }
    try:
        for name, (extra, sender) in cases.items():
            before = len(capture.got)
            done = [_run(client, ["/srv/a.git"], {**base, **extra}, cwd=short_dir)
                    for client in (PYTHON_CLIENT, native)]
            assert [p.returncode for p in done] == [3, 3], (name, [p.stderr for p in done])
            (_, py_header, _), (c_exe, c_header, _) = capture.got[before:]
            assert c_header == py_header and c_exe.startswith(sender), (name, c_exe)
    finally:
        capture.close()


@pytest.mark.parametrize("value", ["off", "OFF", "none", "0", "relative.sock", "/" + "x" * 120])
def test_no_socket_or_a_bad_setting_the_python_decides(value: str, native: list[str], short_dir: Path,
                                                       pk) -> None:  # type: ignore[no-untyped-def]
    """Off: the push runs in the client (here: refused, a repository outside the storage roots); a value that is
    not a socket: the Python's configuration error. The C client says exactly what the Python says."""
    capture = Capture(short_dir / "receive.sock", [b"busy\n"])   # where the state dir's default would be
    try:
        env = {**pk.cli_env(PACKYARD_RECEIVE_SOCKET=value), "PACKYARD_STATE_DIR": str(short_dir)}
        done = [_run(client, ["/nowhere/a.git"], env) for client in (PYTHON_CLIENT, native)]
    finally:
        capture.close()
    assert done[0].returncode != 0 and done[0].stderr
    assert (done[1].returncode, done[1].stdout, done[1].stderr) == (done[0].returncode, done[0].stdout,
                                                                    done[0].stderr)
    assert capture.got == []


def test_busy_runs_the_push_in_the_client_asking_once(native: list[str], short_dir: Path, store_root: Path,
                                                      pk) -> None:  # type: ignore[no-untyped-def]
    repo = store_root / "busy.git"
    git("init", "-q", "--bare", str(repo))
    capture = Capture(short_dir / "r.sock", [b"busy\n"])
    try:
        env = pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(capture.path))
        done = [_run(client, ["--advertise-refs", str(repo)], env) for client in (PYTHON_CLIENT, native)]
    finally:
        capture.close()
    assert [p.returncode for p in done] == [0, 0], [p.stderr for p in done]
    assert done[1].stdout == done[0].stdout and b"capabilities^{}" in done[0].stdout   # run by each client itself
    assert [exe.startswith("python") for exe, _, _ in capture.got] == [True, False]     # each asked once


@pytest.mark.parametrize("answers", [[b"taken\n"], [b"taken\n", b"exit x\n"], [b"taken\n", b"exit 300\n"]],
                         ids=["closed after taken", "a garbled status", "a status out of range"])
def test_a_server_gone_mid_push_is_gits_fatal(answers: list[bytes], native: list[str], short_dir: Path,
                                              pk) -> None:  # type: ignore[no-untyped-def]
    capture = Capture(short_dir / "r.sock", answers)
    try:
        env = pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(capture.path))
        done = [_run(client, ["/srv/a.git"], env) for client in (PYTHON_CLIENT, native)]
    finally:
        capture.close()
    said = b"fatal: the receiving server went away during the push\n"
    assert [(p.returncode, p.stderr) for p in done] == [(128, said), (128, said)]


@pytest.mark.parametrize("args", [["--help"], [], ["--frobnicate", "/srv/a.git"], ["/srv/a.git", "/srv/b.git"],
                                  ["--advertise", "/srv/a.git"]])
def test_what_it_does_not_parse_goes_to_the_pythons_argparse(args: list[str], native: list[str],
                                                             short_dir: Path, pk) -> None:  # type: ignore[no-untyped-def]
    capture = Capture(short_dir / "r.sock", [b"taken\n", b"exit 9\n"])
    try:
        env = pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(capture.path))
        done = [_run(client, args, env) for client in (PYTHON_CLIENT, native)]
    finally:
        capture.close()
    assert (done[1].returncode, done[1].stdout, done[1].stderr) == (done[0].returncode, done[0].stdout,
                                                                    done[0].stderr)
    if args[:1] == ["--advertise"]:    # argparse's abbreviation of --advertise-refs: the Python hands it over
        assert done[0].returncode == 9 and [exe.startswith("python") for exe, _, _ in capture.got] == [True, True]
    else:
        assert done[0].returncode in (0, 2) and capture.got == []


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to act as other users")
def test_a_server_of_another_user_gets_nothing(native: list[str], short_dir: Path, pk) -> None:  # type: ignore[no-untyped-def]
    """A socket another account listens on (nobody, here; the client runs as a third one): the client hangs up
    after reading the server's credentials, before the header, and no descriptor reaches that server."""
    os.chmod(short_dir, 0o777)
    path = short_dir / "other.sock"
    client = short_dir / "client"          # a copy another account may run (the checkout may be in a 0700 dir)
    shutil.copy(native[0], client)
    client.chmod(0o755)
    ran: list[subprocess.CompletedProcess[bytes]] = []

    def run_client() -> None:
        wait_until(path.exists, 30, what="the other user's socket")
        ran.append(subprocess.run([str(client), "/srv/a.git"], env=pk.cli_env(PACKYARD_RECEIVE_SOCKET=str(path)),
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=60, user=65533,
                                  group=65533, extra_groups=[]))

    def serve_once() -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.bind(str(path))
            os.chmod(path, 0o777)
            s.listen(1)
            s.settimeout(60)
            conn, _ = s.accept()
            with conn:
                conn.settimeout(30)
                data, fds, _flags, _addr = socket.recv_fds(conn, 16384, 8)
                return f"header of {len(data)} bytes, {len(fds)} descriptors" if data or fds else "closed"

    thread = threading.Thread(target=run_client)
    thread.start()
    said = as_nobody(serve_once)
    thread.join(90)
    assert said == "closed", (said, ran)
    assert ran and ran[0].returncode != 0   # it then runs the push itself (here it cannot start the Python)
