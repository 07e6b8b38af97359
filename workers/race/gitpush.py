"""The race harness's real-client pusher: ``git push`` through ``packyard receive-pack`` during repacks.

The other pushes (:mod:`.pushes`) are queued jobs a frontend would submit by name. This one is what a
hosting service's user does: ``git push --porcelain --receive-pack='packyard receive-pack' SERVED
<new>:refs/heads/main`` from the work repository, so git computes the thin pack from the refs packyard
advertises, and packyard's receive-pack takes the repository lease and moves the ref in its own process
(the receive side's in-process mode), recorded as a ``packyard.receive_pack`` job row like every push.

:class:`GitPushRun` has the shape the scheduler polls a Celery result with (``id``, ``ready``,
``successful``, ``result``), so a git push takes its turn among the pushes without a second loop. A push
is successful only when git exits 0 AND its porcelain report says the ref moved to the new commit; a
refusal (``!``), a rejected stale old value or an unpack error is a failed push of the run.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import IO

from packyard.workers.race.pushes import GIT_ENV, Push

#: bytes of git's stderr kept for a failure's message
STDERR_TAIL = 2000


class GitPushFailed(RuntimeError):
    """A real ``git push`` of the race did not move its ref (the message has git's porcelain and stderr)."""


def receive_pack_command() -> str:
    """What git runs on the server side: the installed ``packyard`` script next to this Python, else this
    Python running the CLI's entry (a checkout without the script on PATH)."""
    script = Path(sys.executable).parent / "packyard"
    if script.exists():
        return f"{shlex.quote(str(script))} receive-pack"
    code = "import sys; from packyard.workers.cli import entry; sys.exit(entry())"
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} receive-pack"


class GitPushRun:
    """One ``git push`` in flight (see the module doc); its output goes to files in ``scratch``."""

    def __init__(self, push: Push, work: Path, served: Path, scratch: Path, env: dict[str, str]) -> None:
        self.push = push
        self.id = f"git-push-{push.n:04d}-{uuid.uuid4().hex[:8]}"
        scratch.mkdir(parents=True, exist_ok=True)
        self._out_path, self._err_path = scratch / f"{self.id}.out", scratch / f"{self.id}.err"
        self._out: IO[bytes] = open(self._out_path, "wb")
        self._err: IO[bytes] = open(self._err_path, "wb")
        argv = ["git", "--git-dir", str(work), "push", "--porcelain", f"--receive-pack={receive_pack_command()}",
                str(served), f"{push.new}:{push.ref}"]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
                                      env={**os.environ, **env, **GIT_ENV}, start_new_session=True)
        self._outcome: GitPushFailed | None | bool = False   # False: not finished yet

    def ready(self) -> bool:
        if self._outcome is False and self._proc.poll() is not None:
            self._outcome = self._judge()
        return self._outcome is not False

    def successful(self) -> bool:
        return self.ready() and self._outcome is None

    @property
    def result(self) -> GitPushFailed | None:
        """The failure (None when the push landed), as a Celery result's ``result`` holds the exception."""
        return self._outcome if isinstance(self._outcome, GitPushFailed) else None

    def kill(self) -> None:
        """The run gave up on this push (its job timeout): stop git and the receive-pack it started."""
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, 9)
            except ProcessLookupError:
                pass
            self._proc.wait(30)
        self._close()

    def _close(self) -> None:
        for f in (self._out, self._err):
            f.close()

    def _judge(self) -> GitPushFailed | None:
        self._close()
        out = self._out_path.read_bytes().decode(errors="replace")
        err = self._err_path.read_bytes().decode(errors="replace")
        for path in (self._out_path, self._err_path):
            path.unlink(missing_ok=True)
        moved = any(line.split("\t")[:2] == [" ", f"{self.push.new}:{self.push.ref}"]
                    for line in out.splitlines())
        if self._proc.returncode == 0 and moved:
            return None
        return GitPushFailed(f"git push of {self.push.ref} {self.push.old[:12]}..{self.push.new[:12]} exited "
                             f"{self._proc.returncode}: {out.strip()} {err.strip()[-STDERR_TAIL:]}")
