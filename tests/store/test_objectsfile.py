"""Objects files (git cat-file --batch format): read back exactly what git printed; bad files named by offset."""
from __future__ import annotations

import io

import pytest

from gitutil import git, make_worktree_repo
from packyard.store.errors import InvalidInputError, LimitExceededError
from packyard.store.objects import hash_object
from packyard.store.objectsfile import read_objects_file


def test_reads_what_git_cat_file_batch_prints(tmp_path):
    repo = make_worktree_repo(tmp_path)
    ids = [i for i in git("rev-list", "--objects", "--all", git_dir=repo).decode().split() if len(i) == 40]
    data = git("cat-file", "--batch", git_dir=repo, input="\n".join(ids).encode() + b"\n")
    path = tmp_path / "objects.batch"
    path.write_bytes(data)
    with open(path, "rb", buffering=0) as f:
        objects = read_objects_file(f, where=str(path), max_bytes=len(data))
    assert [hash_object(t, d).hex() for t, d in objects] == ids
    for (t, d), oid in zip(objects, ids):
        assert git("cat-file", t.label.decode(), oid, git_dir=repo) == d


@pytest.mark.parametrize("data, error, message, offset", [
    (b"hello world\n", InvalidInputError, "not a `<id> <type> <size>` header line", 0),
    (b"ab" * 20 + b" missing\n", InvalidInputError, "header line", 0),
    (b"ab" * 20 + b" blob 5\nhi\n", InvalidInputError, "object truncated", 0),
    (b"ab" * 20 + b" blob 2\nhi\n", InvalidInputError, "does not hash to the id", 0),
    (hash_object(3, b"hi").hex().encode() + b" blob 2\nhi\n" + b"x" * 100, InvalidInputError, "header line", 51),
    (hash_object(3, b"hi").hex().encode() + b" blob 2\nhiX", InvalidInputError, "object truncated", 0),
    (b"ab" * 20 + b" blob 99999\n", LimitExceededError, "larger than 1000 bytes", None),
])
def test_bad_files_are_named_never_echoed(data, error, message, offset):
    with pytest.raises(error, match=message) as info:
        read_objects_file(io.BytesIO(data), where="in.batch", max_bytes=1000)
    assert info.value.path == "in.batch" and info.value.offset == offset
    assert "hello" not in str(info.value) and "xxx" not in str(info.value)


def test_size_checked_before_reading(tmp_path):
    path = tmp_path / "big.batch"
    path.write_bytes(b"x" * 5000)
    with open(path, "rb") as f, pytest.raises(LimitExceededError, match="at least 5000"):
        read_objects_file(f, where=str(path), max_bytes=4096)
