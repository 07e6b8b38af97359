"""packyard demo: the main job on embedded defaults, end to end, with real worker processes.

The demo plays a hosting frontend against one fresh repository (``hosted.git``):

1. ``index_pack``  — the first push: the corpus pack (or a pack git makes when the corpus is
   absent) is ingested and ``refs/heads/main`` is created in the same job;
2. ``index_pack --fix-thin`` — a thin push of new commits made with git;
3. ``unpack_objects`` — a small (thin) push exploded into loose objects;
4. ``import_tree`` — a small directory committed onto ``refs/heads/docs``;
5. ``write_objects`` — a web edit: blobs, a tree and a commit computed by git, written as one
   batch that creates ``refs/heads/web-edit``;
6. ``verify_repo`` on the result, and on a deliberately corrupted repository (that job fails,
   and its reason names the damaged file);
7. nightly maintenance: the repository the jobs built and two more made with git (one with many
   loose objects, one with a big pack and many small pushes) are registered, and the plan the
   maintenance strategy makes for each is printed with its reasons. Where ``packyard.repack`` is
   installed, the nightly window then runs through the workers and the repacks are shown;
8. a short race (``packyard race``, safe mode, a few seconds): reader processes read a new
   repository while the workers repack it and ingest pushes into it; its counts are printed
   (lookups, repacks, ingests, misses recovered by re-listing or from preserved/, lost reads: 0).

Every job goes through Redis to two real ``celery worker`` processes (``app.send_task``, as a
frontend would). Then the status table, and ``git fsck --full`` on the repository the jobs built.

Queued jobs are confined (:mod:`packyard.workers.confine`): the demo registers its own storage
root (``demo=<state dir>/demo/repositories``) and incoming dir (``<state dir>/demo/incoming``)
for its workers, creates the repositories there, drops every pack and source it pushes in the
incoming dir, and addresses them as ``demo:hosted.git`` and by file name.
"""
from __future__ import annotations

import argparse
import base64
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packyard.workers.cli.children import Child, child_env, ping_workers, wait_for, worker_argv
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.cli.tasknames import known_tasks, normalize_task_name
from packyard.workers.settings import get_settings

ROOT = Path(__file__).resolve().parents[2]
#: The storage the demo registers for its workers (PACKYARD_STORAGE_ROOTS), under <state dir>/demo.
DEMO_STORAGE = "demo"


def confine_to(samples: Path) -> tuple[Path, Path]:
    """Point this process and the workers it starts at the demo's own storage root and incoming dir.

    Queued jobs may only touch repositories inside a storage root and read inputs from the incoming
    dir; the demo's live under ``samples``. Set in this process's environment too, so the rows it
    records when it queues a job name the same paths the workers use.
    """
    root, incoming = samples / "repositories", samples / "incoming"
    os.environ["PACKYARD_STORAGE_ROOTS"] = f"{DEMO_STORAGE}={root}"
    os.environ["PACKYARD_INCOMING_DIR"] = str(incoming)
    # The nightly window's jobs start after a random delay (PACKYARD_MAINTENANCE_JITTER, 60 s by
    # default, to spread a fleet's load): a demo of three repositories need not wait for it.
    os.environ.setdefault("PACKYARD_MAINTENANCE_JITTER", "1")
    os.environ.setdefault("PACKYARD_MAINTENANCE_TICK", "1")
    return root, incoming


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "demo", help="run the whole service once: Redis, 2 workers, pushes, bulk writes, verify, status",
        description="Start the embedded Redis, migrate, start 2 real Celery worker processes, then act as a "
                    "hosting frontend on a fresh repository: ingest the corpus pack (or one git makes) with "
                    "index_pack + ref update, a thin push with fix_thin, a small push with unpack_objects, "
                    "import_tree of a directory onto a branch, a write_objects batch, verify_repo (also on a "
                    "deliberately corrupted repository, so a failed job shows). Print the status table, run "
                    "`git fsck --full` on the built repository, stop everything. State lives in "
                    "PACKYARD_STATE_DIR (default ./.state); the corpus in PACKYARD_CORPUS (default "
                    "../shared/corpus).")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for all jobs (default 300)")
    p.set_defaults(func=run)


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def corpus_dir() -> Path:
    return Path(os.environ.get("PACKYARD_CORPUS") or ROOT.parent / "shared" / "corpus")


def git(*args: str, cwd: Path | None = None, git_dir: Path | None = None, input: bytes | None = None,
        env: dict[str, str] | None = None) -> bytes:
    full_env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "packyard demo",
                "GIT_AUTHOR_EMAIL": "demo@packyard.invalid", "GIT_COMMITTER_NAME": "packyard demo",
                "GIT_COMMITTER_EMAIL": "demo@packyard.invalid", **(env or {})}
    cmd = ["git"] + (["--git-dir", str(git_dir)] if git_dir else []) + list(args)
    proc = subprocess.run(cmd, cwd=cwd, input=input, env=full_env, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


# -- what the "frontend" pushes: made with git in a work tree ----------------------------------------

@dataclass
class Pushes:
    """The packs and sources the demo sends, and the tips git says they lead to."""

    source: str                      # where the first pack came from
    base_pack: Path
    base_tip: str
    thin_pack: Path
    thin_tip: str
    small_pack: Path
    small_tip: str
    import_dir: Path
    web_edit: list[dict[str, str]] = field(default_factory=list)  # write_objects payload
    web_edit_oids: list[str] = field(default_factory=list)        # what git says their ids are
    web_edit_tip: str = ""


def work_tree_from_corpus(work: Path, pack: Path) -> str:
    """A work tree whose history is the corpus pack (indexed by git), checked out at its tip."""
    tip = pack.with_suffix(".refs").read_text().split()[0]
    git("init", "-q", "-b", "main", str(work))
    target = work / ".git" / "objects" / "pack" / "pack-corpus.pack"
    shutil.copyfile(pack, target)
    git("index-pack", str(target))
    git("update-ref", "refs/heads/main", tip, cwd=work)
    git("reset", "-q", "--hard", "main", cwd=work)
    return tip


def work_tree_with_git(work: Path, dest_pack: Path, commits: int = 8) -> str:
    """No corpus: a history made with git (files big enough that git stores deltas), packed by git."""
    git("init", "-q", "-b", "main", str(work))
    for c in range(commits):
        for f in range(6):
            lines = [f"file {f} line {n}: {'x' * (n % 40)}\n" for n in range(300)]
            lines[(c * 37 + f) % 300] = f"file {f} changed in revision {c}\n"
            (work / f"file{f}.txt").write_text("".join(lines))
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"revision {c}", cwd=work)
    dest_pack.write_bytes(git("pack-objects", "--revs", "--stdout", "-q", cwd=work, input=b"main\n"))
    return git("rev-parse", "main", cwd=work).decode().strip()


def commit_changes(work: Path, files: list[str], message: str, new_file: str | None = None) -> str:
    """Append a line to each of ``files`` (and create ``new_file``), commit, return the new tip."""
    for name in files:
        with open(work / name, "a", encoding="utf-8") as f:
            f.write(f"{message}: a line added by the packyard demo\n")
    if new_file:
        (work / new_file).write_text(f"{message}\n" + "".join(f"note {n}\n" for n in range(50)))
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)
    return git("rev-parse", "HEAD", cwd=work).decode().strip()


def thin_pack(work: Path, new: str, old: str, dest: Path) -> Path:
    """What `git push` sends: a thin pack of ``old..new`` (deltas against objects the server has)."""
    dest.write_bytes(git("pack-objects", "--revs", "--thin", "--stdout", "-q", cwd=work,
                         input=f"{new}\n^{old}\n".encode()))
    return dest


def web_edit(work: Path, parent: str, scratch: Path) -> tuple[list[dict[str, str]], list[str], str]:
    """A web edit as the frontend computes it: git writes the objects in the work repo (with a
    scratch index), and their raw bytes become the write_objects payload."""
    env = {"GIT_INDEX_FILE": str(scratch / "web-edit.index")}
    top = list(git("ls-tree", "--name-only", parent, cwd=work).decode().splitlines())
    edited = next(n for n in top if n.endswith((".txt", ".c", ".md", "Makefile", "README")))
    old_text = git("cat-file", "blob", f"{parent}:{edited}", cwd=work)
    blobs = [(edited, old_text + b"edited in the browser\n"), ("WEB-EDIT.md", b"# Written by write_objects\n")]
    git("read-tree", parent, cwd=work, env=env)
    oids = []
    for name, data in blobs:
        oid = git("hash-object", "-w", "--stdin", cwd=work, input=data).decode().strip()
        git("update-index", "--add", "--cacheinfo", f"100644,{oid},{name}", cwd=work, env=env)
        oids.append(oid)
    tree = git("write-tree", cwd=work, env=env).decode().strip()
    commit = git("commit-tree", tree, "-p", parent, "-m", f"Edit {edited} in the browser", cwd=work,
                 input=b"").decode().strip()
    objects = [{"type": "blob", "data": base64.b64encode(data).decode()} for _, data in blobs]
    for kind, oid in (("tree", tree), ("commit", commit)):
        objects.append({"type": kind, "data": base64.b64encode(git("cat-file", kind, oid, cwd=work)).decode()})
    return objects, oids + [tree, commit], commit


def make_pushes(samples: Path, incoming: Path) -> Pushes:
    """What the frontend pushes, made with git in ``samples``; every input a job reads is put in ``incoming``."""
    work = samples / "frontend-work"
    corpus_pack = corpus_dir() / "git-v1.0.0.pack"
    base_pack = incoming / "push-0.pack"
    if corpus_pack.exists() and corpus_pack.with_suffix(".refs").exists():
        base_tip = work_tree_from_corpus(work, corpus_pack)
        shutil.copyfile(corpus_pack, base_pack)   # handed over like any push: a file in the incoming dir
        source = f"corpus {corpus_pack}"
    else:
        base_tip = work_tree_with_git(work, base_pack)
        source = "a history made with git (no corpus found)"
    tracked = sorted(n for n in git("ls-files", cwd=work).decode().splitlines() if n.endswith((".c", ".txt")))
    first = tracked[:3] or ["demo.txt"]

    tip = base_tip
    for i in range(3):  # thin push: 3 commits touching files the server already has
        tip = commit_changes(work, first[i:i + 1] + first[:1], f"thin push commit {i + 1}")
    thin_tip = tip
    tp = thin_pack(work, thin_tip, base_tip, incoming / "push-1-thin.pack")
    for i in range(2):  # small push, exploded into loose objects
        tip = commit_changes(work, first[1:2], f"small push commit {i + 1}", new_file=f"NEWS-{i + 1}.txt")
    small_tip = tip
    sp = thin_pack(work, small_tip, thin_tip, incoming / "push-2-small.pack")

    import_dir = incoming / "import-src"
    (import_dir / "guide").mkdir(parents=True)
    (import_dir / "README.md").write_text("# Documentation\n\nImported by packyard import_tree.\n")
    for n in range(5):
        (import_dir / "guide" / f"chapter-{n + 1}.md").write_text(f"# Chapter {n + 1}\n" + "text\n" * (n + 3))
    script = import_dir / "build.sh"
    script.write_text("#!/bin/sh\necho building docs\n")
    script.chmod(0o755)

    payload, oids, edit_tip = web_edit(work, small_tip, samples)
    return Pushes(source, base_pack, base_tip, tp, thin_tip, sp, small_tip, import_dir, payload, oids, edit_tip)


# -- the deliberately corrupted repository ------------------------------------------------------------

def corrupted_repo(dest: Path, pack: Path, tip: str) -> str:
    """A repository git built from ``pack``, then one byte flipped in the middle of its pack."""
    git("init", "-q", "--bare", str(dest))
    target = dest / "objects" / "pack" / "pack-sample.pack"
    shutil.copyfile(pack, target)
    git("index-pack", str(target))
    git("update-ref", "refs/heads/main", tip, git_dir=dest)
    target.chmod(0o644)
    size = target.stat().st_size
    with open(target, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    return f"flipped the byte at offset {size // 2} of {target.name}"


# -- queueing jobs as a frontend would ----------------------------------------------------------------

@dataclass
class Job:
    label: str
    result: Any          # celery AsyncResult
    expect_ok: bool = True
    ok: bool | None = None


class Frontend:
    """Queues jobs with ``app.send_task`` (by name, no task code imported) and waits for them."""

    def __init__(self, timeout: float) -> None:
        from packyard.workers.app import app

        self.app = app
        self.deadline = time.monotonic() + timeout
        self.jobs: list[Job] = []

    def send(self, task: str, label: str, expect_ok: bool = True, **kwargs: Any) -> Job:
        res = self.app.send_task(normalize_task_name(task), kwargs=kwargs)
        job = Job(label, res, expect_ok)
        self.jobs.append(job)
        say(f"queued {task} {res.id[:8]}: {label}")
        return job

    def wait(self, job: Job) -> Any:
        """Wait for ``job``; report it; return its result (or the error) — the next push builds on it."""
        if job.ok is not None:
            return job.result.result
        try:
            job.result.get(timeout=max(1.0, self.deadline - time.monotonic()), propagate=False)
        except Exception as err:  # celery TimeoutError: no result in time
            job.ok = False
            say(f"{job.label}: no result ({type(err).__name__}); see the worker logs")
            return None
        job.ok = job.result.successful() == job.expect_ok
        verdict = "as expected" if job.ok else "NOT as expected"
        reason = "" if job.result.successful() else f": {type(job.result.result).__name__}: {job.result.result}"
        say(f"{job.label}: {job.result.state} ({verdict}){reason}")
        return job.result.result

    def run_and_wait(self, task: str, label: str, expect_ok: bool = True, **kwargs: Any) -> Any:
        return self.wait(self.send(task, label, expect_ok, **kwargs))

    @property
    def all_ok(self) -> bool:
        return all(j.ok for j in self.jobs)


def drive(fe: Frontend, hosted: Path, broken: Path, pushes: Pushes) -> bool:
    """The frontend's side of the story; every step waits for the one it builds on.

    Repositories are addressed as ``<storage>:<path>`` and inputs by their name in the incoming
    directory, as a frontend that shares the storage only through packyard's settings would.
    """
    repo = f"{DEMO_STORAGE}:{hosted.name}"
    bad = fe.send("verify_repo", "verify the corrupted repository", expect_ok=False,
                  repo=f"{DEMO_STORAGE}:{broken.name}")
    fe.run_and_wait("index_pack", "first push: ingest the pack, create refs/heads/main", repo=repo,
                    pack=pushes.base_pack.name,
                    ref_updates=[{"ref": "refs/heads/main", "old": None, "new": pushes.base_tip}])
    fe.run_and_wait("index_pack", "thin push (3 commits) with fix_thin, move main", repo=repo,
                    pack=pushes.thin_pack.name, fix_thin=True,
                    ref_updates=[{"ref": "refs/heads/main", "old": pushes.base_tip, "new": pushes.thin_tip}])
    fe.run_and_wait("unpack_objects", "small push (2 commits) exploded into loose objects, move main",
                    repo=repo, pack_path=pushes.small_pack.name,
                    ref_updates=[{"ref": "refs/heads/main", "old": pushes.thin_tip, "new": pushes.small_tip}])
    fe.run_and_wait("import_tree", "import a directory onto refs/heads/docs", repo=repo, ref="refs/heads/docs",
                    source=pushes.import_dir.name, message="Import the documentation")
    written = fe.run_and_wait("write_objects", "web edit: 2 blobs, a tree, a commit; create refs/heads/web-edit",
                              repo=repo, objects=pushes.web_edit,
                              ref_updates=[{"ref": "refs/heads/web-edit", "old": None, "new": pushes.web_edit_tip}])
    same = isinstance(written, dict) and written.get("oids") == pushes.web_edit_oids
    say(f"write_objects ids {'match' if same else 'DO NOT match'} the ids git computed for the same objects")
    fe.run_and_wait("verify_repo", "verify the repository the jobs built", repo=repo)
    fe.wait(bad)
    # What an operator does with a repository that failed verification: keep it out of maintenance (a
    # repack of it would fail on the corrupt object, night after night) until it is repaired.
    from packyard.workers.records import registry

    if registry.set_enabled(get_settings(), broken.resolve(), False):
        say(f"packyard repos disable --repo {broken.name}: a repository that failed verification is left out of "
            "maintenance until it is repaired")
    return same


def check_with_git(hosted: Path, pushes: Pushes) -> bool:
    """git is the oracle: the refs are where the jobs said, and `git fsck --full` passes."""
    refs = dict(line.split()[::-1] for line in
                git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=hosted).decode().splitlines())
    want = {"refs/heads/main": pushes.small_tip, "refs/heads/web-edit": pushes.web_edit_tip}
    ok = all(refs.get(k) == v for k, v in want.items()) and "refs/heads/docs" in refs
    for name, oid in sorted(refs.items()):
        say(f"  {name} {oid}{'' if want.get(name, oid) == oid else ' (expected ' + want[name] + ')'}")
    proc = subprocess.run(["git", "--git-dir", str(hosted), "fsck", "--full", "--no-dangling"],
                          capture_output=True, text=True)
    count = git("count-objects", "-v", git_dir=hosted).decode().split()
    stats = dict(zip(count[::2], count[1::2]))
    if proc.returncode == 0:
        say(f"git fsck --full {hosted.name}: passed ({stats.get('in-pack:')} packed + "
            f"{stats.get('count:')} loose objects, {stats.get('packs:')} packs)")
    else:
        say(f"git fsck --full {hosted.name}: FAILED (exit {proc.returncode})\n{proc.stderr.strip()}")
        ok = False
    return ok


# -- nightly maintenance: plans and their reasons ------------------------------------------------------

def maintenance_repos(samples: Path, dest: Path, count_loose: int = 1500, pushes: int = 6) -> list[Path]:
    """Two repositories git builds in ``dest`` (the demo's storage root; scratch work in ``samples``):
    many loose objects; a big pack and many small pushes after it."""
    loose = dest / "busy-loose.git"
    # Made anew on every run (a state dir is reused): the same story each time, not the last run's result.
    for old in (loose, dest / "many-pushes.git"):
        shutil.rmtree(old, ignore_errors=True)
    git("init", "-q", "--bare", str(loose))
    src = samples / "loose-src"
    src.mkdir()
    for i in range(count_loose):
        (src / f"{i}.txt").write_text(f"generated file {i}\n")
    names = sorted(src.iterdir(), key=lambda p: int(p.stem))
    oids = git("hash-object", "-w", "--stdin-paths", git_dir=loose,
               input="\n".join(map(str, names)).encode() + b"\n").decode().split()
    tree = git("mktree", git_dir=loose, input="".join(f"100644 blob {o}\t{p.name}\n" for o, p in zip(oids, names))
               .encode()).decode().strip()
    git("update-ref", "refs/heads/main", git("commit-tree", tree, "-m", "many files", git_dir=loose).decode().strip(),
        git_dir=loose)
    shutil.rmtree(src)

    packs = dest / "many-pushes.git"
    work = samples / "pushes-work"
    git("init", "-q", "-b", "main", str(work))
    git("init", "-q", "--bare", str(packs))
    git("config", "receive.unpackLimit", "1", git_dir=packs)   # every push is kept as the pack it came in
    for n in range(pushes + 1):
        files = 200 if n == 0 else 1
        for f in range(files):
            (work / f"push{n}-{f}.txt").write_text(f"push {n} file {f}\n")
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"push {n}", cwd=work)
        git("push", "-q", str(packs), "main", cwd=work)
    shutil.rmtree(work)
    return [loose, packs]


def show_plans(s: Any, repos: list[Path]) -> None:
    from packyard.workers.commands.plan_maintenance import assess
    from packyard.workers.records import registry

    say("nightly maintenance: the plan each registered repository would get now, and why")
    for repo in repos:
        registry.register(s, repo)
        stats, plan = assess(s, repo)
        say(f"  {repo.name}: {plan.action.value.upper()} — {len(stats.packs)} pack(s), "
            f"~{stats.loose_estimate:,} loose object(s)")
        for reason in plan.reasons:
            say(f"      because {reason}")


def run_window(s: Any, repos: list[Path], timeout: float) -> bool:
    """Where packyard.repack is installed: run the nightly window through the workers, show what it did."""
    from packyard.workers.app import app
    from packyard.workers.records import registry

    if "packyard.repack" not in known_tasks():
        say("(the repack task is not installed in this build: plans shown, not run)")
        return True
    res = app.send_task("packyard.plan_maintenance", kwargs={"trigger": "window"})
    say(f"queued plan_maintenance {res.id[:8]}: the nightly window over the registered repositories")
    paths = {str(r.resolve()) for r in repos}

    def settled() -> bool:
        rows = [r for r in registry.list_repositories(s) if r["path"] in paths]
        done = all(r["last_plan"] and r["last_plan"]["outcome"] != "no_slot" for r in rows)
        return done and not registry.maintenance_in_flight(s)
    if not wait_for(settled, timeout=timeout, interval=0.5):
        say("the window did not finish in time; see `packyard status`")
        return False
    from packyard.workers.cli.status import fetch

    ok = True
    for r in registry.list_repositories(s):
        if r["path"] in paths:
            plan = r["last_plan"]
            line = f"  {Path(r['path']).name}: {plan['action']} -> {plan['outcome']}"
            if plan.get("job"):
                found = fetch(s, None, 1, task_ids=[plan["job"]])
                row = found[0] if found else None
                state = row["state"] if row else "not recorded"
                ok &= state == "SUCCESS"
                error = f": {row['error']}" if row and row.get("error") else ""
                line += f" (job {plan['job'][:8]}: {state}{error})"
            say(line)
    for repo in repos:   # the oracle, not only the jobs' word
        try:
            git("fsck", "--full", git_dir=repo)
        except RuntimeError as err:
            ok = False
            say(f"  git fsck --full {repo.name}: FAILED: {str(err)[:300]}")
        else:
            say(f"  git fsck --full {repo.name}: passed")
    say("after the window:")
    show_plans(s, repos)
    return ok


def run_race_demo(s: Any, root: Path) -> bool:
    """A few seconds of ``packyard race`` (safe mode) on a new repository in the demo's storage root."""
    from packyard.workers.app import app
    from packyard.workers.race.harness import RaceOptions, run_race

    repo = root / "race.git"
    shutil.rmtree(repo, ignore_errors=True)   # a state dir is reused: the harness builds its own repository
    say("race: readers against repacks and pushes (packyard race, safe mode, 4 s; `packyard races` lists them)")
    options = RaceOptions(repo=repo, readers=2, duration=4.0, repack_every=1.2, ingest_every=0.5, seed=1,
                          reader_rate=800.0)
    summary = run_race(s, options, app, say=lambda m: say(f"  {m}"))
    for line in summary.render().splitlines():
        say(f"  {line}")
    return summary.ok


def run(args: argparse.Namespace) -> int:
    from packyard.store.repo import Repository
    from packyard.workers.records import upgrade_database

    t_start = time.monotonic()
    samples = get_settings().state_dir / "demo"
    root, incoming = confine_to(samples)
    s = get_settings()
    say(f"state dir {s.state_dir}; jobs confined to storage {DEMO_STORAGE}={root} and incoming dir {incoming}")
    server = prepare_embedded(s, migrate=False)
    if server is not None:
        say(f"redis {'reused' if server.reused else 'started'} on {server.socket} "
            f"({'pid ' + str(server.process.pid) if server.process else 'already running'})")
    else:
        say(f"redis {s.redis_py_url} (external)")
    upgrade_database(s)
    say(f"database migrated: {s.database_url}")

    logs = s.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = child_env(s, {"PACKYARD_LOG_FORMAT": "json"})
    workers: list[Child] = []
    log_files = []
    try:
        for i in (1, 2):
            log = open(logs / f"worker-{i}.log", "ab")
            log_files.append(log)
            workers.append(Child(f"worker-{i}", worker_argv(s, name=f"demo{i}@%h", concurrency=1),
                                        env, stdout=log))
            say(f"worker-{i} started (pid {workers[-1].pid}, prefork, log {logs / f'worker-{i}.log'})")

        # While the workers boot: what the frontend will push, made with git.
        shutil.rmtree(samples, ignore_errors=True)
        for d in (samples, root, incoming):
            d.mkdir(parents=True, exist_ok=True)
        try:
            pushes = make_pushes(samples, incoming)
        except (RuntimeError, OSError) as err:  # git missing or failing: say so, stop cleanly
            say(f"could not prepare the pushes with git: {err}")
            return 1
        say(f"first push: {pushes.base_pack.name} from {pushes.source}")
        say(f"made with git: {pushes.thin_pack.name} ({pushes.thin_pack.stat().st_size} bytes, thin), "
            f"{pushes.small_pack.name} ({pushes.small_pack.stat().st_size} bytes), "
            f"{pushes.import_dir.name}/, a web edit of {len(pushes.web_edit)} objects")
        hosted = Repository.init(root / "hosted.git").path
        say(f"created the empty repository {hosted}")
        broken = root / "corrupted.git"
        say(f"made {broken}: {corrupted_repo(broken, pushes.base_pack, pushes.base_tip)}")

        if not wait_for(lambda: len(ping_workers()) >= 2, timeout=90, interval=0.5):
            say("workers did not answer a ping within 90 s; see their logs")
            return 1
        say("workers up: " + ", ".join(sorted(ping_workers())))

        # This process is the "frontend": its job.queued log lines would only repeat the [demo] lines.
        logging.getLogger("packyard.jobs").setLevel(logging.WARNING)
        fe = Frontend(args.timeout)
        ids_match = drive(fe, hosted, broken, pushes)

        from packyard.workers.cli.status import fetch, render_table

        print()
        print(render_table(fetch(s, None, len(fe.jobs), task_ids=[j.result.id for j in fe.jobs]), width=100))
        print()
        git_ok = check_with_git(hosted, pushes)
        print()
        fleet = [hosted, *maintenance_repos(samples, root)]
        from packyard.workers.records import registry

        for repo in fleet[1:]:   # new repositories: forget what the registry knew of the last run's
            registry.remove(s, repo)
        show_plans(s, fleet)
        window_ok = run_window(s, fleet, max(30.0, fe.deadline - time.monotonic()))
        print()
        race_ok = run_race_demo(s, root)
        ok = fe.all_ok and ids_match and git_ok and window_ok and race_ok
        say(f"{sum(bool(j.ok) for j in fe.jobs)}/{len(fe.jobs)} jobs as expected, "
            f"{'all checks passed' if ok else 'SOME CHECKS FAILED'} ({time.monotonic() - t_start:.1f}s)")
        say("run `packyard status` (with the same PACKYARD_STATE_DIR) to see these jobs again")
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
