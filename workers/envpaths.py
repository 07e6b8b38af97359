"""The two paths a process needs before it loads its settings: the state directory and the receive socket.

``packyard receive-pack`` reads only these (to hand its push to a running server, workers/receive/handoff.py) and
must start as fast as a bare interpreter, so they are computed here with ``os`` alone; :class:`~.settings.Settings`
takes them from here too, so both agree by construction.
"""
from __future__ import annotations

import os
from typing import Mapping

#: the longest path a unix socket can bind to (sun_path is 108 bytes with its NUL, on Linux): the receive socket's
#: and the embedded Redis's (workers/embedded.py)
MAX_SOCKET_PATH = 107
RECEIVE_SOCKET_NAME = "receive.sock"


def state_dir(env: Mapping[str, str]) -> str:
    """PACKYARD_STATE_DIR (default ``./.state``), absolute and resolved."""
    return os.path.realpath(os.path.expanduser(env.get("PACKYARD_STATE_DIR") or os.path.join(os.getcwd(), ".state")))


def receive_socket(env: Mapping[str, str]) -> str | None:
    """PACKYARD_RECEIVE_SOCKET: an absolute path, "off", or unset (``<state dir>/receive.sock``, or no socket when
    that path is too long for a unix socket: the push then runs in ``packyard receive-pack`` itself).
    ValueError for a value that is neither."""
    raw = env.get("PACKYARD_RECEIVE_SOCKET", "").strip()
    if raw.lower() in ("off", "none", "0"):
        return None
    if not raw:
        path = os.path.join(state_dir(env), RECEIVE_SOCKET_NAME)
        return path if len(os.fsencode(path)) <= MAX_SOCKET_PATH else None
    path = os.path.expanduser(raw)
    if not os.path.isabs(path):
        raise ValueError(f"PACKYARD_RECEIVE_SOCKET must be an absolute path or off, got {raw!r}")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"PACKYARD_RECEIVE_SOCKET is longer than a unix socket's {MAX_SOCKET_PATH} bytes: {raw!r}")
    return path
