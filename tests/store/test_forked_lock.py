"""store/forked.py's PipeLock: the lock forked resolver processes share (index-pack's claim of the next roots)."""
from __future__ import annotations

import mmap
import os
import struct

from packyard.store.forked import PipeLock


def test_pipe_lock_excludes_forked_children() -> None:
    """Children that increment one shared counter by read-modify-write under the lock lose no increment."""
    counter = mmap.mmap(-1, 8)
    lock = PipeLock()
    children, rounds = 3, 2000
    pids = []
    try:
        for _ in range(children):
            pid = os.fork()
            if pid == 0:   # child: never returns
                code = 0
                try:
                    for _ in range(rounds):
                        with lock:
                            (v,) = struct.unpack_from("<q", counter, 0)
                            os.sched_yield()   # invite the others in: without the lock they would overwrite
                            struct.pack_into("<q", counter, 0, v + 1)
                except BaseException:
                    code = 1
                os._exit(code)
            pids.append(pid)
        for pid in pids:
            _pid, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        lock.close()
    assert struct.unpack_from("<q", counter, 0)[0] == children * rounds


def test_pipe_lock_can_be_taken_again_after_release() -> None:
    lock = PipeLock()
    try:
        for _ in range(3):
            with lock:
                pass
    finally:
        lock.close()
