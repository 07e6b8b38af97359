"""Issue 16: an object's type in write_objects. A message (the frontend API, JSON) names it: "commit", "tree",
"blob", "tag", as git's own text interfaces do (`git hash-object -t`); a number or null is an
InvalidInputError naming the object and the value. The store's Python API also takes git's type numbers
1-4 (ObjectType is an IntEnum of them); anything else there is the same typed error, never a ValueError."""
from __future__ import annotations

import base64
import json
import subprocess

import pytest

from gitutil import git


def _obj(kind, data: bytes = b"hello\n") -> dict:
    return {"type": kind, "data": base64.b64encode(data).decode()}


@pytest.mark.parametrize("kind", [3, 5, 0, None, True, 1.0, "3", "Blob", "delta", [], {}])
def test_a_message_names_types_and_nothing_else(kind):
    from packyard.store.errors import InvalidInputError
    from packyard.workers.commands.write_objects import decode_objects

    with pytest.raises(InvalidInputError) as err:
        decode_objects([_obj("blob"), _obj(kind)])
    assert str(err.value).startswith(f"object #1: type {json.dumps(kind)} is not an object type name"), err.value
    assert decode_objects([_obj(name) for name in ("blob", "tree", "commit", "tag")])   # the names pass


def test_git_takes_names_not_numbers_for_a_type(tmp_path):
    """The oracle for the message rule: git's textual interface refuses a type number."""
    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    assert git("hash-object", "-t", "blob", "--stdin", git_dir=bare, input=b"hello\n").strip()
    for number in (b"3", b"5"):
        proc = subprocess.run(["git", "--git-dir", str(bare), "hash-object", "-t", number.decode(), "--stdin"],
                              input=b"hello\n", capture_output=True)
        assert proc.returncode != 0 and b"invalid object type" in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", [5, 0, -1, None, True, "Blob", b"blobs", 3.0])
def test_store_api_refuses_what_is_not_a_type_naming_the_object(tmp_path, kind):
    from packyard.store.batch.api import write_objects
    from packyard.store.errors import InvalidInputError
    from packyard.store.repo import Repository

    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    with pytest.raises(InvalidInputError) as err:
        write_objects(Repository.open(bare), [("blob", b"first\n"), (kind, b"second\n")])
    assert f"object #1: {kind!r} is not an object type" in str(err.value)
    assert git("count-objects", git_dir=bare).startswith(b"0 objects"), "nothing is written before the check"


def test_store_api_takes_git_type_numbers_as_git_does(tmp_path):
    from packyard.store.batch.api import write_objects
    from packyard.store.objects import ObjectType
    from packyard.store.repo import Repository

    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    results, _ = write_objects(Repository.open(bare), [(3, b"three\n"), ("blob", b"name\n"),
                                                        (ObjectType.BLOB, b"enum\n")])
    for (oid, _), data in zip(results, (b"three\n", b"name\n", b"enum\n")):
        assert git("hash-object", "--stdin", input=data).decode().strip() == oid.hex()
        assert git("cat-file", "-t", oid.hex(), git_dir=bare).strip() == b"blob"


@pytest.mark.parametrize("kind", [3, 5, None])
def test_cli_prints_the_error_not_a_traceback(tmp_path, pk, kind):
    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    out = subprocess.run(["packyard", "write-objects", "--repo", str(bare), "--no-progress"],
                         input=json.dumps([_obj("blob"), _obj(kind)]), env=pk.cli_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr == (f"packyard write-objects: InvalidInputError: object #1: type {json.dumps(kind)} is not an "
                          "object type name (want one of commit, tree, blob, tag; numbers are not taken)\n")
    assert git("count-objects", git_dir=bare).startswith(b"0 objects")


def test_a_queued_job_with_a_type_number_fails_typed(celery_worker, celery_app, pk, store_root):
    repo = store_root / "r.git"
    git("init", "-q", "--bare", str(repo))
    res = celery_app.send_task("packyard.write_objects", kwargs={"repo": str(repo), "objects": [_obj(3)]})
    res.get(timeout=120, propagate=False)
    job = pk.job_row(res.id)
    assert job.state.value == "FAILURE" and job.error_type == "InvalidInputError", (job.state, job.error)
    assert "object #0: type 3 is not an object type name" in job.error
    assert git("count-objects", git_dir=repo).startswith(b"0 objects")
