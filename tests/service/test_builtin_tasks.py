"""Only packyard's tasks run in a packyard worker (issue 16): Celery's built-in tasks (celery.starmap, map,
chunks, chain, group, chord, chord_unlock, backend_cleanup, accumulate) wrapping packyard tasks with hostile
arguments are refused, through the broker and through Flower's API; a job row records each refusal; nothing
outside the roots is read or written, and no outside path becomes a registered repository."""
from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gitutil import git, make_worktree_repo
from packyard.store.objects import ObjectType, hash_object

BUILTINS = ("celery.starmap", "celery.map", "celery.chunks", "celery.chain", "celery.group", "celery.chord",
            "celery.chord_unlock", "celery.backend_cleanup", "celery.accumulate")
SECRET = b"SECRETTOKEN-91ac: outside every root\n"


def outside_state(path: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(path)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture
def outside(tmp_path) -> Path:
    make_worktree_repo(tmp_path / "o")
    (tmp_path / "o" / "secret").mkdir()
    (tmp_path / "o" / "secret" / "key").write_bytes(SECRET)
    return tmp_path / "o"


def hostile_calls(outside: Path) -> list[tuple[str, list, dict]]:
    """(packyard task, args, kwargs) that would each reach outside the roots or weaken readers' safety."""
    repo = outside / "repo.git"
    main = git("rev-parse", "main", git_dir=repo).strip().decode()
    blob = b"loot\n"
    tree = b"100644 loot.txt\0" + hash_object(ObjectType.BLOB, blob)
    commit = (f"tree {hash_object(ObjectType.TREE, tree).hex()}\nparent {main}\n"
              "author W <w@x> 1700000000 +0000\ncommitter W <w@x> 1700000000 +0000\n\nloot\n").encode()
    objects = [{"type": t, "data": base64.b64encode(d).decode()} for t, d in
               (("blob", blob), ("tree", tree), ("commit", commit))]
    tip = hash_object(ObjectType.COMMIT, commit).hex()
    return [
        ("packyard.import_tree", [str(repo), "refs/heads/loot", str(outside / "secret")], {}),
        ("packyard.write_objects", [str(repo), objects, [{"ref": "refs/heads/main", "old": main, "new": tip}]], {}),
        ("packyard.verify_repo", [str(repo)], {}),
        ("packyard.repack", [str(repo)], {"preserve": False}),
        ("packyard.index_pack", [str(repo), str(outside / "secret" / "key")], {}),
    ]


def wrapped(app, builtin: str, task: str, args: list, kwargs: dict) -> tuple[list, dict]:
    """The message a hostile publisher would send to ``builtin`` to run ``task`` inside the worker."""
    sig = app.signature(task, args=args, kwargs=kwargs)
    if builtin == "celery.starmap":
        return [], {"task": sig, "it": [args]}
    if builtin == "celery.map":
        return [], {"task": sig, "it": [args]}
    if builtin == "celery.chunks":
        return [], {"task": sig, "it": [args], "n": 1}
    if builtin == "celery.group":
        return [], {"tasks": [sig], "result": None, "group_id": "g-hostile", "partial_args": ()}
    if builtin == "celery.chord":
        return [], {"header": [sig], "body": sig}
    if builtin == "celery.chord_unlock":
        return [], {"group_id": "g-hostile", "callback": sig}
    if builtin == "celery.chain":
        return [sig], {}
    if builtin == "celery.accumulate":
        return [sig, args], {}
    return [], {}                          # backend_cleanup takes nothing: it must not run either


def assert_refused(pk, task_id: str, builtin: str) -> None:
    job = pk.wait_job(task_id, timeout=60)
    assert job.state.value == "FAILURE", (builtin, job.state, job.error)
    assert job.kind == builtin and job.error_type == "InvalidInputError"
    assert "is not a packyard task" in job.error and job.repo_id is None, job.error


def registered_paths(settings) -> set[str]:
    from packyard.workers.records import registry

    return {r["path"] for r in registry.list_repositories(settings)}


def test_every_builtin_is_refused_through_the_broker(celery_worker, celery_app, pk, settings, outside):
    before = outside_state(outside)
    sent = []
    for task, args, kwargs in hostile_calls(outside):
        for builtin in BUILTINS:
            margs, mkwargs = wrapped(celery_app, builtin, task, args, kwargs)
            sent.append((builtin, celery_app.send_task(builtin, args=margs, kwargs=mkwargs)))
    for builtin, res in sent:
        value = res.get(timeout=60, propagate=False)
        assert isinstance(value, Exception) and "is not a packyard task" in str(value), (builtin, value)
        assert_refused(pk, res.id, builtin)
    assert outside_state(outside) == before
    assert not any(p.startswith(str(outside)) for p in registered_paths(settings))
    refs = git("for-each-ref", "--format=%(refname)", git_dir=outside / "repo.git").decode().split()
    assert "refs/heads/loot" not in refs


def test_a_message_claiming_is_eager_still_goes_through_the_boundary(celery_worker, celery_app, pk, settings,
                                                                     outside):
    """A header cannot turn a delivery into a 'direct call' that skips the boundary and the job row."""
    before = outside_state(outside)
    res = celery_app.send_task("packyard.verify_repo", args=[str(outside / "repo.git")],
                               headers={"is_eager": True})
    value = res.get(timeout=60, propagate=False)
    assert isinstance(value, Exception)
    job = pk.wait_job(res.id)
    assert job.state.value == "FAILURE" and job.error_type == "InvalidInputError", job.error
    assert outside_state(outside) == before
    assert str((outside / "repo.git").resolve()) not in registered_paths(settings)


def test_a_refused_repository_is_not_registered(celery_worker, celery_app, pk, settings, outside, store_root):
    """Registration after confinement: /etc-like paths sent in a message never become enabled repositories;
    a confined one is registered once its job passed the boundary."""
    res = celery_app.send_task("packyard.verify_repo", kwargs={"repo": str(outside / "repo.git")})
    res.get(timeout=60, propagate=False)
    job = pk.wait_job(res.id)
    assert job.state.value == "FAILURE" and job.repo_id is None
    assert str((outside / "repo.git").resolve()) not in registered_paths(settings)
    inside = make_worktree_repo(store_root)
    res = celery_app.send_task("packyard.verify_repo", kwargs={"repo": str(inside)})
    res.get(timeout=60)
    job = pk.wait_job(res.id)
    assert job.state.value == "SUCCESS" and job.repo_id is not None
    assert str(inside.resolve()) in registered_paths(settings)


def test_submit_knows_only_packyard_tasks(pk, store_root):
    repo = make_worktree_repo(store_root)
    for name in ("celery.starmap", "celery.backend_cleanup"):
        out = subprocess.run(["packyard", "submit", name, "--repo", str(repo)], env=pk.cli_env(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "unknown task" in out.stderr, out.stderr


def test_flower_api_send_task_of_a_builtin_is_refused(tmp_path, celery_worker, celery_app, pk, outside):
    from packyard.workers.cli.children import Child

    credentials = "operator:a-long-test-password-for-flower"
    port = pk.free_port()
    log = open(tmp_path / "flower.log", "wb")
    flower = Child("flower", ["packyard", "flower", "--port", str(port)], pk.cli_env(FLOWER_BASIC_AUTH=credentials),
                   stdout=log)
    auth = "Basic " + base64.b64encode(credentials.encode()).decode()
    base = f"http://127.0.0.1:{port}"
    before = outside_state(outside)

    def post(path: str, body: dict) -> tuple[int, dict | None]:
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": auth, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read().decode() or "null")
        except urllib.error.HTTPError as err:
            return err.code, None
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, None

    try:
        def ready():
            if flower.poll() is not None:
                raise AssertionError((tmp_path / "flower.log").read_text()[-2000:])
            req = urllib.request.Request(base + "/api/workers", headers={"Authorization": auth})
            try:
                with urllib.request.urlopen(req, timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False
        pk.wait_until(ready, 60, interval=0.3, what="flower's HTTP API")
        task, args, kwargs = hostile_calls(outside)[2]        # verify_repo of an outside repository
        sig = dict(celery_app.signature(task, args=args, kwargs=kwargs))
        status, body = post("/api/task/send-task/celery.starmap", {"kwargs": {"task": sig, "it": [args]}})
        assert status == 200 and body and body.get("task-id"), (status, body)
        assert_refused(pk, body["task-id"], "celery.starmap")
    finally:
        flower.stop(timeout=10)
        log.close()
    assert outside_state(outside) == before


def test_repos_lists_and_removes_outside_paths_left_by_older_versions(pk, settings, outside, store_root):
    from packyard.workers.records import registry

    inside = make_worktree_repo(store_root)
    registry.register(settings, str(inside))
    registry.register(settings, "/etc")                     # what an older version registered from a message
    registry.register(settings, str(outside / "repo.git"))
    out = subprocess.run(["packyard", "repos", "list", "--outside", "--json"], env=pk.cli_env(),
                         capture_output=True, text=True, timeout=60)
    listed = {json.loads(line)["path"] for line in out.stdout.splitlines()}
    assert out.returncode == 0 and {"/etc", str((outside / "repo.git").resolve())} <= listed, out
    assert str(inside.resolve()) not in listed
    out = subprocess.run(["packyard", "repos", "remove-outside"], env=pk.cli_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "removed /etc" in out.stdout, out
    paths = registered_paths(settings)
    assert "/etc" not in paths and str(inside.resolve()) in paths
