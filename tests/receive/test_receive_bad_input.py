"""Bad input to ``packyard receive-pack``, case by case against ``git receive-pack`` on identical repositories.

Each case feeds raw bytes to both servers' stdin (a subprocess with a timeout: the bound in time; an address-space
limit: the bound in memory) and asserts git's verdict where git has one: the same exit status, git's ``fatal:``
line as the start of ours, the same report bytes after the side-band-2 messages; and afterwards no ref moved and
the objects directory listing unchanged (packyard leaves nothing; git neither, for these cases).
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gitutil import GIT_ENV, git

ZERO = b"0" * 40
TIMEOUT = 60
MEMORY = 2 << 30   # address space a server may map


def _pkt(data: bytes) -> bytes:
    return b"%04x" % (len(data) + 4) + data


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _listing(repo: Path) -> list[str]:
    return sorted(str(p.relative_to(repo)) for p in (repo / "objects").rglob("*"))


def _refs(repo: Path) -> str:
    return git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=repo).decode()


def _after_advert(out: bytes) -> bytes:
    pos = 0
    while out[pos:pos + 4] not in (b"0000", b""):
        pos += int(out[pos:pos + 4], 16)
    return out[pos + 4:]


def _bands(data: bytes) -> tuple[bytes, bytes]:
    """(band 1's bytes, band 2's text) of a side-band-64k response."""
    one, two, pos = b"", b"", 0
    while pos < len(data):
        n = int(data[pos:pos + 4], 16)
        if n == 0:
            pos += 4
            continue
        band, payload = data[pos + 4], data[pos + 5:pos + n]
        if band == 1:
            one += payload
        else:
            two += payload
        pos += n
    return one, two


@pytest.fixture
def pair(store_root: Path, tmp_path: Path, pk):  # type: ignore[no-untyped-def]
    """A client with 41 commits (a pack of > 100 objects: git's index-pack, not unpack-objects), and two identical
    bare repositories holding its first commit: ``ours`` in the storage root, ``theirs`` for git."""
    client = tmp_path / "client"
    git("init", "-q", "-b", "main", str(client))
    for i in range(41):
        (client / f"g{i}").write_text("".join(f"{k}\n" for k in range(i * 50)))
        (client / f"h{i}").write_text(f"file {i}\n")
        git("add", "-A", cwd=client)
        git("commit", "-q", "-m", f"commit {i}", cwd=client)
    ours, theirs = store_root / "bad-input.git", tmp_path / "theirs.git"
    for repo in (ours, theirs):
        git("init", "-q", "--bare", str(repo))
        git("push", "-q", str(repo), "HEAD~40:refs/heads/main", cwd=client)
    old = git("rev-parse", "HEAD~40", cwd=client).strip()
    new = git("rev-parse", "HEAD", cwd=client).strip()
    pack = git("pack-objects", "--stdout", "--revs", "-q", cwd=client, input=new + b"\n^" + old + b"\n")
    env = {**pk.cli_env(PACKYARD_RECEIVE_IDLE_TIMEOUT="2"), **GIT_ENV}
    return {"client": client, "ours": ours, "theirs": theirs, "old": old, "new": new, "pack": pack, "env": env}


def _serve(cmd: list[str], data: bytes, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, input=data, env=env, capture_output=True, timeout=TIMEOUT, preexec_fn=_limit_memory)


def _both(pair, data: bytes, *, ours_repo: str | None = None, theirs_repo: str | None = None):  # type: ignore[no-untyped-def]
    before = {side: (_listing(pair[side]), _refs(pair[side])) for side in ("ours", "theirs")}
    theirs = _serve(["git", "receive-pack", theirs_repo or str(pair["theirs"])], data, pair["env"])
    ours = _serve(["packyard", "receive-pack", ours_repo or str(pair["ours"])], data, pair["env"])
    for side in ("ours", "theirs"):   # nothing installed, no ref moved
        assert (_listing(pair[side]), _refs(pair[side])) == before[side], side
    return theirs, ours


def _fatal(proc: subprocess.CompletedProcess) -> str:
    return next(line for line in proc.stderr.decode().splitlines() if line.startswith("fatal: "))


def _command(pair, features: bytes = b"report-status side-band-64k") -> bytes:  # type: ignore[no-untyped-def]
    return _pkt(pair["old"] + b" " + pair["new"] + b" refs/heads/main\0" + features + b"\n") + b"0000"


FRAMING = {
    "a truncated pkt-line (100 bytes said, 10 sent)": b"0064" + b"0123456789",
    "an oversized pkt length": b"ffff" + b"x" * 100,
    "a pkt length that is not hex": b"zzzz0000",
    "a pkt length below 4": b"0003",
    "a malformed command line": _pkt(b"hello world\n") + b"0000",
    "a command with a short new id": _pkt(ZERO + b" " + ZERO[:39] + b" refs/heads/x\n") + b"0000",
}


@pytest.mark.parametrize("case", list(FRAMING))
def test_bad_framing_is_gits_fatal(case: str, pair) -> None:  # type: ignore[no-untyped-def]
    theirs, ours = _both(pair, FRAMING[case])
    assert theirs.returncode == 128
    assert ours.returncode == theirs.returncode, ours.stderr
    assert _fatal(ours).startswith(_fatal(theirs)), (ours.stderr, theirs.stderr)


@pytest.mark.parametrize("case", ["stops mid-object", "a bad trailer checksum"])
def test_bad_pack_is_unpack_error(case: str, pair) -> None:  # type: ignore[no-untyped-def]
    pack = pair["pack"]
    bad = pack[:len(pack) // 2] if case == "stops mid-object" else pack[:-1] + bytes([pack[-1] ^ 1])
    theirs, ours = _both(pair, _command(pair) + bad)
    assert theirs.returncode == ours.returncode == 0
    (t1, t2), (o1, o2) = _bands(_after_advert(theirs.stdout)), _bands(_after_advert(ours.stdout))
    assert t1 == o1   # the report, byte for byte
    assert b"unpack index-pack abnormal exit" in o1 and b"ng refs/heads/main unpacker error" in o1
    assert t2.startswith(b"fatal: ") and o2.startswith(b"fatal: PackFormatError: ")


def test_a_good_pack_goes_in(pair) -> None:  # type: ignore[no-untyped-def]
    """The control for the cases above: the same bytes, whole, are accepted by both."""
    data = _command(pair) + pair["pack"]
    for cmd in (["git", "receive-pack", str(pair["theirs"])], ["packyard", "receive-pack", str(pair["ours"])]):
        proc = _serve(cmd, data, pair["env"])
        assert proc.returncode == 0
        assert b"ok refs/heads/main" in _bands(_after_advert(proc.stdout))[0]
    assert _refs(pair["ours"]) == _refs(pair["theirs"])
    git("fsck", "--full", "--strict", git_dir=pair["ours"])


def test_100000_commands(pair) -> None:  # type: ignore[no-untyped-def]
    """git reads them all (here: deletes of refs that do not exist, each a warning, exit 0); packyard refuses more
    than receive_max_commands (10,000 by default) with a ``fatal:`` before reading the rest."""
    data = b"".join(_pkt(ZERO + b" " + ZERO + b" refs/heads/x%d\n" % i) for i in range(100_000)) + b"0000"
    theirs, ours = _both(pair, data)
    assert theirs.returncode == 0 and theirs.stderr.count(b"warning: deleting a non-existent ref") == 100_000
    assert ours.returncode == 128
    assert _fatal(ours).startswith("fatal: more than 10000 commands in one push")


@pytest.mark.parametrize("where", ["inside a pkt-line", "inside the pack"])
def test_a_silent_client_is_cut_off(where: str, pair) -> None:  # type: ignore[no-untyped-def]
    """git has no idle limit (it waits for as long as the client keeps its end open); packyard gives up after
    receive_idle_timeout (2 s here) with a ``fatal:`` (in the commands) or an unpack error (in the pack)."""
    data = b"0064abc" if where == "inside a pkt-line" else _command(pair) + pair["pack"][:1000]
    before = (_listing(pair["ours"]), _refs(pair["ours"]))
    proc = subprocess.Popen(["packyard", "receive-pack", str(pair["ours"])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=pair["env"], preexec_fn=_limit_memory)
    assert proc.stdin is not None
    proc.stdin.write(data)
    proc.stdin.flush()          # ... and then nothing, the pipe left open
    t0 = time.monotonic()
    try:
        proc.wait(timeout=TIMEOUT)   # (not communicate: it would close the client's end; the output is small)
    finally:
        if proc.poll() is None:   # pragma: no cover - a failing run
            proc.kill()
        proc.stdin.close()
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert time.monotonic() - t0 < TIMEOUT
    assert b"the client sent nothing for 2 s" in out + err
    if where == "inside a pkt-line":
        assert proc.returncode == 128
    else:
        assert proc.returncode == 0
        assert b"unpack index-pack abnormal exit" in _bands(_after_advert(out))[0]
    assert (_listing(pair["ours"]), _refs(pair["ours"])) == before


def test_outside_the_storage_roots(pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """git's words for a repository it cannot serve (here: none at that path); packyard's for one outside every
    storage root, though a repository is there."""
    outside = tmp_path / "outside.git"
    git("init", "-q", "--bare", str(outside))
    listing = _listing(outside)
    theirs, ours = _both(pair, _command(pair) + pair["pack"], ours_repo=str(outside),
                         theirs_repo=str(tmp_path / "nowhere.git"))
    assert theirs.returncode == ours.returncode == 128
    assert _fatal(theirs).startswith("fatal: '") and "does not appear to be a git repository" in _fatal(theirs)
    assert "does not appear to be a git repository" in _fatal(ours) and "outside the storage roots" in _fatal(ours)
    assert ours.stdout == b""   # nothing advertised: nothing read
    assert _listing(outside) == listing and _refs(outside) == ""


def test_shallow_lines(pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A push from a shallow clone (a real ``git push``, which sends ``shallow`` lines): git refuses it
    (receive.shallowUpdate is off by default), and so does packyard, with the same porcelain output."""
    shallow = tmp_path / "shallow"
    git("clone", "-q", "--depth", "1", f"file://{pair['client']}", str(shallow))
    (shallow / "new.txt").write_text("on a shallow clone\n")
    git("add", "-A", cwd=shallow)
    git("commit", "-q", "-m", "shallow", cwd=shallow)
    results = []
    for repo, extra in ((pair["theirs"], []), (pair["ours"], ["--receive-pack", "packyard receive-pack"])):
        before = (_listing(repo), _refs(repo))
        proc = subprocess.run(["git", "push", "--porcelain", *extra, str(repo), "HEAD:refs/heads/other"],
                              cwd=shallow, env=pair["env"], capture_output=True, timeout=TIMEOUT)
        results.append((proc.returncode, proc.stdout.decode().replace(str(repo), "<repo>")))
        assert _refs(repo) == before[1]
        if repo == pair["ours"]:
            assert _listing(repo) == before[0]
    assert results[0] == results[1]
    assert results[0][0] != 0 and "shallow update not allowed" in results[0][1]


@pytest.fixture(autouse=True)
def _need_git(redis_server, migrated_db) -> None:  # type: ignore[no-untyped-def]  # the lease and the job row
    if shutil.which("git") is None:   # pragma: no cover
        pytest.skip("git is needed")
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")
