"""git's policy hooks for one push, as git 2.39's receive-pack runs them (builtin/receive-pack.c
``run_receive_hook``, ``run_update_hook``, ``run_and_feed_hook``, ``feed_receive_hook``), with a time limit git
does not have.

* **pre-receive** (:meth:`Hooks.pre_receive`): after the pack is indexed into the quarantine and connectivity
  is checked, before the lease and the install; stdin ``<old> <new> <ref>\\n`` for every command (git feeds the
  ones already refused too: ``skip_broken`` is 0); the quarantine in ``GIT_QUARANTINE_PATH`` and
  ``GIT_OBJECT_DIRECTORY``, the repository's objects in ``GIT_ALTERNATE_OBJECT_DIRECTORIES`` (git's
  ``tmp_objdir_env``); ``GIT_PUSH_OPTION_COUNT`` (0 without options) and ``GIT_PUSH_OPTION_<n>``. A refusal
  refuses every command: ``pre-receive hook declined``.
* **update** (:meth:`Hooks.update`): once per ref that passed git's rules, args ``<ref> <old> <new>``, no
  stdin; run after the objects are installed (git runs it after ``tmp_objdir_migrate``, so without the
  quarantine variables, and without the push options). A refusal is ``hook declined`` for that ref.
* **post-receive** (:meth:`Hooks.post_receive`): after the report, stdin for the refs that moved (git's
  ``skip_broken``: not the refused ones, not a delete of a ref that did not exist); its exit status is ignored.

Each hook is spawned without a shell, in the repository's directory (git runs a bare repository's hooks in
its GIT_DIR), in a process group of its own, with git's repository-locating environment of the server removed
(:data:`~packyard.workers.commands.upload_pack.LOCAL_ENV`) and ``GIT_DIR`` set. Its stdout and stderr go, as they
come, to ``emit`` (the session sends them on side band 2, else to its stderr: git's ``copy_to_sideband`` /
``stdout_to_stderr``). Its stdin is fed without blocking and then closed; a hook that exits without reading it
(EPIPE) is not a failure, as git ignores SIGPIPE there. At ``timeout`` seconds (PACKYARD_RECEIVE_HOOK_TIMEOUT)
the whole process group is killed with SIGKILL: the run is a refusal and is recorded as timed out. A hook
that cannot be started is a refusal too (a policy hook the server names must run; git skips only a hook
file that is absent).
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from packyard.workers.receive.refrules import Command

#: Bytes read from a hook's output at a time, each read one side-band packet as it comes (git's
#: copy_to_sideband reads 128, so the packets are the same as git's).
READ_CHUNK = 128
#: Seconds of silence from a hook before a keepalive packet (git's receive.keepAlive default, 5).
KEEPALIVE_INTERVAL = 5.0
#: Bytes written to a hook's stdin per write.
WRITE_CHUNK = 65536
#: Seconds to reap a process group's leader after SIGKILL (the kernel's part; a bound, not a wait).
REAP_AFTER_KILL = 10.0


@dataclass(frozen=True)
class HookConfig:
    """The hooks the server's settings name (nothing in a push chooses one)."""

    pre_receive: Path | None = None
    update: Path | None = None
    post_receive: Path | None = None
    timeout: float = 60.0
    keepalive: float = KEEPALIVE_INTERVAL   # seconds of a hook's silence before a keepalive (0: never)

    @classmethod
    def from_settings(cls, s: Any) -> "HookConfig":
        return cls(pre_receive=s.receive_pre_receive_hook, update=s.receive_update_hook,
                   post_receive=s.receive_post_receive_hook, timeout=s.receive_hook_timeout,
                   keepalive=s.receive_keepalive)


@dataclass
class HookRun:
    """One run of one hook: what the job row and the report say about it."""

    hook: str                      # git's name: pre-receive, update, post-receive
    ref: str | None = None         # the update hook's ref
    status: int | None = None      # exit status (negative: the signal that ended it), None: not run to the end
    timed_out: bool = False
    error: str | None = None       # why it could not be started
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 0 and not self.timed_out and self.error is None

    def describe(self) -> str:
        what = f"{self.hook} hook" + (f" for {self.ref}" if self.ref else "")
        if self.timed_out:
            return f"{what} timed out after {self.elapsed:.1f} s and was killed (PACKYARD_RECEIVE_HOOK_TIMEOUT)"
        if self.error is not None:
            return f"{what}: {self.error}"
        return f"{what} exited with {self.status}"


def hook_input(commands: Sequence[Command]) -> bytes:
    """``feed_receive_hook``'s lines: ``<old> <new> <ref>\\n`` per command, in the push's order."""
    return b"".join(f"{c.old} {c.new} ".encode() + c.ref + b"\n" for c in commands)


class Hooks:
    """The hooks of one push. ``emit(bytes)``: where their output goes as it comes; ``before_run()``: called
    before each run; ``keepalive()``: called after ``config.keepalive`` seconds without output from a running
    hook (git's copy_to_sideband sends ``0005\\1`` then). ``bind`` names the repository before a hook runs;
    ``quarantine`` is set while the objects are in one (the pre-receive)."""

    def __init__(self, config: HookConfig, *, emit: Callable[[bytes], None], push_options: Sequence[str] = (),
                 before_run: Callable[[], None] | None = None, keepalive: Callable[[], None] | None = None) -> None:
        self.config = config
        self.emit = emit
        self.before_run = before_run
        self.keepalive = keepalive if config.keepalive > 0 else None
        self.keepalive_interval = config.keepalive
        self.push_options = [o.split("\0", 1)[0] for o in push_options]   # (git's %s stops at a NUL)
        self.runs: list[HookRun] = []
        self.git_dir: Path | None = None
        self.objects_dir: Path | None = None
        self.alternates: tuple[Path, ...] = ()
        self.quarantine: Path | None = None

    @property
    def wants_quarantine(self) -> bool:
        """A pre-receive is configured: it reads the incoming objects from the quarantine."""
        return self.config.pre_receive is not None

    def bind(self, git_dir: str | os.PathLike[str], objects_dir: str | os.PathLike[str],
             alternates: Sequence[str | os.PathLike[str]] = ()) -> None:
        self.git_dir = Path(git_dir)
        self.objects_dir = Path(objects_dir)
        self.alternates = tuple(Path(a) for a in alternates)

    # -- the three hooks ----------------------------------------------------------------------------
    def pre_receive(self, commands: Sequence[Command]) -> bool:
        """False: the hook refused (or timed out, or could not start); the caller refuses every command."""
        if self.config.pre_receive is None or not commands:
            return True
        run = self._run("pre-receive", [str(self.config.pre_receive)], hook_input(commands), receive=True)
        return run.ok

    def update(self, cmd: Command) -> bool:
        """False: the hook refused this ref (``hook declined``)."""
        if self.config.update is None:
            return True
        run = self._run("update", [str(self.config.update), cmd.name, cmd.old, cmd.new], None, receive=False,
                        ref=cmd.name)
        return run.ok

    def post_receive(self, commands: Sequence[Command]) -> None:
        """After the report: the refs that moved; the outcome is only recorded."""
        moved = [c for c in commands if c.error is None and not c.did_not_exist]
        if self.config.post_receive is None or not moved:
            return
        self._run("post-receive", [str(self.config.post_receive)], hook_input(moved), receive=True)

    # -- records ------------------------------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        """For the job row: runs, refusals, time-outs, and what timed out (named)."""
        out: dict[str, Any] = {}
        if not self.runs:
            return out
        out["hooks_run"] = len(self.runs)
        out["hooks_refused"] = sum(not r.ok for r in self.runs if r.hook != "post-receive")
        out["hooks_timed_out"] = sum(r.timed_out for r in self.runs)
        timed_out = [r.describe() for r in self.runs if r.timed_out]
        if timed_out:
            out["hook_timeout"] = "; ".join(timed_out)
        return out

    # -- running one ------------------------------------------------------------------------------
    def environment(self, *, receive: bool) -> dict[str, str]:
        """The server's environment without git's repository-locating variables, then git's for the hook."""
        from packyard.workers.commands.upload_pack import LOCAL_ENV

        assert self.git_dir is not None and self.objects_dir is not None, "Hooks.bind first"
        env = {k: v for k, v in os.environ.items() if k not in LOCAL_ENV and not k.startswith("GIT_PUSH_OPTION_")}
        env["GIT_DIR"] = str(self.git_dir)
        if receive:
            for i, option in enumerate(self.push_options):
                env[f"GIT_PUSH_OPTION_{i}"] = option
            env["GIT_PUSH_OPTION_COUNT"] = str(len(self.push_options))
        if self.quarantine is not None:
            env["GIT_QUARANTINE_PATH"] = env["GIT_OBJECT_DIRECTORY"] = str(self.quarantine)
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = os.pathsep.join(
                str(p) for p in (self.objects_dir, *self.alternates))
        return env

    def _run(self, hook: str, argv: list[str], stdin: bytes | None, *, receive: bool,
             ref: str | None = None) -> HookRun:
        run = HookRun(hook, ref)
        self.runs.append(run)
        if self.before_run is not None:   # (the session sends the messages so far: git's order in time)
            self.before_run()
        started = time.monotonic()
        deadline = started + self.config.timeout
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.git_dir,
                                    env=self.environment(receive=receive), start_new_session=True, close_fds=True)
        except OSError as err:
            run.error = f"cannot run {argv[0]}: {err.strerror}"
            self.emit(f"error: {run.describe()}\n".encode("utf-8", "surrogateescape"))
            return run
        finished = False
        try:
            finished = self._pump(proc, stdin or b"", deadline)
        finally:
            if not finished:
                _kill_group(proc)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:
                        pass
            run.elapsed = time.monotonic() - started
        if finished:
            run.status = proc.returncode
        else:
            run.timed_out = True
            self.emit(f"error: {run.describe()}\n".encode("utf-8", "surrogateescape"))
        return run

    def _pump(self, proc: subprocess.Popen[bytes], stdin: bytes, deadline: float) -> bool:
        """Feed stdin and pass the output on, both without blocking, until the output ends and the hook has
        exited; False when the deadline came first. Bounded by the deadline: every wait is up to it."""
        assert proc.stdout is not None
        out_fd = proc.stdout.fileno()
        os.set_blocking(out_fd, False)
        pending = memoryview(stdin)
        with selectors.DefaultSelector() as sel:
            sel.register(out_fd, selectors.EVENT_READ)
            in_fd = -1
            if proc.stdin is not None:
                if pending:
                    in_fd = proc.stdin.fileno()
                    os.set_blocking(in_fd, False)
                    sel.register(in_fd, selectors.EVENT_WRITE)
                else:
                    proc.stdin.close()
            quiet_since = time.monotonic()
            while sel.get_map():
                now = time.monotonic()
                remaining = deadline - now
                if remaining <= 0:
                    return False
                wait = remaining
                if self.keepalive is not None:
                    if now - quiet_since >= self.keepalive_interval:
                        self.keepalive()
                        quiet_since = now
                    wait = min(remaining, quiet_since + self.keepalive_interval - now)
                for key, _events in sel.select(wait):
                    if key.fd == in_fd:
                        try:
                            pending = pending[os.write(in_fd, pending[:WRITE_CHUNK]):]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:   # the hook stopped reading: not an error (git: SIGPIPE ignored)
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(in_fd)
                            assert proc.stdin is not None
                            try:
                                proc.stdin.close()
                            except OSError:
                                pass
                            in_fd = -1
                    else:
                        try:
                            data = os.read(out_fd, READ_CHUNK)
                        except BlockingIOError:
                            continue
                        if data:
                            self.emit(data)
                            quiet_since = time.monotonic()
                        else:
                            sel.unregister(out_fd)
        while True:   # the output has ended: the exit, still with keepalives (bounded by the deadline)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                proc.wait(timeout=min(remaining, self.keepalive_interval) if self.keepalive else remaining)
                return True
            except subprocess.TimeoutExpired:
                if self.keepalive is not None:
                    self.keepalive()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the hook's whole process group (it leads it: start_new_session), then reap the leader."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=REAP_AFTER_KILL)
    except subprocess.TimeoutExpired:   # pragma: no cover - SIGKILL cannot be caught
        pass
