"""Smart HTTP and the upload side with real git clients: ``git push``/``git clone`` over http:// against
``packyard http`` (a real server process), compared with git's own ``git http-backend`` (as CGI behind a
WSGI bridge), and ``packyard upload-pack`` over stdio."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from httputil import PackyardHttp, Served, cgi_bridge
from test_push_parity import _rewind, client  # noqa: F401 - the fixture

from gitutil import GIT_ENV, git

UPLOAD_PACK = "packyard upload-pack"


def _rel(store_root: Path, settings) -> str:  # type: ignore[no-untyped-def]
    for name, root in settings.storage_roots:
        if Path(os.path.realpath(root)) in Path(os.path.realpath(store_root)).parents:
            return f"{name}/{Path(os.path.realpath(store_root)).relative_to(os.path.realpath(root))}"
    raise AssertionError("store_root outside the storage roots")


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, timeout=120)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_push_over_http_matches_http_backend(client: Path, store_root: Path, tmp_path: Path, pk,  # noqa: F811
                                             settings) -> None:  # type: ignore[no-untyped-def]
    ours_repo, theirs_root = store_root / "ours.git", tmp_path / "cgi"
    theirs_repo = theirs_root / "ours.git"
    for repo in (ours_repo, theirs_repo):
        git("init", "-q", "--bare", str(repo))
    git("config", "receive.denyNonFastForwards", "true", git_dir=theirs_repo)
    env = {**pk.cli_env(PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS="1"), **GIT_ENV}
    ours = PackyardHttp(env, tmp_path / "http.log")
    theirs = Served(cgi_bridge(theirs_root, GIT_ENV))
    try:
        urls = {"ours": f"{ours.url}/{_rel(store_root, settings)}/ours.git", "theirs": f"{theirs.url}/ours.git"}

        def push(*args: str) -> dict[str, tuple[int, str]]:
            out = {}
            for side, url in urls.items():
                rc, stdout, stderr = _run(["git", "push", "--porcelain", "-vv", url, *args], client, env)
                out[side] = (rc, stdout.replace(url, "<url>"))
                out[side + "-stderr"] = (0, stderr)
            return out

        first = push("HEAD~2:refs/heads/main", "feature")            # create
        assert first["ours"] == first["theirs"] and first["ours"][0] == 0, first["ours-stderr"]
        assert "POST git-receive-pack (" in first["ours-stderr"][1]   # git 2.39 sends push bodies unzipped
        ff = push("main")                                             # fast-forward
        assert ff["ours"] == ff["theirs"] and ff["ours"][0] == 0
        _rewind(client)
        refused = push("main")                                        # non-fast-forward, refused by the client
        assert refused["ours"] == refused["theirs"] and refused["ours"][0] == 1
        denied = push("--force", "main")                              # denied by the server
        assert denied["ours"] == denied["theirs"] and "[remote rejected]" in denied["ours"][1]
        (client / "big.bin").write_bytes(os.urandom(1_500_000))       # > http.postBuffer (1 MiB): chunked
        git("add", "big.bin", cwd=client)
        git("commit", "-q", "-m", "big", cwd=client)
        big = push("HEAD:refs/heads/big")
        assert big["ours"] == big["theirs"] and big["ours"][0] == 0
        assert "(chunked)" in big["ours-stderr"][1]
        refs = [git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=r) for r in (ours_repo, theirs_repo)]
        assert refs[0] == refs[1]
        git("fsck", "--full", "--strict", git_dir=ours_repo)
        clone = tmp_path / "clone"                                    # and back through upload-pack
        rc, _o, err = _run(["git", "clone", "--bare", "-q", urls["ours"], str(clone)], tmp_path, env)
        assert rc == 0, err
        git("fsck", "--full", git_dir=clone)
        assert git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=clone) == refs[0]
    finally:
        ours.close()
        theirs.close()


def test_hidden_refs_and_outside_the_roots_over_http(client: Path, store_root: Path, tmp_path: Path, pk,  # noqa: F811
                                                     settings) -> None:  # type: ignore[no-untyped-def]
    import urllib.error
    import urllib.request

    repo = store_root / "hide.git"
    git("init", "-q", "--bare", str(repo))
    git("push", "-q", str(repo), "main", "HEAD:refs/keep-around/x", cwd=client)
    outside = tmp_path / "outside.git"
    git("init", "-q", "--bare", str(outside))
    git("push", "-q", str(outside), "main:refs/heads/secret", cwd=client)
    (store_root / "link.git").symlink_to(outside)
    env = {**pk.cli_env(PACKYARD_RECEIVE_HIDE_REFS="refs/keep-around"), **GIT_ENV}
    server = PackyardHttp(env, tmp_path / "http.log")
    try:
        base = f"{server.url}/{_rel(store_root, settings)}"
        rc, out, err = _run(["git", "ls-remote", f"{base}/hide.git"], tmp_path, env)
        assert rc == 0 and "refs/heads/main" in out and "keep-around" not in out, err
        with urllib.request.urlopen(f"{base}/hide.git/info/refs?service=git-receive-pack") as resp:
            body = resp.read()
            assert resp.headers["Content-Type"] == "application/x-git-receive-pack-advertisement"
            assert resp.headers["Cache-Control"] == "no-cache, max-age=0, must-revalidate"
        assert body.startswith(b"001f# service=git-receive-pack\n0000") and b"refs/heads/main" in body
        assert b"keep-around" not in body
        for path in (f"{base}/link.git", f"{base}/../../../{outside}", f"{base}/missing.git"):
            for service in ("git-upload-pack", "git-receive-pack"):
                with pytest.raises(urllib.error.HTTPError) as info:
                    urllib.request.urlopen(f"{path}/info/refs?service={service}")
                assert info.value.code == 404
        rc, _o, err = _run(["git", "push", f"{base}/link.git", "main:refs/heads/pushed"], client, env)
        assert rc != 0 and "not found" in err
        assert git("for-each-ref", "--format=%(refname)", git_dir=outside) == b"refs/heads/secret\n"
    finally:
        server.close()


def test_upload_pack_over_stdio(client: Path, store_root: Path, tmp_path: Path, pk) -> None:  # noqa: F811  # type: ignore[no-untyped-def]
    repo = store_root / "serve.git"
    git("init", "-q", "--bare", str(repo))
    git("push", "-q", str(repo), "main", "v1", "HEAD:refs/keep-around/x", cwd=client)
    env = {**pk.cli_env(PACKYARD_RECEIVE_HIDE_REFS="refs/keep-around"), **GIT_ENV}
    clone = tmp_path / "clone.git"
    rc, _o, err = _run(["git", "clone", "--bare", "--no-local", "-q", "--upload-pack", UPLOAD_PACK, str(repo),
                        str(clone)], tmp_path, env)
    assert rc == 0, err
    git("fsck", "--full", "--strict", git_dir=clone)
    rc, out, err = _run(["git", "ls-remote", "--upload-pack", UPLOAD_PACK, str(repo)], tmp_path, env)
    assert rc == 0 and "refs/tags/v1" in out and "keep-around" not in out, err
    partial = tmp_path / "partial"          # uploadpack.allowFilter: git's own default would ignore the filter
    rc, _o, err = _run(["git", "clone", "--no-local", "--no-checkout", "-q", "--filter=blob:none", "--upload-pack",
                        UPLOAD_PACK, str(repo), str(partial)], tmp_path, env)
    assert rc == 0, err
    missing = git("rev-list", "--objects", "--missing=print", "--all", cwd=partial).decode().splitlines()
    assert any(line.startswith("?") for line in missing)
    git("commit", "-q", "--allow-empty", "-m", "more", cwd=client)
    git("push", "-q", str(repo), "main", cwd=client)
    rc, _o, err = _run(["git", "fetch", "-q", "--upload-pack", UPLOAD_PACK, str(repo), "main:refs/heads/main"],
                       tmp_path, {**env, "GIT_DIR": str(clone)})
    assert rc == 0, err
    assert git("rev-parse", "main", git_dir=clone) == git("rev-parse", "main", cwd=client)
    outside = tmp_path / "outside.git"
    git("init", "-q", "--bare", str(outside))
    rc, _o, err = _run(["git", "ls-remote", "--upload-pack", UPLOAD_PACK, str(outside)], tmp_path, env)
    assert rc != 0 and "does not appear to be a git repository" in err and "outside the storage roots" in err


@pytest.fixture(autouse=True)
def _need_git(redis_server, migrated_db) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("git") is None:   # pragma: no cover
        pytest.skip("git is needed")
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")


def test_gzipped_fetch_request(client: Path, store_root: Path, tmp_path: Path, pk, settings) -> None:  # noqa: F811  # type: ignore[no-untyped-def]
    """git gzips a fetch request over 1 KiB: 40 branches at 40 commits make one."""
    repo = store_root / "many.git"
    git("init", "-q", "--bare", str(repo))
    for i in range(40):
        git("commit", "-q", "--allow-empty", "-m", f"c{i}", cwd=client)
        git("branch", f"b{i:02d}", cwd=client)
    git("push", "-q", str(repo), "refs/heads/*:refs/heads/*", cwd=client)
    env = {**pk.cli_env(), **GIT_ENV}
    server = PackyardHttp(env, tmp_path / "http.log")
    try:
        clone = tmp_path / "clone.git"
        rc, _o, err = _run(["git", "clone", "--bare", f"{server.url}/{_rel(store_root, settings)}/many.git",
                            str(clone)], tmp_path, {**env, "GIT_TRACE_CURL": "1", "GIT_TRACE_CURL_NO_DATA": "1"})
        assert rc == 0, err[-3000:]
        assert "Content-Encoding: gzip" in err
        git("fsck", "--full", git_dir=clone)
        assert git("for-each-ref", git_dir=clone) == git("for-each-ref", git_dir=repo)
    finally:
        server.close()
