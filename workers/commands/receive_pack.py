"""receive_pack as a plain function: one push's pack and commands into the repository.

The same pipeline as every other ingest (:func:`.index_pack.index_pack`): the pack is received into a
quarantine through :class:`~packyard.store.pack.indexpack.IncomingPack` with the server's fsck
(``--strict``, thin bases fixed); then, under the repository lease (``lock``), the pack is installed,
git's rules are applied to each command (:mod:`packyard.workers.receive.refrules`, after the objects
are in place, as git's receive-pack applies them after ``tmp_objdir_migrate``) and the commands that
pass move in ONE ref transaction fenced by the lease's token. With ``atomic`` any failure fails all.
Returns each command's verdict (git's ``error_string``) for the report.

With ``hooks`` (:mod:`packyard.workers.receive.hooks`), git's order (``execute_commands``): the pre-receive runs
after the connectivity check, before the lease and the install, with the quarantine readable by git; the
update hook runs for each ref once git's rules pass, under the lease after the install (git: after
``tmp_objdir_migrate``). The post-receive is the session's, after the report.
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, BinaryIO, Sequence

from packyard.store.errors import InvalidInputError, StoreError
from packyard.store.fsck import FsckOptions
from packyard.store.objects import ZERO_OID
from packyard.store.pack.indexpack import IncomingPack
from packyard.store.progress import Progress
from packyard.store.refs import RefUpdate
from packyard.workers.commands.index_pack import LockFactory, index_pack_counters
from packyard.workers.receive.hooks import Hooks
from packyard.workers.receive.refrules import ZERO_HEX, Command, Rules, judge, reject_hidden, stale_reason
from packyard.workers.repos import open_repository

#: Commits visited by one fast-forward check at most (git walks without a bound; a bound is a refusal).
MAX_ANCESTRY_WALK = 2_000_000


def _ancestry(objects: Any):  # type: ignore[no-untyped-def]
    from packyard.store.maintenance.walk.parse import parse_commit
    from packyard.store.objects import ObjectType

    def is_ancestor(old_hex: str, new_hex: str) -> bool | None:
        old, new = bytes.fromhex(old_hex), bytes.fromhex(new_hex)
        try:
            if objects.read_header(old)[0] != ObjectType.COMMIT or objects.read_header(new)[0] != ObjectType.COMMIT:
                return None
            seen = {new}
            todo = [new]
            while todo:
                oid = todo.pop()
                if oid == old:
                    return True
                if len(seen) > MAX_ANCESTRY_WALK:
                    return False
                _t, data = objects.read(oid)
                for parent in parse_commit(data, oid)[1]:
                    if parent not in seen:
                        seen.add(parent)
                        todo.append(parent)
        except StoreError:
            return None
        return False
    return is_ancestor


def _type_of(objects: Any):  # type: ignore[no-untyped-def]
    def type_of(hex_id: str) -> str | None:
        try:
            return objects.read_header(bytes.fromhex(hex_id))[0].label.decode()
        except StoreError:
            return None
    return type_of


def receive_pack(repo: str | Path, pack: BinaryIO | None, commands: Sequence[Command], *, atomic: bool = False,
                 rules: Rules | None = None, fsck: FsckOptions | None = None, max_pack_bytes: int | None = None,
                 progress: Progress | None = None, lock: LockFactory | None = None,
                 hooks: Hooks | None = None) -> dict[str, Any]:
    """Apply one push. ``commands`` get their ``error`` set (None: the ref moved). ``pack``: the client's
    pack stream (None for a delete-only push). Returns ``{"unpack": None | error, "pack": ..., "counters"}``;
    a bad pack is ``unpack`` (git: "index-pack abnormal exit") with every command "unpacker error", and
    the typed error's text in ``unpack_detail``; nothing installed, no ref moved."""
    rules = rules or Rules()
    r = open_repository(repo)
    out: dict[str, Any] = {"repo": str(r.path), "unpack": None, "pack": None, "counters": {}}
    reject_hidden(commands, rules)
    incoming: IncomingPack | None = None
    if pack is not None:
        try:
            incoming = IncomingPack.begin(r, pack, fix_thin=True, strict=True, fsck=fsck,
                                          max_pack_bytes=max_pack_bytes, progress=progress)
        except StoreError as err:
            out["unpack"] = "index-pack abnormal exit"
            out["unpack_detail"] = f"{type(err).__name__}: {err}"
            for cmd in commands:
                cmd.error = "unpacker error"
            return out
    with incoming if incoming is not None else nullcontext():
        for cmd in commands:   # git's connectivity check: a new value must be in the pack or the repository
            if cmd.error is None and not cmd.is_delete:
                oid = bytes.fromhex(cmd.new)
                if not ((incoming is not None and incoming.contains(oid)) or r.objects.has(oid)):
                    cmd.error = "missing necessary objects"
        if hooks is not None and not _pre_receive(hooks, r, incoming, commands):
            return out          # refused: the quarantine goes, nothing installed, no ref moved
        if all(cmd.error is not None for cmd in commands):
            return out          # nothing to do: the quarantine goes, as git's does
        with (lock() if lock is not None else nullcontext()) as lease:
            if incoming is not None:
                result = incoming.commit((), lease=lease)
                out["pack"] = result.pack_name
                out["counters"] = index_pack_counters(result)
            _apply(r, commands, atomic=atomic, rules=rules, lease=lease, hooks=hooks)
    return out


def _pre_receive(hooks: Hooks, r: Any, incoming: IncomingPack | None, commands: Sequence[Command]) -> bool:
    """git's pre-receive step: every command on stdin (the refused ones too, as git feeds them), the
    quarantine as git's object directory; False (every command refused) when the hook says no."""
    hooks.bind(r.path, r.objects.path, list(r.alternates.paths))
    hooks.quarantine = incoming.object_directory() if incoming is not None and hooks.wants_quarantine else None
    try:
        if hooks.pre_receive(commands):
            return True
    finally:
        hooks.quarantine = None     # the update hook runs after the install: no quarantine (git's tmp_objdir NULL)
    for cmd in commands:
        if cmd.error is None:
            cmd.error = "pre-receive hook declined"
    return False


def _apply(r: Any, commands: Sequence[Command], *, atomic: bool, rules: Rules, lease: Any,
           hooks: Hooks | None = None) -> None:
    """git's update() for each command, then one transaction of the ones that pass."""
    from packyard.store.lease import check as check_lease
    from packyard.store.lease import token_of

    is_ancestor = _ancestry(r.objects)
    type_of = _type_of(r.objects)
    current_refs = r.refs.as_dict()

    def current(name: str) -> str | None:
        value = current_refs.get(name)
        return value.hex() if value is not None else None

    live = [c for c in commands if c.error is None]
    for cmd in live:
        judge(cmd, rules, is_ancestor)
        if cmd.error is None and hooks is not None and not hooks.update(cmd):
            cmd.messages.append(f"hook declined to update {cmd.name}")
            cmd.error = "hook declined"
        if cmd.error is not None and atomic:
            break
    if atomic and any(c.error is not None for c in live):
        for cmd in commands:
            if cmd.error is None:
                cmd.error = "atomic push failure"
        return
    moving: list[Command] = []
    for cmd in live:
        if cmd.error is not None:
            continue
        reason = stale_reason(cmd, current, type_of)
        if reason is not None:
            cmd.messages.append(reason)
            if atomic:
                for other in commands:
                    if other.error is None:
                        other.error = "atomic transaction failed"
                return
            cmd.error = "failed to update ref"
            continue
        if cmd.is_delete and current(cmd.name) is None:
            cmd.messages.append("warning: deleting a non-existent ref")
            cmd.did_not_exist = True
            continue
        moving.append(cmd)
    updates = [RefUpdate(c.name, None if c.old == ZERO_HEX else bytes.fromhex(c.old),
                         ZERO_OID if c.is_delete else bytes.fromhex(c.new)) for c in moving]
    if not updates:
        return
    check_lease(lease)
    try:
        r.refs.update(updates, fence_token=token_of(lease), allow_delete=True)
    except StoreError as err:
        for cmd in moving:
            cmd.messages.append(str(err))
            cmd.error = "atomic transaction failed" if atomic else "failed to update ref"


def commands_from(params: Sequence[dict[str, str]]) -> list[Command]:
    """The job's ``commands`` param (``Command.as_param``'s spelling) as commands."""
    return [Command(c["old"], c["new"], c["ref"].encode("utf-8", "surrogateescape")) for c in params]


def push_job(repo: str | Path, pack: BinaryIO | None, commands: Sequence[Command], *, atomic: bool = False,
             push_options: Sequence[str] = (), lock: LockFactory | None = None, hooks: Hooks | None = None,
             progress: Progress | None = None) -> dict[str, Any]:
    """One push as a job, the same whether the receiving process runs it (PACKYARD_RECEIVE_MODE=process) or a
    worker does (``packyard.receive_pack``): :func:`receive_pack` with the server's rules, fsck and pack limit
    (this process's settings: a message cannot change them) and ``hooks``. ``commands`` get their verdicts.
    Returns ``unpack`` / ``unpack_detail``, the verdicts for the report (``commands``: each one's ``error`` and
    ``messages``, in order), ``refs`` (name -> "ok" or the error) and the job row's counters."""
    from packyard.workers.receive.session import rules_from
    from packyard.workers.settings import get_settings

    s = get_settings()
    result = receive_pack(repo, pack, commands, atomic=atomic, rules=rules_from(s), fsck=s.fsck_options,
                          max_pack_bytes=s.max_pack_bytes, progress=progress, lock=lock, hooks=hooks)
    return {"repo": result["repo"], "unpack": result["unpack"], "unpack_detail": result.get("unpack_detail"),
            "pack": result["pack"], "push_options": len(push_options),
            "commands": [{"ref": c.name, "error": c.error, "messages": list(c.messages)} for c in commands],
            "refs": {c.name: c.error or "ok" for c in commands},
            "counters": push_counters(result["counters"], commands, hooks)}


def push_counters(counters: dict[str, Any], commands: Sequence[Command], hooks: Hooks | None) -> dict[str, Any]:
    """The job row's counters: the ingest's, the refs moved and refused, the hooks' runs."""
    out = dict(counters)
    out["refs_moved"] = sum(c.error is None for c in commands)
    out["refs_refused"] = sum(c.error is not None for c in commands)
    if hooks is not None:
        out.update(hooks.counters())
    return out


class PushUnpackFailed(InvalidInputError):
    """The push's pack was refused (git: ``unpack index-pack abnormal exit``): the job fails with the typed
    error's text, and every command is ``unpacker error`` in the report."""


def unpack_failure(result: dict[str, Any]) -> PushUnpackFailed:
    return PushUnpackFailed(f"unpack {result['unpack']}: {result.get('unpack_detail')}")
