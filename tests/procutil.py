"""Process helpers shared by the test folders: waiting for a condition, a pid that is surely dead, a call run as
another user, a queued task's outcome (the session's fixtures live in conftest.py; these are plain functions to
import)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Callable


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def spawn_python(script: str, *args: str, fault: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -c script args...`` with text pipes to its stdin and stdout, PACKYARD_FAULT set to ``fault`` (else
    unset, whatever this process has) and ``env`` on top of this process's environment."""
    child_env = {k: v for k, v in os.environ.items() if k != "PACKYARD_FAULT"}
    if fault:
        child_env["PACKYARD_FAULT"] = fault
    child_env.update(env or {})
    return subprocess.Popen([sys.executable, "-c", script, *args], env=child_env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def as_nobody(call: Callable[[], str]) -> str:
    """``call()`` in a forked child running as nobody (uid and gid 65534, no groups); what it returned, or
    ``child failed: <error>``. A fork of this process (already imported: the child need not reach the
    interpreter or the checkout, which may live under a 0700 directory such as /root); needs root."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, run, report through the pipe, exit at once
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write_end, call().encode())
        except BaseException as err:  # reported to the parent
            os.write(write_end, f"child failed: {err!r}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        said = f.read().decode()
    os.waitpid(pid, 0)
    return said


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP: state T in /proc/<pid>/stat); False once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped (until the kernel reuses the number)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def run_task(celery_app: Any, pk: Any, name: str, timeout: float = 120, **kwargs: Any) -> tuple[Any, Any, Any]:
    """Send task ``name`` through the broker, wait for its result: (AsyncResult, value, job row)."""
    res = celery_app.send_task(name, kwargs=kwargs)
    value = res.get(timeout=timeout, propagate=False)
    return res, value, pk.job_row(res.id)


def native_client_or_skip() -> str:
    """The installed ``packyard-receive-pack`` (the C client of a stdio push handed to a server); the test is
    skipped when it was not built (no compiler at install time), and fails instead under PACKYARD_REQUIRE_C=1
    (CI: a program that did not build must not go unnoticed)."""
    import pytest

    from packyard.workers.receive.handoff import NATIVE_CLIENT, native_client

    path = native_client()
    if path is None:
        if os.environ.get("PACKYARD_REQUIRE_C") == "1":
            raise AssertionError(f"{NATIVE_CLIENT} was not installed beside {sys.executable} (PACKYARD_REQUIRE_C=1)")
        pytest.skip(f"{NATIVE_CLIENT} was not built (no C compiler at install time)")
    return path
