"""The race harness's frontend: the repository it builds with git and the pushes it makes.

The served repository (``--repo``) is built here, never an existing one: a history on ``main``
(files edited commit after commit, so the pack has deltas) and topic branches, each with commits
whose new files only that topic reaches, all in ONE pack dated a day back (history pushed long
ago, as in any real repository; a geometric repack leaves that large pack alone).

The work repository (bare, in scratch space) makes every push with git plumbing and is the
oracle of what the served repository must hold:

* ``index_pack`` -- a thin pack (``git pack-objects --revs --thin``) of new commits on ``main``,
  ingested with ``fix_thin`` and the ref moved in the same job;
* ``unpack_objects`` -- the same kind of thin pack, exploded into loose objects;
* ``write_objects`` -- the new objects' raw bytes (``git cat-file``) as one batch;
* ``git_push`` -- a real ``git push`` of the new commit through ``packyard receive-pack``
  (:mod:`.gitpush`): git builds the thin pack from what packyard advertises;
* a **force push** of a topic (``write_objects`` of a commit on the topic's fork point, the ref
  moved from the old tip): the topic's own objects become unreachable. Readers that sampled them
  keep reading them, as a frontend serving a fetch of the refs it advertised does; a full repack
  with a short expiry drops them, so only ``objects/pack/preserved/`` serves those readers then.

Every input file goes into the incoming dir (queued jobs read nothing else).
"""
from __future__ import annotations

import base64
import os
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "packyard race", "GIT_AUTHOR_EMAIL": "race@packyard.invalid",
           "GIT_COMMITTER_NAME": "packyard race", "GIT_COMMITTER_EMAIL": "race@packyard.invalid",
           "GIT_TERMINAL_PROMPT": "0"}
MARKER = "packyard/race-harness"   # written into a repository this module built
WORDS = ("pack", "object", "delta", "tree", "blob", "commit", "ref", "lease", "fence", "reader", "repack", "loose",
         "index", "cruft", "keep", "prune", "mtime", "stat", "fsync", "rename", "quarantine", "thin", "base")
PUSH_KINDS = ("index_pack", "unpack_objects", "write_objects", "git_push")


class GitFailed(RuntimeError):
    pass


def git(*args: str, git_dir: Path, input: bytes | None = None, env: dict[str, str] | None = None) -> bytes:
    proc = subprocess.run(["git", "--git-dir", str(git_dir), *args], input=input, capture_output=True,
                          env={**os.environ, **GIT_ENV, **(env or {})})
    if proc.returncode != 0:
        raise GitFailed(f"git {' '.join(args[:3])} failed: {proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout


def git_init(path: Path) -> None:
    proc = subprocess.run(["git", "init", "-q", "--bare", str(path)], capture_output=True,
                          env={**os.environ, **GIT_ENV})
    if proc.returncode != 0:
        raise GitFailed(f"git init {path} failed: {proc.stderr.decode(errors='replace').strip()[:300]}")


@dataclass
class Push:
    """One push: the task that ingests it, its kwargs, and what the work repository expects after it."""

    n: int
    kind: str                       # index_pack | unpack_objects | write_objects | rewrite (write_objects)
    task: str
    kwargs: dict[str, Any]
    ref: str
    old: str
    new: str
    objects: list[str] = field(default_factory=list)   # ids the push carries (must exist after it lands)
    dropped: list[str] = field(default_factory=list)   # ids a force push leaves unreachable
    tree: dict[str, str] | None = None                 # main's files after the push


class Frontend:
    """Builds the served repository and makes the pushes (see the module doc)."""

    def __init__(self, served: Path, work: Path, incoming: Path, seed: int, *, files: int = 20,
                 commits: int = 60, topics: int = 8) -> None:
        self.served, self.work, self.incoming = Path(served), Path(work), Path(incoming)
        self.rng = random.Random(seed)
        self.files, self.commits, self.topics = files, commits, topics
        self.tree: dict[str, str] = {}         # main's files: name -> blob id
        self.main = ""
        self.topic_base: dict[str, str] = {}   # topic ref -> the main commit it forked from
        self.topic_tip: dict[str, str] = {}
        self.rewritten: set[str] = set()
        self.pushed: list[str] = []            # every object id a landed push carried
        self.n = 0
        self.t = int(time.time()) - 86400 * 30  # commit dates: a month back, one minute apart

    # -- git plumbing in the work repository ----------------------------------------------------
    def _text(self, lines: int) -> bytes:
        r = self.rng
        return "".join(" ".join(r.choice(WORDS) for _ in range(r.randint(4, 12))) + f" {r.getrandbits(32):08x}\n"
                       for _ in range(lines)).encode()

    def _blob(self, data: bytes) -> str:
        return git("hash-object", "-w", "--stdin", git_dir=self.work, input=data).decode().strip()

    def _commit(self, tree: dict[str, str], parent: str | None, message: str) -> str:
        listing = "".join(f"100644 blob {oid}\t{name}\n" for name, oid in sorted(tree.items())).encode()
        tree_id = git("mktree", git_dir=self.work, input=listing).decode().strip()
        self.t += 60
        when = {"GIT_AUTHOR_DATE": f"{self.t} +0000", "GIT_COMMITTER_DATE": f"{self.t} +0000"}
        args = ["commit-tree", tree_id, "-m", message] + (["-p", parent] if parent else [])
        return git(*args, git_dir=self.work, env=when).decode().strip()

    def _edit(self, tree: dict[str, str], name: str) -> None:
        """Replace a few lines of ``name`` (a delta against its previous version)."""
        old = git("cat-file", "blob", tree[name], git_dir=self.work).splitlines(keepends=True) if name in tree else []
        lines = old or self._text(60).splitlines(keepends=True)
        for _ in range(3):
            lines[self.rng.randrange(len(lines))] = self._text(1)
        tree[name] = self._blob(b"".join(lines))

    # -- the served repository ---------------------------------------------------------------------
    def build(self) -> dict[str, int]:
        """The work repository's history, then the served repository: one pack, dated a day back."""
        git_init(self.work)
        tree: dict[str, str] = {}
        for f in range(self.files):
            tree[f"file-{f:02d}.txt"] = self._blob(self._text(60))
        commit = self._commit(tree, None, "initial history")
        history = [commit]
        for c in range(self.commits - 1):
            for name in self.rng.sample(sorted(tree), 2):
                self._edit(tree, name)
            commit = self._commit(tree, commit, f"history {c + 1}")
            history.append(commit)
        self.tree, self.main = dict(tree), commit
        git("update-ref", "refs/heads/main", commit, git_dir=self.work)
        for i in range(self.topics):
            ref = f"refs/heads/topic-{i}"
            base = history[self.rng.randrange(len(history) // 2, len(history))]
            ttree = self._tree_of(base)
            tip = base
            for k in range(2):
                ttree[f"topic-{i}-{k}.txt"] = self._blob(self._text(40))
                tip = self._commit(ttree, tip, f"topic {i} commit {k + 1}")
            git("update-ref", ref, tip, git_dir=self.work)
            self.topic_base[ref], self.topic_tip[ref] = base, tip
        git("symbolic-ref", "HEAD", "refs/heads/main", git_dir=self.work)
        self._publish()
        return {"objects": len(self._objects_of(["--all"])), "topics": self.topics, "commits": self.commits}

    def _tree_of(self, commit: str) -> dict[str, str]:
        out = git("ls-tree", commit, git_dir=self.work).decode()
        return {line.split("\t", 1)[1]: line.split()[2] for line in out.splitlines()}

    def _objects_of(self, revs: list[str]) -> list[str]:
        out = git("rev-list", "--objects", *revs, git_dir=self.work).decode()
        return [line.split()[0] for line in out.splitlines() if line]

    def _publish(self) -> None:
        """The served repository: everything in one pack git made, dated a day back, no reflogs."""
        self.served.mkdir(parents=True, exist_ok=True)
        if any(self.served.iterdir()):
            raise FileExistsError(f"{self.served} exists and is not empty: packyard race builds its own repository "
                                  "there (name a new path)")
        git_init(self.served)
        git("config", "core.logAllRefUpdates", "false", git_dir=self.served)
        git("push", "-q", str(self.served), "refs/heads/*:refs/heads/*", git_dir=self.work)
        git("-c", "repack.writeBitmaps=false", "repack", "-a", "-d", "-q", git_dir=self.served)
        git("prune-packed", git_dir=self.served)
        old = time.time() - 86400
        for f in (self.served / "objects" / "pack").iterdir():
            os.utime(f, (old, old))
        (self.served / "packyard").mkdir(exist_ok=True)
        (self.served / MARKER).write_text(f"built by packyard race at {time.time():.0f}\n")

    # -- pushes --------------------------------------------------------------------------------------
    def next_push(self, kind: str) -> Push:
        """New commits on main (1-2 edited files and a new one), as ``kind``; the work repository moves
        main only once the push is known to have landed (:meth:`landed`)."""
        self.n += 1
        tree = dict(self.tree)
        for name in self.rng.sample(sorted(n for n in tree if n.startswith("file-")), self.rng.randint(1, 2)):
            self._edit(tree, name)
        tree[f"push-{self.n:04d}.txt"] = self._blob(self._text(self.rng.randint(5, 20)))
        new = self._commit(tree, self.main, f"push {self.n} ({kind})")
        objects = self._objects_of([new, f"^{self.main}"])
        ref_updates = [{"ref": "refs/heads/main", "old": self.main, "new": new}]
        task = "packyard.receive_pack" if kind == "git_push" else f"packyard.{kind}"
        push = Push(self.n, kind, task, {}, "refs/heads/main", self.main, new, objects, tree=tree)
        if kind != "git_push":   # (git computes its own pack from the served refs)
            push.kwargs = self._payload(kind, new, self.main, objects, ref_updates)
        return push

    def rewrite_topic(self) -> Push | None:
        """A force push of a topic not yet rewritten: its own commits and files become unreachable."""
        left = sorted(set(self.topic_tip) - self.rewritten)
        if not left:
            return None
        ref = left[0]
        self.n += 1
        old, base = self.topic_tip[ref], self.topic_base[ref]
        new = self._commit(self._tree_of(base), base, f"force push of {ref} (rewritten)")
        dropped = self._objects_of([old, f"^{base}"])
        push = Push(self.n, "rewrite", "packyard.write_objects", {}, ref, old, new, [new], dropped)
        push.kwargs = self._payload("write_objects", new, base, [new], [{"ref": ref, "old": old, "new": new}])
        return push

    def _payload(self, kind: str, new: str, old: str, objects: list[str],
                 ref_updates: list[dict[str, str]]) -> dict[str, Any]:
        repo = str(self.served)
        if kind == "write_objects":
            batch = git("cat-file", "--batch", git_dir=self.work, input="".join(f"{o}\n" for o in objects).encode())
            items, pos = [], 0
            for _ in objects:
                nl = batch.index(b"\n", pos)
                _oid, typ, size = batch[pos:nl].split()
                data = batch[nl + 1:nl + 1 + int(size)]
                pos = nl + 1 + int(size) + 1
                items.append({"type": typ.decode(), "data": base64.b64encode(data).decode()})
            return {"repo": repo, "objects": items, "ref_updates": ref_updates}
        pack = git("pack-objects", "--revs", "--thin", "--stdout", "-q", git_dir=self.work,
                   input=f"{new}\n^{old}\n".encode())
        path = self.incoming / f"push-{self.n:04d}.pack"
        path.write_bytes(pack)
        if kind == "index_pack":
            return {"repo": repo, "pack": str(path), "fix_thin": True, "ref_updates": ref_updates}
        return {"repo": repo, "pack_path": str(path), "ref_updates": ref_updates}

    def fork(self, served: Path, work: Path, incoming: Path, seed: int) -> "Frontend":
        """A fork of the served repository (the pool race's, workers/race/pool.py): ``git clone --bare`` of it at
        ``served`` and of the work repository at ``work``, with this frontend's state; its pushes build on the
        history the two share (thin packs whose bases a pool holds once the fork is linked)."""
        fe = Frontend(served, work, incoming, seed, files=self.files, commits=self.commits, topics=self.topics)
        for src, dst in ((self.work, fe.work), (self.served, fe.served)):
            proc = subprocess.run(["git", "clone", "-q", "--bare", "--no-local", str(src), str(dst)],
                                  capture_output=True, env={**os.environ, **GIT_ENV})
            if proc.returncode != 0:
                raise GitFailed(f"git clone {src} failed: {proc.stderr.decode(errors='replace').strip()[:300]}")
        git("config", "core.logAllRefUpdates", "false", git_dir=fe.served)
        (fe.served / "packyard").mkdir(exist_ok=True)
        (fe.served / MARKER).write_text(f"cloned by packyard race --pool from {self.served} at {time.time():.0f}\n")
        fe.tree, fe.main, fe.t = dict(self.tree), self.main, self.t
        fe.topic_base, fe.topic_tip = dict(self.topic_base), dict(self.topic_tip)
        fe.incoming.mkdir(parents=True, exist_ok=True)
        return fe

    def all_objects(self) -> list[str]:
        """Every object the work repository's refs reach (what the served repository must hold, by git)."""
        return self._objects_of(["--all"])

    def landed(self, push: Push) -> None:
        """The push's job succeeded: the work repository moves its ref too."""
        git("update-ref", push.ref, push.new, push.old, git_dir=self.work)
        if push.ref == "refs/heads/main":
            self.main = push.new
            if push.tree is not None:
                self.tree = push.tree
        else:
            self.topic_tip[push.ref] = push.new
            self.rewritten.add(push.ref)
        self.pushed.extend(push.objects)
        path = push.kwargs.get("pack") or push.kwargs.get("pack_path")
        if path:
            Path(path).unlink(missing_ok=True)

    def expected_refs(self) -> dict[str, str]:
        out = git("for-each-ref", "--format=%(refname) %(objectname)", git_dir=self.work).decode()
        return dict(line.split() for line in out.splitlines())
