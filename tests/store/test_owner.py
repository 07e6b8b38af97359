"""store.owner: owner records on claim files, and telling a dead owner from a live one."""
from __future__ import annotations

import os
import subprocess
import sys

from packyard.store import owner as ow
from procutil import dead_pid as _dead_pid


def test_record_round_trips_and_names_the_bound_job():
    with ow.bind_job("job-123"):
        me = ow.current_owner()
    assert me.pid == os.getpid() and me.job == "job-123"
    assert ow.Owner.decode(me.encode() + b"rest of a .keep message\n") == me
    assert ow.current_owner().job is None


def test_files_without_a_record_have_no_owner(tmp_path):
    for content in (b"", b"0123456789abcdef0123456789abcdef01234567\n", b"{not json", b'{"pid": 1}\n',
                    b"x" * 10000):
        p = tmp_path / "f"
        p.write_bytes(content)
        assert ow.read_owner(p) is None
    assert ow.read_owner(tmp_path / "absent") is None


def test_liveness_of_self_dead_reused_and_foreign_owners():
    me = ow.current_owner()
    assert ow.liveness(me) is ow.Liveness.ALIVE
    dead = ow.Owner(pid=_dead_pid(), host=me.host, boot=me.boot, start=1)
    assert ow.liveness(dead) is ow.Liveness.DEAD
    reused = ow.Owner(pid=me.pid, host=me.host, boot=me.boot, start=(me.start or 0) + 1)
    assert ow.liveness(reused) is ow.Liveness.DEAD
    rebooted = ow.Owner(pid=me.pid, host=me.host, boot="another-boot", start=me.start)
    assert ow.liveness(rebooted) is ow.Liveness.DEAD
    assert ow.liveness(ow.Owner(pid=me.pid, host=me.host + "-elsewhere")) is ow.Liveness.UNKNOWN


def test_a_zombie_is_dead():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = ow.process_start_ticks(proc.pid)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)   # exited, not yet reaped: a zombie
    try:
        assert ow.liveness(ow.Owner(pid=proc.pid, host=ow.current_owner().host, start=start)) is ow.Liveness.DEAD
    finally:
        proc.wait()
