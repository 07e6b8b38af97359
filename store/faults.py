"""Fault-injection points between durability steps.

Code calls ``fault_point("bulk.after_renames")`` between steps. Normally this is
one dictionary lookup that does nothing (it runs per object in bulk writes, so it
must stay that cheap). Tests arm a point through the environment, read when this
module is imported (so it reaches worker and child processes started with it)::

    PACKYARD_FAULT=bulk.after_renames            # SIGKILL this process there
    PACKYARD_FAULT=bulk.after_renames:raise      # raise InjectedFault instead
    PACKYARD_FAULT=bulk.write_object:kill@37     # kill on the 37th time it is reached
    PACKYARD_FAULT=refs.before_rename:kill-once  # kill only the first process of all to get there
                                                 # (needs PACKYARD_FAULT_ONCE_DIR, shared by them)
    PACKYARD_FAULT=repack.after_lease_check:stop-once   # SIGSTOP this process there (a stall: the
                                                 # test sends SIGCONT; the code then goes on)

or in-process with :func:`arm` / :func:`disarm`, or :func:`arm_call` (run a function there: a test makes
another host act at exactly that point of a read, where a race would hit it only by luck). A process that changes
``PACKYARD_FAULT`` after import calls :func:`reload_env`.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass


class InjectedFault(RuntimeError):
    """Raised by an armed fault point in ``raise`` mode."""


@dataclass
class _Armed:
    name: str
    mode: str = "kill"
    at: int = 1
    hits: int = 0
    call: Callable[[], None] | None = None   # mode ``local-call``: what runs there


_armed: dict[str, _Armed] = {}


def _parse(spec: str) -> dict[str, _Armed]:
    out: dict[str, _Armed] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, rest = item.partition(":")
        mode, _, at = (rest or "kill").partition("@")
        out[name] = _Armed(name=name, mode=mode or "kill", at=int(at) if at else 1)
    return out


def reload_env() -> None:
    """(Re)read PACKYARD_FAULT; points armed in-process with :func:`arm` stay armed."""
    global _armed
    spec = os.environ.get("PACKYARD_FAULT", "")
    _armed = {**_parse(spec), **{k: v for k, v in _armed.items() if v.mode.startswith("local-")}}


def arm(name: str, mode: str = "raise", at: int = 1) -> None:
    """Arm a point in this process only (``mode`` is ``raise`` or ``kill``)."""
    _armed[name] = _Armed(name=name, mode="local-" + mode, at=at)


def arm_call(name: str, call: Callable[[], None], at: int = 1) -> None:
    """Run ``call`` at the ``at``-th time this process reaches the point (once; then it is disarmed)."""
    _armed[name] = _Armed(name=name, mode="local-call", at=at, call=call)


def disarm(name: str | None = None) -> None:
    if name is None:
        for key in [k for k, v in _armed.items() if v.mode.startswith("local-")]:
            del _armed[key]
    else:
        _armed.pop(name, None)


def _first_of_all(name: str) -> bool:
    """For ``-once`` modes: True in the one process that creates ``$PACKYARD_FAULT_ONCE_DIR/<name>``.

    Worker pools fork a fresh child after a kill; without this the redelivered job would be killed
    at the same point again, forever.
    """
    directory = os.environ.get("PACKYARD_FAULT_ONCE_DIR")
    if not directory:
        raise InjectedFault(f"fault {name}: a -once mode needs PACKYARD_FAULT_ONCE_DIR")
    try:
        os.close(os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def fault_point(name: str) -> None:
    """Crash or raise here if a test armed this point; otherwise do nothing."""
    armed = _armed.get(name)
    if armed is None:
        return
    armed.hits += 1
    if armed.hits < armed.at:
        return
    mode = armed.mode.removeprefix("local-")
    if mode == "call":
        if _armed.pop(name, None) is armed and armed.call is not None:   # (one thread of several: the pop's)
            armed.call()
        return
    if mode.endswith("-once"):
        if not _first_of_all(name):
            return
        mode = mode.removesuffix("-once")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "stop":
        # A stall (GC pause, VM freeze, NFS hang): every thread stops until someone sends SIGCONT.
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    raise InjectedFault(f"injected fault at {name}")


reload_env()
