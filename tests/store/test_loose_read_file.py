"""Reading a loose file (store/loose.py ``_read_file``): an open and reads to the end, no fstat."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from packyard.store.errors import ObjectMissingError
from packyard.store.loose import READ_CHUNK, LooseObjects
from packyard.store.objects import ObjectType, hash_object


def _write_loose(objects: Path, data: bytes) -> bytes:
    oid = hash_object(ObjectType.BLOB, data)
    path = objects / oid.hex()[:2] / oid.hex()[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zlib.compress(b"blob %d\0" % len(data) + data, 1))
    return oid


@pytest.mark.parametrize("size", [0, 100, READ_CHUNK - 40, READ_CHUNK + 1, 5 * READ_CHUNK + 3, 3_000_000])
def test_a_loose_file_is_read_whole_at_any_size_and_refused_over_the_limit(tmp_path, size):
    lo = LooseObjects(tmp_path)
    data = os.urandom(size)   # (incompressible: the file is about as large as the object)
    oid = _write_loose(tmp_path, data)
    raw = lo.path_for(oid).read_bytes()
    assert lo.read_raw(oid, len(raw)) == raw
    assert lo.read_raw(oid, len(raw) - 1) is None
    assert lo.read(oid) == (ObjectType.BLOB, data)


def test_a_gone_loose_file_is_missing_and_a_directory_in_its_place_is_an_error(tmp_path):
    lo = LooseObjects(tmp_path)
    oid = _write_loose(tmp_path, b"x")
    lo.path_for(oid).unlink()
    with pytest.raises(ObjectMissingError):
        lo.read(oid)
    assert lo.read_raw(oid, 1 << 20) is None
    lo.path_for(oid).mkdir()
    with pytest.raises(IsADirectoryError):
        lo.read(oid)
    assert lo.read_raw(oid, 1 << 20) is None


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_reading_a_loose_file_makes_no_stat_call_on_it(tmp_path):
    oid = _write_loose(tmp_path, b"hello\n" * 1000)
    name = oid.hex()[2:]
    code = ("import sys; from pathlib import Path; from packyard.store.loose import LooseObjects; "
            f"lo = LooseObjects(Path({str(tmp_path)!r})); print(lo.read(bytes.fromhex({oid.hex()!r}))[0])")
    log = tmp_path / "strace.log"
    proc = subprocess.run(["strace", "-f", "-qq", "-y", "-o", str(log), "-e",
                           "trace=openat,read,fstat,newfstatat,statx,close", sys.executable, "-c", code],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    calls = [line.split("(", 1)[0].split()[-1] for line in log.read_text().splitlines() if name in line]
    assert calls[0] == "openat" and calls[-1] == "close", calls
    assert not {"fstat", "newfstatat", "statx"} & set(calls), calls


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_loose_name_that_is_no_regular_file_is_refused_without_reading_forever(tmp_path, kind):
    """A hostile repository's loose name leading to /dev/zero (endless bytes) or a FIFO (an open that would block):
    the read ends with a typed error naming the file, in a child process that would otherwise never return (the raw
    read the prefetch makes gives nothing for the device, the FIFO's empty contents, which no object decodes from)."""
    oid = hash_object(ObjectType.BLOB, b"x")
    path = tmp_path / oid.hex()[:2] / oid.hex()[2:]
    path.parent.mkdir()
    if kind == "device":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)
    code = ("import sys; from pathlib import Path; from packyard.store.loose import LooseObjects; "
            "from packyard.store.errors import CorruptObjectError\n"
            f"lo = LooseObjects(Path({str(tmp_path)!r})); oid = bytes.fromhex({oid.hex()!r})\n"
            f"assert lo.read_raw(oid, 1 << 30) == {None if kind == 'device' else b''!r}\n"
            "try:\n    lo.read(oid)\nexcept CorruptObjectError as err:\n    print(type(err).__name__, err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("CorruptObjectError") and str(path) in proc.stdout, proc.stdout
