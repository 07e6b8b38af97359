"""packyard demo: the main job on embedded defaults, end to end, with real worker processes."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from workers.cli import common

ROOT = Path(__file__).resolve().parents[2]


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "demo", help="run the whole service once: Redis, 2 workers, sample repositories, jobs, status",
        description="Start the embedded Redis, migrate, start 2 real Celery worker processes, build sample "
                    "repositories (from the corpus pack when present, else with git), queue verify_repo jobs "
                    "(one on a deliberately corrupted copy, so a failed job shows), wait, print the status "
                    "table, stop everything. State lives in PACKYARD_STATE_DIR (default ./.state).")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the jobs (default 300)")
    p.set_defaults(func=run)


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def corpus_dir() -> Path:
    return Path(os.environ.get("PACKYARD_CORPUS") or ROOT.parent / "shared" / "corpus")


def git(*args: str, cwd: Path | None = None, git_dir: Path | None = None, input: bytes | None = None) -> bytes:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "packyard demo",
           "GIT_AUTHOR_EMAIL": "demo@packyard.invalid", "GIT_COMMITTER_NAME": "packyard demo",
           "GIT_COMMITTER_EMAIL": "demo@packyard.invalid"}
    cmd = ["git"] + (["--git-dir", str(git_dir)] if git_dir else []) + list(args)
    return subprocess.run(cmd, cwd=cwd, input=input, env=env, check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE).stdout


def build_from_corpus(dest: Path, pack: Path) -> Path:
    from workers.cli.bench.common import repo_from_pack

    return repo_from_pack(dest, pack, pack.with_suffix(".refs"))


def build_with_git(dest: Path, commits: int = 5) -> Path:
    """A small bare repository made by git, with loose objects."""
    work = dest.with_name(dest.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    git("init", "-q", "-b", "main", str(work))
    for c in range(commits):
        for f in range(4):
            (work / f"file{f}.txt").write_text(f"revision {c} of file {f}\n" * (f + 1))
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"revision {c}", cwd=work)
    git("clone", "-q", "--bare", "--no-local", str(work), str(dest))
    packs = list((dest / "objects" / "pack").glob("*.pack"))
    for pack in packs:  # explode into loose objects, so the sample has both kinds across repos
        data = pack.read_bytes()
        pack.rename(pack.with_suffix(".pack.tmp"))
        git("unpack-objects", "-q", cwd=dest, input=data)
    for p in (dest / "objects" / "pack").glob("pack-*"):
        p.unlink()
    shutil.rmtree(work)
    return dest


def corrupt_copy(src: Path, dest: Path) -> str:
    """Copy ``src`` and damage one object in the copy; return what was damaged."""
    shutil.copytree(src, dest)
    loose = sorted(p for p in (dest / "objects").glob("[0-9a-f][0-9a-f]/*") if p.is_file())
    if loose:
        victim = loose[len(loose) // 2]
        victim.chmod(0o644)
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 2])  # truncated zlib stream
        return f"truncated loose object {victim.parent.name}{victim.name}"
    pack = next((dest / "objects" / "pack").glob("*.pack"))
    pack.chmod(0o644)
    with open(pack, "r+b") as f:
        f.seek(pack.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    return f"flipped one byte in the middle of {pack.name}"


def run(args: argparse.Namespace) -> int:
    from workers.records import upgrade_database

    s = common.settings()
    say(f"state dir {s.state_dir}")
    server = common.prepare_embedded(s, migrate=False)
    if server is not None:
        say(f"redis {'reused' if server.reused else 'started'} on {server.socket} "
            f"({'pid ' + str(server.process.pid) if server.process else 'already running'})")
    else:
        say(f"redis {s.redis_py_url} (external)")
    upgrade_database(s)
    say(f"database migrated: {s.database_url}")

    logs = s.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = common.child_env(s, {"PACKYARD_LOG_FORMAT": "json"})
    workers: list[common.Child] = []
    log_files = []
    try:
        for i in (1, 2):
            log = open(logs / f"worker-{i}.log", "ab")
            log_files.append(log)
            workers.append(common.Child(f"worker-{i}", common.worker_argv(s, name=f"demo{i}@%h", concurrency=1),
                                        env, stdout=log))
            say(f"worker-{i} started (pid {workers[-1].pid}, prefork, log {logs / f'worker-{i}.log'})")

        samples = s.state_dir / "demo"
        shutil.rmtree(samples, ignore_errors=True)
        samples.mkdir(parents=True)
        repos: list[tuple[Path, bool]] = []
        pack = corpus_dir() / "git-v1.0.0.pack"
        if pack.exists():
            sample = build_from_corpus(samples / "git-v1.0.0.git", pack)
            say(f"built {sample} from {pack} (git index-pack)")
            repos.append((sample, True))
        small = build_with_git(samples / "small.git")
        say(f"built {small} with git (loose objects)")
        repos.append((small, True))
        broken = samples / "corrupted.git"
        what = corrupt_copy(repos[0][0], broken)
        say(f"made {broken}: {what}")
        repos.append((broken, False))

        if not common.wait_for(lambda: len(common.ping_workers()) >= 2, timeout=90, interval=0.5):
            say("workers did not answer a ping within 90 s; see their logs")
            return 1
        say("workers up: " + ", ".join(sorted(common.ping_workers())))

        from workers.app import app

        submitted = []
        for repo, expect_ok in repos:
            res = app.send_task("packyard.verify_repo", kwargs={"repo": str(repo)})
            say(f"queued verify_repo {res.id} on {repo.name}")
            submitted.append((repo, expect_ok, res))

        ok = True
        deadline = time.monotonic() + args.timeout
        for repo, expect_ok, res in submitted:
            try:
                res.get(timeout=max(1.0, deadline - time.monotonic()), propagate=False)
            except Exception as err:  # timeout
                say(f"{repo.name}: no result ({type(err).__name__})")
                ok = False
                continue
            good = res.successful() == expect_ok
            ok &= good
            say(f"{repo.name}: {res.state} ({'as expected' if good else 'NOT as expected'})")

        from workers.cli.status import fetch, render_table

        print()
        print(render_table(fetch(s, None, len(submitted))))
        print()
        say("run `packyard status` (from this directory) to see these jobs again")
        return 0 if ok else 1
    finally:
        for w in workers:
            w.stop()
        for f in log_files:
            f.close()
        say("workers stopped")
        if server is not None and not server.reused:
            server.stop()
            say("redis stopped")
