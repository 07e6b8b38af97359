"""One push over a byte stream, as git 2.39's ``receive-pack`` speaks protocol v0/v1 (builtin/receive-pack.c
``cmd_receive_pack``): the advertisement, the commands (capabilities on the first), push options, the pack,
then the report (``report-status`` or ``report-status-v2``), on side band 1 with ``side-band-64k`` and
the ``error:`` lines on side band 2. Exit status as git's: 0 once a report is sent (refused refs too),
128 after ``fatal:`` (a protocol error, a repository that is not one).
"""
from __future__ import annotations

import functools
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

from packyard.store.errors import StoreError
from packyard.workers.receive.hooks import HookConfig, Hooks
from packyard.workers.receive.packstream import PackStream
from packyard.workers.receive.pktline import PktReader, ProtocolError, flush_pkt, pkt, sideband
from packyard.workers.receive.refrules import Command, Rules, ref_is_hidden

CAPABILITIES = ("report-status", "report-status-v2", "delete-refs", "side-band-64k", "quiet", "atomic",
                "ofs-delta", "push-options", "object-format=sha1")
KIND = "packyard.receive_pack"
KEEPALIVE = b"0005\x01"   # copy_to_sideband's: band 1, no data
EXIT_FATAL = 128


@functools.cache
def agent() -> str:
    """``packyard/<version>``, read once per process (the package's metadata: 1 ms a read)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"packyard/{version('packyard')}"
    except PackageNotFoundError:   # pragma: no cover - an uninstalled checkout
        return "packyard/unknown"


def advertisement(repo: Any, rules: Rules, *, version1: bool) -> bytes:
    """``write_head_info``: refs sorted by name (hidden ones left out), ``.have`` for ids of the
    alternates' refs not already shown, ``capabilities^{}`` when there is no line to carry them."""
    caps = " ".join((*CAPABILITIES, f"agent={agent()}"))
    lines: list[tuple[str, str]] = []
    seen: set[bytes] = set()
    for name, oid in sorted(repo.refs.as_dict().items(), key=lambda kv: kv[0].encode()):
        if ref_is_hidden(name, rules.hide_refs):
            continue
        seen.add(oid)
        lines.append((oid.hex(), name))
    from packyard.store.refs import RefStore

    for alt in repo.alternates.paths:
        try:
            alt_refs = RefStore(alt.parent).as_dict()
        except (StoreError, OSError):
            continue
        for _name, oid in sorted(alt_refs.items(), key=lambda kv: kv[0].encode()):
            if oid not in seen:
                seen.add(oid)
                lines.append((oid.hex(), ".have"))
    if not lines:
        lines.append(("0" * 40, "capabilities^{}"))
    out = [pkt(b"version 1\n")] if version1 else []
    first, *rest = lines
    out.append(pkt(f"{first[0]} {first[1]}\0{caps}\n".encode()))
    out.extend(pkt(f"{h} {n}\n".encode()) for h, n in rest)
    out.append(flush_pkt())
    return b"".join(out)


@dataclass
class Request:
    commands: list[Command] = field(default_factory=list)
    features: set[str] = field(default_factory=set)
    shallow: list[str] = field(default_factory=list)
    push_options: list[str] = field(default_factory=list)

    @property
    def sideband(self) -> bool:
        return "side-band-64k" in self.features


def _hex40(text: bytes) -> str | None:
    try:
        value = text.decode("ascii")
    except UnicodeDecodeError:
        return None
    return value if len(value) == 40 and all(c in "0123456789abcdef" for c in value) else None


def read_request(reader: PktReader, *, max_commands: int, max_options: int) -> Request:
    """``read_head_info`` and ``read_push_options``; protocol errors as git words them."""
    req = Request()
    for line in reader.read_section(max_commands, "commands"):
        if len(line) > 8 and line.startswith(b"shallow "):
            if _hex40(line[8:48]) is None:
                raise ProtocolError(f"protocol error: expected shallow sha, got '{line[8:].decode('latin-1')}'")
            req.shallow.append(line[8:48].decode())
            continue
        text, nul, feats = line.partition(b"\0")
        if nul:
            req.features.update(f.decode("latin-1") for f in feats.split(b" ") if f)
            fmt = [f for f in req.features if f.startswith("object-format=")]
            if fmt and fmt[0] != "object-format=sha1":
                raise ProtocolError(f"error: unsupported object format '{fmt[0].partition('=')[2]}'")
        old, new = _hex40(text[:40]), _hex40(text[41:81])
        if old is None or new is None or text[40:41] != b" " or text[81:82] != b" " or len(text) < 83:
            raise ProtocolError(f"protocol error: expected old/new/ref, got '{text.decode('latin-1')}'")
        req.commands.append(Command(old, new, text[82:]))
    if req.commands and "push-options" in req.features:
        req.push_options = [o.decode("utf-8", "surrogateescape")
                            for o in reader.read_section(max_options, "push options")]
    return req


def report(req: Request, unpack_error: str | None) -> bytes:
    """``report`` / ``report_v2`` (no proc-receive: no option lines), framed for the client."""
    if not ({"report-status", "report-status-v2"} & req.features):
        return b""
    body = [pkt(f"unpack {unpack_error or 'ok'}\n".encode())]
    for cmd in req.commands:
        if cmd.error is None:
            body.append(pkt(b"ok " + cmd.ref + b"\n"))
        else:
            body.append(pkt(b"ng " + cmd.ref + b" " + cmd.error.encode() + b"\n"))
    body.append(flush_pkt())
    data = b"".join(body)
    return sideband(1, data) if req.sideband else data


def messages(req: Request, extra: list[str]) -> bytes:
    """The ``error:`` / ``warning:`` lines (rp_error / rp_warning) on side band 2 or for stderr."""
    lines = list(extra)
    for cmd in req.commands:
        lines += [m if m.startswith(("warning: ", "error: ", "fatal: ")) else f"error: {m}" for m in cmd.messages]
    return "".join(f"{line}\n" for line in lines).encode("utf-8", "surrogateescape")


def open_target(repo_arg: str, s: Any) -> tuple[str, Any]:
    """(resolved path, repository) for ``repo_arg`` if it lies inside a storage root (StoreError if not)."""
    from packyard.workers.confine import Confinement
    from packyard.workers.repos import open_repository

    path = Confinement.from_settings(s).repository(repo_arg)
    return path, open_repository(path, s)


def rules_from(s: Any) -> Rules:
    return Rules(deny_deletes=s.receive_deny_deletes, deny_non_fast_forwards=s.receive_deny_non_fast_forwards,
                 hide_refs=s.receive_hide_refs)


def _fatal(stderr: BinaryIO, text: str) -> int:
    stderr.write(f"fatal: {text}\n".encode("utf-8", "surrogateescape"))
    stderr.flush()
    return EXIT_FATAL


def serve(repo_arg: str, in_fd: int, stdout: BinaryIO, stderr: BinaryIO, *,
          advertise_only: bool = False, stateless: bool = False, git_protocol: str | None = None) -> int:
    """Run ``packyard receive-pack REPO`` on these streams; returns the exit status. ``git_protocol``: the
    client's GIT_PROTOCOL (default: this process's environment's)."""
    from packyard.workers.settings import get_settings

    s = get_settings()
    try:
        path, repo = open_target(repo_arg, s)
    except StoreError as err:
        return _fatal(stderr, f"'{repo_arg}' does not appear to be a git repository ({err})")
    rules = rules_from(s)
    if git_protocol is None:
        git_protocol = os.environ.get("GIT_PROTOCOL", "")
    version1 = "version=1" in git_protocol.split(":")
    if advertise_only or not stateless:
        stdout.write(advertisement(repo, rules, version1=version1))
        stdout.flush()
    if advertise_only:
        return 0
    stdin = os.fdopen(in_fd, "rb", buffering=0, closefd=False)   # unbuffered: the pack follows the packets
    pack = PackStream(in_fd, idle_timeout=s.receive_idle_timeout, where=f"pack pushed to {repo_arg}")
    return exchange(path, repo_arg, stdin, pack, stdout, stderr, rules, s, idle_timeout=s.receive_idle_timeout)


def exchange(path: str, repo_arg: str, stream: BinaryIO, pack: Any, stdout: BinaryIO, stderr: BinaryIO,
             rules: Rules, s: Any, *, idle_timeout: float | None = None) -> int:
    """Everything after the advertisement: the commands and push options read from ``stream``, the pack
    read from ``pack`` (the same bytes' continuation: a :class:`PackStream` on a pipe, the rest of an HTTP
    request body), the push, the report on ``stdout``. Stateless (smart HTTP) and stdio share it.
    ``idle_timeout``: how long a client on a pipe may be silent (stdio); None for a request body the HTTP
    server reads."""
    reader = PktReader(stream, where=f"receive-pack {repo_arg}", idle_timeout=idle_timeout)
    try:
        req = read_request(reader, max_commands=s.receive_max_commands, max_options=s.receive_max_commands)
    except StoreError as err:
        return _fatal(stderr, str(err))
    if not req.commands:
        return 0
    sink = _HookSink(req, stdout, stderr)
    hooks: Hooks | None = None
    if s.receive_mode == "queue":   # the worker runs the hooks too; their output comes back with the result
        from packyard.workers.receive.queued import run_push_queued

        def keepalive() -> None:   # git's "0005\1": an empty packet on band 1, only to side-band clients
            if req.sideband:
                sink.keepalive()

        unpack_error, extra, hook_output = run_push_queued(path, req, pack, s, keepalive, emit=sink.write)
        if hook_output:
            sink.write(hook_output)
        finish = _nothing
    else:
        hooks = Hooks(HookConfig.from_settings(s), emit=sink.write, before_run=sink.flush_messages,
                      keepalive=sink.keepalive if req.sideband else None, push_options=req.push_options)
        unpack_error, extra, finish = run_push(path, req, rules, pack, s, hooks=hooks)
    try:
        out = report(req, unpack_error)
        notes = sink.take_messages(extra)
        if req.sideband:
            if notes:   # git's rp_error / rp_warning: sent whether or not the client asked for quiet
                stdout.write(b"".join(sideband(2, line) for line in notes.splitlines(keepends=True)))
            stdout.write(out)
        else:
            if notes:
                stderr.write(notes)
                stderr.flush()
            stdout.write(out)
        stdout.flush()
        if hooks is not None:
            hooks.post_receive(req.commands)   # git: after the report, its output still on side band 2, then the flush
    finally:
        finish()                               # the job row, with the post-receive's run, before the client is let go
    if req.sideband:
        stdout.write(flush_pkt())
        stdout.flush()
    return 0


class _HookSink:
    """Where the hooks' stdout and stderr go as they come: side band 2 with side-band-64k (``remote: ...`` in
    git push's output), else this process's stderr, as git's receive-pack sends them."""

    def __init__(self, req: Request, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.req, self.stdout, self.stderr = req, stdout, stderr

    def write(self, data: bytes, *, lines: bool = False) -> None:
        if self.req.sideband:
            chunks = data.splitlines(keepends=True) if lines else [data]
            self.stdout.write(b"".join(sideband(2, chunk) for chunk in chunks))
            self.stdout.flush()
        else:
            self.stderr.write(data)
            self.stderr.flush()

    def keepalive(self) -> None:
        """git's keepalive while a hook is silent: an empty packet on side band 1."""
        self.stdout.write(KEEPALIVE)
        self.stdout.flush()

    def take_messages(self, extra: list[str]) -> bytes:
        """:func:`messages` not sent yet, taken off the commands (each is sent once)."""
        notes = messages(self.req, extra)
        for cmd in self.req.commands:
            cmd.messages.clear()
        return notes

    def flush_messages(self) -> None:
        """Before a hook runs: the ``error:``/``warning:`` lines so far (git sends each as it happens, so they
        come before the hook's output)."""
        notes = self.take_messages([])
        if notes:
            self.write(notes, lines=True)


def _nothing() -> None:
    return None


def run_push(path: str, req: Request, rules: Rules, stdin: Any, s: Any,
             hooks: Hooks | None = None) -> tuple[str | None, list[str], Callable[[], None]]:
    """The push as a recorded job in this process (PACKYARD_RECEIVE_MODE=process): one job row with the
    commands and push options as its params, the verdicts as its counters (and the hooks' runs: a hook
    killed at its time limit is named in ``hook_timeout``); the job itself is the queued mode's
    (commands/receive_pack.py's ``push_job``), so the row is the same either way. Returns (unpack error,
    messages, finish): ``finish()`` records a push that went through once the post-receive has run (a failed
    one is recorded already, and ``finish`` does nothing)."""
    from packyard.workers.commands.receive_pack import push_counters, push_job, unpack_failure
    from packyard.workers.records import task_runs as recording

    extra: list[str] = []
    if req.shallow:
        for cmd in req.commands:
            cmd.error = "shallow update not allowed"
        return None, extra, _nothing
    task_id = f"receive-{uuid.uuid4()}"
    params = [c.as_param() for c in req.commands]
    kwargs = {"repo": path, "commands": params, "push_options": req.push_options, "atomic": "atomic" in req.features}
    started = time.monotonic()
    recording.job_started(task_id, KIND, (), kwargs, os.uname().nodename)
    delete_only = all(c.is_delete for c in req.commands)
    try:
        result = push_job(path, None if delete_only else stdin, req.commands, atomic="atomic" in req.features,
                          push_options=req.push_options, lock=_lock(path, s), hooks=hooks)
    except Exception as exc:   # the lease, the records: every command fails, as git's failed transaction does
        recording.job_finished(task_id, KIND, (), kwargs, started, exc=exc)
        for cmd in req.commands:
            if cmd.error is None:
                cmd.error = "failed to update ref"
        return None, [f"error: {type(exc).__name__}: {exc}"], _nothing
    except BaseException as exc:
        recording.job_finished(task_id, KIND, (), kwargs, started, exc=exc)
        raise
    if result["unpack"] is not None:
        extra.append(f"fatal: {result['unpack_detail']}")
        recording.job_finished(task_id, KIND, (), kwargs, started, exc=unpack_failure(result))
        return result["unpack"], extra, _nothing

    def finish() -> None:
        recording.job_finished(task_id, KIND, (), kwargs, started,
                               result={**result, "counters": push_counters(result["counters"], req.commands, hooks),
                                       "refs": {c.name: c.error or "ok" for c in req.commands}})
    return None, extra, finish


def _lock(path: str, s: Any):  # type: ignore[no-untyped-def]
    from packyard.workers.commands.index_pack import redis_repo_lock

    return redis_repo_lock(path)
