"""git's rules for one push command, as git 2.39's receive-pack applies them (builtin/receive-pack.c
``update``, ``reject_updates_to_hidden``; refs.c ``check_refname_format``, ``ref_is_hidden``;
refs/files-backend.c ``check_old_oid``), with the same words in the ``ng`` reasons and the
``error:`` lines.

Pure functions over names, ids and a reader of the current refs: no I/O of their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

ZERO_HEX = "0" * 40

# refs.c refname_disposition: 0 ok, 1 end of component, 2 '.', 3 '{', 4 forbidden, 5 '*'
_DISPOSITION = bytearray(256)
for _c in range(0x20):
    _DISPOSITION[_c] = 4
_DISPOSITION[0] = 1
_DISPOSITION[ord("/")] = 1
_DISPOSITION[ord(".")] = 2
_DISPOSITION[ord("{")] = 3
for _c in b" :?[\\^~\x7f":
    _DISPOSITION[_c] = 4
_DISPOSITION[ord("*")] = 5
LOCK_SUFFIX = b".lock"


def _component_length(name: bytes, start: int) -> int:
    """refs.c check_refname_component: the component's length, 0 for an empty one, -1 when bad."""
    last = 0
    i = start
    n = len(name)
    while i < n:
        ch = name[i]
        disp = _DISPOSITION[ch]
        if disp == 1:
            break
        if disp == 2 and last == ord("."):
            return -1
        if disp == 3 and last == ord("@"):
            return -1
        if disp in (4, 5):
            return -1
        last = ch
        i += 1
    length = i - start
    if length == 0:
        return 0
    if name[start] == ord("."):
        return -1
    if length >= len(LOCK_SUFFIX) and name[i - len(LOCK_SUFFIX):i] == LOCK_SUFFIX:
        return -1
    return length


def check_refname_format(name: bytes, *, allow_onelevel: bool = False) -> bool:
    """True when git's ``check_refname_format(name, flags)`` accepts ``name`` (no pattern flag)."""
    if name == b"@" or b"\0" in name:
        return False
    count = 0
    pos = 0
    while True:
        length = _component_length(name, pos)
        if length <= 0:
            return False
        count += 1
        if pos + length == len(name):
            break
        pos += length + 1
    if name.endswith(b"."):
        return False
    return allow_onelevel or count >= 2


def pushable_name(name: bytes) -> bool:
    """receive-pack's test: only ``refs/...`` with a well-formed rest (``check_refname_format(name + 5, 0)``)."""
    return name.startswith(b"refs/") and check_refname_format(name[5:])


def parse_hide_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """``transfer.hideRefs`` / ``receive.hideRefs`` values as git keeps them (trailing slashes stripped)."""
    return tuple(p.rstrip("/") for p in patterns if p.strip("/"))


def ref_is_hidden(name: str, patterns: Sequence[str]) -> bool:
    """refs.c ``ref_is_hidden`` (no namespaces: the full name is the name); the last match wins."""
    for match in reversed(patterns):
        neg = match.startswith("!")
        if neg:
            match = match[1:]
        if match.startswith("^"):
            match = match[1:]
        if name.startswith(match) and (len(name) == len(match) or name[len(match)] == "/"):
            return not neg
    return False


@dataclass
class Command:
    """One ``<old> <new> <ref>`` line; ``error`` is git's ``cmd->error_string`` (None: ok)."""

    old: str
    new: str
    ref: bytes
    error: str | None = None
    messages: list[str] = field(default_factory=list)   # "error: ..." lines for side band 2
    did_not_exist: bool = False   # git's cmd->did_not_exist: deleting a ref that was not there (no post-receive)

    @property
    def name(self) -> str:
        return self.ref.decode("utf-8", "surrogateescape")

    @property
    def is_delete(self) -> bool:
        return self.new == ZERO_HEX

    @property
    def is_create(self) -> bool:
        return self.old == ZERO_HEX

    def as_param(self) -> dict[str, str]:
        return {"ref": self.name, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class Rules:
    """receive.* settings (git's defaults)."""

    deny_deletes: bool = False
    deny_non_fast_forwards: bool = False
    hide_refs: tuple[str, ...] = ()


def reject_hidden(commands: Sequence[Command], rules: Rules) -> None:
    """receive-pack's ``reject_updates_to_hidden``."""
    for cmd in commands:
        if cmd.error is None and ref_is_hidden(cmd.name, rules.hide_refs):
            cmd.error = "deny deleting a hidden ref" if cmd.is_delete else "deny updating a hidden ref"


def judge(cmd: Command, rules: Rules, is_ancestor: Callable[[str, str], bool | None]) -> None:
    """receive-pack's ``update`` for one command (the policy checks, before the transaction), in git's order.

    ``is_ancestor(old, new)``: whether ``old`` is reachable from ``new`` (None when either is not a
    commit: git's "bad ref").
    """
    name = cmd.name
    if not pushable_name(cmd.ref):
        cmd.messages.append(f"refusing to create funny ref '{name}' remotely")
        cmd.error = "funny refname"
        return
    if not cmd.is_create and cmd.is_delete and rules.deny_deletes and name.startswith("refs/heads/"):
        cmd.messages.append(f"denying ref deletion for {name}")
        cmd.error = "deletion prohibited"
        return
    if (rules.deny_non_fast_forwards and not cmd.is_delete and not cmd.is_create
            and name.startswith("refs/heads/")):
        verdict = is_ancestor(cmd.old, cmd.new)
        if verdict is None:
            cmd.messages.append(f"bad sha1 objects for {name}")
            cmd.error = "bad ref"
            return
        if not verdict:
            cmd.messages.append(f"denying non-fast-forward {name} (you should pull first)")
            cmd.error = "non-fast-forward"
            return


def stale_reason(cmd: Command, current: Callable[[str], str | None],
                 type_of: Callable[[str], str | None]) -> str | None:
    """What the ref transaction's commit says about ``cmd`` (files-backend ``check_old_oid``, and the
    branch-names-a-commit rule), or None when it would commit."""
    name = cmd.name
    have = current(name)
    if cmd.is_delete and have is None:
        return None   # git: "deleting a non-existent ref" is a warning, and the delete succeeds
    if (have or ZERO_HEX) != cmd.old:
        if cmd.is_create:
            what = "reference already exists"
        elif have is None:
            what = f"reference is missing but expected {cmd.old}"
        else:
            what = f"is at {have} but expected {cmd.old}"
        return f"cannot lock ref '{name}': {what}"
    if not cmd.is_delete and name.startswith("refs/heads/"):
        kind = type_of(cmd.new)
        if kind is not None and kind != "commit":
            return f"trying to write non-commit object {cmd.new} to branch '{name}'"
    return None
