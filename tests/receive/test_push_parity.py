"""``packyard receive-pack`` against ``git receive-pack``: the same pushes by a real ``git push`` into two
identical repositories, one served by each; the same ``--porcelain`` output, exit status and refs after.
Plus byte-level parity of the report for raw requests (a stale old value), and the job row."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gitutil import GIT_ENV, git
from procutil import native_client_or_skip

RECEIVE_PACK = "packyard receive-pack"


def commit(work: Path, name: str, text: str) -> None:
    (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", f"{name}: {text[:20]}", cwd=work)


@pytest.fixture
def client(tmp_path: Path) -> Path:
    work = tmp_path / "client"
    git("init", "-q", "-b", "main", str(work))
    for i in range(3):
        commit(work, f"f{i}.txt", "".join(f"line {j} of {i}\n" for j in range(200)))
    git("tag", "-a", "-m", "release", "v1", cwd=work)
    git("branch", "feature", "HEAD~1", cwd=work)
    return work


class Pair:
    """Two identical bare repositories: ``ours`` (in the storage root) and ``theirs`` (git's)."""

    def __init__(self, store_root: Path, tmp_path: Path, pk) -> None:  # type: ignore[no-untyped-def]
        self.ours = store_root / "ours.git"
        self.theirs = tmp_path / "theirs.git"
        for repo in (self.ours, self.theirs):
            git("init", "-q", "--bare", str(repo))
            git("config", "receive.advertisePushOptions", "true", git_dir=repo)
        self.pk = pk
        self.env: dict[str, str] = {}
        self.stderrs: dict[bool, str] = {}

    def configure(self, git_config: dict[str, str], env: dict[str, str]) -> None:
        for key, value in git_config.items():
            git("config", "--add", key, value, git_dir=self.theirs)
        self.env.update(env)

    def install_hooks(self, scripts: dict[str, str], where: Path) -> None:
        """The same executables for both: git's through ``core.hooksPath``, packyard's through its settings."""
        where.mkdir(exist_ok=True)
        for name, body in scripts.items():
            script = where / name
            script.write_text(body)
            script.chmod(0o755)
            self.env[HOOK_SETTINGS[name]] = str(script)
        git("config", "core.hooksPath", str(where), git_dir=self.theirs)

    def hook_logs(self, ours: bool) -> dict[str, str]:
        """What the hooks recorded (files they wrote in their working directory, the repository)."""
        repo = self.ours if ours else self.theirs
        return {p.name: p.read_text() for p in sorted(repo.glob("hook-*.log"))}

    def seed(self, client: Path, *refspecs: str) -> None:
        for repo in (self.ours, self.theirs):
            git("push", "-q", str(repo), *refspecs, cwd=client)

    def hand_to_server(self, sock: Path, log: Path) -> Any:
        """From now on ``packyard receive-pack`` hands its pushes to a ``packyard http`` with these settings
        (docs/receive.md, PACKYARD_RECEIVE_SOCKET): the server's settings are the ones the push gets."""
        from httputil import PackyardHttp

        self.env["PACKYARD_RECEIVE_SOCKET"] = str(sock)
        server = PackyardHttp({**self.pk.cli_env(**self.env), **GIT_ENV}, log)
        assert server.socket == str(sock)
        return server

    def push(self, client: Path, *args: str, ours: bool, receive_pack: str = RECEIVE_PACK) -> tuple[int, str]:
        repo = self.ours if ours else self.theirs
        env = {**self.pk.cli_env(**self.env), **GIT_ENV}
        cmd = ["git", "push", "--porcelain", *(["--receive-pack", receive_pack] if ours else []), str(repo), *args]
        proc = subprocess.run(cmd, cwd=client, env=env, capture_output=True, timeout=120)
        self.stderr = proc.stderr.decode()
        self.stderrs[ours] = self.stderr
        return proc.returncode, proc.stdout.decode().replace(str(repo), "<repo>")

    def refs(self, ours: bool) -> str:
        repo = self.ours if ours else self.theirs
        return git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=repo).decode()


HOOK_SETTINGS = {"pre-receive": "PACKYARD_RECEIVE_PRE_RECEIVE_HOOK", "update": "PACKYARD_RECEIVE_UPDATE_HOOK",
                 "post-receive": "PACKYARD_RECEIVE_POST_RECEIVE_HOOK"}

# Hooks for the scenarios: sh scripts run in the repository (both servers' cwd), writing hook-*.log files there
# for the test to compare, and "policy:" lines on stderr that git push prints as "remote: policy: ...".
PRE_RECEIVE_REFUSES = """#!/bin/sh
cat > hook-pre-receive.log
echo "policy: pushes to this repository are frozen" >&2
exit 1
"""
UPDATE_REFUSES_NEW = """#!/bin/sh
echo "$1 $2 $3" >> hook-update.log
case "$1" in refs/heads/new*) echo "policy: $1 may not be created"; exit 1;; esac
"""
RECORD_PRE_RECEIVE = """#!/bin/sh
{ echo "options=${GIT_PUSH_OPTION_COUNT-unset} 0=${GIT_PUSH_OPTION_0-unset} 1=${GIT_PUSH_OPTION_1-unset}"
  echo "quarantine=${GIT_QUARANTINE_PATH:+set}"; cat; } > hook-pre-receive.log
"""
RECORD_UPDATE = """#!/bin/sh
echo "$1 $2 $3 options=${GIT_PUSH_OPTION_COUNT-unset} quarantine=${GIT_QUARANTINE_PATH:+set}" >> hook-update.log
"""
RECORD_POST_RECEIVE = """#!/bin/sh
{ echo "options=${GIT_PUSH_OPTION_COUNT-unset} 0=${GIT_PUSH_OPTION_0-unset}"
  echo "quarantine=${GIT_QUARANTINE_PATH:+set}"; cat; } > hook-post-receive.log
echo "policy: post-receive saw $(wc -l < hook-post-receive.log) lines"
"""


def _rewind(client: Path) -> None:
    git("reset", "-q", "--hard", "HEAD~1", cwd=client)
    commit(client, "other.txt", "a different history\n")


# name -> (seed refspecs, client preparation, push args, git config for git's side, packyard settings)
SCENARIOS = {
    "create": ((), None, ("main",), {}, {}),
    "fast-forward": (("HEAD~2:refs/heads/main",), None, ("main",), {}, {}),
    "non-fast-forward refused": (("main",), _rewind, ("main",), {}, {}),
    "force": (("main",), _rewind, ("--force", "main"), {}, {}),
    "non-fast-forward denied by the server": (
        ("main",), _rewind, ("--force", "main"), {"receive.denyNonFastForwards": "true"},
        {"PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS": "1"}),
    "delete": (("main", "feature"), None, (":refs/heads/feature",), {}, {}),
    "delete denied": (("main", "feature"), None, (":refs/heads/feature",), {"receive.denyDeletes": "true"},
                      {"PACKYARD_RECEIVE_DENY_DELETES": "1"}),
    "a tag": (("main",), None, ("v1",), {}, {}),
    "atomic with one ref failing": (
        ("main",), _rewind, ("--atomic", "--force", "main", "HEAD:refs/heads/new"),
        {"receive.denyNonFastForwards": "true"}, {"PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS": "1"}),
    "several refs, one failing, not atomic": (
        ("main",), _rewind, ("--force", "main", "HEAD:refs/heads/new", "v1"),
        {"receive.denyNonFastForwards": "true"}, {"PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS": "1"}),
    "push options": ((), None, ("-o", "ci.skip", "-o", "merge_request.create", "main"), {}, {}),
    "a thin push": (("HEAD~1:refs/heads/main",), None, ("--thin", "main"), {}, {}),
    "a hidden ref": (("main",), None, ("HEAD:refs/keep-around/x", "feature"), {"receive.hideRefs": "refs/keep-around"},
                     {"PACKYARD_RECEIVE_HIDE_REFS": "refs/keep-around"}),
    "a funny ref name": ((), None, ("HEAD:refs/heads/a..b",), {}, {}),
    # policy hooks (6th field: the scripts, the same for both servers)
    "pre-receive refuses": (("HEAD~1:refs/heads/main",), None, ("main", "v1"), {}, {},
                            {"pre-receive": PRE_RECEIVE_REFUSES, "post-receive": RECORD_POST_RECEIVE}),
    "update hook refuses one ref of two": (
        ("HEAD~1:refs/heads/main",), None, ("main", "HEAD:refs/heads/new"), {}, {},
        {"update": UPDATE_REFUSES_NEW, "post-receive": RECORD_POST_RECEIVE}),
    "update hook refuses two refs of four, one denied before": (   # git's error lines and the hooks' output interleave
        ("main",), _rewind, ("--force", "main", "HEAD:refs/heads/new", "HEAD:refs/heads/ok", "HEAD:refs/heads/new2"),
        {"receive.denyNonFastForwards": "true"}, {"PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS": "1"},
        {"update": UPDATE_REFUSES_NEW, "post-receive": RECORD_POST_RECEIVE}),
    "update hook refuses one ref, atomic": (
        ("HEAD~1:refs/heads/main",), None, ("--atomic", "main", "HEAD:refs/heads/new"), {}, {},
        {"update": UPDATE_REFUSES_NEW, "post-receive": RECORD_POST_RECEIVE}),
    "a slow pre-receive, keepalives meanwhile": (   # packyard sends one every 0.2 s of silence; git's client skips them
        ("HEAD~1:refs/heads/main",), None, ("main",), {}, {"PACKYARD_RECEIVE_KEEPALIVE": "0.2"},
        {"pre-receive": '#!/bin/sh\nsleep 1\necho "policy: awake"\n', "post-receive": RECORD_POST_RECEIVE}),
    "hooks see git's stdin, arguments and environment": (
        ("main", "feature"), _rewind,
        ("-o", "ci.skip", "-o", "two words", "--force", "main", "HEAD:refs/heads/new", "v1",
         "HEAD:refs/keep-around/x", ":refs/heads/feature"),
        {"receive.denyNonFastForwards": "true", "receive.hideRefs": "refs/keep-around"},
        {"PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS": "1", "PACKYARD_RECEIVE_HIDE_REFS": "refs/keep-around"},
        {"pre-receive": RECORD_PRE_RECEIVE, "update": RECORD_UPDATE, "post-receive": RECORD_POST_RECEIVE}),
}


@pytest.mark.parametrize("via", ["process", "server", "native"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_git_push_parity(scenario: str, via: str, client: Path, store_root: Path, tmp_path: Path, pk,  # type: ignore[no-untyped-def]
                         short_dir: Path) -> None:
    """Each scenario three times: in ``packyard receive-pack``'s own process; handed by it to a running
    ``packyard http`` (its stdin, stdout and stderr passed over the receive socket); and handed there by the C
    client, ``packyard-receive-pack`` (what a frontend runs): git cannot tell."""
    receive_pack = native_client_or_skip() if via == "native" else RECEIVE_PACK
    seed, prepare, args, git_config, env, *more = SCENARIOS[scenario]
    hooks: dict[str, str] = more[0] if more else {}
    pair = Pair(store_root, tmp_path, pk)
    pair.configure(git_config, env)
    if seed:
        pair.seed(client, *seed)
    if prepare is not None:
        prepare(client)
    if hooks:
        pair.install_hooks(hooks, tmp_path / "hooks")
    theirs = pair.push(client, *args, ours=False)
    with contextlib.ExitStack() as stack:
        if via in ("server", "native"):
            stack.callback(pair.hand_to_server(short_dir / "receive.sock", tmp_path / "http.log").close)
        ours = pair.push(client, *args, ours=True, receive_pack=receive_pack)
    assert ours == theirs, pair.stderr
    assert pair.refs(True) == pair.refs(False)
    git("fsck", "--full", "--strict", git_dir=pair.ours)
    if hooks:   # the hooks saw the same stdin, arguments and environment, and their output reached the client
        assert pair.hook_logs(True) == pair.hook_logs(False)
        assert pair.hook_logs(False), "the hooks recorded nothing"
        said = {side: [line for line in text.splitlines() if line.startswith("remote: ")]
                for side, text in pair.stderrs.items()}
        assert said[True] == said[False], pair.stderrs    # the hooks' output and git's error lines, in order
        assert any(line.startswith("remote: policy: ") for line in said[False]), pair.stderrs


def test_a_thousand_refs(client: Path, store_root: Path, tmp_path: Path, pk) -> None:  # type: ignore[no-untyped-def]
    refs = "".join(f"create refs/heads/b{i:04d} HEAD\n" for i in range(1000))
    git("update-ref", "--stdin", cwd=client, input=refs.encode())
    pair = Pair(store_root, tmp_path, pk)
    theirs = pair.push(client, "refs/heads/*:refs/heads/*", ours=False)
    ours = pair.push(client, "refs/heads/*:refs/heads/*", ours=True)
    assert theirs[0] == 0 and ours == theirs
    assert pair.refs(True) == pair.refs(False)
    assert len(pair.refs(True).splitlines()) == 1002


def _pkt(data: bytes) -> bytes:
    return b"%04x" % (len(data) + 4) + data


def raw_exchange(cmd: list[str], request: bytes, env: dict[str, str]) -> tuple[int, bytes]:
    """Send ``request`` after reading the advertisement; return the exit status and what follows it."""
    proc = subprocess.run(cmd, input=request, env=env, capture_output=True, timeout=60)
    out = proc.stdout
    pos = 0
    while out[pos:pos + 4] != b"0000":   # skip the advertisement, up to its flush
        pos += int(out[pos:pos + 4], 16)
    return proc.returncode, out[pos + 4:]


@pytest.mark.parametrize("features", [b"report-status", b"report-status-v2 side-band-64k", b"report-status atomic"])
def test_stale_old_value_byte_parity(features: bytes, client: Path, store_root: Path, tmp_path: Path,
                                     pk) -> None:  # type: ignore[no-untyped-def]
    pair = Pair(store_root, tmp_path, pk)
    pair.seed(client, "main", "feature")
    main = git("rev-parse", "main", cwd=client).strip()
    feature = git("rev-parse", "feature", cwd=client).strip()
    zero = b"0" * 40
    request = (_pkt(feature + b" " + zero + b" refs/heads/main\0" + features + b"\n")   # stale: main is elsewhere
               + _pkt(main + b" " + zero + b" refs/heads/feature\n")                  # stale too
               + _pkt(zero + b" " + zero + b" refs/heads/missing\n")                  # deleting nothing: ok
               + b"0000")
    env = {**pk.cli_env(), **GIT_ENV}
    theirs = raw_exchange(["git", "receive-pack", str(pair.theirs)], request, env)
    ours = raw_exchange(["packyard", "receive-pack", str(pair.ours)], request, env)
    assert b"ng refs/heads/main" in theirs[1]
    assert ours == theirs
    assert pair.refs(True) == pair.refs(False)


def test_advertisement_matches_git_but_the_agent(client: Path, store_root: Path, tmp_path: Path, pk) -> None:  # type: ignore[no-untyped-def]
    pair = Pair(store_root, tmp_path, pk)
    env = {**pk.cli_env(), **GIT_ENV}

    def adverts() -> tuple[bytes, bytes]:
        theirs = subprocess.run(["git", "receive-pack", "--advertise-refs", str(pair.theirs)], env=env,
                                capture_output=True, check=True).stdout
        ours = subprocess.run(["packyard", "receive-pack", "--advertise-refs", str(pair.ours)], env=env,
                              capture_output=True, check=True).stdout
        return theirs, ours

    for seed in ((), ("main", "feature", "v1")):
        if seed:
            pair.seed(client, *seed)
        theirs, ours = adverts()
        ours_lines, theirs_lines = _payloads(ours), _payloads(theirs)
        for lines in (ours_lines, theirs_lines):   # the one difference: the agent
            head, _, agent = lines[0].rpartition(b" agent=")
            assert agent.startswith(b"packyard/" if lines is ours_lines else b"git/")
            lines[0] = head
        assert ours_lines == theirs_lines
        assert len(ours_lines) == (2 if not seed else 4)   # capabilities^{} or 3 refs, and the flush


def _payloads(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        n = int(data[pos:pos + 4], 16)
        out.append(data[pos + 4:pos + n] if n else b"")
        pos += n or 4
    return out


def test_the_push_is_a_job_row(client: Path, store_root: Path, tmp_path: Path, pk, settings) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from packyard.workers.records import Job, session_scope

    pair = Pair(store_root, tmp_path, pk)
    rc, _out = pair.push(client, "-o", "ci.skip", "main", "v1", ours=True)
    assert rc == 0
    with session_scope(settings) as s:
        jobs = [j for j in s.scalars(select(Job).where(Job.kind == "packyard.receive_pack"))
                if j.params and j.params.get("push_options") == ["ci.skip"]]
        assert len(jobs) == 1
        job = jobs[0]
        assert job.state.value == "SUCCESS"
        assert [c["ref"] for c in job.params["commands"]] == ["refs/heads/main", "refs/tags/v1"]
        assert job.counters["refs_moved"] == 2 and job.counters["refs_refused"] == 0
        assert job.counters["objects"] > 0


def test_outside_the_storage_roots(client: Path, tmp_path: Path, pk) -> None:  # type: ignore[no-untyped-def]
    outside = tmp_path / "outside.git"
    git("init", "-q", "--bare", str(outside))
    env = {**pk.cli_env(), **GIT_ENV}
    proc = subprocess.run(["git", "push", "--receive-pack", RECEIVE_PACK, str(outside), "main"], cwd=client,
                          env=env, capture_output=True, timeout=60)
    assert proc.returncode != 0
    assert b"does not appear to be a git repository" in proc.stderr
    assert b"outside the storage roots" in proc.stderr
    assert git("for-each-ref", git_dir=outside) == b""
    assert not list((outside / "objects" / "pack").iterdir())


@pytest.fixture(autouse=True)
def _need_git(redis_server, migrated_db) -> None:  # type: ignore[no-untyped-def]  # the lease and the job row
    if shutil.which("git") is None:   # pragma: no cover
        pytest.skip("git is needed")
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")
