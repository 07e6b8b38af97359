"""Policy hooks of ``packyard receive-pack`` (workers/receive/hooks.py) against ``git receive-pack`` with
``core.hooksPath`` naming the same scripts: the quarantine a pre-receive reads, the output's way to the client
with and without side band (byte for byte), a hook that does not read its stdin; and packyard's own: the time
limit (the process group killed, the push refused, the job row naming it), a hook that cannot run, the settings.
The parity table's hook rows (refusals, recorded stdin/arguments/environment) are in test_push_parity.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_push_parity import Pair, _pkt, client  # noqa: F401 - the fixture

from gitutil import GIT_ENV, git

# Reads every pushed commit through the hook's environment, and proves it is not installed yet: without the
# quarantine variables git does not find it.
PRE_RECEIVE_READS_QUARANTINE = """#!/bin/sh
set -e
while read old new ref; do
  git cat-file -e "$new"
  git rev-list --objects "$new" > /dev/null
  echo "policy: $ref: $(git rev-list --count "$new") commits, $(git cat-file -t "$new")" >&2
  if env -u GIT_QUARANTINE_PATH -u GIT_OBJECT_DIRECTORY -u GIT_ALTERNATE_OBJECT_DIRECTORIES \\
       git cat-file -e "$new" 2>/dev/null; then
    echo "policy: $new is installed already" >&2
    exit 1
  fi
done
"""

# Leaves at once, not reading its stdin (git ignores SIGPIPE there: not a failure).
PRE_RECEIVE_IGNORES_STDIN = """#!/bin/sh
echo "policy: did not read"
exit 0
"""


@pytest.fixture(autouse=True)
def _need_git(redis_server, migrated_db) -> None:  # type: ignore[no-untyped-def]  # the lease and the job row
    if shutil.which("git") is None:   # pragma: no cover
        pytest.skip("git is needed")
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")


def _remote_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("remote: ")]


def test_pre_receive_reads_the_new_objects_in_the_quarantine(client: Path, store_root: Path, tmp_path: Path,  # noqa: F811
                                                              pk) -> None:  # type: ignore[no-untyped-def]
    pair = Pair(store_root, tmp_path, pk)
    pair.seed(client, "HEAD~2:refs/heads/main")
    pair.install_hooks({"pre-receive": PRE_RECEIVE_READS_QUARANTINE}, tmp_path / "hooks")
    theirs = pair.push(client, "main", "v1", ours=False)
    ours = pair.push(client, "main", "v1", ours=True)
    assert theirs[0] == 0 and ours == theirs, pair.stderrs
    assert pair.refs(True) == pair.refs(False)
    said = {side: _remote_lines(text) for side, text in pair.stderrs.items()}
    assert said[True] == said[False]
    assert [line.split()[2:] for line in said[True]] == [["refs/heads/main:", "3", "commits,", "commit"],
                                                         ["refs/tags/v1:", "3", "commits,", "tag"]], said
    assert not list((pair.ours / "objects").glob("incoming-*")), "the quarantine was left behind"
    git("fsck", "--full", "--strict", git_dir=pair.ours)


def test_pre_receive_reads_through_the_pool_of_a_fork(client: Path, store_root: Path, tmp_path: Path,  # noqa: F811
                                                      pk) -> None:  # type: ignore[no-untyped-def]
    """A fork whose history is in its pool (objects/info/alternates): the hook's git finds the old objects
    through the alternates and the new ones in the quarantine; the thin pack's bases come from the pool."""
    pair = Pair(store_root, tmp_path, pk)
    old = git("rev-parse", "HEAD~1", cwd=client).decode().strip()
    for repo, pool in ((pair.ours, store_root / "pool.git"), (pair.theirs, tmp_path / "pool.git")):
        git("init", "-q", "--bare", str(pool))
        git("push", "-q", str(pool), "HEAD~1:refs/heads/main", cwd=client)
        (repo / "objects" / "info" / "alternates").write_text(f"{pool / 'objects'}\n")
        git("update-ref", "refs/heads/main", old, git_dir=repo)
    pair.install_hooks({"pre-receive": PRE_RECEIVE_READS_QUARANTINE}, tmp_path / "hooks")
    theirs = pair.push(client, "--thin", "main", ours=False)
    ours = pair.push(client, "--thin", "main", ours=True)
    assert theirs[0] == 0 and ours == theirs, pair.stderrs
    said = {side: _remote_lines(text) for side, text in pair.stderrs.items()}
    assert said[True] == said[False]
    assert len(said[True]) == 1 and said[True][0].startswith("remote: policy: refs/heads/main: 3 commits, commit")
    assert pair.refs(True) == pair.refs(False)
    git("fsck", "--full", "--strict", git_dir=pair.ours)


def test_a_hook_that_does_not_read_its_stdin_is_not_a_failure(client: Path, store_root: Path, tmp_path: Path,  # noqa: F811
                                                              pk) -> None:  # type: ignore[no-untyped-def]
    # 1,000 lines (~100 KB) do not fit in a pipe: feeding them meets EPIPE once the hook is gone.
    refs = "".join(f"create refs/heads/b{i:04d} HEAD\n" for i in range(1000))
    git("update-ref", "--stdin", cwd=client, input=refs.encode())
    pair = Pair(store_root, tmp_path, pk)
    pair.install_hooks({"pre-receive": PRE_RECEIVE_IGNORES_STDIN}, tmp_path / "hooks")
    theirs = pair.push(client, "refs/heads/*:refs/heads/*", ours=False)
    ours = pair.push(client, "refs/heads/*:refs/heads/*", ours=True)
    assert theirs[0] == 0 and ours == theirs, pair.stderrs
    assert pair.refs(True) == pair.refs(False)
    assert "remote: policy: did not read" in pair.stderrs[True]


def _exchange(cmd: list[str], request: bytes, env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """Exit status, what follows the advertisement on stdout, and stderr."""
    proc = subprocess.run(cmd, input=request, env=env, capture_output=True, timeout=60)
    out, pos = proc.stdout, 0
    while out[pos:pos + 4] != b"0000":
        pos += int(out[pos:pos + 4], 16)
    return proc.returncode, out[pos + 4:], proc.stderr


HOOKS_THAT_TALK = {
    "pre-receive refuses": {"pre-receive": '#!/bin/sh\necho "policy: refused by pre-receive"\nexit 1\n'},
    "update refuses": {"update": '#!/bin/sh\necho "policy: refused $1" >&2\nexit 1\n'},
    "post-receive after the report": {"post-receive": '#!/bin/sh\necho "policy: post-receive $(cat)"\n'},
}


@pytest.mark.parametrize("features", [b"report-status", b"report-status side-band-64k",
                                      b"report-status-v2 side-band-64k quiet"])
@pytest.mark.parametrize("hooks", list(HOOKS_THAT_TALK))
def test_hook_output_byte_parity(hooks: str, features: bytes, client: Path, store_root: Path, tmp_path: Path,  # noqa: F811
                                 pk) -> None:  # type: ignore[no-untyped-def]
    """A delete (no pack): the hook's output on side band 2 where git puts it (before the report for
    pre-receive and update, after it and before the flush for post-receive), or on stderr without side band."""
    pair = Pair(store_root, tmp_path, pk)
    pair.seed(client, "main", "feature")
    pair.install_hooks(HOOKS_THAT_TALK[hooks], tmp_path / "hooks")
    feature = git("rev-parse", "feature", cwd=client).strip()
    request = _pkt(feature + b" " + b"0" * 40 + b" refs/heads/feature\0" + features + b"\n") + b"0000"
    env = {**pk.cli_env(**pair.env), **GIT_ENV}
    theirs = _exchange(["git", "receive-pack", str(pair.theirs)], request, env)
    ours = _exchange(["packyard", "receive-pack", str(pair.ours)], request, env)
    assert b"policy: " in (theirs[1] if b"side-band" in features else theirs[2])
    assert ours[:2] == theirs[:2]
    logs = [line for line in ours[2].splitlines(keepends=True) if line.startswith(b'{"')]   # packyard's JSON logs
    assert b"".join(line for line in ours[2].splitlines(keepends=True) if line not in logs) == theirs[2]
    assert pair.refs(True) == pair.refs(False)


def test_keepalives_while_a_hook_is_silent(client: Path, store_root: Path, tmp_path: Path, pk) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """git's copy_to_sideband: ``0005\\1`` after each receive.keepAlive seconds without output; packyard's
    bytes are git's once they are taken out (git's 5 s never pass here)."""
    pair = Pair(store_root, tmp_path, pk)
    pair.seed(client, "main", "feature")
    pair.install_hooks({"pre-receive": '#!/bin/sh\nsleep 1\necho "policy: awake"\n'}, tmp_path / "hooks")
    pair.env["PACKYARD_RECEIVE_KEEPALIVE"] = "0.2"
    feature = git("rev-parse", "feature", cwd=client).strip()
    request = (_pkt(feature + b" " + b"0" * 40 + b" refs/heads/feature\0report-status side-band-64k\n")
               + b"0000")
    env = {**pk.cli_env(**pair.env), **GIT_ENV}
    theirs = _exchange(["git", "receive-pack", str(pair.theirs)], request, env)
    ours = _exchange(["packyard", "receive-pack", str(pair.ours)], request, env)
    assert theirs[1].count(b"0005\x01") == 0
    assert ours[1].count(b"0005\x01") >= 3
    assert ours[1].index(b"0005\x01") < ours[1].index(b"policy: awake")
    assert (ours[0], ours[1].replace(b"0005\x01", b"")) == theirs[:2]
    assert pair.refs(True) == pair.refs(False)


def _group_alive(pgid: int) -> list[str]:
    """Processes of the group that are not zombies (a zombie has exited; only its parent's wait is left)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(text)
    return alive


# hook -> (porcelain line for main, exit status, whether the pack is in and main moved): the update hook runs
# after the install, as git's does after migrating the objects; the post-receive after the refs moved.
TIMED_OUT = {
    "pre-receive": ("!\trefs/heads/main:refs/heads/main\t[remote rejected] (pre-receive hook declined)", 1, False),
    "update": ("!\trefs/heads/main:refs/heads/main\t[remote rejected] (hook declined)", 1, False),
    "post-receive": (" \trefs/heads/main:refs/heads/main\t", 0, True),
}


@pytest.mark.parametrize("hook", list(TIMED_OUT))
def test_a_hook_past_the_time_limit_is_killed_with_its_process_group(hook: str, client: Path,  # noqa: F811
                                                                     store_root: Path, tmp_path: Path, pk,
                                                                     settings) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from packyard.workers.records import Job, session_scope

    line, status, moved = TIMED_OUT[hook]
    hangs = ('#!/bin/sh\necho $$ > "$PWD/hook.pid"\necho "policy: thinking"\n'
             "sleep 300 &\nsleep 300\n")
    pair = Pair(store_root, tmp_path, pk)
    pair.seed(client, "HEAD~1:refs/heads/main")
    pair.install_hooks({hook: hangs}, tmp_path / "hooks")
    pair.env["PACKYARD_RECEIVE_HOOK_TIMEOUT"] = "1.5"
    before = pair.refs(True)
    packs = sorted((pair.ours / "objects" / "pack").iterdir())
    started = time.monotonic()
    rc, out = pair.push(client, "main", ours=True)
    assert time.monotonic() - started < 30, "the push waited for the hook"
    assert rc == status
    assert out.startswith(f"To <repo>\n{line}") and out.endswith("\nDone\n") and out.count("\n") == 3, out
    assert "remote: policy: thinking" in pair.stderrs[True]
    assert f"remote: error: {hook} hook " in pair.stderrs[True] and " timed out after " in pair.stderrs[True]
    assert (pair.refs(True) != before) == moved
    assert (sorted((pair.ours / "objects" / "pack").iterdir()) != packs) == (hook != "pre-receive")
    assert not list((pair.ours / "objects").glob("incoming-*")), "the quarantine was left behind"
    pgid = int((pair.ours / "hook.pid").read_text())
    assert not _group_alive(pgid), "the hook's process group outlived the push"
    with session_scope(settings) as s:
        jobs = [j for j in s.scalars(select(Job).where(Job.kind == "packyard.receive_pack"))
                if j.params and j.params.get("repo") == str(pair.ours)]
    assert len(jobs) == 1
    assert jobs[0].counters["hooks_timed_out"] == 1 and jobs[0].counters["refs_refused"] == int(not moved)
    assert f"{hook} hook" in jobs[0].counters["hook_timeout"] and "timed out" in jobs[0].counters["hook_timeout"]
    git("fsck", "--full", "--strict", git_dir=pair.ours)


def test_a_hook_that_cannot_run_refuses(client: Path, store_root: Path, tmp_path: Path, pk) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A policy hook the settings name must run: one missing or not executable refuses (git would skip a
    hook file that is not there; a server's policy that silently passes would be worse)."""
    pair = Pair(store_root, tmp_path, pk)
    not_executable = tmp_path / "update"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    for env in ({"PACKYARD_RECEIVE_PRE_RECEIVE_HOOK": str(tmp_path / "missing")},
                {"PACKYARD_RECEIVE_UPDATE_HOOK": str(not_executable)}):
        pair.env = env
        rc, out = pair.push(client, "main", ours=True)
        assert rc == 1 and "[remote rejected]" in out and "declined" in out, (out, pair.stderrs)
        assert "remote: error: " in pair.stderrs[True] and "cannot run" in pair.stderrs[True]
    assert pair.refs(True) == ""


def test_hook_settings(tmp_path: Path) -> None:
    from packyard.workers.settings import Settings, SettingsError

    base = {"PACKYARD_STATE_DIR": str(tmp_path), "PACKYARD_REDIS_URL": "redis://cache:6379/2"}
    s = Settings.from_env({**base, "PACKYARD_RECEIVE_PRE_RECEIVE_HOOK": "/srv/hooks/pre-receive",
                           "PACKYARD_RECEIVE_POST_RECEIVE_HOOK": "/srv/hooks/post-receive",
                           "PACKYARD_RECEIVE_HOOK_TIMEOUT": "2.5"})
    assert s.receive_pre_receive_hook == Path("/srv/hooks/pre-receive") and s.receive_update_hook is None
    assert s.receive_hook_timeout == 2.5
    assert Settings.from_env(s.as_env()) == s
    assert Settings.from_env(base).receive_hook_timeout == 60.0
    with pytest.raises(SettingsError, match="PACKYARD_RECEIVE_UPDATE_HOOK must be an absolute path"):
        Settings.from_env({**base, "PACKYARD_RECEIVE_UPDATE_HOOK": "hooks/update"})
    with pytest.raises(SettingsError, match="PACKYARD_RECEIVE_KEEPALIVE"):
        Settings.from_env({**base, "PACKYARD_RECEIVE_KEEPALIVE": "-1"})
    with pytest.raises(SettingsError, match="PACKYARD_RECEIVE_HOOK_TIMEOUT"):
        Settings.from_env({**base, "PACKYARD_RECEIVE_HOOK_TIMEOUT": "0"})


def test_hooks_over_smart_http_match_http_backend(client: Path, store_root: Path, tmp_path: Path, pk,  # noqa: F811
                                                  settings) -> None:  # type: ignore[no-untyped-def]
    """The same hooks behind ``packyard http`` and behind ``git http-backend``: the same porcelain output, refs,
    and ``remote:`` lines (the quarantine read by the pre-receive, the update refusal, the post-receive's line)."""
    from httputil import PackyardHttp, Served, cgi_bridge
    from test_http import _rel
    from test_push_parity import RECORD_POST_RECEIVE, UPDATE_REFUSES_NEW

    ours_repo, theirs_root = store_root / "hooked.git", tmp_path / "cgi"
    theirs_repo = theirs_root / "hooked.git"
    scripts = {"pre-receive": PRE_RECEIVE_READS_QUARANTINE, "update": UPDATE_REFUSES_NEW,
               "post-receive": RECORD_POST_RECEIVE}
    hooks_dir = tmp_path / "hooks"
    hooks_dir.mkdir()
    hook_env = {}
    for name, body in scripts.items():
        (hooks_dir / name).write_text(body)
        (hooks_dir / name).chmod(0o755)
        hook_env[f"PACKYARD_RECEIVE_{name.upper().replace('-', '_')}_HOOK"] = str(hooks_dir / name)
    for repo in (ours_repo, theirs_repo):
        git("init", "-q", "--bare", str(repo))
        git("push", "-q", str(repo), "HEAD~1:refs/heads/main", cwd=client)
    git("config", "core.hooksPath", str(hooks_dir), git_dir=theirs_repo)
    env = {**pk.cli_env(**hook_env), **GIT_ENV}
    ours = PackyardHttp(env, tmp_path / "http.log")
    theirs = Served(cgi_bridge(theirs_root, GIT_ENV))
    try:
        results = {}
        for side, url in (("ours", f"{ours.url}/{_rel(store_root, settings)}/hooked.git"),
                          ("theirs", f"{theirs.url}/hooked.git")):
            proc = subprocess.run(["git", "push", "--porcelain", url, "main", "HEAD:refs/heads/new"], cwd=client,
                                  env=env, capture_output=True, timeout=120)
            results[side] = (proc.returncode, proc.stdout.decode().replace(url, "<url>"),
                             _remote_lines(proc.stderr.decode()))
        assert results["ours"] == results["theirs"]
        rc, out, said = results["ours"]
        assert rc == 1 and "(hook declined)" in out
        assert said[0].startswith("remote: policy: refs/heads/main: 3 commits") and len(said) >= 4, said
        refs = [git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=r) for r in (ours_repo, theirs_repo)]
        assert refs[0] == refs[1]
        assert (ours_repo / "hook-post-receive.log").read_text() == (theirs_repo / "hook-post-receive.log").read_text()
    finally:
        ours.close()
        theirs.close()
